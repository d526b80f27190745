package main

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	apiwatch "k8s.io/apimachinery/pkg/watch"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/informers"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2/ktesting"

	"github.com/demo-operator/uuid-controller/internal/kopf"
	"github.com/demo-operator/uuid-controller/test/framework"
)

// The watch runs the informer the CRD allows and follows it both ways
// without a restart: the narrowed one lists with the selector, the full
// one without; the gauge and the sweep request follow; reads go to the
// informer in use, and --remove-kopf-finalizer keeps the full one.
func TestWatchFollowsTheCRD(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	obj := newUUIDObject("ns", "pending", "1")
	client := newClient(t, obj)
	var mu sync.Mutex
	var selectors []string
	client.PrependReactor("list", "uuid", func(a k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		selectors = append(selectors, a.(k8stesting.ListAction).GetListRestrictions().Fields.String())
		return false, nil, nil
	})
	var narrowed, known atomic.Bool
	gauge := prometheus.NewGauge(prometheus.GaugeOpts{Name: "watch_narrowed"})
	newInf := informersOver(client)
	f := newFixtureWithClient(t, client, Options{})
	w := newWatch(nil, newInf, f.ctrl.attach, func() (bool, bool) { return narrowed.Load(), known.Load() }, false, gauge)
	var sweeps atomic.Int32
	f.ctrl.useWatch(w, nil)
	w.onNarrowed = func() { sweeps.Add(1) }
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	defer func() { cancel(); <-done }()

	waitFor := func(what string, cond func() bool) {
		t.Helper()
		if err := framework.PollTrue(ctx, 10*time.Second, what, cond); err != nil {
			t.Fatal(err)
		}
	}
	lastSelector := func() string {
		mu.Lock()
		defer mu.Unlock()
		if len(selectors) == 0 {
			return "none"
		}
		return selectors[len(selectors)-1]
	}
	if w.HasSynced() {
		t.Fatal("HasSynced before the first CRD check, want false")
	}
	// The first check could not complete: the full informer, for now.
	w.Poke()
	waitFor("the full informer", func() bool { return w.HasSynced() && !w.Narrowed() })
	if got := lastSelector(); got != "" {
		t.Errorf("full informer's field selector = %q, want none", got)
	}
	if _, exists, _ := w.GetByKey("ns/pending"); !exists {
		t.Error("the full informer's store does not hold ns/pending")
	}
	// crd.yaml applied: the narrowed one, without a restart.
	narrowed.Store(true)
	known.Store(true)
	w.Poke()
	// The sweep is requested once the old informer has stopped, a moment
	// after Narrowed turns true.
	waitFor("the narrowed informer and its sweep request", func() bool { return w.HasSynced() && w.Narrowed() && sweeps.Load() > 0 })
	if got := lastSelector(); got != pendingSelector {
		t.Errorf("narrowed informer's field selector = %q, want %q", got, pendingSelector)
	}
	if v := testutil.ToFloat64(gauge); v != 1 {
		t.Errorf("watch_narrowed = %v, want 1", v)
	}
	if sweeps.Load() != 1 {
		t.Errorf("sweeps requested = %d, want 1 on switching to the narrowed informer", sweeps.Load())
	}
	// The article's CRD applied again: back to the full one.
	narrowed.Store(false)
	w.Poke()
	waitFor("the full informer again", func() bool { return w.HasSynced() && !w.Narrowed() })
	if v := testutil.ToFloat64(gauge); v != 0 {
		t.Errorf("watch_narrowed = %v, want 0", v)
	}
	if got := lastSelector(); got != "" {
		t.Errorf("full informer's field selector = %q, want none", got)
	}
	// An unknown state (a failed check) keeps what is in use.
	known.Store(false)
	narrowed.Store(true)
	w.Poke()
	time.Sleep(200 * time.Millisecond) // no signal exists for a switch not made
	if w.Narrowed() {
		t.Error("switched on a check that could not complete, want the informer in use kept")
	}

	forced := newWatch(nil, newInf, f.ctrl.attach, func() (bool, bool) { return true, true }, true, gauge)
	fctx, fcancel := context.WithCancel(ctx)
	fdone := make(chan struct{})
	go func() { defer close(fdone); forced.Run(fctx) }()
	waitFor("the forced full informer", forced.HasSynced)
	if forced.Narrowed() {
		t.Error("--remove-kopf-finalizer's watch is narrowed, want every object watched")
	}
	fcancel()
	<-fdone
}

