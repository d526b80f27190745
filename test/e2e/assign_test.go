package e2e

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/demo-operator/uuid-controller/test/cluster"
)

// kubectl runs the kubectl from bin/ as the admin, as a user would.
func kubectl(t *testing.T, args ...string) string {
	t.Helper()
	out, err := kubectlResult(args...)
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// kubectlResult is kubectl for a command that may fail: its output and
// its error (an *exec.ExitError for a non-zero exit).
func kubectlResult(args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(env.cluster.BinDir(), cluster.KubectlBinary),
		append([]string{"--kubeconfig", env.cluster.AdminKubeconfig()}, args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestExampleGetsUUID is README.md's quick start: kubectl apply the
// example, and kubectl get id shows its UUID and state.
func TestExampleGetsUUID(t *testing.T) {
	ctx := testCtx(t)
	root, err := cluster.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	// examples/uuid.yaml names namespace default.
	startController(ctx, t, "default")
	kubectl(t, "apply", "-f", filepath.Join(root, "examples", "uuid.yaml"))
	t.Cleanup(func() { kubectl(t, "delete", "-f", filepath.Join(root, "examples", "uuid.yaml")) })

	ids := waitUUIDs(ctx, t, "default", []string{"example"}, 30*time.Second)
	out := kubectl(t, "get", "id", "example", "-n", "default")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 {
		t.Fatalf("kubectl get id printed %d lines, want a header and one row:\n%s", len(lines), out)
	}
	header, row := strings.Fields(lines[0]), strings.Fields(lines[1])
	want := []string{"NAME", "UUID", "STATUS", "AGE"}
	if strings.Join(header, " ") != strings.Join(want, " ") {
		t.Fatalf("kubectl get id columns = %v, want %v", header, want)
	}
	if len(row) != 4 || row[0] != "example" || row[1] != ids["example"] || row[2] != "Ok" {
		t.Errorf("kubectl get id row = %q, want example, %s, Ok, age", lines[1], ids["example"])
	}
	state, _ := status(ctx, t, "default", "example")
	if state != "Ok" {
		t.Errorf("status.state = %q, want Ok", state)
	}
	msg := kubectl(t, "get", "id", "example", "-n", "default", "-o", "jsonpath={.status.message}")
	if msg != "resource created successfully" {
		t.Errorf("status.message = %q", msg)
	}
}

// TestAllNamespaces: without --namespace, as deployed, the ServiceAccount's
// ClusterRole is enough to watch every namespace and write status in each.
func TestAllNamespaces(t *testing.T) {
	ctx := testCtx(t)
	nsA, nsB := newNamespace(ctx, t), newNamespace(ctx, t)
	p, err := cluster.StartController(ctx, cluster.ControllerOptions{Binary: env.binary, Kubeconfig: env.kubeconfig})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if code, _ := p.Stop(); code != 0 {
			t.Errorf("exit code after SIGTERM = %d, want 0", code)
		}
		if t.Failed() {
			t.Logf("controller output:\n%s", p.Output())
		}
	})
	if err := p.WaitReady(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{nsA, nsB} {
		waitUUIDs(ctx, t, ns, createUuids(ctx, t, ns, "obj", 5), time.Minute)
	}
}
