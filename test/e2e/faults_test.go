package e2e

import (
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
