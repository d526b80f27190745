package main

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus/testutil"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic/dynamicinformer"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2/ktesting"
)

const testUUID = "3d6a4f0e-5b2c-4e7a-9c1d-8f0e2a4b6c8d"

func newUuid(ns, name, rv string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{}}
	u.SetAPIVersion("demo.operator/v1")
	u.SetKind("Uuid")
	u.SetNamespace(ns)
	u.SetName(name)
	u.SetResourceVersion(rv)
	return u
}

func withStatus(u *unstructured.Unstructured, status any) *unstructured.Unstructured {
	u.Object["status"] = status
	return u
}

// fixture is one controller over a fake dynamic client whose cache is loaded
// by hand, as in sample-controller.
type fixture struct {
	t        *testing.T
	ctx      context.Context
	client   *dynamicfake.FakeDynamicClient
	ctrl     *Controller
	indexer  cache.Indexer
	recorder *record.FakeRecorder
	metrics  *Metrics
}

func newFixture(t *testing.T, opts Options, objs ...*unstructured.Unstructured) *fixture {
	t.Helper()
	return newFixtureWithClient(t, newClient(t, objs...), opts, objs...)
}

// newClient is a fake dynamic client holding objs under uuidGVR (the fake
// would otherwise guess the plural "uuids" from the kind).
func newClient(t *testing.T, objs ...*unstructured.Unstructured) *dynamicfake.FakeDynamicClient {
	t.Helper()
	client := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{uuidGVR: "UuidList"})
	for _, o := range objs {
		if err := client.Tracker().Create(uuidGVR, o.DeepCopy(), o.GetNamespace()); err != nil {
			t.Fatal(err)
		}
	}
	return client
}

