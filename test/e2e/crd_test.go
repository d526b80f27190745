package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/demo-operator/uuid-controller/test/cluster"
	"github.com/demo-operator/uuid-controller/test/framework"
)

// TestCRDDeletedAndReinstalled: the CRD goes away under a running
// controller and another controller starts while it is missing (a
// Deployment applied before crd.yaml). Neither crashes; the one started
// without the CRD stays not ready and says why; once the CRD is back both
// serve new objects, without a restart.
func TestCRDDeletedAndReinstalled(t *testing.T) {
	ctx := testCtx(t)
	nsRunning, nsLate := env.fw.NewNamespace(ctx, t), env.fw.NewNamespace(ctx, t)
	running := framework.StartController(ctx, t, controllerAs(env.kubeconfig), nsRunning)
	env.fw.WaitUUIDs(ctx, t, nsRunning, env.fw.CreateUuids(ctx, t, nsRunning, "before", 3), time.Minute)

	// Put the CRD back even if the test fails half-way: the tests after
	// this one need it.
	t.Cleanup(func() {
		// t.Context() is already cancelled when cleanups run.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := env.cluster.InstallCRD(ctx); err != nil {
			t.Errorf("reinstalling the CRD: %v", err)
		}
	})
	if err := env.cluster.DeleteCRD(ctx); err != nil {
		t.Fatal(err)
	}

	late, err := cluster.StartController(ctx, cluster.ControllerOptions{
		Binary: env.binary, Kubeconfig: env.kubeconfig, Args: []string{"--namespace", nsLate, "-v", "2"},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		late.Stop()
		if t.Failed() {
			t.Logf("late controller output:\n%s", late.Output())
		}
	})
	if err := late.WaitReady(ctx, 5*time.Second); err == nil {
		t.Fatal("a controller started without the CRD reports ready")
	}
	mustStayRunning(t, late)
	mustStayRunning(t, running)
	if out := late.Output(); !strings.Contains(out, "the server could not find the requested resource") {
		t.Errorf("the controller started without the CRD does not log the missing resource:\n%s", out)
	}

	if err := env.cluster.InstallCRD(ctx); err != nil {
		t.Fatal(err)
	}
	// The reflectors retry with a backoff of up to 30 s.
	if err := late.WaitReady(ctx, time.Minute); err != nil {
		t.Fatalf("not ready after the CRD was installed: %v", err)
	}
	env.fw.WaitUUIDs(ctx, t, nsLate, env.fw.CreateUuids(ctx, t, nsLate, "after", 3), time.Minute)
	env.fw.WaitUUIDs(ctx, t, nsRunning, env.fw.CreateUuids(ctx, t, nsRunning, "after", 3), time.Minute)
	mustStayRunning(t, running)

	for name, p := range map[string]*cluster.ControllerProcess{"running": running, "late": late} {
		if code, took := p.Stop(); code != 0 {
			t.Errorf("%s controller: exit code %d after SIGTERM (%s), want 0", name, code, took)
		}
	}
}
