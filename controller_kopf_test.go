package main

import (
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/demo-operator/uuid-controller/internal/kopf"
	"github.com/demo-operator/uuid-controller/internal/testlog"
)

// kopfObject is an object as kopf leaves it: its finalizer (after others'
// given first), its annotation and a UUID; terminating when deleting.
func kopfObject(name string, deleting bool, others ...string) *unstructured.Unstructured {
	u := withStatus(newUUIDObject("default", name, "5"), map[string]any{"state": "Ok", "message": "Création de la ressource réussie", "uuid": testUUID})
	u.SetFinalizers(append(others, kopf.Finalizer))
	u.SetAnnotations(map[string]string{"kopf.zalando.org/last-handled-configuration": "{}\n"})
	if deleting {
		u.SetDeletionTimestamp(&metav1.Time{Time: time.Now()})
	}
	return u
}

func TestCacheKeepsFinalizersOfTerminatingObjectsOnly(t *testing.T) {
	live := toCached(kopfObject("live", false, "example.com/other"))
	if live.GetFinalizers() != nil || live.GetDeletionTimestamp() != nil {
		t.Errorf("live object cached with finalizers %v, deletionTimestamp %v", live.GetFinalizers(), live.GetDeletionTimestamp())
	}
	deleting := toCached(kopfObject("deleting", true, "example.com/other"))
	if want := []string{"example.com/other", kopf.Finalizer}; !slices.Equal(deleting.GetFinalizers(), want) || deleting.GetDeletionTimestamp() == nil {
		t.Errorf("terminating object cached with finalizers %v, deletionTimestamp %v; want %v and set", deleting.GetFinalizers(), deleting.GetDeletionTimestamp(), want)
	}
}

func TestNeedsWork(t *testing.T) {
	tests := []struct {
		name string
		obj  *unstructured.Unstructured
		want bool
	}{
		{name: "no UUID", obj: newUUIDObject("default", "new", "1"), want: true},
		{name: "kopf's, live", obj: kopfObject("live", false)},
		{name: "kopf's, deleting", obj: kopfObject("deleting", true), want: true},
		{name: "deleting, another finalizer only", obj: func() *unstructured.Unstructured {
			u := kopfObject("other", true)
			u.SetFinalizers([]string{"example.com/other"})
			return u
		}()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := needsWork(toCached(tt.obj)); got != tt.want {
				t.Errorf("needsWork = %v, want %v", got, tt.want)
			}
			f := newFixture(t, Options{})
			logger, _ := ktesting.NewTestContext(t)
			f.ctrl.enqueue(logger, toCached(tt.obj))
			if n := f.ctrl.queue.Len(); n != map[bool]int{false: 0, true: 1}[tt.want] {
				t.Errorf("queued %d, want needsWork's answer", n)
			}
		})
	}
}

// Without the opt-in, an object held by kopf's finalizer is logged with the
// fix and where it is explained, at -v=0, once however often it is synced
// (every resync under a full watch), and nothing is written to it.
func TestKopfHeldObjectLogsTheFixWithoutOptIn(t *testing.T) {
	f := newFixture(t, Options{}, kopfObject("stuck", true))
	logger, logs := testlog.New(t, 0)
	for range 3 {
		if err := f.ctrl.syncHandler(klog.NewContext(f.ctx, logger), key("default", "stuck")); err != nil {
			t.Fatal(err)
		}
	}
	out := logs.String()
	if n := strings.Count(out, "waits for kopf's finalizer"); n != 1 {
		t.Errorf("%d lines for one held object synced 3 times, want 1:\n%s", n, out)
	}
	if !strings.Contains(out, "--remove-kopf-finalizer") || !strings.Contains(out, "default/stuck") {
		t.Errorf("log does not name the object and the flag:\n%s", out)
	}
	if !strings.Contains(out, "docs/migrating-from-kopf.md") {
		t.Errorf("log does not point at docs/migrating-from-kopf.md:\n%s", out)
	}
	if ps := f.patches(); len(ps) != 0 {
		t.Errorf("%d patches sent without the opt-in, want 0", len(ps))
	}
}

// failedTest is what the apiserver answers a JSON patch whose test failed
// (k8s.io/apiserver's patch handler builds it so).
func failedTest() error {
	return apierrors.NewGenericServerResponse(http.StatusUnprocessableEntity, "", schema.GroupResource{}, "",
		"testing value /metadata/finalizers/1 failed: test failed", 0, false)
}

