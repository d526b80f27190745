package main

import (
	"bytes"
	"context"
	"crypto/elliptic"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	cdx "github.com/CycloneDX/cyclonedx-go"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/sigstore/sigstore/pkg/cryptoutils"
)

// goVersionModules is what `go version -m FILE` lists as the binary's
// modules, each PATH@VERSION as compiled (a replacement in place of what it
// replaces), in its order: the main module, then the dependencies.
func goVersionModules(t *testing.T, file string) []string {
	t.Helper()
	out, err := exec.Command("go", "version", "-m", file).Output()
	if err != nil {
		t.Fatalf("go version -m %s: %v", file, err)
	}
	var mods []string
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Split(strings.TrimPrefix(l, "\t"), "\t")
		switch f[0] {
		case "mod", "dep":
			mods = append(mods, f[1]+"@"+f[2])
		case "=>":
			mods[len(mods)-1] = f[1] + "@" + f[2]
		}
	}
	if len(mods) == 0 {
		t.Fatalf("go version -m %s lists no module:\n%s", file, out)
	}
	return mods
}

// sbomModules decodes a CycloneDX BOM and returns, for each platform's
// binary, its modules as PATH@VERSION.
func sbomModules(data []byte) (map[string][]string, error) {
	var bom cdx.BOM
	if err := cdx.NewBOMDecoder(bytes.NewReader(data), cdx.BOMFileFormatJSON).Decode(&bom); err != nil {
		return nil, fmt.Errorf("decoding the SBOM: %w", err)
	}
	if bom.Components == nil {
		return nil, fmt.Errorf("the SBOM lists no component")
	}
	out := map[string][]string{}
	for _, c := range *bom.Components {
		p, ok := strings.CutPrefix(c.BOMRef, "binary:")
		if !ok || c.Components == nil {
			continue
		}
		for _, m := range *c.Components {
			out[p] = append(out[p], m.Name+"@"+m.Version)
		}
	}
	return out, nil
}

// checkSBOMModules says how the SBOM's modules for platform p differ from
// the binary's `go version -m`, or nil when they are the same list.
func checkSBOMModules(sbom map[string][]string, p string, want []string) error {
	got := sbom[p]
	if slices.Equal(got, want) {
		return nil
	}
	var missing, extra []string
	for _, m := range want {
		if !slices.Contains(got, m) {
			missing = append(missing, m)
		}
	}
	for _, m := range got {
		if !slices.Contains(want, m) {
			extra = append(extra, m)
		}
	}
	return fmt.Errorf("the SBOM's modules for %s differ from go version -m: missing %v, not in the binary %v (%d listed, %d in the binary)", p, missing, extra, len(got), len(want))
}