// A watch over several namespaces runs one informer each: a key is read
// from its namespace's informer, List holds the objects of every watched
// namespace, a namespace not watched is neither listed nor read, and
// after a switch (full to narrowed) each namespace still has its informer.
func TestWatchSeveralNamespaces(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	client := newClient(t, newUUIDObject("a", "one", "1"), newUUIDObject("b", "two", "2"), newUUIDObject("c", "three", "3"))
	var mu sync.Mutex
	listed := map[string]int{}
	client.PrependReactor("list", "uuid", func(a k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		listed[a.GetNamespace()]++
		return false, nil, nil
	})
	var narrowed atomic.Bool
	w, _ := runWatchOver(t, ctx, client, []string{"a", "b"}, func() (bool, bool) { return narrowed.Load(), true })
	check := func(when string) {
		t.Helper()
		if err := framework.PollTrue(ctx, 10*time.Second, "the informers to sync", w.HasSynced); err != nil {
			t.Fatalf("%s: %v", when, err)
		}
		for key, want := range map[string]bool{"a/one": true, "b/two": true, "c/three": false} {
			if _, exists, err := w.GetByKey(key); err != nil || exists != want {
				t.Errorf("%s: GetByKey(%s) exists %v (%v), want %v", when, key, exists, err, want)
			}
		}
		if n := len(w.List()); n != 2 {
			t.Errorf("%s: List holds %d objects, want the 2 of namespaces a and b", when, n)
		}
		mu.Lock()
		defer mu.Unlock()
		if listed["a"] == 0 || listed["b"] == 0 || listed["c"] != 0 || listed[""] != 0 {
			t.Errorf("%s: lists by namespace %v, want a and b only, each on its own", when, listed)
		}
	}
	check("full")
	narrowed.Store(true)
	w.Poke()
	if err := framework.PollTrue(ctx, 10*time.Second, "the switch to the narrowed informers", w.Narrowed); err != nil {
		t.Fatal(err)
	}
	check("narrowed")
}

// ByIndex reads the index of every watched namespace's informer, and of no
// other namespace: the kopf gauge counts the held objects of all of them.
func TestWatchByIndexEveryNamespace(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	var objs []*unstructured.Unstructured
	for _, ns := range []string{"a", "b", "c"} {
		held := kopfObject("held", true)
		held.SetNamespace(ns)
		live := kopfObject("live", false)
		live.SetNamespace(ns)
		objs = append(objs, held, live)
	}
	w, _ := runWatchOver(t, ctx, newClient(t, objs...), []string{"a", "b"}, func() (bool, bool) { return false, true })
	if err := framework.PollTrue(ctx, 10*time.Second, "the informers to sync", w.HasSynced); err != nil {
		t.Fatal(err)
	}
	got, err := w.ByIndex(kopf.HeldIndex, kopf.HeldValue)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, o := range got {
		keys = append(keys, cache.MetaObjectToName(o.(*cachedUUID)).String())
	}
	slices.Sort(keys)
	if !slices.Equal(keys, []string{"a/held", "b/held"}) {
		t.Errorf("ByIndex(%s) = %v, want [a/held b/held]", kopf.HeldIndex, keys)
	}
	if _, err := w.ByIndex("no-such-index", "x"); err == nil {
		t.Error("ByIndex of an index no informer has: no error")
	}
}