func TestRemoveKopfFinalizer(t *testing.T) {
	tests := []struct {
		name       string
		apiErr     error
		wantErr    func(error) bool
		wantCount  float64
		wantEvents int
	}{
		{name: "removed", wantCount: 1, wantEvents: 1},
		{name: "already gone", apiErr: apierrors.NewNotFound(uuidGVR.GroupResource(), "x")},
		{name: "finalizers changed: retried as a conflict", apiErr: failedTest(), wantErr: apierrors.IsConflict},
		{name: "denied by admission: not a conflict", apiErr: apierrors.NewInvalid(schema.GroupKind{Group: "demo.operator", Kind: "Uuid"}, "x", nil),
			wantErr: func(err error) bool { return apierrors.IsInvalid(err) && !apierrors.IsConflict(err) }, wantEvents: 1},
		{name: "forbidden", apiErr: apierrors.NewForbidden(uuidGVR.GroupResource(), "x", errors.New("no grant")), wantErr: apierrors.IsForbidden, wantEvents: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			obj := kopfObject("deleting", true, "example.com/other")
			f := newFixture(t, Options{RemoveKopfFinalizer: true, NormalEvents: true}, obj)
			f.client.PrependReactor("patch", "uuid", func(a k8stesting.Action) (bool, runtime.Object, error) {
				return true, obj, tt.apiErr
			})
			err := f.ctrl.syncHandler(f.ctx, key("default", "deleting"))
			if (err != nil) != (tt.wantErr != nil) || (err != nil && !tt.wantErr(err)) {
				t.Fatalf("sync error = %v", err)
			}
			ps := f.patches()
			if len(ps) != 1 {
				t.Fatalf("%d patches sent, want 1", len(ps))
			}
			p := ps[0]
			if p.GetSubresource() != "" || p.GetPatchType() != types.JSONPatchType {
				t.Errorf("patch to subresource %q of type %s, want the object itself by JSON patch", p.GetSubresource(), p.GetPatchType())
			}
			if !strings.Contains(string(p.GetPatch()), `"path":"/metadata/finalizers/1"`) {
				t.Errorf("patch %s does not address kopf's finalizer at index 1", p.GetPatch())
			}
			if got := metricValue(t, f.metrics.Registry, "uuid_controller_kopf_finalizers_removed_total"); got != tt.wantCount {
				t.Errorf("kopf_finalizers_removed_total = %v, want %v", got, tt.wantCount)
			}
			if ev := f.events(); len(ev) != tt.wantEvents {
				t.Errorf("events = %q, want %d", ev, tt.wantEvents)
			}
		})
	}
}

// A removal is per object, like an assignment: nothing at -v=0
// (docs/design.md#logs), the line at -v=2.
func TestKopfFinalizerRemovalLogsAtV2(t *testing.T) {
	for _, tc := range []struct {
		verbosity int
		want      []string
	}{
		{0, nil},
		{2, []string{"Removed kopf's finalizer from an object being deleted"}},
	} {
		obj := kopfObject("deleting", true)
		f := newFixture(t, Options{RemoveKopfFinalizer: true}, obj)
		logger, logs := testlog.New(t, tc.verbosity)
		if err := f.ctrl.syncHandler(klog.NewContext(f.ctx, logger), key("default", "deleting")); err != nil {
			t.Fatal(err)
		}
		if got := metricValue(t, f.metrics.Registry, "uuid_controller_kopf_finalizers_removed_total"); got != 1 {
			t.Fatalf("kopf_finalizers_removed_total = %v, want 1", got)
		}
		if lines := logs.Messages(); !slices.Equal(lines, tc.want) {
			t.Errorf("-v=%d log lines for one removal: %q, want %q", tc.verbosity, lines, tc.want)
		}
	}
}

// A terminating kopf object without a UUID (kopf failed on it) gets its
// UUID first; the finalizer goes on the next pass, which the write's own
// update event brings.
func TestTerminatingKopfObjectWithoutUUIDGetsOneFirst(t *testing.T) {
	obj := kopfObject("failed", true)
	obj.Object["status"] = map[string]any{"state": "Erreur", "message": "boom", "uuid": "NA"}
	f := newFixture(t, Options{RemoveKopfFinalizer: true}, obj)
	if err := f.ctrl.syncHandler(f.ctx, key("default", "failed")); err != nil {
		t.Fatal(err)
	}
	ps := f.patches()
	if len(ps) != 1 || ps[0].GetSubresource() != "status" {
		t.Fatalf("patches = %v, want one status write", ps)
	}
	if _, st := patchStatusOf(t, ps[0]); st.State != StateOk || st.UUID != testUUID {
		t.Errorf("status written = %+v, want Ok with a UUID", st)
	}
}