// referrerBlob fetches the one artifact of artifactType that refers to d and
// returns its one layer.
func referrerBlob(t *testing.T, d name.Digest, artifactType string, opts []remote.Option) ([]byte, string) {
	t.Helper()
	idx, err := remote.Referrers(d, opts...)
	if err != nil {
		t.Fatalf("referrers of %s: %v", d, err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var found []v1.Descriptor
	for _, m := range im.Manifests {
		if m.ArtifactType == artifactType {
			found = append(found, m)
		}
	}
	if len(found) != 1 {
		t.Fatalf("referrers of %s with artifactType %s: %+v, want one", d, artifactType, im.Manifests)
	}
	img, err := remote.Image(d.Context().Digest(found[0].Digest.String()), opts...)
	if err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("artifact %s: layers %v, %v", found[0].Digest, layers, err)
	}
	mt, _ := layers[0].MediaType()
	rc, err := layers[0].Compressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return b, string(mt)
}

// TestAttach pushes the pause image with its SBOM, provenance and signature
// to three registries: go-containerregistry's with the OCI 1.1 referrers
// API, the same without it (the sha256-<digest> tag fallback), and CNCF
// distribution's (bin/registry, as the node runs it: no referrers API). It
// reads each back by the referrers of the pushed index: the SBOM lists
// exactly the binary's modules, and the provenance's DSSE signature checks
// against the public key and names the index, the source commit, the
// Dockerfile's base image and the binary's build info. A tampered SBOM and
// a tampered provenance are refused.
func TestAttach(t *testing.T) {
	dir := t.TempDir()
	bin := goBuildFile(t, dir, dockerfileEnv, "-trimpath", "-ldflags=-s -w")
	archive := filepath.Join(dir, "pause.tar")
	o := buildOptions{dockerfile: "pause/Dockerfile", contextDir: ".", binaries: []string{bin}, tag: "registry.local/pause:test",
		out: archive, loadPlatform: hostPlatform, sbom: filepath.Join(dir, "pause.sbom.cdx.json"),
		provenance: filepath.Join(dir, "pause.provenance.json"), buildArgs: map[string]string{}}
	if err := build(o); err != nil {
		t.Fatal(err)
	}
	privPEM, pubPEM, err := cryptoutils.GeneratePEMEncodedECDSAKeyPair(elliptic.P256(), cryptoutils.StaticPasswordFunc([]byte("pw")))
	if err != nil {
		t.Fatal(err)
	}
	key := filepath.Join(dir, "cosign.key")
	if err := os.WriteFile(key, privPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("COSIGN_PASSWORD", "pw")
	_, otherPub, err := cryptoutils.GeneratePEMEncodedECDSAKeyPair(elliptic.P256(), cryptoutils.SkipPassword)
	if err != nil {
		t.Fatal(err)
	}
	pubFile, otherPubFile := filepath.Join(dir, "cosign.pub"), filepath.Join(dir, "other.pub")
	if err := os.WriteFile(pubFile, pubPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(otherPubFile, otherPub, 0o644); err != nil {
		t.Fatal(err)
	}
	wantMods := goVersionModules(t, bin)
	goVersionM, err := exec.Command("go", "version", "-m", bin).Output()
	if err != nil {
		t.Fatal(err)
	}

	withAPI := httptest.NewServer(registry.New(registry.WithReferrersSupport(true), registry.Logger(log.New(io.Discard, "", 0))))
	defer withAPI.Close()
	without := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer without.Close()
	registries := []struct {
		name        string
		setup       func(t *testing.T) (host, ca string)
		referrerAPI bool
	}{
		{"referrers API", func(*testing.T) (string, string) { return strings.TrimPrefix(withAPI.URL, "http://"), "" }, true},
		{"tag fallback", func(*testing.T) (string, string) { return strings.TrimPrefix(without.URL, "http://"), "" }, false},
		{"distribution", func(t *testing.T) (string, string) {
			host, ca := startRegistry(t)
			dockerConfig(t, host, testUser, testPassword)
			return host, ca
		}, false},
	}
	for _, r := range registries {
		t.Run(r.name, func(t *testing.T) {
			host, ca := r.setup(t)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			pushed, err := pushAndAttach(ctx, archive, host+"/team/pause:v1", ca, attachments{sbom: o.sbom, provenance: o.provenance, key: key})
			if err != nil {
				t.Fatal(err)
			}
			d, err := name.NewDigest(pushed)
			if err != nil {
				t.Fatal(err)
			}
			opts, err := remoteOptions(ctx, ca)
			if err != nil {
				t.Fatal(err)
			}
			// Where the referrers live: the API, or the fallback tag.
			fallback := d.Context().Tag(strings.Replace(d.DigestStr(), ":", "-", 1))
			_, ferr := remote.Head(fallback, opts...)
			if r.referrerAPI != (ferr != nil) {
				t.Errorf("referrers API %v, but the fallback tag %s: %v", r.referrerAPI, fallback.TagStr(), ferr)
			}

			sbom, mt := referrerBlob(t, d, sbomMediaType, opts)
			if mt != sbomMediaType {
				t.Errorf("SBOM layer media type %s", mt)
			}
			mods, err := sbomModules(sbom)
			if err != nil {
				t.Fatal(err)
			}
			if err := checkSBOMModules(mods, hostPlatform.String(), wantMods); err != nil {
				t.Error(err)
			}
			want, _ := os.ReadFile(o.sbom)
			if !bytes.Equal(sbom, want) {
				t.Error("the SBOM read back differs from the one build wrote")
			}

			env, mt := referrerBlob(t, d, provenanceMediaType, opts)
			if mt != dsseMediaType {
				t.Errorf("provenance layer media type %s", mt)
			}
			if _, _, err := dsseVerify(env, otherPub); err == nil {
				t.Error("the provenance verified with another key")
			}
			pt, payload, err := dsseVerify(env, pubPEM)
			if err != nil {
				t.Fatal(err)
			}
			var st statement
			if err := json.Unmarshal(payload, &st); err != nil {
				t.Fatal(err)
			}
			if pt != provenanceMediaType || st.Type != inTotoStatementType || st.PredicateType != slsaProvenanceType ||
				st.Subject[0].Digest["sha256"] != strings.TrimPrefix(d.DigestStr(), "sha256:") {
				t.Errorf("provenance: payload type %s, statement %s %s, subject %v, pushed %s", pt, st.Type, st.PredicateType, st.Subject, d.DigestStr())
			}
			deps := st.Predicate.BuildDefinition.ResolvedDependencies
			if len(deps) != 2 || deps[1].URI != "pkg:docker/golang:1.26.8-bookworm" ||
				deps[1].Digest["sha256"] != "a688600ca24f8a4d3ca77f95b0dd40704a9fc787c826660eb7ba0b641b8b175d" {
				t.Errorf("provenance's resolved dependencies %+v, want the source and the Dockerfile's golang base by digest", deps)
			}
			bp := st.Predicate.RunDetails.Byproducts
			// go version -m: FILE: GOVERSION, then the build info's lines
			// after its first ("go GOVERSION"), each indented by a tab.
			_, wantInfo, _ := strings.Cut(string(goVersionM), "\n")
			var gotInfo string
			if len(bp) == 1 {
				_, info, _ := strings.Cut(bp[0].Annotations["goBuildInfo"], "\n")
				gotInfo = "\t" + strings.ReplaceAll(strings.TrimSuffix(info, "\n"), "\n", "\n\t") + "\n"
			}
			if gotInfo != wantInfo {
				t.Errorf("provenance's build info %q, go version -m says %q", bp, wantInfo)
			}
			// What a user runs: image attestations -pub cosign.pub TAG.
			out := t.TempDir()
			got, err := fetchAttestations(ctx, host+"/team/pause:v1", ca, pubFile, out)
			if err != nil || got != pushed {
				t.Errorf("attestations: %s, %v; pushed %s", got, err, pushed)
			}
			if b, _ := os.ReadFile(filepath.Join(out, "provenance.json")); !bytes.Equal(b, payload) {
				t.Error("attestations wrote another provenance than the signed one")
			}
			if b, _ := os.ReadFile(filepath.Join(out, "sbom.cdx.json")); !bytes.Equal(b, want) {
				t.Error("attestations wrote another SBOM than build's")
			}
			_, err = fetchAttestations(ctx, pushed, ca, otherPubFile, t.TempDir())
			t.Logf("attestations with another key: %v", err)
			if err == nil {
				t.Error("attestations accepted the provenance with another key")
			}
			gb := st.Predicate.BuildDefinition.InternalParameters.GoBuild[hostPlatform.String()]
			if gb.Flags["-ldflags"] != "-s -w" || gb.Flags["-trimpath"] != "true" || gb.Env["CGO_ENABLED"] != "0" || gb.Toolchain != runtime.Version() {
				t.Errorf("provenance's go build for %s: %+v", hostPlatform, gb)
			}
		})
	}

	// Tampered inputs are refused: a module left out of the SBOM, one byte
	// of the signed provenance changed.
	data, _ := os.ReadFile(o.sbom)
	var bom map[string]any
	if err := json.Unmarshal(data, &bom); err != nil {
		t.Fatal(err)
	}
	comps := bom["components"].([]any)[0].(map[string]any)
	comps["components"] = []any{}
	tampered, _ := json.Marshal(bom)
	mods, err := sbomModules(tampered)
	if err != nil {
		t.Fatal(err)
	}
	err = checkSBOMModules(mods, hostPlatform.String(), wantMods)
	t.Logf("SBOM with a module left out: %v", err)
	if err == nil {
		t.Error("an SBOM with a module left out passed")
	}
	signer, err := loadSigner(key)
	if err != nil {
		t.Fatal(err)
	}
	prov, _ := os.ReadFile(o.provenance)
	env, err := dsseSign(signer, provenanceMediaType, prov)
	if err != nil {
		t.Fatal(err)
	}
	var e dsseEnvelope
	if err := json.Unmarshal(env, &e); err != nil {
		t.Fatal(err)
	}
	e.Payload = strings.Replace(e.Payload, e.Payload[40:44], "AAAA", 1)
	env, _ = json.Marshal(e)
	_, _, err = dsseVerify(env, pubPEM)
	t.Logf("provenance with one byte changed: %v", err)
	if err == nil {
		t.Error("a changed provenance verified")
	}
}

// TestPinnedToolchain: build refuses a binary built with another Go than
// the build context's go.mod pins, and a Dockerfile whose golang base is
// another release; the repository's go.mod pins the Go this machine has.
func TestPinnedToolchain(t *testing.T) {
	if got, err := pinnedToolchain("../.."); err != nil || got != runtime.Version() {
		t.Errorf("the repository's go.mod pins %q (%v); this Go is %s", got, err, runtime.Version())
	}
	dir := t.TempDir()
	bin := goBuildFile(t, dir, dockerfileEnv, "-trimpath", "-ldflags=-s -w")
	if err := checkGoVersion(bin, runtime.Version()); err != nil {
		t.Errorf("a binary built with this Go: %v", err)
	}
	err := checkGoVersion(bin, "go1.26.7")
	t.Logf("a binary built with %s against toolchain go1.26.7: %v", runtime.Version(), err)
	if err == nil || !strings.Contains(err.Error(), "go.mod pins toolchain go1.26.7") {
		t.Errorf("a binary built with another Go: %v", err)
	}

	// A context whose go.mod pins go1.26.7: the Dockerfile's golang:1.26.8
	// base disagrees, and build says so before packing anything.
	ctxDir := filepath.Join(dir, "ctx")
	if err := os.MkdirAll(ctxDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ctxDir, "go.mod"), []byte("module x\n\ngo 1.26.0\n\ntoolchain go1.26.7\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	err = build(buildOptions{dockerfile: "pause/Dockerfile", contextDir: ctxDir, binaries: []string{bin}, tag: "x:y",
		out: filepath.Join(dir, "x.tar"), loadPlatform: hostPlatform})
	t.Logf("build against toolchain go1.26.7: %v", err)
	if err == nil || !strings.Contains(err.Error(), "but go.mod pins toolchain go1.26.7") {
		t.Errorf("build with a go.mod pinning go1.26.7: %v", err)
	}
	if err := os.WriteFile(filepath.Join(ctxDir, "go.mod"), []byte("module x\n\ngo 1.26\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := pinnedToolchain(ctxDir); err == nil || !strings.Contains(err.Error(), "names no toolchain") {
		t.Errorf("a go.mod without a toolchain: %v", err)
	}
}

// TestBaseToolchainEnv: a golang build stage of an older release is
// accepted only when its ENV GOTOOLCHAIN names go.mod's toolchain exactly,
// so docker fetches that Go (checksum-verified) and compiles with it.
func TestBaseToolchainEnv(t *testing.T) {
	const base = "golang:1.26.8-bookworm@sha256:a688600ca24f8a4d3ca77f95b0dd40704a9fc787c826660eb7ba0b641b8b175d"
	dockerfile := func(env string) string {
		return "FROM --platform=$BUILDPLATFORM " + base + " AS build\n" + env +
			"RUN CGO_ENABLED=0 go build -trimpath -o /x .\n" +
			"FROM scratch\nCOPY --from=build /x /x\nUSER 65532:65532\nENTRYPOINT [\"/x\"]\n"
	}
	for _, c := range []struct {
		name, env, toolchain, want string
	}{
		{"the image's own Go", "", "go1.26.8", ""},
		{"ENV names the toolchain", "ENV GOTOOLCHAIN=go1.27.3\n", "go1.27.3", ""},
		{"no ENV, older image", "", "go1.27.3", "set ENV GOTOOLCHAIN=go1.27.3"},
		{"ENV names another Go", "ENV GOTOOLCHAIN=go1.27.2\n", "go1.27.3", "sets GOTOOLCHAIN=go1.27.2, but go.mod pins toolchain go1.27.3"},
		{"ENV local on the right image", "ENV GOTOOLCHAIN=local\n", "go1.26.8", "sets GOTOOLCHAIN=local"},
	} {
		s, err := parseDockerfile(strings.NewReader(dockerfile(c.env)))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		err = checkBaseToolchain(s, c.toolchain)
		t.Logf("%s: %v", c.name, err)
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%s: got %v, want %q", c.name, err, c.want)
		}
	}
}
