package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus/testutil"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic/dynamicinformer"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/demo-operator/uuid-controller/internal/crdcheck"
	"github.com/demo-operator/uuid-controller/internal/testlog"
)

// The transform must be set before the informer starts; NewController says
// so instead of caching whole objects that its reads would then reject.
func TestNewControllerOnStartedInformer(t *testing.T) {
	client := newClient(t)
	factory := dynamicinformer.NewDynamicSharedInformerFactory(client, 0)
	informer := factory.ForResource(uuidGVR)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	_, tctx := ktesting.NewTestContext(t)
	_, err := NewController(tctx, testDeps(client, informer, record.NewFakeRecorder(1), NewMetrics()), Options{})
	if err == nil || !strings.Contains(err.Error(), "must not have started") {
		t.Errorf("err = %v, want one saying the informer must not have started", err)
	}
}

func TestNewControllerRejectsNegativeOptions(t *testing.T) {
	client := newClient(t)
	informer := dynamicinformer.NewDynamicSharedInformerFactory(client, 0).ForResource(uuidGVR)
	_, ctx := ktesting.NewTestContext(t)
	for _, opts := range []Options{{ErrorAfter: -1}, {MaxRetryDelay: -time.Second}} {
		if _, err := NewController(ctx, testDeps(client, informer, record.NewFakeRecorder(1), NewMetrics()), opts); err == nil {
			t.Errorf("%+v accepted", opts)
		}
	}
}

func TestEnqueueOnlyObjectsWithoutUUID(t *testing.T) {
	f := newFixture(t, Options{})
	logger, _ := ktesting.NewTestContext(t)
	f.ctrl.enqueue(logger, toCached(withStatus(newUUIDObject("a", "done", "1"), map[string]any{"uuid": testUUID})))
	f.ctrl.enqueue(logger, "not an object")
	f.ctrl.enqueue(logger, newUUIDObject("a", "raw", "1")) // not transformed: a bug, not work
	f.ctrl.enqueue(logger, toCached(newUUIDObject("a", "new", "1")))
	if n := f.ctrl.queue.Len(); n != 1 {
		t.Fatalf("queue length = %d, want 1", n)
	}
	if k, _ := f.ctrl.queue.Get(); k != key("a", "new") {
		t.Errorf("queued %v, want a/new", k)
	}
}

// The echo of the controller's own Error write is told from every other
// update by the old and new objects alone.
func TestIsErrorWriteEcho(t *testing.T) {
	cached := func(uid types.UID, rv string, st Status) *cachedUUID {
		return cachedWithStatus(t, "ns", "obj", uid, rv, st)
	}
	none := Status{}
	failed := Status{State: StateError, Message: "boom"}
	tests := []struct {
		name     string
		old, cur any
		want     bool
	}{
		{"Error written on an object without status", cached("u1", "5", none), cached("u1", "6", failed), true},
		{"a new Error text over an older one", cached("u1", "5", Status{State: StateError, Message: "old"}), cached("u1", "6", failed), true},
		{"resync", cached("u1", "6", failed), cached("u1", "6", failed), false},
		{"a user's update of a failed object", cached("u1", "6", failed), cached("u1", "7", failed), false},
		{"status cleared", cached("u1", "6", failed), cached("u1", "7", none), false},
		{"UUID assigned", cached("u1", "5", none), cached("u1", "6", Status{State: StateOk, UUID: testUUID}), false},
		{"Error over a UUID (not the controller's)", cached("u1", "5", Status{State: StateOk, UUID: testUUID}), cached("u1", "6", failed), false},
		{"another object of the same name", cached("u1", "5", none), cached("u2", "6", failed), false},
		{"not a cached object", "tombstone", cached("u1", "6", failed), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := isErrorWriteEcho(tt.old, tt.cur); got != tt.want {
				t.Errorf("isErrorWriteEcho = %v, want %v", got, tt.want)
			}
		})
	}
}

