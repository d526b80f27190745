package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/demo-operator/uuid-controller/test/cluster"
	"github.com/demo-operator/uuid-controller/test/framework"
)

// sweeps is the controller's uuid_controller_sweeps_total{result}.
func sweeps(t *testing.T, p *cluster.ControllerProcess, result string) float64 {
	t.Helper()
	return controllerMetric(t.Context(), t, p, "uuid_controller_sweeps_total", func(l map[string]string) bool { return l["result"] == result })
}

// TestSweepSkippedUnderUnchangedCRD: a leader's sweep that found every
// status.uuid valid is recorded on its Lease with the CRD's uid and
// generation, and the next leader, under the same CRD, does not sweep;
// once the CRD has changed (relaxed to the article's, which lets a stray
// "NA" be written, then crd.yaml again), the next leader sweeps, and finds
// and replaces the stray.
func TestSweepSkippedUnderUnchangedCRD(t *testing.T) {
	if cluster.FullWatch() {
		t.Skip("the sweep runs only under the narrowed watch")
	}
	ctx := testCtx(t)
	ns := env.fw.NewNamespace(ctx, t)
	if err := env.cluster.InstallCRD(ctx); err != nil {
		t.Fatal(err)
	}
	names := env.fw.CreateUuids(ctx, t, ns, "rec", 3)
	args := leaderArgs(ctx, t, "sweep-record", 4*time.Second)
	start := func() *cluster.ControllerProcess {
		t.Helper()
		p := framework.StartController(ctx, t, controllerAs(env.kubeconfig), "", args...)
		waitLeader(ctx, t, 30*time.Second, p)
		return p
	}
	stop := func(p *cluster.ControllerProcess) {
		t.Helper()
		if code := sigterm(t, p, 30*time.Second); code != 0 {
			t.Fatalf("exit code %d after SIGTERM", code)
		}
	}

	p := start()
	env.fw.WaitUUIDs(ctx, t, ns, names, 30*time.Second)
	if v := metricReaches(ctx, t, p, "uuid_controller_sweeps_total", func(l map[string]string) bool { return l["result"] == "ok" }, 1); v != 1 {
		t.Fatalf("first leader: sweeps_total{ok} = %v, want 1 (no clean sweep recorded yet)", v)
	}
	stop(p)

	p = start()
	if v := metricReaches(ctx, t, p, "uuid_controller_sweeps_total", func(l map[string]string) bool { return l["result"] == "skipped" }, 1); v != 1 {
		t.Errorf("second leader, same CRD: sweeps_total{skipped} = %v, want 1", v)
	}
	if v := sweeps(t, p, "ok"); v != 0 {
		t.Errorf("second leader, same CRD: sweeps_total{ok} = %v, want 0", v)
	}
	if out := p.Output(); strings.Contains(out, "Swept every Uuid object") || !strings.Contains(out, "Not sweeping") {
		t.Errorf("second leader: the log does not say it skipped the sweep, or says it swept:\n%s", out)
	}
	stop(p)

	// Under the article's CRD nothing refuses "NA"; crd.yaml then comes
	// back, with a new generation, over the stray.
	useArticleCRD(ctx, t)
	patch := `{"status":{"state":"Erreur","message":"boom","uuid":"NA"}}`
	if _, err := env.fw.Uuids(ns).Patch(ctx, names[0], types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := env.cluster.InstallCRD(ctx); err != nil {
		t.Fatal(err)
	}
	p = start()
	if v := metricReaches(ctx, t, p, "uuid_controller_sweeps_total", func(l map[string]string) bool { return l["result"] == "ok" }, 1); v != 1 {
		t.Errorf("leader after a CRD change: sweeps_total{ok} = %v, want 1", v)
	}
	waitFor(t, 30*time.Second, "the stray written under the relaxed CRD to get a UUID", func() bool {
		_, id := env.fw.Status(ctx, t, ns, names[0])
		_, err := uuid.Parse(id)
		return err == nil && len(id) == 36
	})
	mustStayRunning(t, p)
}

// TestKopfFinalizerKeepsTheWatchNarrowed: an object carrying kopf's
// finalizer, which any tenant may add to their own, no longer switches the
// controller to watching and caching every object: the watch stays
// narrowed, in this process and the next. Its deletion, which kopf's
// finalizer holds, is still seen without --remove-kopf-finalizer (the
// narrowed watch lost the object once it had its UUID): the waiting gauge
// counts it, and one line names it, however many resyncs pass.
func TestKopfFinalizerKeepsTheWatchNarrowed(t *testing.T) {
	if cluster.FullWatch() {
		t.Skip("the narrowed watch is what this test keeps")
	}
	ctx := testCtx(t)
	ns := env.fw.NewNamespace(ctx, t)
	if err := env.cluster.InstallCRD(ctx); err != nil {
		t.Fatal(err)
	}
	createBare(ctx, t, ns, "held", kopfFinalizer)
	t.Cleanup(func() { dropFinalizers(ns, "held") })
	p := framework.StartController(ctx, t, controllerAs(env.kubeconfig), "", "--resync", "1s")
	env.fw.WaitUUIDs(ctx, t, ns, []string{"held"}, 30*time.Second)
	deleteUuid(ctx, t, ns, "held")
	if v := metricReaches(ctx, t, p, "uuid_controller_kopf_finalizer_waiting_objects", nil, 1); v != 1 {
		t.Errorf("kopf_finalizer_waiting_objects = %v after the deletion, want 1", v)
	}
	// Resyncs every second: under the full watch each would sync the
	// object again.
	time.Sleep(3 * time.Second)
	if v := controllerMetric(ctx, t, p, "uuid_controller_watch_narrowed", nil); v != 1 {
		t.Errorf("uuid_controller_watch_narrowed = %v with an object carrying kopf's finalizer, want 1", v)
	}
	line := "waits for kopf's finalizer"
	if n := strings.Count(p.Output(), line); n != 1 || !strings.Contains(p.Output(), ns+"/held") {
		t.Errorf("%d lines %q (want 1, naming %s/held):\n%s", n, line, ns, p.Output())
	}
	if code, took := p.Stop(); code != 0 {
		t.Fatalf("exit code %d after SIGTERM (%s)", code, took)
	}
	p = framework.StartController(ctx, t, controllerAs(env.kubeconfig), "", "--resync", "1s")
	if v := metricReaches(ctx, t, p, "uuid_controller_kopf_finalizer_waiting_objects", nil, 1); v != 1 {
		t.Errorf("after a restart: kopf_finalizer_waiting_objects = %v, want 1 (the sweep finds it)", v)
	}
	if v := controllerMetric(ctx, t, p, "uuid_controller_watch_narrowed", nil); v != 1 {
		t.Errorf("after a restart: uuid_controller_watch_narrowed = %v, want 1", v)
	}
	mustStayRunning(t, p)
}