func newFixtureWithClient(t *testing.T, client *dynamicfake.FakeDynamicClient, opts Options, objs ...*unstructured.Unstructured) *fixture {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	f := &fixture{t: t, ctx: ctx, client: client, recorder: record.NewFakeRecorder(100), metrics: NewMetrics()}
	informer := dynamicinformer.NewDynamicSharedInformerFactory(client, 0).ForResource(uuidGVR)
	ctrl, err := NewController(ctx, client, informer, f.recorder, f.metrics, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctrl.synced = func() bool { return true }
	ctrl.newUUID = func() uuid.UUID { return uuid.MustParse(testUUID) }
	t.Cleanup(ctrl.queue.ShutDown)
	f.ctrl = ctrl
	f.indexer = informer.Informer().GetIndexer()
	for _, o := range objs {
		if err := f.indexer.Add(toCached(o)); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// patches returns the patch actions sent, ignoring reads.
func (f *fixture) patches() []k8stesting.PatchAction {
	var out []k8stesting.PatchAction
	for _, a := range f.client.Actions() {
		if p, ok := a.(k8stesting.PatchAction); ok {
			out = append(out, p)
		}
	}
	return out
}

func (f *fixture) events() []string {
	var out []string
	for {
		select {
		case e := <-f.recorder.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

// patchStatusOf decodes the status a patch action carried.
func patchStatusOf(t *testing.T, p k8stesting.PatchAction) (rv string, st Status) {
	t.Helper()
	var body struct {
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
		Status Status `json:"status"`
	}
	if err := json.Unmarshal(p.GetPatch(), &body); err != nil {
		t.Fatalf("patch is not JSON: %v", err)
	}
	return body.Metadata.ResourceVersion, body.Status
}

// failPatches makes every status patch whose state is state fail with err.
func failPatches(client *dynamicfake.FakeDynamicClient, state string, err error) *atomic.Int32 {
	var n atomic.Int32
	client.PrependReactor("patch", "uuid", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if strings.Contains(string(a.(k8stesting.PatchAction).GetPatch()), `"state":"`+state+`"`) {
			n.Add(1)
			return true, nil, err
		}
		return false, nil, nil
	})
	return &n
}

func key(ns, name string) cache.ObjectName { return cache.NewObjectName(ns, name) }

func TestSyncAssignsOneUUID(t *testing.T) {
	f := newFixture(t, Options{NormalEvents: true}, newUuid("default", "example", "5"))
	if err := f.ctrl.syncHandler(f.ctx, key("default", "example")); err != nil {
		t.Fatal(err)
	}
	ps := f.patches()
	if len(ps) != 1 {
		t.Fatalf("%d patches sent, want exactly 1", len(ps))
	}
	p := ps[0]
	if p.GetSubresource() != "status" || p.GetNamespace() != "default" || p.GetName() != "example" {
		t.Errorf("patched %s/%s subresource %q, want default/example status", p.GetNamespace(), p.GetName(), p.GetSubresource())
	}
	rv, st := patchStatusOf(t, p)
	if rv != "5" {
		t.Errorf("precondition resourceVersion = %q, want the cached 5", rv)
	}
	if st.State != StateOk || st.Message != MessageAssigned || st.UUID != testUUID {
		t.Errorf("status = %+v", st)
	}
	if got := testutil.ToFloat64(f.metrics.Assigned); got != 1 {
		t.Errorf("assigned metric = %v, want 1", got)
	}
	if ev := f.events(); len(ev) != 1 || !strings.HasPrefix(ev[0], "Normal "+ReasonAssigned) {
		t.Errorf("events = %q, want one Normal %s", ev, ReasonAssigned)
	}
}

func TestSyncRealUUIDIsValid(t *testing.T) {
	f := newFixture(t, Options{}, newUuid("default", "example", "5"))
	f.ctrl.newUUID = uuid.New
	if err := f.ctrl.syncHandler(f.ctx, key("default", "example")); err != nil {
		t.Fatal(err)
	}
	_, st := patchStatusOf(t, f.patches()[0])
	if _, err := uuid.Parse(st.UUID); err != nil || len(st.UUID) != 36 {
		t.Errorf("uuid %q is not a canonical UUID: %v", st.UUID, err)
	}
	if ev := f.events(); len(ev) != 0 {
		t.Errorf("Normal events posted at the default Warning level: %q", ev)
	}
}

func TestSyncWritesNothing(t *testing.T) {
	tests := []struct {
		name string
		objs []*unstructured.Unstructured
	}{
		{name: "already has a UUID", objs: []*unstructured.Unstructured{
			withStatus(newUuid("default", "example", "5"), map[string]any{"state": "Ok", "uuid": "6f1c2a4e-8a53-4c0c-9d8e-3f7c5a1b2d90"})}},
		{name: "has a UUID and unknown fields", objs: []*unstructured.Unstructured{
			withStatus(newUuid("default", "example", "5"), map[string]any{"uuid": "6f1c2a4e-8a53-4c0c-9d8e-3f7c5a1b2d90", "extra": map[string]any{"a": "b"}})}},
		{name: "deleted", objs: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, Options{}, tt.objs...)
			if err := f.ctrl.syncHandler(f.ctx, key("default", "example")); err != nil {
				t.Fatalf("sync returned %v, want nil", err)
			}
			if n := len(f.client.Actions()); n != 0 {
				t.Errorf("%d API calls made, want none: %v", n, f.client.Actions())
			}
		})
	}
}

func TestSyncReplacesBadStatus(t *testing.T) {
	tests := []struct {
		name   string
		status any
	}{
		{name: "uuid not a UUID", status: map[string]any{"uuid": "NA", "state": "Error"}},
		{name: "uuid a number", status: map[string]any{"uuid": 12.0}},
		{name: "status a string", status: "broken"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, Options{}, withStatus(newUuid("default", "example", "3"), tt.status))
			if err := f.ctrl.syncHandler(f.ctx, key("default", "example")); err != nil {
				t.Fatal(err)
			}
			ps := f.patches()
			if len(ps) != 1 {
				t.Fatalf("%d patches, want 1", len(ps))
			}
			if _, st := patchStatusOf(t, ps[0]); st.UUID != testUUID {
				t.Errorf("uuid = %q, want the new %q", st.UUID, testUUID)
			}
			ev := f.events()
			if len(ev) != 1 || !strings.HasPrefix(ev[0], "Warning "+ReasonInvalid) {
				t.Errorf("events = %q, want one Warning %s", ev, ReasonInvalid)
			}
		})
	}
}

func TestEnqueueOnlyObjectsWithoutUUID(t *testing.T) {
	f := newFixture(t, Options{})
	logger, _ := ktesting.NewTestContext(t)
	f.ctrl.enqueue(logger, toCached(withStatus(newUuid("a", "done", "1"), map[string]any{"uuid": testUUID})))
	f.ctrl.enqueue(logger, "not an object")
	f.ctrl.enqueue(logger, newUuid("a", "raw", "1")) // not transformed: a bug, not work
	f.ctrl.enqueue(logger, toCached(newUuid("a", "new", "1")))
	if n := f.ctrl.queue.Len(); n != 1 {
		t.Fatalf("queue length = %d, want 1", n)
	}
	if k, _ := f.ctrl.queue.Get(); k != key("a", "new") {
		t.Errorf("queued %v, want a/new", k)
	}
}

// syncCache copies the object's current state from the fake API into the
// cache, as the informer would.
func (f *fixture) syncCache(k cache.ObjectName) {
	f.t.Helper()
	cur, err := f.client.Tracker().Get(uuidGVR, k.Namespace, k.Name)
	if err != nil {
		f.t.Fatal(err)
	}
	if err := f.indexer.Update(toCached(cur.(*unstructured.Unstructured))); err != nil {
		f.t.Fatal(err)
	}
}

// drive processes n queue items, each waiting for its backoff.
func (f *fixture) drive(n int) {
	f.t.Helper()
	for i := range n {
		done := make(chan bool)
		go func() { done <- f.ctrl.processNextWorkItem(f.ctx) }()
		select {
		case ok := <-done:
			if !ok {
				f.t.Fatalf("queue shut down at item %d", i)
			}
		case <-time.After(10 * time.Second):
			f.t.Fatalf("no item %d came out of the queue", i)
		}
	}
}

// A failure the apiserver may recover from (here a 500) is retried with
// backoff for as long as it lasts; from the ErrorAfter-th attempt it is also
// reported on the object, once in status; and the object gets its UUID as
// soon as the apiserver takes the write.
func TestTransientErrorIsReportedAndRetried(t *testing.T) {
	obj := newUuid("default", "example", "5")
	client := newClient(t, obj)
	preconditionReactor(t, client)
	failing := atomic.Bool{}
	failing.Store(true)
	var failures atomic.Int32
	client.PrependReactor("patch", "uuid", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if failing.Load() && strings.Contains(string(a.(k8stesting.PatchAction).GetPatch()), `"state":"Ok"`) {
			failures.Add(1)
			return true, nil, apierrors.NewInternalError(errors.New("etcd is sad"))
		}
		return false, nil, nil
	})
	f := newFixtureWithClient(t, client, Options{ErrorAfter: 2}, obj)
	k := key("default", "example")

	f.ctrl.queue.Add(k)
	for range 4 {
		f.drive(1)
		f.syncCache(k) // as the informer would
	}

	if n := failures.Load(); n != 4 {
		t.Errorf("%d assignment attempts, want 4", n)
	}
	var errorWrites []Status
	for _, p := range f.patches() {
		if rv, st := patchStatusOf(t, p); st.State == StateError {
			errorWrites = append(errorWrites, st)
			if st.UUID != "" || !strings.Contains(st.Message, "etcd is sad") || rv != "5" {
				t.Errorf("Error status = %+v (rv %q), want the error text, no uuid, precondition 5", st, rv)
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

	failing.Store(false)
	f.drive(1)
	final, _ := client.Tracker().Get(uuidGVR, "default", "example")
	if id, _, _ := unstructured.NestedString(final.(*unstructured.Unstructured).Object, "status", "uuid"); id != testUUID {
		t.Errorf("uuid after recovery = %q, want %s", id, testUUID)
	}
	if f.ctrl.queue.NumRequeues(k) != 0 {
		t.Error("key still tracked after success")
	}
}

// The update event of the controller's own Error write must not queue the
// object past its backoff (or, after a rejected request, at all: with an
// error text that differs every time, that would be a hot loop), even when
// the informer delivers it before the PATCH response arrives; a user's
// update of the object must queue it.
func TestOwnErrorWriteDoesNotRequeue(t *testing.T) {
	obj := newUuid("default", "example", "5")
	client := newClient(t, obj)
	preconditionReactor(t, client)
	invalid := apierrors.NewInvalid(schema.GroupKind{Group: "demo.operator", Kind: "Uuid"}, "example", nil)
	failPatches(client, StateOk, invalid)
	var f *fixture
	// A watch may deliver the write before the PATCH response arrives: look
	// at the written object from inside the request.
	var earlyEcho atomic.Bool
	client.PrependReactor("patch", "uuid", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if !strings.Contains(string(a.(k8stesting.PatchAction).GetPatch()), `"state":"Error"`) {
			return false, nil, nil
		}
		handled, out, err := preconditionPatch(t, client, a)
		if err == nil {
			earlyEcho.Store(f.ctrl.reports.isEcho(toCached(out.(*unstructured.Unstructured))))
		}
		return handled, out, err
	})
	f = newFixtureWithClient(t, client, Options{}, obj)
	logger, _ := ktesting.NewTestContext(t)
	f.ctrl.queue.Add(key("default", "example"))
	f.drive(1)
	if !earlyEcho.Load() {
		t.Error("the Error write's own update event, delivered before the response, was not recognised")
	}

	cur, err := client.Tracker().Get(uuidGVR, "default", "example")
	if err != nil {
		t.Fatal(err)
	}
	echo := toCached(cur.(*unstructured.Unstructured))
	if echo.Status.State != StateError {
		t.Fatalf("status = %+v, want the Error write", echo.Status)
	}
	if f.ctrl.reports.isEcho(echo) {
		t.Error("recognised twice: a later event with the same version is a resync and must be looked at")
	}
	user := echo.DeepCopyObject().(*cachedUuid)
	user.ResourceVersion = "99"
	if f.ctrl.reports.isEcho(user) {
		t.Error("a user's update was taken for the controller's own write")
	}
	f.ctrl.enqueue(logger, user)
	if f.ctrl.queue.Len() != 1 {
		t.Error("a user's update of a failed object did not queue it")
	}
}

func TestPermanentErrorIsNotRetried(t *testing.T) {
	obj := newUuid("default", "example", "5")
	client := newClient(t, obj)
	invalid := apierrors.NewInvalid(schema.GroupKind{Group: "demo.operator", Kind: "Uuid"}, "example", nil)
	failures := failPatches(client, StateOk, invalid)
	f := newFixtureWithClient(t, client, Options{ErrorAfter: 5}, obj)

	f.ctrl.queue.Add(key("default", "example"))
	f.drive(1)
	if n := failures.Load(); n != 1 {
		t.Errorf("%d attempts, want 1", n)
	}
	if f.ctrl.queue.Len() != 0 {
		t.Error("permanent error requeued")
	}
	if _, st := patchStatusOf(t, f.patches()[1]); st.State != StateError {
		t.Errorf("status = %+v, want Error", st)
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
	done := withStatus(newUuid("default", "done", "5"), map[string]any{"state": "Ok", "uuid": testUUID})
	f := newFixture(t, Options{}, done)
	cause := errors.New("boom")
	f.ctrl.markFailed(f.ctx, key("default", "done"), cause, true)
	f.ctrl.markFailed(f.ctx, key("default", "gone"), cause, false)
	if n := len(f.patches()); n != 0 {
		t.Errorf("%d patches, want none", n)
	}
	if ev := f.events(); len(ev) != 0 {
		t.Errorf("events = %q, want none", ev)
	}
}

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
	_, err := NewController(tctx, client, informer, record.NewFakeRecorder(1), NewMetrics(), Options{})
	if err == nil || !strings.Contains(err.Error(), "must not have started") {
		t.Errorf("err = %v, want one saying the informer must not have started", err)
	}
}

func TestErrorStatusNotRewritten(t *testing.T) {
	cause := apierrors.NewForbidden(schema.GroupResource{Group: "demo.operator", Resource: "uuid/status"}, "example", errors.New("no"))
	obj := withStatus(newUuid("default", "example", "5"), map[string]any{"state": "Error", "message": errorStatus(cause).Message})
	f := newFixture(t, Options{}, obj)
	f.ctrl.markFailed(f.ctx, key("default", "example"), cause, true)
	if n := len(f.patches()); n != 0 {
		t.Errorf("%d patches, want none: status already says so", n)
	}
}

// preconditionReactor makes the fake client check a merge patch's
// metadata.resourceVersion the way the apiserver does, and bump it on write.
func preconditionReactor(t *testing.T, client *dynamicfake.FakeDynamicClient) {
	client.PrependReactor("patch", "uuid", func(a k8stesting.Action) (bool, runtime.Object, error) {
		return preconditionPatch(t, client, a)
	})
}

func preconditionPatch(t *testing.T, client *dynamicfake.FakeDynamicClient, a k8stesting.Action) (bool, runtime.Object, error) {
	p := a.(k8stesting.PatchAction)
	cur, err := client.Tracker().Get(uuidGVR, p.GetNamespace(), p.GetName())
	if err != nil {
		return true, nil, err
	}
	u := cur.(*unstructured.Unstructured).DeepCopy()
	rv, st := patchStatusOf(t, p)
	if rv != u.GetResourceVersion() {
		return true, nil, apierrors.NewConflict(uuidGVR.GroupResource(), p.GetName(), errors.New("the object has been modified"))
	}
	n, _ := strconv.Atoi(rv)
	u.SetResourceVersion(strconv.Itoa(n + 1))
	u.Object["status"] = map[string]any{"state": st.State, "message": st.Message, "uuid": st.UUID}
	return true, u, client.Tracker().Update(uuidGVR, u, p.GetNamespace())
}

// Two replicas (or an old and a new pod) see the same object without a UUID
// in their caches and both try to assign one. The precondition lets only the
// first write land; the second gets a conflict, requeues, and on its next try
// sees the winner's UUID and writes nothing.
func TestTwoWritersRaceKeepsFirstUUID(t *testing.T) {
	obj := newUuid("default", "example", "1")
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
	final, _ := client.Tracker().Get(uuidGVR, "default", "example")
	if id, _, _ := unstructured.NestedString(final.(*unstructured.Unstructured).Object, "status", "uuid"); id != "aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa" {
		t.Errorf("final uuid = %q, want the first writer's", id)
	}
	if b.ctrl.queue.Len() != 0 {
		t.Error("key still queued")
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
	ctx, cancel := context.WithCancel(f.ctx)
	errc := make(chan error)
	go func() { errc <- f.ctrl.Run(ctx, 1) }()
	f.ctrl.queue.Add(key("ns", "first"))
	<-started
	f.ctrl.queue.Add(key("ns", "second"))
	cancel()
	if err := <-errc; err != nil {
		t.Fatalf("Run = %v", err)
	}
	if !finished.Load() {
		t.Error("in-flight reconcile did not finish before Run returned")
	}
	if after.Load() {
		t.Error("a new item was started after shutdown began")
	}
}

func TestRunShutdownIsBounded(t *testing.T) {
	f := newFixture(t, Options{ShutdownTimeout: 50 * time.Millisecond})
	started := make(chan struct{})
	release := make(chan struct{})
	defer close(release)
	f.ctrl.syncHandler = func(context.Context, cache.ObjectName) error {
		close(started)
		<-release
		return nil
	}
	ctx, cancel := context.WithCancel(f.ctx)
	errc := make(chan error)
	go func() { errc <- f.ctrl.Run(ctx, 1) }()
	f.ctrl.queue.Add(key("ns", "stuck"))
	<-started
	cancel()
	if err := <-errc; err == nil || !strings.Contains(err.Error(), "still busy") {
		t.Errorf("Run = %v, want a 'still busy' error", err)
	}
}

func TestNewControllerRejectsNegativeOptions(t *testing.T) {
	client := newClient(t)
	informer := dynamicinformer.NewDynamicSharedInformerFactory(client, 0).ForResource(uuidGVR)
	_, ctx := ktesting.NewTestContext(t)
	for _, opts := range []Options{{ErrorAfter: -1}, {MaxRetryDelay: -time.Second}} {
		if _, err := NewController(ctx, client, informer, record.NewFakeRecorder(1), NewMetrics(), opts); err == nil {
			t.Errorf("%+v accepted", opts)
		}
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

// A rejected request, then (after the user's update) a run of retryable
// failures: the second is reported too, not hidden by the first's report.
func TestFailureAfterRejectionIsReported(t *testing.T) {
	obj := newUuid("default", "example", "5")
	client := newClient(t, obj)
	preconditionReactor(t, client)
	var cause atomic.Value
	cause.Store(error(apierrors.NewInvalid(schema.GroupKind{Group: "demo.operator", Kind: "Uuid"}, "example", nil)))
	client.PrependReactor("patch", "uuid", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if strings.Contains(string(a.(k8stesting.PatchAction).GetPatch()), `"state":"Ok"`) {
			return true, nil, cause.Load().(error)
		}
		return false, nil, nil
	})
	f := newFixtureWithClient(t, client, Options{ErrorAfter: 2}, obj)
	k := key("default", "example")
	f.ctrl.queue.Add(k)
	f.drive(1)
	f.syncCache(k)
	if ev := f.events(); len(ev) != 1 {
		t.Fatalf("events after the rejection = %q, want one", ev)
	}

	cause.Store(error(apierrors.NewServiceUnavailable("overloaded")))
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
