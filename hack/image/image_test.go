package main

import (
	"archive/tar"
	"bytes"
	"debug/buildinfo"
	"debug/elf"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// goBuildFile builds ./pause into dir with the given extra arguments and
// environment, as a Dockerfile's build stage would.
func goBuildFile(t *testing.T, dir string, env []string, args ...string) string {
	t.Helper()
	out := filepath.Join(dir, "pause")
	cmd := exec.Command("go", append(append([]string{"build"}, args...), "-o", out, "./pause")...)
	cmd.Env = append(os.Environ(), env...)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	return out
}

var dockerfileEnv = []string{"CGO_ENABLED=0", "GOOS=linux"}

// goBuildVersioned builds a program with a main.version variable (pause has
// none for -X to set), in a module of its own, and returns the binary.
func goBuildVersioned(t *testing.T, args ...string) string {
	t.Helper()
	dir := t.TempDir()
	src := "package main\n\nvar version string\n\nfunc main() { println(version) }\n"
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module versioned\n\ngo 1.26\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "versioned")
	cmd := exec.Command("go", append(append([]string{"build"}, args...), "-o", out, ".")...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), dockerfileEnv...)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	return out
}

func TestCheckBinary(t *testing.T) {
	f, err := os.Open("pause/Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	s, err := parseDockerfile(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	good := goBuildFile(t, dir, dockerfileEnv, "-trimpath", "-ldflags=-s -w")
	if _, err := checkBinary(good, s.Build, nil); err != nil {
		t.Errorf("a binary built as the Dockerfile builds it: %v", err)
	}

	notTrimmed := goBuildFile(t, t.TempDir(), dockerfileEnv, "-ldflags=-s -w")
	if _, err := checkBinary(notTrimmed, s.Build, nil); err == nil || !strings.Contains(err.Error(), `-trimpath "", Dockerfile "true"`) {
		t.Errorf("a binary built without -trimpath: got %v", err)
	}
	otherLdflags := goBuildFile(t, t.TempDir(), dockerfileEnv, "-trimpath")
	if _, err := checkBinary(otherLdflags, s.Build, nil); err == nil || !strings.Contains(err.Error(), `DWARF present true, Dockerfile -ldflags "-s -w"`) {
		t.Errorf("a binary built with other -ldflags: got %v", err)
	}
	tagged := goBuildFile(t, t.TempDir(), dockerfileEnv, "-trimpath", "-ldflags=-s -w", "-tags=netgo")
	if _, err := checkBinary(tagged, s.Build, nil); err == nil || !strings.Contains(err.Error(), `-tags "netgo", Dockerfile ""`) {
		t.Errorf("a binary built with extra -tags: got %v", err)
	}

	// -X: its value must be in the binary.
	withX := buildCommand{Script: `CGO_ENABLED=0 GOOS=linux go build -trimpath -ldflags="-s -w -X main.version=$V" -o /pause ./pause`,
		Args: map[string]*string{"V": nil}}
	stamped := goBuildVersioned(t, "-trimpath", "-ldflags=-s -w -X main.version=v9.8.7-stamp")
	if _, err := checkBinary(stamped, withX, map[string]string{"V": "v9.8.7-stamp"}); err != nil {
		t.Errorf("a binary stamped with -X as the Dockerfile stamps it: %v", err)
	}
	if _, err := checkBinary(good, withX, map[string]string{"V": "v9.8.7-stamp"}); err == nil || !strings.Contains(err.Error(), `-X value "v9.8.7-stamp" not in the binary`) {
		t.Errorf("a binary without the -X value: got %v", err)
	}
	linkmode := withX
	linkmode.Script = strings.Replace(withX.Script, "-s -w", "-s -w -linkmode=internal", 1)
	if _, err := checkBinary(good, linkmode, nil); err == nil || !strings.Contains(err.Error(), "only -s, -w and -X") {
		t.Errorf("a Dockerfile with other -ldflags: got %v", err)
	}

	// A dynamically linked ELF: the system's own ls.
	ls, err := exec.LookPath("ls")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := checkBinary(ls, s.Build, nil); err == nil || !strings.Contains(err.Error(), "dynamically linked") {
		t.Errorf("%s: got %v", ls, err)
	}
	if _, err := checkBinary("pause/Dockerfile", s.Build, nil); err == nil || !strings.Contains(err.Error(), "as ELF") {
		t.Errorf("not an ELF file: got %v", err)
	}
	if _, err := checkBinary(filepath.Join(dir, "missing"), s.Build, nil); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a missing binary: got %v", err)
	}
}

