package e2e

import (
	"context"
	"maps"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/demo-operator/uuid-controller/test/cluster"
	"github.com/demo-operator/uuid-controller/test/framework"
)

// resyncWitness is an object held in its deletion by kopf's finalizer. A
// controller with the full watch queues it at every resync (needsWork),
// so workqueue_adds_total counts the resyncs a process has worked through:
// the positive signal that the resyncs a test waits for have happened, and
// that everything queued before them (the events of the step before) has
// been taken from the queue. (It is named in the log once, not at every
// resync.) Under the narrowed watch, the cache holds no object that is
// done, so a resync has nothing to touch and nothing to count.
type resyncWitness struct{ ns, name string }

// newResyncWitness creates the witness in ns, waits for its UUID (its one
// status write), then deletes it; it stays held until the test ends.
func newResyncWitness(ctx context.Context, t *testing.T, ns string) *resyncWitness {
	t.Helper()
	w := &resyncWitness{ns: ns, name: "resync-witness"}
	createBare(ctx, t, ns, w.name, kopfFinalizer)
	t.Cleanup(func() { dropFinalizers(ns, w.name) })
	env.fw.WaitUUIDs(ctx, t, ns, []string{w.name}, 30*time.Second)
	deleteUuid(ctx, t, ns, w.name)
	return w
}

// logged counts the lines p named the witness in, waiting for kopf's
// finalizer.
func (w *resyncWitness) logged(p *cluster.ControllerProcess) int {
	n := 0
	for _, line := range strings.Split(p.Output(), "\n") {
		if strings.Contains(line, "waits for kopf's finalizer") && strings.Contains(line, w.ns+"/"+w.name) {
			n++
		}
	}
	return n
}

// waitResyncs waits, for each of ps (run with --resync 1s), for two
// resyncs since the call: under the full watch, two more keys queued (the
// witness, the one object a resync queues); under the narrowed one, which
// has nothing to count, two resync periods and a margin.
func (w *resyncWitness) waitResyncs(t *testing.T, ps ...*cluster.ControllerProcess) {
	t.Helper()
	adds := func(p *cluster.ControllerProcess) float64 {
		return controllerMetric(t.Context(), t, p, "workqueue_adds_total", func(l map[string]string) bool { return l["name"] == "uuid" })
	}
	for _, p := range ps {
		if controllerMetric(t.Context(), t, p, "uuid_controller_watch_narrowed", nil) == 1 {
			time.Sleep(2500 * time.Millisecond)
			continue
		}
		start := adds(p)
		waitFor(t, 30*time.Second, "two resyncs (the held witness queued twice more)", func() bool { return adds(p) >= start+2 })
	}
}