// The update event of the controller's own Error write must not queue the
// object past its backoff (or, after a rejected request, at all: with an
// error text that differs every time, that would be a hot loop), even when
// the informer delivers it before the PATCH response arrives; a user's
// update of the object must queue it.
func TestOwnErrorWriteDoesNotRequeue(t *testing.T) {
	obj := newUUIDObject("default", "example", "5")
	client := newClient(t, obj)
	preconditionReactor(t, client)
	failPatches(client, StateOk, invalid())
	var f *fixture
	logger, _ := ktesting.NewTestContext(t)
	// A watch may deliver the write before the PATCH response arrives: hand
	// the written object to the update handler from inside the request.
	var earlyEcho atomic.Bool
	client.PrependReactor("patch", "uuid", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if !strings.Contains(string(a.(k8stesting.PatchAction).GetPatch()), `"state":"Error"`) {
			return false, nil, nil
		}
		handled, out, err := preconditionPatch(t, client, a)
		if err == nil {
			earlyEcho.Store(true)
			f.ctrl.onUpdate(logger, toCached(obj), toCached(out.(*unstructured.Unstructured)))
		}
		return handled, out, err
	})
	f = newFixtureWithClient(t, client, Options{}, obj)
	k := key("default", "example")
	f.ctrl.queue.Add(k)
	f.drive(1)
	if !earlyEcho.Load() {
		t.Fatal("no Error write was sent")
	}
	if n := f.ctrl.queue.Len(); n != 0 {
		t.Error("the Error write's own update event, delivered before the response, queued the object")
	}

	cur, err := client.Tracker().Get(uuidGVR, "default", "example")
	if err != nil {
		t.Fatal(err)
	}
	echo := toCached(cur.(*unstructured.Unstructured))
	if echo.status().State != StateError {
		t.Fatalf("status = %+v, want the Error write", echo.status())
	}
	f.ctrl.onUpdate(logger, echo, echo)
	if f.ctrl.queue.Len() != 1 {
		t.Error("a resync of the Error write's version did not queue the object: it must be looked at")
	}
	k2, _ := f.ctrl.queue.Get()
	f.ctrl.queue.Done(k2)
	user := echo.DeepCopyObject().(*cachedUUID)
	user.rv = 99
	f.ctrl.onUpdate(logger, echo, user)
	if f.ctrl.queue.Len() != 1 {
		t.Error("a user's update of a failed object did not queue it")
	}
}

func TestRunFinishesInFlightWorkOnShutdown(t *testing.T) {
	f := newFixture(t, Options{ShutdownTimeout: 5 * time.Second})
	started := make(chan struct{})
	var finished, after atomic.Bool
	f.ctrl.syncHandler = func(ctx context.Context, k cache.ObjectName) error {
		if k.Name == "second" {
			after.Store(true)
			return nil
		}
		close(started)
		time.Sleep(200 * time.Millisecond)
		if ctx.Err() != nil {
			return ctx.Err() // the in-flight reconcile's context must outlive the shutdown signal
		}
		finished.Store(true)
		return nil
	}
	err := f.runUntilCancelled(key("ns", "first"), started, func() { f.ctrl.queue.Add(key("ns", "second")) })
	if err != nil {
		t.Fatalf("Run = %v", err)
	}
	if !finished.Load() {
		t.Error("in-flight reconcile did not finish before Run returned")
	}
	if after.Load() {
		t.Error("a new item was started after shutdown began")
	}
}

// TestRunShutdownIsBounded: a reconcile still running after
// ShutdownTimeout is cancelled, and Run returns only once it has returned,
// so the lease (released after Run) is never let go while a write may
// still land.
func TestRunShutdownIsBounded(t *testing.T) {
	f := newFixture(t, Options{ShutdownTimeout: 50 * time.Millisecond, SyncTimeout: time.Hour})
	started := make(chan struct{})
	var returned atomic.Bool
	f.ctrl.syncHandler = func(ctx context.Context, _ cache.ObjectName) error {
		close(started)
		<-ctx.Done() // a write that only ends when cancelled
		returned.Store(true)
		return ctx.Err()
	}
	err := f.runUntilCancelled(key("ns", "stuck"), started, func() {})
	if err == nil || !strings.Contains(err.Error(), "still busy") {
		t.Errorf("Run = %v, want a 'still busy' error", err)
	}
	if !returned.Load() {
		t.Error("Run returned after the shutdown timeout while a write was still in flight, want it cancelled and returned first")
	}
}

