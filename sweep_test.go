package main

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/demo-operator/uuid-controller/internal/kopf"
	"github.com/demo-operator/uuid-controller/internal/testlog"
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