// A namespace whose list is refused as Forbidden (a scoped install not yet
// granted there) does not hold back the others: the workers may start
// (Servable) once the rest have synced, while HasSynced, /readyz's check,
// stays false; once the namespace is granted its informer syncs and its
// objects are read, without a restart.
func TestWatchServesWhileOneNamespaceForbidden(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	client := newClient(t, newUUIDObject("a", "one", "1"), newUUIDObject("b", "two", "2"))
	var granted atomic.Bool
	client.PrependReactor("list", "uuid", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetNamespace() == "b" && !granted.Load() {
			return true, nil, apierrors.NewForbidden(uuidGVR.GroupResource(), "", errors.New("no Role in b"))
		}
		return false, nil, nil
	})
	client.PrependWatchReactor("uuid", func(a k8stesting.Action) (bool, apiwatch.Interface, error) {
		if a.GetNamespace() == "b" && !granted.Load() {
			return true, nil, apierrors.NewForbidden(uuidGVR.GroupResource(), "", errors.New("no Role in b"))
		}
		return false, nil, nil
	})
	w, f := runWatchOver(t, ctx, client, []string{"a", "b"}, func() (bool, bool) { return false, true })

	if err := framework.PollTrue(ctx, 10*time.Second, "the workers to be allowed to start while b is Forbidden", f.ctrl.synced); err != nil {
		t.Fatalf("the controller's workers never may start while b is Forbidden: %v", err)
	}
	if w.HasSynced() {
		t.Errorf("HasSynced (/readyz's informer check) is true while b's informer has not synced")
	}
	if _, exists, err := w.GetByKey("a/one"); err != nil || !exists {
		t.Errorf("GetByKey(a/one) exists %v (%v) while b is Forbidden, want true", exists, err)
	}

	granted.Store(true)
	if err := framework.PollTrue(ctx, 20*time.Second, "b's informer to sync", w.HasSynced); err != nil {
		t.Fatalf("b's informer never synced once granted: %v", err)
	}
	if _, exists, err := w.GetByKey("b/two"); err != nil || !exists {
		t.Errorf("GetByKey(b/two) exists %v (%v) once b is granted, want true", exists, err)
	}
}

// informersOver is watch's newInformer over client, with no resync.
func informersOver(client *dynamicfake.FakeDynamicClient) func(string, bool, func(context.Context, error)) informers.GenericInformer {
	return func(ns string, narrowed bool, observe func(context.Context, error)) informers.GenericInformer {
		return newInformer(informerClient{Interface: client, list: dynamicLister(client)}, ns, 0, narrowed, observe)
	}
}

// runWatchOver runs a watch over namespaces, fed by client and following
// modes, for a fixture's controller, until the test ends.
func runWatchOver(t *testing.T, ctx context.Context, client *dynamicfake.FakeDynamicClient, namespaces []string, modes watchModes) (*watch, *fixture) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	newInf := informersOver(client)
	f := newFixtureWithClient(t, client, Options{})
	w := newWatch(namespaces, newInf, f.ctrl.attach, modes, false, prometheus.NewGauge(prometheus.GaugeOpts{Name: "watch_narrowed"}))
	f.ctrl.useWatch(w, namespaces)
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	w.Poke()
	return w, f
}

// The one informer over all namespaces is never skipped: refused as
// Forbidden, it holds the workers back as before, since there is nothing
// else to serve.
func TestWatchAllNamespacesForbiddenWaits(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	client := newClient(t, newUUIDObject("a", "one", "1"))
	client.PrependReactor("list", "uuid", func(a k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(uuidGVR.GroupResource(), "", errors.New("no ClusterRole"))
	})
	w, f := runWatchOver(t, ctx, client, nil, func() (bool, bool) { return false, true })
	if err := framework.PollTrue(ctx, 10*time.Second, "the refused list to be recorded", func() bool {
		cur := w.cur.Load()
		if cur == nil {
			return false
		}
		reason, _ := cur.refused.Load(metav1.NamespaceAll)
		return reason == string(metav1.StatusReasonForbidden)
	}); err != nil {
		t.Fatalf("the refused list was never recorded: %v", err)
	}
	if f.ctrl.synced() || w.HasSynced() {
		t.Errorf("Servable %v, HasSynced %v with the only informer refused, want both false", f.ctrl.synced(), w.HasSynced())
	}
}