// syncUUID writes one status patch, with the cached resourceVersion as its
// precondition, to an object without a valid UUID, and nothing at all to
// one that has a UUID or is gone.
func TestSyncUUID(t *testing.T) {
	const other = "6f1c2a4e-8a53-4c0c-9d8e-3f7c5a1b2d90"
	tests := []struct {
		name         string
		obj          *unstructured.Unstructured // nil: deleted
		normalEvents bool
		// realUUID uses uuid.New instead of testUUID.
		realUUID bool
		// wantPatch: one status patch assigning a UUID; else no API call.
		wantPatch  bool
		wantEvents []string // prefixes, in order
	}{
		{name: "assigns one UUID", obj: newUUIDObject("default", "example", "5"), normalEvents: true,
			wantPatch: true, wantEvents: []string{"Normal " + ReasonAssigned}},
		{name: "a real UUID, no Normal event at the default Warning level", obj: newUUIDObject("default", "example", "5"),
			realUUID: true, wantPatch: true},
		{name: "already has a UUID",
			obj: withStatus(newUUIDObject("default", "example", "5"), map[string]any{"state": "Ok", "uuid": other})},
		{name: "has a UUID and unknown fields",
			obj: withStatus(newUUIDObject("default", "example", "5"), map[string]any{"uuid": other, "extra": map[string]any{"a": "b"}})},
		{name: "deleted"},
		{name: "uuid not a UUID", obj: withStatus(newUUIDObject("default", "example", "3"), map[string]any{"uuid": "NA", "state": "Error"}),
			wantPatch: true, wantEvents: []string{"Warning " + ReasonInvalid}},
		{name: "uuid a number", obj: withStatus(newUUIDObject("default", "example", "3"), map[string]any{"uuid": 12.0}),
			wantPatch: true, wantEvents: []string{"Warning " + ReasonInvalid}},
		{name: "status a string", obj: withStatus(newUUIDObject("default", "example", "3"), "broken"),
			wantPatch: true, wantEvents: []string{"Warning " + ReasonInvalid}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var objs []*unstructured.Unstructured
			if tt.obj != nil {
				objs = append(objs, tt.obj)
			}
			f := newFixture(t, Options{NormalEvents: tt.normalEvents}, objs...)
			if tt.realUUID {
				f.ctrl.newUUID = uuid.New
			}
			if err := f.ctrl.syncHandler(f.ctx, key("default", "example")); err != nil {
				t.Fatalf("sync returned %v, want nil", err)
			}
			if !tt.wantPatch {
				if n := len(f.client.Actions()); n != 0 {
					t.Errorf("%d API calls made, want none: %v", n, f.client.Actions())
				}
			} else {
				ps := f.patches()
				if len(ps) != 1 {
					t.Fatalf("%d patches sent, want exactly 1", len(ps))
				}
				p := ps[0]
				if p.GetSubresource() != "status" || p.GetNamespace() != "default" || p.GetName() != "example" {
					t.Errorf("patched %s/%s subresource %q, want default/example status", p.GetNamespace(), p.GetName(), p.GetSubresource())
				}
				rv, st := patchStatusOf(t, p)
				if rv != tt.obj.GetResourceVersion() {
					t.Errorf("precondition resourceVersion = %q, want the cached %s", rv, tt.obj.GetResourceVersion())
				}
				wantUUID := testUUID
				if tt.realUUID {
					if _, err := uuid.Parse(st.UUID); err != nil || len(st.UUID) != 36 {
						t.Errorf("uuid %q is not a canonical UUID: %v", st.UUID, err)
					}
					wantUUID = st.UUID
				}
				if st.State != StateOk || st.Message != MessageAssigned || st.UUID != wantUUID {
					t.Errorf("status = %+v, want state Ok, message %q, uuid %s", st, MessageAssigned, wantUUID)
				}
				if got := testutil.ToFloat64(f.metrics.Assigned); got != 1 {
					t.Errorf("assigned metric = %v, want 1", got)
				}
			}
			ev := f.events()
			ok := len(ev) == len(tt.wantEvents)
			for i := 0; ok && i < len(ev); i++ {
				ok = strings.HasPrefix(ev[i], tt.wantEvents[i])
			}
			if !ok {
				t.Errorf("events = %q, want %q", ev, tt.wantEvents)
			}
		})
	}
}

// Two replicas (or an old and a new pod) see the same object without a UUID
// in their caches and both try to assign one. The precondition lets only the
// first write land; the second gets a conflict, requeues, and on its next try
// sees the winner's UUID and writes nothing.
func TestTwoWritersRaceKeepsFirstUUID(t *testing.T) {
	obj := newUUIDObject("default", "example", "1")
	client := newClient(t, obj)
	preconditionReactor(t, client)
	a := newFixtureWithClient(t, client, Options{}, obj)
	b := newFixtureWithClient(t, client, Options{}, obj)
	a.ctrl.newUUID = func() uuid.UUID { return uuid.MustParse("aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa") }
	b.ctrl.newUUID = func() uuid.UUID { return uuid.MustParse("bbbbbbbb-bbbb-4bbb-8bbb-bbbbbbbbbbbb") }
	k := key("default", "example")

	a.ctrl.queue.Add(k)
	a.drive(1)
	b.ctrl.queue.Add(k)
	b.drive(1) // stale cache: conflict

	if got := testutil.ToFloat64(b.metrics.StatusWrites.WithLabelValues("conflict")); got != 1 {
		t.Fatalf("second writer's conflicts = %v, want 1", got)
	}
	if b.ctrl.queue.NumRequeues(k) != 1 || testutil.ToFloat64(b.metrics.PatchFailures.WithLabelValues("Conflict")) != 0 {
		t.Error("conflict was not requeued, or was counted as a failure")
	}
	// b's informer catches up with a's write.
	cur, err := client.Tracker().Get(uuidGVR, "default", "example")
	if err != nil {
		t.Fatal(err)
	}
	if err := b.indexer.Update(toCached(cur.(*unstructured.Unstructured))); err != nil {
		t.Fatal(err)
	}
	before := len(b.patches())
	b.drive(1)
	if n := len(b.patches()) - before; n != 0 {
		t.Errorf("second writer sent %d more patches after seeing the UUID, want 0", n)
	}
	if id := uuidInAPI(t, client, "default", "example"); id != "aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa" {
		t.Errorf("final uuid = %q, want the first writer's", id)
	}
	if b.ctrl.queue.Len() != 0 {
		t.Error("key still queued")
	}
}

