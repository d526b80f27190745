package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/demo-operator/uuid-controller/test/framework"
)

// TestVersion: `make build` stamps the binary with git describe and the
// commit, which --version prints with the Go version; a plain `go build`
// (as go install or go run build it) still names its commit, from what the
// Go toolchain recorded.
func TestVersion(t *testing.T) {
	root := framework.RepoRoot(t)
	git := func(args ...string) string {
		cmd := exec.Command("git", args...)
		cmd.Dir = root
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("git %v: %v", args, err)
		}
		return strings.TrimSpace(string(out))
	}
	describe, commit := git("describe", "--tags", "--always", "--dirty"), git("rev-parse", "HEAD")

	bin := t.TempDir()
	if out, err := exec.Command("make", "-C", root, "build", "BIN_DIR="+bin).CombinedOutput(); err != nil {
		t.Fatalf("make build: %v\n%s", err, out)
	}
	out, err := exec.Command(filepath.Join(bin, "uuid-controller"), "--version").Output()
	if err != nil {
		t.Fatalf("--version: %v", err)
	}
	want := "uuid-controller " + describe + " (commit " + commit + ", " + runtime.Version() + ")\n"
	if string(out) != want {
		t.Errorf("make build's --version printed %q, want %q", out, want)
	}

	// A plain go build: no -X. -buildvcs=true on the command line
	// overrides a GOFLAGS=-buildvcs=false in the go env (set on this
	// machine), under which the Go toolchain records no commit at all.
	plain := filepath.Join(bin, "plain")
	build := exec.Command("go", "build", "-buildvcs=true", "-o", plain, ".")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err = exec.Command(plain, "--version").Output()
	if err != nil {
		t.Fatalf("--version: %v", err)
	}
	// The Go toolchain looks for a .git directory: a git worktree (.git a
	// file) gets no VCS stamp, and --version then says so.
	if fi, err := os.Stat(filepath.Join(root, ".git")); err == nil && !fi.IsDir() {
		if !strings.Contains(string(out), "(commit unknown, ") {
			t.Errorf("go build in a git worktree: --version printed %q, want commit unknown", out)
		}
		return
	}
	if !strings.Contains(string(out), "(commit "+commit) {
		t.Errorf("go build's --version printed %q, want commit %s from the build info", out, commit)
	}
}