// Each binary's platform is the one its ELF header names, and its build
// settings must be the Dockerfile's for that platform.
func TestCheckBinaryPlatform(t *testing.T) {
	multi := buildCommand{Script: `CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH go build -trimpath -ldflags="-s -w" -o /pause ./pause`,
		Args: map[string]*string{"TARGETOS": nil, "TARGETARCH": nil}}
	arm64 := goBuildFile(t, t.TempDir(), []string{"CGO_ENABLED=0", "GOOS=linux", "GOARCH=arm64"}, "-trimpath", "-ldflags=-s -w")
	if p, err := checkBinary(arm64, multi, nil); err != nil || p != (platform{OS: "linux", Arch: "arm64"}) {
		t.Errorf("an arm64 cross-build: %v, %v", p, err)
	}
	amd64 := goBuildFile(t, t.TempDir(), []string{"CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64"}, "-trimpath", "-ldflags=-s -w")
	if p, err := checkBinary(amd64, multi, nil); err != nil || p != (platform{OS: "linux", Arch: "amd64"}) {
		t.Errorf("an amd64 build: %v, %v", p, err)
	}

	// An amd64 binary whose ELF header claims aarch64: the header and the
	// Go build info disagree.
	data, err := os.ReadFile(amd64)
	if err != nil {
		t.Fatal(err)
	}
	binary.LittleEndian.PutUint16(data[18:20], uint16(elf.EM_AARCH64)) // e_machine
	relabelled := filepath.Join(t.TempDir(), "pause")
	if err := os.WriteFile(relabelled, data, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := checkBinary(relabelled, multi, nil); err == nil ||
		!strings.Contains(err.Error(), `GOARCH="amd64", Dockerfile "arm64"`) || !strings.Contains(err.Error(), "ELF header says linux/arm64") {
		t.Errorf("an ELF machine that is not the binary's GOARCH: got %v", err)
	}
	binary.LittleEndian.PutUint16(data[18:20], uint16(elf.EM_SPARCV9))
	if err := os.WriteFile(relabelled, data, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := checkBinary(relabelled, multi, nil); err == nil || !strings.Contains(err.Error(), "ELF machine EM_SPARCV9") {
		t.Errorf("an ELF machine with no GOARCH here: got %v", err)
	}
}

// readBack loads an archive as `docker load` would (its manifest.json) and
// returns its config, the files of its single layer and its image ID (the
// config's digest).
func readBack(t *testing.T, archive, tag string) (*v1.ConfigFile, map[string]*tar.Header, map[string][]byte, v1.Hash) {
	t.Helper()
	ref, err := name.NewTag(tag)
	if err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(archive, &ref)
	if err != nil {
		t.Fatalf("reading %s as %s: %v", archive, tag, err)
	}
	cf, headers, contents := imageFiles(t, img)
	id, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	return cf, headers, contents, id
}

// imageFiles returns an image's config and the files of its single layer.
func imageFiles(t *testing.T, img v1.Image) (*v1.ConfigFile, map[string]*tar.Header, map[string][]byte) {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != 1 {
		t.Fatalf("%d layers, want 1", len(layers))
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	headers, contents := map[string]*tar.Header{}, map[string][]byte{}
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
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
		headers[hdr.Name], contents[hdr.Name] = hdr, b
	}
	return cf, headers, contents
}

// readIndex loads an archive as `ctr images import` would (its OCI
// layout) and returns the index's digest, its platforms in order, and each
// platform's image.
func readIndex(t *testing.T, archive string) (v1.Hash, []string, map[string]v1.Image) {
	t.Helper()
	idx, err := readArchive(archive, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if mt, err := idx.MediaType(); err != nil || mt != types.OCIImageIndex {
		t.Errorf("index media type %q, %v", mt, err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	imgs := map[string]v1.Image{}
	for _, d := range im.Manifests {
		if d.Platform == nil || d.MediaType != types.OCIManifestSchema1 {
			t.Fatalf("index entry %+v: want an OCI manifest with a platform", d)
		}
		p := d.Platform.OS + "/" + d.Platform.Architecture
		order = append(order, p)
		if imgs[p], err = idx.Image(d.Digest); err != nil {
			t.Fatal(err)
		}
	}
	digest, err := idx.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return digest, order, imgs
}

var hostPlatform = platform{OS: "linux", Arch: runtime.GOARCH}

func TestPauseImage(t *testing.T) {
	dir := t.TempDir()
	bin := goBuildFile(t, dir, dockerfileEnv, "-trimpath", "-ldflags=-s -w")
	archive := filepath.Join(dir, "pause.tar")
	const tag = "registry.local/pause:test"
	o := buildOptions{dockerfile: "pause/Dockerfile", contextDir: ".", binaries: []string{bin}, tag: tag, out: archive, loadPlatform: hostPlatform}
	if err := build(o); err != nil {
		t.Fatal(err)
	}
	cf, headers, contents, id := readBack(t, archive, tag)
	if cf.Config.User != "65535:65535" || !slices.Equal(cf.Config.Entrypoint, []string{"/pause"}) ||
		cf.OS != "linux" || cf.Architecture != runtime.GOARCH {
		t.Errorf("config: user %q, entrypoint %q, platform %s/%s", cf.Config.User, cf.Config.Entrypoint, cf.OS, cf.Architecture)
	}
	if names := slices.Sorted(maps.Keys(headers)); !slices.Equal(names, []string{"pause"}) {
		t.Errorf("layer holds %v, want only the binary", names)
	}
	want, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	if hdr := headers["pause"]; hdr == nil || hdr.Mode != 0o755 || hdr.Uid != 0 || !bytes.Equal(contents["pause"], want) {
		t.Errorf("/pause: header %+v, same bytes as the binary: %v", hdr, bytes.Equal(contents["pause"], want))
	}
	// The OCI layout's index holds the same image for the one platform.
	indexDigest, platforms, imgs := readIndex(t, archive)
	if !slices.Equal(platforms, []string{hostPlatform.String()}) {
		t.Fatalf("index platforms %v", platforms)
	}
	if want, _ := imgs[hostPlatform.String()].ConfigName(); want != id {
		t.Errorf("the index's image ID %s is not the one docker load reads, %s", want, id)
	}

	// The same inputs give the same index, so a rebuild loads nothing new.
	o.out = filepath.Join(dir, "again.tar")
	if err := build(o); err != nil {
		t.Fatal(err)
	}
	if d, _, _ := readIndex(t, o.out); d != indexDigest {
		t.Errorf("rebuilt index digest %s, first %s", d, indexDigest)
	}
}

// TestControllerImage runs `make image` as a user would and checks the
// archive against what the Deployment relies on, for each platform: the
// static binary as the Dockerfile builds it for that platform, at the
// entrypoint, run as 65532:65532. A second `make image` gives the same
// index digest.
func TestControllerImage(t *testing.T) {
	dir := t.TempDir()
	archive := filepath.Join(dir, "uuid-controller.tar")
	const tag = "uuid-controller:test"
	makeImage := func(archive string) {
		cmd := exec.Command("make", "-C", "../..", "image", "IMG="+tag, "IMAGE_TAR="+archive)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("make image: %v\n%s", err, out)
		}
	}
	makeImage(archive)
	indexDigest, platforms, imgs := readIndex(t, archive)
	sbomData, err := os.ReadFile(strings.TrimSuffix(archive, ".tar") + ".sbom.cdx.json")
	if err != nil {
		t.Fatalf("make image wrote no SBOM beside the archive: %v", err)
	}
	sbomMods, err := sbomModules(sbomData)
	if err != nil {
		t.Fatal(err)
	}
	provData, err := os.ReadFile(strings.TrimSuffix(archive, ".tar") + ".provenance.json")
	if err != nil {
		t.Fatalf("make image wrote no provenance beside the archive: %v", err)
	}
	var prov statement
	if err := json.Unmarshal(provData, &prov); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(platforms, []string{"linux/amd64", "linux/arm64"}) {
		t.Fatalf("index platforms %v, want linux/amd64 and linux/arm64", platforms)
	}
	machines := map[string]elf.Machine{"linux/amd64": elf.EM_X86_64, "linux/arm64": elf.EM_AARCH64}
	git := func(args ...string) string {
		out, err := exec.Command("git", args...).Output()
		if err != nil {
			t.Fatalf("git %v: %v", args, err)
		}
		return strings.TrimSpace(string(out))
	}
	wantLabels := map[string]string{
		"org.opencontainers.image.version":  git("describe", "--tags", "--always", "--dirty"),
		"org.opencontainers.image.revision": git("rev-parse", "HEAD"),
		"org.opencontainers.image.source":   "https://github.com/demo-operator/uuid-controller",
	}
	if src := prov.Predicate.BuildDefinition.ExternalParameters.Source; src.Digest["gitCommit"] != wantLabels["org.opencontainers.image.revision"] ||
		prov.Subject[0].Digest["sha256"] != indexDigest.Hex || len(prov.Predicate.RunDetails.Byproducts) != len(platforms) {
		t.Errorf("provenance: source %+v, subjects %v, %d byproducts; want commit %s, index %s", src, prov.Subject,
			len(prov.Predicate.RunDetails.Byproducts), wantLabels["org.opencontainers.image.revision"], indexDigest)
	}
	for _, p := range platforms {
		t.Run(p, func(t *testing.T) {
			cf, headers, contents := imageFiles(t, imgs[p])
			if cf.Config.User != "65532:65532" || !slices.Equal(cf.Config.Entrypoint, []string{"/uuid-controller"}) || cf.OS+"/"+cf.Architecture != p {
				t.Errorf("config: user %q, entrypoint %q, platform %s/%s", cf.Config.User, cf.Config.Entrypoint, cf.OS, cf.Architecture)
			}
			if !maps.Equal(cf.Config.Labels, wantLabels) {
				t.Errorf("labels %v, want %v", cf.Config.Labels, wantLabels)
			}
			// The Deployment's containerPorts.
			if ports := slices.Sorted(maps.Keys(cf.Config.ExposedPorts)); !slices.Equal(ports, []string{"8080/tcp", "9090/tcp"}) {
				t.Errorf("exposed ports %v", ports)
			}
			if names := slices.Sorted(maps.Keys(headers)); !slices.Equal(names, []string{"etc/", "etc/group", "etc/passwd", "uuid-controller"}) {
				t.Errorf("layer holds %v", names)
			}
			if !strings.Contains(string(contents["etc/passwd"]), "nonroot:x:65532:65532:") {
				t.Errorf("/etc/passwd has no nonroot user 65532:\n%s", contents["etc/passwd"])
			}
			hdr := headers["uuid-controller"]
			if hdr == nil || hdr.Mode != 0o755 || hdr.Uid != 0 || hdr.Gid != 0 {
				t.Fatalf("/uuid-controller: %+v", hdr)
			}
			extracted := filepath.Join(t.TempDir(), "uuid-controller")
			if err := os.WriteFile(extracted, contents["uuid-controller"], 0o755); err != nil {
				t.Fatal(err)
			}
			// The SBOM lists exactly the modules go version -m lists.
			mods := goVersionModules(t, extracted)
			if err := checkSBOMModules(sbomMods, p, mods); err != nil {
				t.Error(err)
			} else {
				t.Logf("%s: the SBOM lists the binary's %d modules, as go version -m does", p, len(mods))
			}
			ef, err := elf.Open(extracted)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: ELF %s %s %s", p, ef.Class, ef.Data, ef.Machine)
			if ef.Machine != machines[p] {
				t.Errorf("ELF machine %s, want %s", ef.Machine, machines[p])
			}
			ef.Close()
			if err := checkStatic(extracted); err != nil {
				t.Error(err)
			}
			// Stripped, and stamped with the version the labels carry.
			ldflags := "-s -w -X v=" + wantLabels["org.opencontainers.image.version"] + " -X r=" + wantLabels["org.opencontainers.image.revision"]
			if diffs, err := checkLdflags(extracted, ldflags); err != nil || len(diffs) > 0 {
				t.Errorf("the binary in the image is not built with -ldflags=%q: %v %v", ldflags, diffs, err)
			}
			info, err := buildinfo.ReadFile(extracted)
			if err != nil {
				t.Fatal(err)
			}
			settings := map[string]string{}
			for _, s := range info.Settings {
				settings[s.Key] = s.Value
			}
			if settings["CGO_ENABLED"] != "0" || settings["-trimpath"] != "true" ||
				settings["GOOS"]+"/"+settings["GOARCH"] != p || info.Path != "github.com/demo-operator/uuid-controller" {
				t.Errorf("the binary in the image: path %s, settings %v", info.Path, settings)
			}
		})
	}
	// docker load gets this machine's platform, the same image as the index's.
	cf, _, _, id := readBack(t, archive, tag)
	if want, _ := imgs[hostPlatform.String()].ConfigName(); id != want || cf.Architecture != runtime.GOARCH {
		t.Errorf("docker load's image ID %s (%s), the index's %s image %s", id, cf.Architecture, hostPlatform, want)
	}

	again := filepath.Join(dir, "again.tar")
	makeImage(again)
	againDigest, _, _ := readIndex(t, again)
	t.Logf("index digest: first build %s, second build %s", indexDigest, againDigest)
	if againDigest != indexDigest {
		t.Errorf("make image twice from the same sources: index %s, then %s", indexDigest, againDigest)
	}
}

func TestBuildErrors(t *testing.T) {
	dir := t.TempDir()
	bin := goBuildFile(t, dir, dockerfileEnv, "-trimpath", "-ldflags=-s -w")
	out := filepath.Join(dir, "x.tar")
	other := platform{OS: "linux", Arch: "s390x"}
	if runtime.GOARCH == "s390x" {
		other.Arch = "amd64"
	}
	base := buildOptions{dockerfile: "pause/Dockerfile", contextDir: ".", binaries: []string{bin}, tag: "a:b", out: out, loadPlatform: hostPlatform}
	tests := []struct {
		name string
		edit func(o *buildOptions)
		want string
	}{
		{"missing flag", func(o *buildOptions) { o.tag = "" }, "are required"},
		{"missing Dockerfile", func(o *buildOptions) { o.dockerfile = filepath.Join(dir, "Dockerfile") }, "no such file"},
		{"bad tag", func(o *buildOptions) { o.tag = "UPPER:case" }, "image tag"},
		{"unwritable output", func(o *buildOptions) { o.out = filepath.Join(dir, "no", "x.tar") }, "writing"},
		{"context file missing", func(o *buildOptions) {
			// A context with only go.mod (the pinned toolchain), none of the files COPY names.
			if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module x\n\ngo 1.26.0\n\ntoolchain "+runtime.Version()+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			o.dockerfile, o.contextDir = "../../Dockerfile", dir
		}, "COPY source"},
		{"context without go.mod", func(o *buildOptions) { o.contextDir = t.TempDir() }, "the build context's go.mod pins the Go toolchain"},
		{"two binaries for one platform", func(o *buildOptions) { o.binaries = []string{bin, bin} }, "both " + hostPlatform.String() + " binaries"},
		{"binary not among the platforms", func(o *buildOptions) { o.platforms = []platform{other} }, "not one of -platforms " + other.String()},
		{"platform without a binary", func(o *buildOptions) { o.platforms = []platform{hostPlatform, other} }, "no -binary for platform " + other.String()},
		{"docker load platform not built", func(o *buildOptions) { o.loadPlatform = other }, "-load-platform " + other.String()},
		{"undeclared build argument", func(o *buildOptions) { o.buildArgs = map[string]string{"VERSION": "1"} }, "no ARG VERSION"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := base
			tt.edit(&o)
			err := build(o)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want an error containing %q", err, tt.want)
			}
			if _, err := os.Stat(o.out); err == nil {
				t.Errorf("%s was written despite the error", o.out)
			}
		})
	}
}

func TestParsePlatform(t *testing.T) {
	if p, err := parsePlatform("linux/arm64"); err != nil || p != (platform{OS: "linux", Arch: "arm64"}) {
		t.Errorf("linux/arm64: %v %v", p, err)
	}
	for _, bad := range []string{"", "linux", "linux/", "windows/amd64", "linux/arm64/v8", "linux/mips"} {
		if _, err := parsePlatform(bad); err == nil {
			t.Errorf("platform %q accepted", bad)
		}
	}
}