// TestStaleReadAfterOwnWriteSendsNothing: a key queued again before the
// cache shows the controller's own write (an event from the other informer
// while the watch switches, or any event racing the write's) reads the
// version the write replaced. It sends no second write (which could only
// earn a 409); once the cache shows someone blanking the status, the
// object gets a UUID again.
func TestStaleReadAfterOwnWriteSendsNothing(t *testing.T) {
	obj := newUUIDObject("default", "example", "1")
	client := newClient(t, obj)
	preconditionReactor(t, client)
	f := newFixtureWithClient(t, client, Options{}, obj)
	k := key("default", "example")

	f.ctrl.queue.Add(k)
	f.drive(1)
	f.ctrl.queue.Add(k) // the cache still holds resourceVersion 1
	f.drive(1)
	if n := len(f.patches()); n != 1 {
		t.Fatalf("%d status writes for one object read twice before the cache caught up, want 1", n)
	}
	if got := testutil.ToFloat64(f.metrics.StatusWrites.WithLabelValues("conflict")); got != 0 {
		t.Errorf("conflicts = %v, want 0", got)
	}

	// A user blanks the status: a new resourceVersion, no UUID.
	cur, err := client.Tracker().Get(uuidGVR, "default", "example")
	if err != nil {
		t.Fatal(err)
	}
	blank := withStatus(cur.(*unstructured.Unstructured).DeepCopy(), map[string]any{})
	blank.SetResourceVersion("7")
	if err := client.Tracker().Update(uuidGVR, blank, "default"); err != nil {
		t.Fatal(err)
	}
	f.syncCache(k)
	f.ctrl.queue.Add(k)
	f.drive(1)
	if n := len(f.patches()); n != 2 {
		t.Errorf("%d status writes after the status was blanked, want 2 (it is refilled)", n)
	}
}

// A failure the apiserver may recover from (here a 500) is retried with
// backoff for as long as it lasts; from the ErrorAfter-th attempt it is also
// reported on the object, once in status; and the object gets its UUID as
// soon as the apiserver takes the write.
func TestTransientErrorIsReportedAndRetried(t *testing.T) {
	obj := newUUIDObject("default", "example", "5")
	client := newClient(t, obj)
	preconditionReactor(t, client)
	fault := failPatches(client, StateOk, apierrors.NewInternalError(errors.New("etcd is sad")))
	f := newFixtureWithClient(t, client, Options{ErrorAfter: 2}, obj)
	k := key("default", "example")

	f.ctrl.queue.Add(k)
	for range 4 {
		f.drive(1)
		f.syncCache(k) // as the informer would
	}

	if n := fault.failures.Load(); n != 4 {
		t.Errorf("%d assignment attempts, want 4", n)
	}
	var errorWrites []Status
	for _, p := range f.patches() {
		if rv, st := patchStatusOf(t, p); st.State == StateError {
			errorWrites = append(errorWrites, st)
			if st.UUID != "" || !strings.Contains(st.Message, "etcd is sad") || rv != "5" {
				t.Errorf("Error status = %+v (rv %q), want the error text, no uuid, precondition 5", st, rv)
			}
			if !meta.IsStatusConditionFalse(st.Conditions, ConditionReady) || !meta.IsStatusConditionTrue(st.Conditions, ConditionReconciling) {
				t.Errorf("Error status conditions = %+v, want Ready=False and Reconciling=True: it is retried", st.Conditions)
			}
		}
	}
	if len(errorWrites) != 1 {
		t.Errorf("%d Error status writes, want 1 (at the 2nd attempt, then not again)", len(errorWrites))
	}
	if got := f.ctrl.queue.NumRequeues(k); got != 4 {
		t.Errorf("requeues = %d, want 4: the object is still being retried", got)
	}
	if got := testutil.ToFloat64(f.metrics.Dropped); got != 0 {
		t.Errorf("dropped = %v, want 0", got)
	}
	if got := testutil.ToFloat64(f.metrics.PatchFailures.WithLabelValues(string(metav1.StatusReasonInternalError))); got != 4 {
		t.Errorf("patch failures = %v, want 4", got)
	}
	ev := f.events()
	if len(ev) != 1 || !strings.HasPrefix(ev[0], "Warning "+ReasonFailed) || !strings.Contains(ev[0], "etcd is sad") {
		t.Errorf("events = %q, want one Warning %s with the error: a failure is reported once", ev, ReasonFailed)
	}

	fault.set(nil)
	f.drive(1)
	if id := uuidInAPI(t, client, "default", "example"); id != testUUID {
		t.Errorf("uuid after recovery = %q, want %s", id, testUUID)
	}
	if f.ctrl.queue.NumRequeues(k) != 0 {
		t.Error("key still tracked after success")
	}
}

