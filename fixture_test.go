package main

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/informers"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2/ktesting"
)

const testUUID = "3d6a4f0e-5b2c-4e7a-9c1d-8f0e2a4b6c8d"

func newUUIDObject(ns, name, rv string) *unstructured.Unstructured {
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
	ctrl, err := NewController(ctx, testDeps(client, informer, f.recorder, f.metrics), opts)
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
	// The admission policy is proven at start, as Run proves it; Run
	// returns at once on a cancelled context.
	started, cancel := context.WithCancel(ctx)
	cancel()
	ctrl.kopf.Run(started)
	return f
}

// testDeps are a controller's dependencies over the fake client: status
// written with the dynamic client, no CRD check, and a kopf admission
// policy that binds (internal/kopf tests the proof).
func testDeps(client dynamic.Interface, informer informers.GenericInformer, recorder record.EventRecorder, metrics *Metrics) Deps {
	return Deps{Client: client, Informer: informer, Status: dynamicPatcher(client.Resource(uuidGVR)),
		Recorder: recorder, Metrics: metrics, CRD: noCRDGate{},
		KopfProbe: func(context.Context, string, string) error { return nil }}
}

// metricValue is the value of the metric name (a counter or gauge
// without labels) in reg.
func metricValue(t *testing.T, reg prometheus.Gatherer, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range families {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			m := mf.GetMetric()[0]
			return m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	t.Fatalf("no single series of %s", name)
	return 0
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
		go func() {
			key, shutdown := f.ctrl.queue.Get()
			if !shutdown {
				f.ctrl.processItem(f.ctx, context.WithoutCancel(f.ctx), key)
			}
			done <- !shutdown
		}()
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

// patchFault fails every status patch that writes a given state with its
// current error, and counts the patches it failed. With no error (set(nil))
// the patches go through.
type patchFault struct {
	mu       sync.Mutex
	err      error
	failures atomic.Int32
}

// failPatches makes every status patch whose state is state fail with err.
func failPatches(client *dynamicfake.FakeDynamicClient, state string, err error) *patchFault {
	f := &patchFault{err: err}
	client.PrependReactor("patch", "uuid", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if !strings.Contains(string(a.(k8stesting.PatchAction).GetPatch()), `"state":"`+state+`"`) {
			return false, nil, nil
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.err == nil {
			return false, nil, nil
		}
		f.failures.Add(1)
		return true, nil, f.err
	})
	return f
}

// set changes the error the patches fail with; nil lets them through.
func (f *patchFault) set(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.err = err
}

// invalid is the apiserver's 422 for the test object.
func invalid() error {
	return apierrors.NewInvalid(schema.GroupKind{Group: "demo.operator", Kind: "Uuid"}, "example", nil)
}

// uuidInAPI reads an object's status.uuid from the fake API.
func uuidInAPI(t *testing.T, client *dynamicfake.FakeDynamicClient, ns, name string) string {
	t.Helper()
	obj, err := client.Tracker().Get(uuidGVR, ns, name)
	if err != nil {
		t.Fatal(err)
	}
	id, _, _ := unstructured.NestedString(obj.(*unstructured.Unstructured).Object, "status", "uuid")
	return id
}

// runUntilCancelled runs the controller with one worker and queues k; once
// k's sync has started (started is closed) it calls then, cancels Run's
// context and returns what Run returned.
func (f *fixture) runUntilCancelled(k cache.ObjectName, started <-chan struct{}, then func()) error {
	ctx, cancel := context.WithCancel(f.ctx)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- f.ctrl.Run(ctx, 1) }()
	f.ctrl.queue.Add(k)
	<-started
	then()
	cancel()
	return <-errc
}

func key(ns, name string) cache.ObjectName { return cache.NewObjectName(ns, name) }