// Without the opt-in, a terminating kopf object without a UUID is named
// when it gets its UUID: it then leaves a narrowed watch, which would not
// bring it back to be named.
func TestTerminatingKopfObjectNamedWhenAssignedWithoutOptIn(t *testing.T) {
	obj := kopfObject("failed", true)
	obj.Object["status"] = map[string]any{"state": "Erreur", "message": "boom", "uuid": "NA"}
	f := newFixture(t, Options{}, obj)
	logger, logs := testlog.New(t, 0)
	if err := f.ctrl.syncHandler(klog.NewContext(f.ctx, logger), key("default", "failed")); err != nil {
		t.Fatal(err)
	}
	if ps := f.patches(); len(ps) != 1 || ps[0].GetSubresource() != "status" {
		t.Fatalf("patches = %v, want one status write", ps)
	}
	if n := strings.Count(logs.String(), "waits for kopf's finalizer"); n != 1 || !strings.Contains(logs.String(), "default/failed") {
		t.Errorf("%d lines naming default/failed as held, want 1:\n%s", n, logs)
	}
}

// Live objects keep kopf's finalizer even with the opt-in: a running kopf
// would put it back, and a rolled-back one needs it.
func TestLiveKopfObjectsAreLeftAlone(t *testing.T) {
	f := newFixture(t, Options{RemoveKopfFinalizer: true}, kopfObject("live", false))
	if err := f.ctrl.syncHandler(f.ctx, key("default", "live")); err != nil {
		t.Fatal(err)
	}
	if ps := f.patches(); len(ps) != 0 {
		t.Errorf("%d patches sent to a live kopf object with a UUID, want 0", len(ps))
	}
}

func TestRemoveKopfFinalizerFlagIsOptIn(t *testing.T) {
	if c, err := parse(); err != nil || c.opts.RemoveKopfFinalizer {
		t.Errorf("default: %v, %v; want off", c, err)
	}
	if c, err := parse("--remove-kopf-finalizer"); err != nil || !c.opts.RemoveKopfFinalizer {
		t.Errorf("--remove-kopf-finalizer: %v, %v; want on", c, err)
	}
}

// listCounter counts the full listings of the store it wraps.
type listCounter struct {
	objectStore
	lists int
}

func (l *listCounter) List() []any { l.lists++; return l.objectStore.List() }

// The kopf policy's proof samples one cached object every few seconds while
// unproven: it reads the object sampled before by key, and lists the cache
// only when that object is gone, once each time.
func TestAnyCachedListsOnlyWhenTheSampleIsGone(t *testing.T) {
	f := newFixture(t, Options{}, newUUIDObject("default", "a", "1"), newUUIDObject("default", "b", "2"))
	store := &listCounter{objectStore: f.ctrl.store}
	f.ctrl.store = store
	sample := func(want int) string {
		t.Helper()
		first := f.ctrl.anyCached()
		if first == nil {
			t.Fatal("no object sampled from a cache holding some")
		}
		for range 3 {
			if got := f.ctrl.anyCached(); got == nil || got.GetName() != first.GetName() {
				t.Errorf("sampled %v after %s, want the same object while it is cached", got, first.GetName())
			}
		}
		if store.lists != want {
			t.Errorf("the cache was listed %d times in all, want %d", store.lists, want)
		}
		return first.GetName()
	}
	first := sample(1)
	if err := f.indexer.Delete(toCached(newUUIDObject("default", first, "1"))); err != nil {
		t.Fatal(err)
	}
	second := sample(2)
	if second == first {
		t.Errorf("sampled %s again after it left the cache", first)
	}
	if err := f.indexer.Delete(toCached(newUUIDObject("default", second, "1"))); err != nil {
		t.Fatal(err)
	}
	if got := f.ctrl.anyCached(); got != nil {
		t.Errorf("sampled %s from an empty cache, want nil", got.GetName())
	}
}

// A removal that keeps failing is logged as that, once at -v=0 when the
// streak starts, and never reported as a UUID not assigned: the object has
// its UUID, and kopf's Warning Event names the failure.
func TestKopfRemovalFailureLogLines(t *testing.T) {
	obj := kopfObject("deleting", true)
	f := newFixture(t, Options{RemoveKopfFinalizer: true, ErrorAfter: 3}, obj)
	f.client.PrependReactor("patch", "uuid", func(a k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewServiceUnavailable("overloaded")
	})
	logger, logs := testlog.New(t, 0)
	f.ctx = klog.NewContext(f.ctx, logger)
	k := key("default", "deleting")
	f.ctrl.queue.Add(k)
	for range 5 {
		f.drive(1)
	}
	var lines []string
	for _, e := range logs.Entries() {
		lines = append(lines, string(e.Type)+" "+e.Message)
	}
	want := []string{"ERROR Failed to remove kopf's finalizer from an object being deleted, will retry"}
	if !slices.Equal(lines, want) {
		t.Errorf("-v=0 log lines for 5 failed removals:\n%s\nwant:\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
	if got := f.ctrl.queue.NumRequeues(k); got != 5 {
		t.Errorf("requeues = %d, want 5: a failed removal is retried", got)
	}
}
