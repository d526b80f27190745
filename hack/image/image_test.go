package main

import (
	"archive/tar"
	"bytes"
	"debug/buildinfo"
	"errors"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
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
	if _, err := checkBinary(good, s.Build); err != nil {
		t.Errorf("a binary built as the Dockerfile builds it: %v", err)
	}

	notTrimmed := goBuildFile(t, t.TempDir(), dockerfileEnv, "-ldflags=-s -w")
	if _, err := checkBinary(notTrimmed, s.Build); err == nil || !strings.Contains(err.Error(), `-trimpath "", Dockerfile "true"`) {
		t.Errorf("a binary built without -trimpath: got %v", err)
	}
	otherLdflags := goBuildFile(t, t.TempDir(), dockerfileEnv, "-trimpath")
	if _, err := checkBinary(otherLdflags, s.Build); err == nil || !strings.Contains(err.Error(), `DWARF present true, Dockerfile -ldflags "-s -w"`) {
		t.Errorf("a binary built with other -ldflags: got %v", err)
	}
	tagged := goBuildFile(t, t.TempDir(), dockerfileEnv, "-trimpath", "-ldflags=-s -w", "-tags=netgo")
	if _, err := checkBinary(tagged, s.Build); err == nil || !strings.Contains(err.Error(), `-tags "netgo", Dockerfile ""`) {
		t.Errorf("a binary built with extra -tags: got %v", err)
	}

	withX := s.Build
	withX.Flags = map[string]string{"-trimpath": "true", "-ldflags": "-s -w -X main.version=1"}
	if _, err := checkBinary(good, withX); err == nil || !strings.Contains(err.Error(), "only -s and -w can be checked") {
		t.Errorf("a Dockerfile with -ldflags -X: got %v", err)
	}

	// A dynamically linked ELF: the system's own ls.
	ls, err := exec.LookPath("ls")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := checkBinary(ls, s.Build); err == nil || !strings.Contains(err.Error(), "dynamically linked") {
		t.Errorf("%s: got %v", ls, err)
	}
	if _, err := checkBinary("pause/Dockerfile", s.Build); err == nil || !strings.Contains(err.Error(), "as ELF") {
		t.Errorf("not an ELF file: got %v", err)
	}
	if _, err := checkBinary(filepath.Join(dir, "missing"), s.Build); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a missing binary: got %v", err)
	}
}

// readBack loads an archive as `docker load` would and returns its config
// and the files of its single layer.
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
	digest, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return cf, headers, contents, digest
}

func TestPauseImage(t *testing.T) {
	dir := t.TempDir()
	bin := goBuildFile(t, dir, dockerfileEnv, "-trimpath", "-ldflags=-s -w")
	archive := filepath.Join(dir, "pause.tar")
	const tag = "registry.local/pause:test"
	if err := run("pause/Dockerfile", ".", bin, tag, archive); err != nil {
		t.Fatal(err)
	}
	cf, headers, contents, digest := readBack(t, archive, tag)
	if cf.Config.User != "65535:65535" || !slices.Equal(cf.Config.Entrypoint, []string{"/pause"}) ||
		cf.OS != "linux" || cf.Architecture == "" {
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

	// The same inputs give the same image, so a rebuild loads nothing new.
	again := filepath.Join(dir, "again.tar")
	if err := run("pause/Dockerfile", ".", bin, tag, again); err != nil {
		t.Fatal(err)
	}
	if _, _, _, d := readBack(t, again, tag); d != digest {
		t.Errorf("rebuilt image digest %s, first %s", d, digest)
	}
}

// TestControllerImage runs `make image` as a user would and checks the
// archive against what the Deployment relies on: the static binary as
// the Dockerfile builds it, at the entrypoint, run as 65532:65532.
func TestControllerImage(t *testing.T) {
	dir := t.TempDir()
	archive := filepath.Join(dir, "uuid-controller.tar")
	const tag = "uuid-controller:test"
	cmd := exec.Command("make", "-C", "../..", "image", "IMG="+tag, "IMAGE_TAR="+archive)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make image: %v\n%s", err, out)
	}
	cf, headers, contents, _ := readBack(t, archive, tag)
	if cf.Config.User != "65532:65532" || !slices.Equal(cf.Config.Entrypoint, []string{"/uuid-controller"}) || cf.OS != "linux" {
		t.Errorf("config: user %q, entrypoint %q, os %q", cf.Config.User, cf.Config.Entrypoint, cf.OS)
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
	extracted := filepath.Join(dir, "uuid-controller")
	if err := os.WriteFile(extracted, contents["uuid-controller"], 0o755); err != nil {
		t.Fatal(err)
	}
	if err := checkStatic(extracted); err != nil {
		t.Error(err)
	}
	if diffs, err := checkLdflags(extracted, "-s -w"); err != nil || len(diffs) > 0 {
		t.Errorf("the binary in the image is not stripped as -ldflags=\"-s -w\" strips: %v %v", diffs, err)
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
		settings["GOARCH"] != cf.Architecture || info.Path != "github.com/demo-operator/uuid-controller" {
		t.Errorf("the binary in the image: path %s, settings %v, image arch %s", info.Path, settings, cf.Architecture)
	}
}

func TestRunErrors(t *testing.T) {
	dir := t.TempDir()
	bin := goBuildFile(t, dir, dockerfileEnv, "-trimpath", "-ldflags=-s -w")
	out := filepath.Join(dir, "x.tar")
	tests := []struct {
		name, dockerfile, context, binary, tag, out, want string
	}{
		{"missing flag", "pause/Dockerfile", ".", bin, "", out, "are required"},
		{"missing Dockerfile", filepath.Join(dir, "Dockerfile"), ".", bin, "a:b", out, "no such file"},
		{"bad tag", "pause/Dockerfile", ".", bin, "UPPER:case", out, "image tag"},
		{"unwritable output", "pause/Dockerfile", ".", bin, "a:b", filepath.Join(dir, "no", "x.tar"), "writing"},
		{"context file missing", "../../Dockerfile", dir, bin, "a:b", out, "COPY source"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := run(tt.dockerfile, tt.context, tt.binary, tt.tag, tt.out)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want an error containing %q", err, tt.want)
			}
			if _, err := os.Stat(tt.out); err == nil {
				t.Errorf("%s was written despite the error", tt.out)
			}
		})
	}
}
