package e2e

import (
	"syscall"
	"testing"
	"time"
)

// TestAPIServerRestart: the apiserver goes away and comes back on the same
// etcd while the controller runs; the controller keeps running, its watch
// resumes, and objects from before and after all have their UUIDs.
func TestAPIServerRestart(t *testing.T) {
	ctx := testCtx(t)
	ns := newNamespace(ctx, t)
	p := startController(ctx, t, ns)
	before := createUuids(ctx, t, ns, "before", 10)
	want := waitUUIDs(ctx, t, ns, before, 30*time.Second)

	if err := env.cluster.RestartAPIServer(ctx); err != nil {
		t.Fatalf("restart apiserver: %v", err)
	}
	mustStayRunning(t, p)

	after := createUuids(ctx, t, ns, "after", 10)
	// The reflector backs off while the apiserver is down, so the first
	// events after it returns can take a few seconds.
	waitUUIDs(ctx, t, ns, after, 60*time.Second)
	got := waitUUIDs(ctx, t, ns, before, time.Second)
	for n, id := range want {
		if got[n] != id {
			t.Errorf("%s: UUID changed across the apiserver restart: %s -> %s", n, id, got[n])
		}
	}
	if n := controllerMetric(ctx, t, p, "uuid_controller_uuids_assigned_total", nil); n != 20 {
		t.Errorf("uuids_assigned_total = %v, want 20", n)
	}
	mustStayRunning(t, p)
}

// TestSIGTERMMidBurst: a controller stopped while it works through a
// backlog exits 0 promptly; the next one finishes the backlog, and no object
// is written twice.
func TestSIGTERMMidBurst(t *testing.T) {
	ctx := testCtx(t)
	ns := newNamespace(ctx, t)
	names := createUuids(ctx, t, ns, "backlog", 300)
	p := startController(ctx, t, ns)
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	code, err := p.Wait(10 * time.Second)
	if err != nil {
		t.Fatalf("after SIGTERM: %v", err)
	}
	if code != 0 {
		t.Errorf("exit code after SIGTERM = %d, want 0", code)
	}
	t.Logf("first controller wrote %d of %d before it stopped", auditedStatusPatches(t, ns, 200), len(names))

	startController(ctx, t, ns)
	waitUUIDs(ctx, t, ns, names, time.Minute)
	if got := auditedStatusPatches(t, ns, 0); got != len(names) {
		t.Errorf("the audit log has %d status writes for %d objects, want exactly one each", got, len(names))
	}
}