// When the report itself cannot be written (no grant on uuid/status fails
// it as it fails the assignment), the log says so, the Warning Event still
// goes out, and retrying goes on: nothing is dropped.
func TestFailedReportIsLoggedAndRetryGoesOn(t *testing.T) {
	obj := newUUIDObject("default", "example", "5")
	client := newClient(t, obj)
	forbidden := apierrors.NewForbidden(uuidGVR.GroupResource(), "example", errors.New("no grant on uuid/status"))
	failPatches(client, StateOk, forbidden)
	failPatches(client, StateError, forbidden)
	f := newFixtureWithClient(t, client, Options{ErrorAfter: 1}, obj)
	logger, logs := testlog.New(t, 0)
	f.ctx = klog.NewContext(f.ctx, logger)
	k := key("default", "example")

	f.ctrl.queue.Add(k)
	f.drive(1)

	var logged bool
	for _, e := range logs.Entries() {
		if e.Type == ktesting.LogError && e.Message == "Failed to record the error in status" && apierrors.IsForbidden(e.Err) {
			logged = true
		}
	}
	if !logged {
		t.Error("no error log for the failed Error status write")
	}
	if got := testutil.ToFloat64(f.metrics.StatusWrites.WithLabelValues("error")); got != 2 {
		t.Errorf("failed status writes = %v, want 2 (the assignment and the report)", got)
	}
	if ev := f.events(); len(ev) != 1 || !strings.HasPrefix(ev[0], "Warning "+ReasonFailed) {
		t.Errorf("events = %q, want one Warning %s", ev, ReasonFailed)
	}
	if got := f.ctrl.queue.NumRequeues(k); got != 1 {
		t.Errorf("requeues = %d, want 1: still retried", got)
	}
	if got := testutil.ToFloat64(f.metrics.Dropped); got != 0 {
		t.Errorf("dropped = %v, want 0", got)
	}
}

// A streak of retryable failures is reported once, at the ErrorAfter-th
// attempt; a streak that ended (a success, the object deleted) leaves
// nothing behind, so the next one, or a new object of the same name, is
// reported too.
func TestFailureReportedOncePerStreak(t *testing.T) {
	obj := newUUIDObject("default", "example", "5")
	f := newFixture(t, Options{ErrorAfter: 3}, obj)
	k := key("default", "example")
	cause := apierrors.NewServiceUnavailable("overloaded")
	fail := func(n int) {
		for range n {
			f.ctrl.handleErr(f.ctx, k, cause)
		}
	}
	reports := func() int {
		n := 0
		for _, p := range f.patches() {
			if _, st := patchStatusOf(t, p); st.State == StateError {
				n++
			}
		}
		return n
	}

	fail(2)
	if n := reports(); n != 0 {
		t.Fatalf("%d reports after 2 failures with ErrorAfter 3, want 0", n)
	}
	fail(5)
	if n := reports(); n != 1 {
		t.Errorf("%d reports after 7 failures, want 1: a streak is reported once", n)
	}

	f.ctrl.handleErr(f.ctx, k, nil) // the streak ends
	fail(3)
	if n := reports(); n != 2 {
		t.Errorf("%d reports after a second streak, want 2", n)
	}

	f.ctrl.onDelete(toCached(obj))
	recreated := newUUIDObject("default", "example", "9")
	recreated.SetUID("new")
	if err := f.indexer.Update(toCached(recreated)); err != nil {
		t.Fatal(err)
	}
	fail(3)
	if n := reports(); n != 3 {
		t.Errorf("%d reports after a new object of the same name failed, want 3: it inherited the old one's", n)
	}
	if ev := f.events(); len(ev) != 3 {
		t.Errorf("events = %q, want 3 Warnings", ev)
	}
}