// TestUUIDIsStable: once assigned, a UUID survives an update of the object,
// resyncs, a controller restart and a second replica, and none of them
// sends another status write.
func TestUUIDIsStable(t *testing.T) {
	ctx := testCtx(t)
	ns := env.fw.NewNamespace(ctx, t)
	p := framework.StartController(ctx, t, controllerAs(env.kubeconfig), ns, "--resync", "1s")
	witness := newResyncWitness(ctx, t, ns)
	names := env.fw.CreateUuids(ctx, t, ns, "stable", 5)
	want := env.fw.WaitUUIDs(ctx, t, ns, names, 30*time.Second)
	writes := settled(t, func() (float64, error) { return env.cluster.APIStatusWrites(ctx) })

	// After each step, two resyncs of every running replica (the
	// witness queued twice), then the counts: the witness's one write and
	// one for each object.
	unchanged := func(step string, ps ...*cluster.ControllerProcess) {
		t.Helper()
		witness.waitResyncs(t, ps...)
		if got := env.fw.WaitUUIDs(ctx, t, ns, names, time.Second); !maps.Equal(got, want) {
			t.Errorf("after %s: UUIDs changed from %v to %v", step, want, got)
		}
		if got := settled(t, func() (float64, error) { return env.cluster.APIStatusWrites(ctx) }); got != writes {
			t.Errorf("after %s: the apiserver counted %v more status writes, want 0", step, got-writes)
		}
		if got := auditedStatusPatches(t, ns, 0); got != len(names)+1 {
			t.Errorf("after %s: the audit log has %d status writes for %d objects and the witness, want one each", step, got, len(names))
		}
	}

	// A user's update of spec and labels, through the main resource.
	for _, n := range names {
		patch := `{"metadata":{"labels":{"touched":"yes"}},"spec":{"size":3}}`
		if _, err := env.fw.Uuids(ns).Patch(ctx, n, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatalf("update %s: %v", n, err)
		}
	}
	unchanged("an update and resyncs", p)
	// One for each object and the witness's.
	if got := metricReaches(ctx, t, p, "uuid_controller_status_writes_total", nil, float64(len(names)+1)); got != float64(len(names)+1) {
		t.Errorf("controller counted %v status writes, want %d", got, len(names)+1)
	}

	if code, took := p.Stop(); code != 0 {
		t.Fatalf("controller exit code %d after %s", code, took)
	}
	p = framework.StartController(ctx, t, controllerAs(env.kubeconfig), ns, "--resync", "1s")
	unchanged("a restart", p)

	second := framework.StartController(ctx, t, controllerAs(env.kubeconfig), ns, "--resync", "1s")
	unchanged("a second replica started", p, second)

	// Both replicas race for new objects (no leader election): the
	// resourceVersion precondition lets exactly one write land per object.
	more := env.fw.CreateUuids(ctx, t, ns, "raced", 20)
	env.fw.WaitUUIDs(ctx, t, ns, more, 30*time.Second)
	// Both have worked their queues through two resyncs since.
	witness.waitResyncs(t, p, second)
	// 5 objects from before and the witness, and one write for each new one.
	if got := auditedStatusPatches(t, ns, 200); got != len(names)+1+len(more) {
		t.Errorf("two replicas: the audit log has %d successful status writes for %d objects and the witness, want exactly one each", got, len(names)+len(more))
	}
	var ok float64
	ok += controllerMetric(ctx, t, p, "uuid_controller_status_writes_total", func(l map[string]string) bool { return l["result"] == "ok" })
	ok += controllerMetric(ctx, t, second, "uuid_controller_status_writes_total", func(l map[string]string) bool { return l["result"] == "ok" })
	if ok != float64(len(more)) {
		t.Errorf("two replicas counted %v successful writes, want %d", ok, len(more))
	}
	// Both see each new object at once, so they really race: the losers'
	// writes are the 409s that prove the precondition at work.
	isConflict := func(l map[string]string) bool { return l["result"] == "conflict" }
	conflicts := controllerMetric(ctx, t, p, "uuid_controller_status_writes_total", isConflict) +
		controllerMetric(ctx, t, second, "uuid_controller_status_writes_total", isConflict)
	if conflicts == 0 {
		t.Error("the two replicas never raced for an object (no 409 Conflict): the test proves nothing")
	}
	t.Logf("two replicas: %v writes lost the race with 409 Conflict", conflicts)
	mustStayRunning(t, p)
	mustStayRunning(t, second)
}

// TestObjectsCreatedWhileDown: objects created with no controller running
// all get a UUID, one write each, once it starts.
func TestObjectsCreatedWhileDown(t *testing.T) {
	ctx := testCtx(t)
	ns := env.fw.NewNamespace(ctx, t)
	names := env.fw.CreateUuids(ctx, t, ns, "early", 50)
	writes := settled(t, func() (float64, error) { return env.cluster.APIStatusWrites(ctx) })
	p := framework.StartController(ctx, t, controllerAs(env.kubeconfig), ns)
	env.fw.WaitUUIDs(ctx, t, ns, names, 60*time.Second)
	if got := settled(t, func() (float64, error) { return env.cluster.APIStatusWrites(ctx) }) - writes; got != float64(len(names)) {
		t.Errorf("%v status writes for %d objects, want one each", got, len(names))
	}
	if got := auditedReaches(t, ns, 0, len(names)); got != len(names) {
		t.Errorf("the audit log has %d status writes for %d objects, want one each", got, len(names))
	}
	if got := metricReaches(ctx, t, p, "uuid_controller_uuids_assigned_total", nil, float64(len(names))); got != float64(len(names)) {
		t.Errorf("uuids_assigned_total = %v, want %d", got, len(names))
	}
}
