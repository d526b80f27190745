package main

import (
	"context"
	"crypto/elliptic"
	"encoding/json"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/sigstore/sigstore/pkg/cryptoutils"
)

// testKeyPair writes an unencrypted ECDSA P-256 key pair (PKCS#8 PEM
// private, PKIX PEM public) into dir and returns both files.
func testKeyPair(t *testing.T, dir, name string) (key, pub string) {
	t.Helper()
	privPEM, pubPEM, err := cryptoutils.GeneratePEMEncodedECDSAKeyPair(elliptic.P256(), cryptoutils.SkipPassword)
	if err != nil {
		t.Fatal(err)
	}
	key, pub = filepath.Join(dir, name+".key"), filepath.Join(dir, name+".pub")
	if err := os.WriteFile(key, privPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(pub, pubPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	return key, pub
}

// TestVerify signs an image in an in-process registry as push does and
// verifies it by tag and by digest with the public key. Another key, an
// image whose layer changed after signing (so another digest, unsigned),
// the same changed image with the first signature copied to its signature
// tag (a payload naming another digest), and a payload naming another
// repository are each refused.
func TestVerify(t *testing.T) {
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	dir := t.TempDir()
	key, pub := testKeyPair(t, dir, "signing")
	_, otherPub := testKeyPair(t, dir, "other")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	opts, err := remoteOptions(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	signer, err := loadSigner(key)
	if err != nil {
		t.Fatal(err)
	}

	img, err := random.Image(256, 1)
	if err != nil {
		t.Fatal(err)
	}
	tag, err := name.NewTag(host + "/team/app:v1")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(tag, img, opts...); err != nil {
		t.Fatal(err)
	}
	h, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	d := tag.Context().Digest(h.String())
	if err := sign(d, signer, opts); err != nil {
		t.Fatal(err)
	}

	for _, ref := range []string{tag.String(), d.String()} {
		got, err := verifyCmd(ctx, ref, "", pub)
		if err != nil || got != d.String() {
			t.Errorf("verify %s: %s, %v; want %s", ref, got, err, d)
		}
	}
	refuse := func(what, ref, pubKey, want string) {
		t.Helper()
		_, err := verifyCmd(ctx, ref, "", pubKey)
		t.Logf("%s: %v", what, err)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error saying %q", what, err, want)
		}
	}
	refuse("another key", tag.String(), otherPub, "does not check against")

	// One layer changed: the tag names another digest, which nobody signed.
	changed, err := mutate.AppendLayers(img, static.NewLayer([]byte("changed"), types.OCILayer))
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(tag, changed, opts...); err != nil {
		t.Fatal(err)
	}
	ch, err := changed.Digest()
	if err != nil {
		t.Fatal(err)
	}
	refuse("a changed layer", tag.String(), pub, "is not signed")

	// The first signature copied to the changed image's signature tag: it
	// checks against the key, but names the first digest.
	sigImg, err := remote.Image(signatureTag(d), opts...)
	if err != nil {
		t.Fatal(err)
	}
	cd := tag.Context().Digest(ch.String())
	if err := remote.Write(signatureTag(cd), sigImg, opts...); err != nil {
		t.Fatal(err)
	}
	refuse("a signature for another digest", tag.String(), pub, "names another digest, "+h.String())

	// The first image under another repository, its signature copied along.
	other := d.Context().Registry.Repo("elsewhere", "app").Digest(h.String())
	if err := remote.Write(other, img, opts...); err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(signatureTag(other), sigImg, opts...); err != nil {
		t.Fatal(err)
	}
	refuse("a signature for another repository", other.String(), pub, "names another repository")

	// A payload of another type, signed with the right key.
	var p simpleSigning
	p.Critical.Identity.DockerReference = d.Context().Name()
	p.Critical.Image.DockerManifestDigest = d.DigestStr()
	p.Critical.Type = "atomic container signature"
	payload, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := writeSignature(d, payload, signer, opts); err != nil {
		t.Fatal(err)
	}
	refuse("a payload of another type", d.String(), pub, `has type "atomic container signature"`)
}