// A rejected request, then (after the user's update) a run of retryable
// failures: the second is reported too, not hidden by the first's report.
func TestFailureAfterRejectionIsReported(t *testing.T) {
	obj := newUUIDObject("default", "example", "5")
	client := newClient(t, obj)
	preconditionReactor(t, client)
	fault := failPatches(client, StateOk, invalid())
	f := newFixtureWithClient(t, client, Options{ErrorAfter: 2}, obj)
	k := key("default", "example")
	f.ctrl.queue.Add(k)
	f.drive(1)
	f.syncCache(k)
	if ev := f.events(); len(ev) != 1 {
		t.Fatalf("events after the rejection = %q, want one", ev)
	}

	fault.set(apierrors.NewServiceUnavailable("overloaded"))
	f.ctrl.queue.Add(k) // the user's update
	for range 2 {
		f.drive(1)
		f.syncCache(k)
	}
	ev := f.events()
	if len(ev) != 1 || !strings.Contains(ev[0], "overloaded") {
		t.Errorf("events after %d retryable failures = %q, want one naming the new cause", 2, ev)
	}
}

// TestIsPermanent: only a request the apiserver rejected as malformed is
// given up; an outage, a 429, a missing RBAC grant or an admission denial
// with 403 heal without a restart, so they are retried.
func TestIsPermanent(t *testing.T) {
	gr := uuidGVR.GroupResource()
	for _, c := range []struct {
		err  error
		want bool
	}{
		{invalid(), true},
		{apierrors.NewBadRequest("bad"), true},
		{apierrors.NewRequestEntityTooLargeError("big"), true},
		{apierrors.NewForbidden(gr, "example", errors.New("RBAC: no grant")), false},
		{apierrors.NewInternalError(errors.New("etcd is sad")), false},
		{apierrors.NewServiceUnavailable("overloaded"), false},
		{apierrors.NewTooManyRequests("slow down", 1), false},
		{apierrors.NewTimeoutError("slow", 1), false},
		{apierrors.NewConflict(gr, "example", errors.New("changed")), false},
		{errors.New("connection refused"), false},
	} {
		if got := isPermanent(c.err); got != c.want {
			t.Errorf("isPermanent(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

func TestPermanentErrorIsNotRetried(t *testing.T) {
	obj := newUUIDObject("default", "example", "5")
	client := newClient(t, obj)
	fault := failPatches(client, StateOk, invalid())
	f := newFixtureWithClient(t, client, Options{ErrorAfter: 5}, obj)

	f.ctrl.queue.Add(key("default", "example"))
	f.drive(1)
	if n := fault.failures.Load(); n != 1 {
		t.Errorf("%d attempts, want 1", n)
	}
	if f.ctrl.queue.Len() != 0 {
		t.Error("permanent error requeued")
	}
	if len(f.patches()) != 2 {
		t.Fatalf("%d status patches, want 2: the attempt and the Error status", len(f.patches()))
	}
	if _, st := patchStatusOf(t, f.patches()[1]); st.State != StateError ||
		!meta.IsStatusConditionFalse(st.Conditions, ConditionReady) || !meta.IsStatusConditionTrue(st.Conditions, ConditionStalled) {
		t.Errorf("status = %+v, want Error with Ready=False and Stalled=True: it is given up", st)
	}
	if got := testutil.ToFloat64(f.metrics.Dropped); got != 1 {
		t.Errorf("dropped = %v, want 1", got)
	}
	if ev := f.events(); len(ev) != 1 || !strings.HasPrefix(ev[0], "Warning "+ReasonFailed) {
		t.Errorf("events = %q, want one Warning %s", ev, ReasonFailed)
	}
	// A resync (same version, still no UUID) tries a dropped object again.
	logger, _ := ktesting.NewTestContext(t)
	f.ctrl.enqueue(logger, toCached(obj))
	if f.ctrl.queue.Len() != 1 {
		t.Error("a resync did not queue the dropped object again")
	}
}

// markFailed has nothing to do for an object that is gone from the cache or
// got its UUID from another writer meanwhile: no event, no write.
func TestMarkFailedSkipsGoneOrDone(t *testing.T) {
	done := withStatus(newUUIDObject("default", "done", "5"), map[string]any{"state": "Ok", "uuid": testUUID})
	f := newFixture(t, Options{}, done)
	cause := errors.New("boom")
	f.ctrl.markFailed(f.ctx, key("default", "done"), cause, true)
	f.ctrl.markFailed(f.ctx, key("default", "gone"), cause, true)
	if n := len(f.patches()); n != 0 {
		t.Errorf("%d patches, want none", n)
	}
	if ev := f.events(); len(ev) != 0 {
		t.Errorf("events = %q, want none", ev)
	}
}

// A failure the status already reports, conditions and all, is not
// written again; an Error status without conditions (written by an older
// version) gets them.
func TestErrorStatusNotRewritten(t *testing.T) {
	cause := apierrors.NewForbidden(schema.GroupResource{Group: "demo.operator", Resource: "uuid/status"}, "example", errors.New("no"))
	written := errorStatus(cause, true, nil, metav1.Now())
	var full map[string]any
	if err := json.Unmarshal(mustJSON(t, written), &full); err != nil {
		t.Fatal(err)
	}
	old := map[string]any{"state": "Error", "message": written.Message}
	for _, tt := range []struct {
		name   string
		status map[string]any
		want   int
	}{
		{name: "reported", status: full, want: 0},
		{name: "reported without conditions", status: old, want: 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, Options{}, withStatus(newUUIDObject("default", "example", "5"), tt.status))
			f.ctrl.markFailed(f.ctx, key("default", "example"), cause, true)
			p := f.patches()
			if len(p) != tt.want {
				t.Fatalf("%d patches, want %d", len(p), tt.want)
			}
			if len(p) == 1 {
				if _, st := patchStatusOf(t, p[0]); !sameStatus(st, written) {
					t.Errorf("status written = %+v, want %+v", st, written)
				}
			}
		})
	}
}

// The backoff doubles from 5 ms and stops at the cap, with no overall
// bucket stretching it as more objects fail.
func TestRateLimiterCapsBackoff(t *testing.T) {
	rl := rateLimiter(time.Second)
	a, b := key("ns", "a"), key("ns", "b")
	if d := rl.When(a); d != 5*time.Millisecond {
		t.Errorf("first delay = %s, want 5ms", d)
	}
	var last time.Duration
	for range 30 {
		last = rl.When(a)
	}
	if last != time.Second {
		t.Errorf("delay after 31 failures = %s, want the 1s cap", last)
	}
	for i := range 1000 {
		rl.When(key("ns", strconv.Itoa(i)))
	}
	if d := rl.When(b); d != 5*time.Millisecond {
		t.Errorf("first delay of another object after 1,000 others failed = %s, want 5ms", d)
	}
	rl.Forget(a)
	if d := rl.When(a); d != 5*time.Millisecond {
		t.Errorf("delay after Forget = %s, want 5ms", d)
	}
}

// The figure --error-after's help gives ("about 1m22s") is the limiter's
// own delays added up.
func TestBackoffBefore(t *testing.T) {
	for _, tc := range []struct {
		attempt  int
		maxDelay time.Duration
		want     time.Duration
	}{
		{1, time.Minute, 0},
		{3, time.Minute, 15 * time.Millisecond},
		{15, time.Minute, 81915 * time.Millisecond},              // 5 ms × (2^14 - 1)
		{12, time.Second, 1275*time.Millisecond + 3*time.Second}, // 5 ms .. 640 ms, then three 1 s caps
	} {
		if got := backoffBefore(tc.attempt, tc.maxDelay); got != tc.want {
			t.Errorf("backoffBefore(%d, %s) = %s, want %s", tc.attempt, tc.maxDelay, got, tc.want)
		}
	}
}

// At -v=0 a streak of failures logs two error lines, when it starts and
// when it is reported on the object, and an assignment none: a burst or an
// outage over many objects must not log every object at every retry.
func TestLogLinesAtDefaultVerbosity(t *testing.T) {
	obj := newUUIDObject("default", "example", "5")
	client := newClient(t, obj)
	preconditionReactor(t, client)
	fault := failPatches(client, StateOk, apierrors.NewServiceUnavailable("overloaded"))
	f := newFixtureWithClient(t, client, Options{ErrorAfter: 4}, obj)
	logger, logs := testlog.New(t, 0)
	f.ctx = klog.NewContext(f.ctx, logger)
	k := key("default", "example")

	f.ctrl.queue.Add(k)
	for range 6 {
		f.drive(1)
		f.syncCache(k)
	}
	fault.set(nil)
	f.drive(1)
	if id := uuidInAPI(t, client, "default", "example"); id != testUUID {
		t.Fatalf("uuid = %q, want %s", id, testUUID)
	}

	var lines []string
	for _, e := range logs.Entries() {
		lines = append(lines, string(e.Type)+" "+e.Message)
	}
	want := []string{
		"ERROR Failed to assign UUID, will retry",
		"ERROR Failed to assign UUID; reporting it on the object, retrying goes on",
	}
	if !slices.Equal(lines, want) {
		t.Errorf("-v=0 log lines for 6 failures and an assignment:\n%s\nwant:\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
}

// fakeCRDGate is a CRD check whose state a test sets; it counts Suspect
// calls.
type fakeCRDGate struct {
	blocked  error
	suspects int
}

func (g *fakeCRDGate) Blocked() error { return g.blocked }
func (g *fakeCRDGate) Suspect()       { g.suspects++ }

// While the CRD is known to be wrong nothing is written and nothing is
// reported on the objects (no Error status that would 404 too, no Event
// per object), however many attempts; the key stays queued with backoff,
// and the heal callback queues it again at once.
func TestWritesWaitForTheCRD(t *testing.T) {
	f := newFixture(t, Options{ErrorAfter: 1}, newUUIDObject("default", "example", "5"))
	gate := &fakeCRDGate{blocked: fmt.Errorf("%w: the CRD has no status subresource", crdcheck.ErrNotReady)}
	f.ctrl.crd = gate

	f.ctrl.queue.Add(key("default", "example"))
	f.drive(3)
	if ps := f.patches(); len(ps) != 0 {
		t.Errorf("%d patches sent while the CRD is wrong, want 0", len(ps))
	}
	if ev := f.events(); len(ev) != 0 {
		t.Errorf("events = %q, want none: the CRD problem is reported once, by the checker", ev)
	}
	if n := f.ctrl.queue.NumRequeues(key("default", "example")); n != 3 {
		t.Errorf("requeues = %d, want 3", n)
	}
	if d := testutil.ToFloat64(f.metrics.Dropped); d != 0 {
		t.Errorf("dropped = %v", d)
	}

	gate.blocked = nil
	f.ctrl.requeueUnfinished(f.ctx)
	if n := f.ctrl.queue.Len(); n != 1 {
		t.Fatalf("queue length after the fix = %d, want the object queued at once", n)
	}
	if n := f.ctrl.queue.NumRequeues(key("default", "example")); n != 0 {
		t.Errorf("requeues after the fix = %d, want its backoff started again", n)
	}
	f.drive(1)
	if ps := f.patches(); len(ps) != 1 {
		t.Errorf("%d patches after the fix, want 1", len(ps))
	}
}

// A 404 on the status write for an object the cache still holds is a
// missing status subresource or a deletion not yet delivered: the key is
// retried and a CRD check asked for; once the cache has lost the object
// too, it is forgotten, never counted as a failure.
func TestNotFoundOnPatchAsksForACheck(t *testing.T) {
	obj := newUUIDObject("default", "example", "5")
	f := newFixtureWithClient(t, newClient(t), Options{}, obj) // cached, but gone from the API
	gate := &fakeCRDGate{}
	f.ctrl.crd = gate
	f.ctrl.queue.Add(key("default", "example"))
	f.drive(1)
	if n := f.ctrl.queue.NumRequeues(key("default", "example")); n != 1 {
		t.Errorf("requeues = %d, want 1: a 404 the cache cannot explain is retried", n)
	}
	if gate.suspects != 1 {
		t.Errorf("CRD checks asked for = %d, want 1", gate.suspects)
	}
	if err := f.indexer.Delete(toCached(obj)); err != nil {
		t.Fatal(err)
	}
	f.drive(1)
	if n := f.ctrl.queue.NumRequeues(key("default", "example")); n != 0 || f.ctrl.queue.Len() != 0 {
		t.Errorf("requeues = %d, queue length %d once the object left the cache, want it forgotten", n, f.ctrl.queue.Len())
	}
	if gate.suspects != 1 {
		t.Errorf("CRD checks asked for = %d, want still 1 for a deleted object", gate.suspects)
	}
	if got := testutil.ToFloat64(f.metrics.StatusWrites.WithLabelValues("not_found")); got != 1 {
		t.Errorf("not_found writes = %v, want 1", got)
	}
	if d := testutil.ToFloat64(f.metrics.Dropped); d != 0 {
		t.Errorf("dropped = %v", d)
	}
}

// TestDropLoggedOncePerObject: an object the apiserver keeps rejecting is
// dropped again at each resync (it still has no UUID); the drop is logged
// at -v=0 once, not once per resync.
func TestDropLoggedOncePerObject(t *testing.T) {
	obj := newUUIDObject("default", "example", "5")
	client := newClient(t, obj)
	failPatches(client, StateOk, invalid())
	f := newFixtureWithClient(t, client, Options{ErrorAfter: 5}, obj)
	logger, logs := testlog.New(t, 0)
	f.ctx = klog.NewContext(f.ctx, logger)
	for range 3 {
		f.ctrl.enqueue(logger, toCached(obj)) // the first event, then two resyncs
		f.drive(1)
	}
	if got := testutil.ToFloat64(f.metrics.Dropped); got != 3 {
		t.Fatalf("dropped = %v, want 3: the test proves nothing", got)
	}
	if n := strings.Count(logs.String(), "Dropping object"); n != 1 {
		t.Errorf("%d lines for one object dropped 3 times, want 1:\n%s", n, logs)
	}
}
