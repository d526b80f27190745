package main

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2/ktesting"
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
	newInf := func(n bool) informers.GenericInformer { return newInformer(client, "", 0, n) }
	f := newFixtureWithClient(t, client, Options{})
	w := newWatch(newInf, f.ctrl.attach, func() (bool, bool) { return narrowed.Load(), known.Load() }, false, gauge)
	var sweeps atomic.Int32
	f.ctrl.useWatch(w, "")
	w.onNarrowed = func() { sweeps.Add(1) }
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	defer func() { cancel(); <-done }()

	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(10 * time.Millisecond)
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
	waitFor("the narrowed informer", func() bool { return w.HasSynced() && w.Narrowed() })
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

	forced := newWatch(newInf, f.ctrl.attach, func() (bool, bool) { return true, true }, true, gauge)
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
