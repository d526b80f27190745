package main

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/demo-operator/uuid-controller/internal/kopf"
	"github.com/demo-operator/uuid-controller/internal/testlog"
	"github.com/demo-operator/uuid-controller/test/framework"
)

// A sweep queues exactly the objects whose status.uuid is not a UUID, reads
// them from the apiserver rather than the cache (a narrowed watch never
// holds them), replaces each with one write, and forgets them once done;
// it counts the objects carrying kopf's finalizer.
func TestSweepFindsInvalidUUIDs(t *testing.T) {
	kopfObj := withStatus(newUUIDObject("ns", "kopf", "4"), map[string]any{"uuid": testUUID})
	kopfObj.SetFinalizers([]string{kopf.Finalizer})
	objs := []*unstructured.Unstructured{
		withStatus(newUUIDObject("ns", "na", "1"), map[string]any{"state": "Erreur", "uuid": "NA"}),
		withStatus(newUUIDObject("ns", "done", "2"), map[string]any{"uuid": testUUID}),
		newUUIDObject("ns", "pending", "3"),
		kopfObj,
		withStatus(newUUIDObject("other", "number", "5"), map[string]any{"uuid": int64(7)}),
	}
	client := newClient(t)
	for _, obj := range objs {
		if err := client.Tracker().Create(uuidGVR, obj, obj.GetNamespace()); err != nil {
			t.Fatal(err)
		}
	}
	f := newFixtureWithClient(t, client, Options{})
	preconditionReactor(t, client)
	n, err := f.ctrl.sweeps.sweep(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n.found != 2 || n.listed != 5 {
		t.Errorf("sweep found %d of %d listed, want 2 of 5", n.found, n.listed)
	}
	if n.kopf != 1 || n.kopfHeld != 0 {
		t.Errorf("sweep counted %d objects carrying kopf's finalizer, %d held, want 1 and 0", n.kopf, n.kopfHeld)
	}
	if n := f.ctrl.queue.Len(); n != 2 {
		t.Errorf("queue holds %d keys, want the 2 invalid ones", n)
	}
	f.drive(2)
	for _, k := range []cache.ObjectName{key("ns", "na"), key("other", "number")} {
		if got := uuidInAPI(t, client, k.Namespace, k.Name); got != testUUID {
			t.Errorf("%s: status.uuid %q after the sweep's work, want %q", k, got, testUUID)
		}
		if f.ctrl.sweeps.strays.has(k) {
			t.Errorf("%s is still a stray after its UUID was written", k)
		}
	}
	if n := len(f.patches()); n != 2 {
		t.Errorf("%d patches, want one for each invalid object", n)
	}
}

// No object decides what the controller watches: objects carrying kopf's
// finalizer, live or held in deletion, on an event or found by sweeps,
// leave the watch narrowed (the CRD allows it), and each held one is named
// once at -v=0 however often it is swept.
func TestNoObjectDecidesTheWatch(t *testing.T) {
	held := withStatus(newUUIDObject("ns", "held", "1"), map[string]any{"uuid": testUUID})
	held.SetFinalizers([]string{"other", kopf.Finalizer})
	held.SetDeletionTimestamp(&metav1.Time{Time: time.Now()})
	pending := newUUIDObject("ns", "pending", "2")
	pending.SetFinalizers([]string{kopf.Finalizer})
	client := newClient(t, held, pending)
	f := newFixtureWithClient(t, client, Options{})
	w := newWatch(nil, informersOver(client), f.ctrl.attach, func() (bool, bool) { return true, true }, false,
		prometheus.NewGauge(prometheus.GaugeOpts{Name: "watch_narrowed"}))
	f.ctrl.useWatch(w, nil)
	logger, logs := testlog.New(t, 0)
	ctx := klog.NewContext(f.ctx, logger)
	f.ctrl.enqueue(logger, toCached(pending))
	f.ctrl.enqueue(logger, toCached(held))
	for range 2 {
		n, err := f.ctrl.sweeps.sweep(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n.kopf != 2 || n.kopfHeld != 1 {
			t.Errorf("sweep counted %d objects carrying kopf's finalizer, %d held, want 2 and 1", n.kopf, n.kopfHeld)
		}
	}
	if narrowed, known := w.want(); !narrowed || !known {
		t.Errorf("watch wants narrowed %v (known %v) after objects carrying kopf's finalizer were seen, want the narrowed watch the CRD allows", narrowed, known)
	}
	if got := strings.Count(logs.String(), "waits for kopf's finalizer"); got != 1 {
		t.Errorf("%d lines name the held object after two sweeps, want 1:\n%s", got, logs)
	}
	if !strings.Contains(logs.String(), "ns/held") {
		t.Errorf("the line does not name ns/held:\n%s", logs)
	}
}

// A sweep that outlasts etcd's compaction gets 410 Expired for its next
// page; it goes on from the token that answer carries, and fails (wrapped,
// with how far it got) when the answer has none or the same token again.
func TestSweepGoesOnAfterExpiredToken(t *testing.T) {
	expired := func(next string) error {
		err := apierrors.NewResourceExpired("The provided continue parameter is too old")
		err.ErrStatus.ListMeta.Continue = next
		return err
	}
	page := func(cont string, objs ...*unstructured.Unstructured) *unstructured.UnstructuredList {
		list := &unstructured.UnstructuredList{}
		list.SetContinue(cont)
		for _, o := range objs {
			list.Items = append(list.Items, *o)
		}
		return list
	}
	na := func(name string) *unstructured.Unstructured {
		return withStatus(newUUIDObject("ns", name, "1"), map[string]any{"uuid": "NA"})
	}
	for _, tc := range []struct {
		name    string
		answers map[string]func() (runtime.Object, error) // by continue token
		want    sweepCounts
		wantErr string
	}{{
		name: "token in the 410",
		answers: map[string]func() (runtime.Object, error){
			"":       func() (runtime.Object, error) { return page("old", na("a")), nil },
			"old":    func() (runtime.Object, error) { return nil, expired("latest") },
			"latest": func() (runtime.Object, error) { return page("", na("b")), nil },
		},
		want: sweepCounts{found: 2, listed: 2, expired: 1},
	}, {
		name: "no token in the 410",
		answers: map[string]func() (runtime.Object, error){
			"":    func() (runtime.Object, error) { return page("old", na("a")), nil },
			"old": func() (runtime.Object, error) { return nil, expired("") },
		},
		want:    sweepCounts{found: 1, listed: 1},
		wantErr: "listing uuid.demo.operator in namespace ns (1 listed): The provided continue parameter is too old",
	}, {
		name: "the same token again",
		answers: map[string]func() (runtime.Object, error){
			"":    func() (runtime.Object, error) { return page("old", na("a")), nil },
			"old": func() (runtime.Object, error) { return nil, expired("old") },
		},
		want:    sweepCounts{found: 1, listed: 1},
		wantErr: "(1 listed): The provided continue parameter is too old",
	}, {
		name: "410 on the first page",
		answers: map[string]func() (runtime.Object, error){
			"": func() (runtime.Object, error) { return nil, expired("latest") },
		},
		wantErr: "(0 listed): The provided continue parameter is too old",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			client := newClient(t)
			lists := 0
			client.PrependReactor("list", uuidGVR.Resource, func(a k8stesting.Action) (bool, runtime.Object, error) {
				opts := a.(k8stesting.ListActionImpl).ListOptions
				if opts.Limit != sweepPageSize {
					return false, nil, nil // the informer's, or not a sweep's page
				}
				if lists++; lists > 10 {
					t.Errorf("more than 10 lists: the sweep goes round in circles")
					return true, nil, errors.New("too many lists")
				}
				answer, ok := tc.answers[opts.Continue]
				if !ok {
					t.Fatalf("list with unexpected continue token %q", opts.Continue)
				}
				obj, err := answer()
				return true, obj, err
			})
			f := newFixtureWithClient(t, client, Options{})
			// One namespace: the fake drops a cluster-wide list's limit
			// and continue token before the reactor sees them.
			f.ctrl.sweeps.namespaces = []string{"ns"}
			n, err := f.ctrl.sweeps.sweep(f.ctx)
			if n != tc.want {
				t.Errorf("sweep counted %+v, want %+v", n, tc.want)
			}
			if tc.wantErr == "" && err != nil {
				t.Errorf("sweep: %v", err)
			}
			if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("sweep error %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

// fakeRecord is a sweepRecord in memory.
type fakeRecord struct {
	mu            sync.Mutex
	crd, recorded string
	crdErr        error
}

func (r *fakeRecord) CRD(context.Context) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.crd, r.crdErr
}

func (r *fakeRecord) Recorded(context.Context) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.recorded, nil
}

func (r *fakeRecord) get() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.recorded
}

func (r *fakeRecord) Record(_ context.Context, crd string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recorded = crd
	return nil
}

// TestSweepSkippedUnderRecordedCRD: a sweep that finds every status.uuid
// valid is recorded with the CRD read before it; a request under that CRD
// sweeps nothing; under a changed CRD, or with the CRD unreadable, it
// sweeps; a sweep that found an invalid value is not recorded.
func TestSweepSkippedUnderRecordedCRD(t *testing.T) {
	client := newClient(t, withStatus(newUUIDObject("ns", "done", "1"), map[string]any{"uuid": testUUID}))
	f := newFixtureWithClient(t, client, Options{})
	rec := &fakeRecord{crd: "uid-1/1"}
	s := f.ctrl.sweeps
	s.narrowed, s.record = func() bool { return true }, rec
	ctx, cancel := context.WithCancel(f.ctx)
	done := make(chan struct{})
	go func() { defer close(done); s.run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	lists := func() int {
		n := 0
		for _, a := range client.Actions() {
			if a.GetVerb() == "list" {
				n++
			}
		}
		return n
	}
	// step requests a sweep and waits until its result is counted.
	step := func(what string, wantLists int, result string) {
		t.Helper()
		before := testutil.ToFloat64(f.metrics.Sweeps.WithLabelValues(result))
		s.request()
		if err := framework.PollTrue(ctx, 5*time.Second, what, func() bool {
			return testutil.ToFloat64(f.metrics.Sweeps.WithLabelValues(result)) == before+1
		}); err != nil {
			t.Fatal(err)
		}
		if got := lists(); got != wantLists {
			t.Errorf("%s: %d lists in all, want %d", what, got, wantLists)
		}
	}
	step("the first sweep", 1, "ok")
	if got := rec.get(); got != "uid-1/1" {
		t.Fatalf("recorded %q after a clean sweep, want the CRD read before it", got)
	}
	step("a request under the recorded CRD", 1, "skipped")
	rec.mu.Lock()
	rec.crd = "uid-1/2"
	rec.mu.Unlock()
	step("a request under a changed CRD", 2, "ok")
	step("a request under the new recorded CRD", 2, "skipped")
	rec.mu.Lock()
	rec.crdErr = errors.New("forbidden")
	rec.mu.Unlock()
	step("a request with the CRD unreadable", 3, "ok")

	stray := withStatus(newUUIDObject("ns", "stray", "2"), map[string]any{"uuid": "NA"})
	if err := client.Tracker().Create(uuidGVR, stray, "ns"); err != nil {
		t.Fatal(err)
	}
	rec.mu.Lock()
	rec.crd, rec.crdErr = "uid-2/1", nil
	rec.mu.Unlock()
	step("a sweep finding a stray", 4, "ok")
	if got := rec.get(); got != "uid-1/2" {
		t.Errorf("recorded %q after a sweep that found a stray, want the earlier record kept", got)
	}
}
