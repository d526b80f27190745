package cosignverify

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/elliptic"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/sigstore/cosign/v2/pkg/cosign"
	sigs "github.com/sigstore/cosign/v2/pkg/signature"
	"github.com/sigstore/sigstore/pkg/cryptoutils"
)

const password = "test-key-password"

// keyPair writes a key pair as `cosign generate-key-pair` does (the private
// key encrypted with password) and returns the paths.
func keyPair(t *testing.T, dir, prefix string) (priv, pub string) {
	t.Helper()
	privPEM, pubPEM, err := cryptoutils.GeneratePEMEncodedECDSAKeyPair(elliptic.P256(), cryptoutils.StaticPasswordFunc([]byte(password)))
	if err != nil {
		t.Fatal(err)
	}
	priv, pub = filepath.Join(dir, prefix+".key"), filepath.Join(dir, prefix+".pub")
	if err := os.WriteFile(priv, privPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(pub, pubPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	return priv, pub
}

// imageTool runs hack/image's command (go run .) in hack/image.
func imageTool(t *testing.T, env []string, args ...string) string {
	t.Helper()
	cmd := exec.Command("go", append([]string{"run", "."}, args...)...)
	cmd.Dir = ".."
	cmd.Env = append(append(os.Environ(), "GOFLAGS=-mod=mod"), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("image %v: %v\n%s", args, err, stderr.String())
	}
	return strings.TrimSpace(string(out))
}

// verify is `cosign verify --key PUB --insecure-ignore-tlog=true REF` in
// cosign's own code: the key loaded as the CLI loads it, no transparency
// log, and the claim (the payload's digest) checked against ref.
func verify(ctx context.Context, ref, pub string) error {
	v, err := sigs.LoadPublicKey(ctx, pub)
	if err != nil {
		return err
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		return err
	}
	co := &cosign.CheckOpts{
		SigVerifier:   v,
		IgnoreTlog:    true,
		ClaimVerifier: cosign.SimpleClaimVerifier,
	}
	_, _, err = cosign.VerifyImageSignatures(ctx, r, co)
	return err
}

// TestCosignVerify pushes the pause image signed with a cosign key and
// verifies it with cosign's verifier; then the same with a signature by
// another key, and with an index whose one layer was changed but which
// carries the original signature: both must fail.
func TestCosignVerify(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	srv := httptest.NewServer(registry.New(registry.WithReferrersSupport(true), registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	dir := t.TempDir()
	priv, pub := keyPair(t, dir, "cosign")
	_, otherPub := keyPair(t, dir, "other")

	bin := filepath.Join(dir, "pause")
	build := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin, "./pause")
	build.Dir = ".."
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	archive := filepath.Join(dir, "pause.tar")
	imageTool(t, nil, "build", "-dockerfile", "pause/Dockerfile", "-context", ".", "-binary", bin,
		"-load-platform", "linux/"+runtime.GOARCH, "-tag", "registry.local/pause:test", "-o", archive)
	ref := imageTool(t, []string{"COSIGN_PASSWORD=" + password}, "push", "-i", archive, "-key", priv, host+"/team/pause:v1")
	t.Logf("pushed %s", ref)

	if err := verify(ctx, ref, pub); err != nil {
		t.Fatalf("cosign verify --key cosign.pub %s: %v", ref, err)
	}
	err := verify(ctx, ref, otherPub)
	t.Logf("verified with another key: %v", err)
	if err == nil {
		t.Error("a signature verified with another key")
	}

	// One layer changed: the index and the image differ, the signature is
	// copied over as an attacker would.
	tampered := tamper(t, ref)
	d, err := name.NewDigest(ref)
	if err != nil {
		t.Fatal(err)
	}
	td, err := name.NewDigest(tampered)
	if err != nil {
		t.Fatal(err)
	}
	sig, err := remote.Image(sigTag(d))
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(sigTag(td), sig); err != nil {
		t.Fatal(err)
	}
	err = verify(ctx, tampered, pub)
	t.Logf("verified an index with one layer changed, carrying the original signature: %v", err)
	if err == nil {
		t.Error("an index with one layer changed verified")
	}

	// A chart as `helm push` uploads it (Helm's config and content media
	// types), signed by `image sign` as make chart-push does.
	chart := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), "application/vnd.cncf.helm.config.v1+json")
	chart, err = mutate.Append(chart, mutate.Addendum{Layer: static.NewLayer([]byte("not really a chart"), "application/vnd.cncf.helm.chart.content.v1.tar+gzip")})
	if err != nil {
		t.Fatal(err)
	}
	chartTag := d.Context().Registry.Repo("charts", "uuid-controller").Tag("0.1.0")
	if err := remote.Write(chartTag, chart); err != nil {
		t.Fatal(err)
	}
	cd, err := chart.Digest()
	if err != nil {
		t.Fatal(err)
	}
	chartRef := chartTag.Context().Digest(cd.String()).String()
	imageTool(t, []string{"COSIGN_PASSWORD=" + password}, "sign", "-key", priv, chartRef)
	if err := verify(ctx, chartRef, pub); err != nil {
		t.Errorf("cosign verify --key cosign.pub %s (the chart): %v", chartRef, err)
	}
	err = verify(ctx, chartRef, otherPub)
	t.Logf("verified the chart with another key: %v", err)
	if err == nil {
		t.Error("the chart's signature verified with another key")
	}
}

func sigTag(d name.Digest) name.Tag {
	return d.Context().Tag(strings.Replace(d.DigestStr(), ":", "-", 1) + ".sig")
}

// tamper pushes a copy of ref's index whose one image has its layer changed
// (one file's content flipped) and returns it by digest.
func tamper(t *testing.T, ref string) string {
	t.Helper()
	d, err := name.NewDigest(ref)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := remote.Index(d)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	img, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	tr, tw := tar.NewReader(rc), tar.NewWriter(&buf)
	changed := false
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if !changed && h.Typeflag == tar.TypeReg && len(b) > 0 {
			b[len(b)-1] ^= 0xff
			changed = true
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	rc.Close()
	tw.Close()
	data := buf.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil },
		tarball.WithMediaType(types.OCIUncompressedLayer))
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	timg, err := mutate.AppendLayers(base, layer)
	if err != nil {
		t.Fatal(err)
	}
	tcf, err := timg.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	tcf = tcf.DeepCopy()
	tcf.OS, tcf.Architecture, tcf.Config, tcf.Created = cf.OS, cf.Architecture, cf.Config, cf.Created
	if timg, err = mutate.ConfigFile(timg, tcf); err != nil {
		t.Fatal(err)
	}
	tidx := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex),
		mutate.IndexAddendum{Add: timg, Descriptor: v1.Descriptor{Platform: im.Manifests[0].Platform}})
	tag := d.Context().Tag("tampered")
	if err := remote.WriteIndex(tag, tidx); err != nil {
		t.Fatal(err)
	}
	h, err := tidx.Digest()
	if err != nil {
		t.Fatal(err)
	}
	if h.String() == d.DigestStr() {
		t.Fatal("tampering changed nothing")
	}
	return d.Context().Digest(h.String()).String()
}
