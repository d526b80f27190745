//go:build node

package node

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// writeKeyPair writes a fresh ECDSA P-256 key pair into dir as what
// SIGNING_KEY and `image verify -pub` take: an unencrypted PKCS#8 PEM
// private key and a PKIX PEM public key.
func writeKeyPair(dir, name string) (key, pub string, err error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return "", "", err
	}
	pubDER, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	if err != nil {
		return "", "", err
	}
	key, pub = filepath.Join(dir, name+".key"), filepath.Join(dir, name+".pub")
	if err := os.WriteFile(key, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return "", "", err
	}
	if err := os.WriteFile(pub, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}), 0o644); err != nil {
		return "", "", err
	}
	return key, pub, nil
}

// imageTool runs hack/image's command (as the Makefile's IMAGE_TOOL runs
// it) against the node's registry and returns what it printed on stdout,
// trimmed, or an error carrying its stderr.
func imageTool(ctx context.Context, args ...string) (string, error) {
	args = append([]string{"run", ".", args[0], "-ca", env.cluster.RegistryCA()}, args[1:]...)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = filepath.Join(env.root, "hack", "image")
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("image %s: %w: %s", strings.Join(args[2:], " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(string(out)), nil
}

// verifyRef runs `image verify -pub PUB ref` and fails the test unless it
// verifies, as want (REPOSITORY@sha256:...).
func verifyRef(ctx context.Context, t *testing.T, pub, ref, want string) {
	t.Helper()
	got, err := imageTool(ctx, "verify", "-pub", pub, ref)
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Fatalf("image verify %s printed %q, want %s", ref, got, want)
	}
}

// verifyRefused runs `image verify -pub PUB ref` and fails the test unless
// it is refused with an error saying want.
func verifyRefused(ctx context.Context, t *testing.T, what, pub, ref, want string) {
	t.Helper()
	_, err := imageTool(ctx, "verify", "-pub", pub, ref)
	t.Logf("%s: %v", what, err)
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("%s: %v, want an error saying %q", what, err, want)
	}
}

// checkAttestations reads the SBOM and the provenance that refer to the
// image tag with `image attestations -pub`, which checks the provenance's
// signature, and fails the test unless the SBOM lists the controller's
// module and the provenance names the commit `make image` built (the work
// tree's HEAD).
func checkAttestations(ctx context.Context, t *testing.T, pub, tag string) {
	t.Helper()
	dir := t.TempDir()
	got, err := imageTool(ctx, "attestations", "-pub", pub, "-o", dir, tag)
	if err != nil {
		t.Fatal(err)
	}
	if got != env.image {
		t.Fatalf("image attestations %s printed %q, want %s", tag, got, env.image)
	}
	mod, err := exec.Command("go", "-C", env.root, "list", "-m").Output()
	if err != nil {
		t.Fatal(err)
	}
	var bom struct {
		Components []sbomComponent `json:"components"`
	}
	readJSON(t, filepath.Join(dir, "sbom.cdx.json"), &bom)
	var binaries int
	for _, b := range bom.Components {
		for _, m := range b.Components {
			if m.Name == strings.TrimSpace(string(mod)) {
				binaries++
			}
		}
	}
	if binaries == 0 || binaries != len(bom.Components) {
		t.Errorf("the SBOM lists module %s in %d of its %d components", strings.TrimSpace(string(mod)), binaries, len(bom.Components))
	}
	// The Makefile stamps the commit git names, and none outside a git
	// checkout (make mutate's scratch copy).
	head, err := exec.Command("git", "-C", env.root, "rev-parse", "HEAD").Output()
	if _, statErr := os.Stat(filepath.Join(env.root, ".git")); err != nil && statErr == nil {
		t.Fatalf("git rev-parse HEAD: %v", err)
	}
	var st struct {
		Predicate struct {
			BuildDefinition struct {
				ExternalParameters struct {
					Source struct {
						Digest map[string]string `json:"digest"`
					} `json:"source"`
				} `json:"externalParameters"`
			} `json:"buildDefinition"`
		} `json:"predicate"`
	}
	readJSON(t, filepath.Join(dir, "provenance.json"), &st)
	if got, want := st.Predicate.BuildDefinition.ExternalParameters.Source.Digest["gitCommit"], strings.TrimSpace(string(head)); got != want {
		t.Errorf("the provenance names commit %q, want HEAD %s", got, want)
	}
	t.Logf("attestations of %s: the SBOM lists %s in its %d binaries, the provenance names commit %s", got, strings.TrimSpace(string(mod)), binaries, strings.TrimSpace(string(head)))
}

// sbomComponent is what checkAttestations reads of a CycloneDX component.
type sbomComponent struct {
	Name       string          `json:"name"`
	Components []sbomComponent `json:"components"`
}

func readJSON(t *testing.T, file string, v any) {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
}

// copyManifest copies the OCI manifest tagged from to the tag to in the
// node's registry's repository repo, through the distribution API: what
// someone with push rights does to swap a signature.
func copyManifest(ctx context.Context, repo, from, to string) error {
	ca, err := os.ReadFile(env.cluster.RegistryCA())
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	const mt = "application/vnd.oci.image.manifest.v1+json"
	base := "https://" + env.cluster.Registry() + "/v2/" + repo + "/manifests/"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+from, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", mt)
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s%s: %s %v", base, from, resp.Status, err)
	}
	req, err = http.NewRequestWithContext(ctx, http.MethodPut, base+to, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", mt)
	if resp, err = client.Do(req); err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		return fmt.Errorf("PUT %s%s: %s", base, to, resp.Status)
	}
	return nil
}

// sigTag is the tag cosign (and image sign) keep a digest's signature in.
func sigTag(digest string) string {
	return strings.Replace(digest, ":", "-", 1) + ".sig"
}

// signedRelease checks the release as a user does before installing it,
// offline, with the public key: the image tag's signature, its SBOM and
// provenance, and the signature of the chart chart-push pushed (chart, by
// digest). Tampered inputs are refused: another public key, and the
// image's signature tag overwritten with a valid signature by the same key
// for another digest (the chart's); the image is signed again after.
func signedRelease(ctx context.Context, t *testing.T, tag, chart string) {
	t.Helper()
	verifyRef(ctx, t, env.publicKey, tag, env.image)
	checkAttestations(ctx, t, env.publicKey, tag)
	verifyRef(ctx, t, env.publicKey, chart, chart)
	t.Logf("verified the signatures of %s and %s", env.image, chart)

	_, otherPub, err := writeKeyPair(t.TempDir(), "other")
	if err != nil {
		t.Fatal(err)
	}
	verifyRefused(ctx, t, "the image with another public key", otherPub, tag, "does not check against")
	verifyRefused(ctx, t, "the chart with another public key", otherPub, chart, "does not check against")

	repo, imageDigest, _ := strings.Cut(env.image, "@")
	_, chartDigest, _ := strings.Cut(chart, "@")
	if _, err := imageTool(ctx, "sign", "-key", env.signingKey, repo+"@"+chartDigest); err != nil {
		t.Fatal(err)
	}
	if err := copyManifest(ctx, imageRepo, sigTag(chartDigest), sigTag(imageDigest)); err != nil {
		t.Fatal(err)
	}
	verifyRefused(ctx, t, "the image, its signature tag overwritten with a signature for another digest", env.publicKey, tag, "names another digest, "+chartDigest)
	if _, err := imageTool(ctx, "sign", "-key", env.signingKey, env.image); err != nil {
		t.Fatal(err)
	}
	verifyRef(ctx, t, env.publicKey, tag, env.image)
}
