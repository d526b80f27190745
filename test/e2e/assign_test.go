package e2e

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/demo-operator/uuid-controller/test/cluster"
	"github.com/demo-operator/uuid-controller/test/framework"
)

// TestExampleGetsUUID is README.md's quick start: kubectl apply the
// example, and kubectl get id shows its UUID and state.
func TestExampleGetsUUID(t *testing.T) {
	ctx := testCtx(t)
	root := framework.RepoRoot(t)
	// examples/uuid.yaml names namespace default.
	framework.StartController(ctx, t, controllerAs(env.kubeconfig), "default")
	framework.Kubectl(t, env.cluster, "apply", "-f", filepath.Join(root, "examples", "uuid.yaml"))
	t.Cleanup(func() {
		framework.Kubectl(t, env.cluster, "delete", "-f", filepath.Join(root, "examples", "uuid.yaml"))
	})

	ids := env.fw.WaitUUIDs(ctx, t, "default", []string{"example"}, 30*time.Second)
	out := framework.Kubectl(t, env.cluster, "get", "id", "example", "-n", "default")
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
	state, _ := env.fw.Status(ctx, t, "default", "example")
	if state != "Ok" {
		t.Errorf("status.state = %q, want Ok", state)
	}
	msg := framework.Kubectl(t, env.cluster, "get", "id", "example", "-n", "default", "-o", "jsonpath={.status.message}")
	if msg != "resource created successfully" {
		t.Errorf("status.message = %q", msg)
	}
}

// TestAllNamespaces: without --namespace, as deployed, the ServiceAccount's
// ClusterRole is enough to watch every namespace and write status in each.
func TestAllNamespaces(t *testing.T) {
	ctx := testCtx(t)
	nsA, nsB := env.fw.NewNamespace(ctx, t), env.fw.NewNamespace(ctx, t)
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
		env.fw.WaitUUIDs(ctx, t, ns, env.fw.CreateUuids(ctx, t, ns, "obj", 5), time.Minute)
	}
}
