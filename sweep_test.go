package main

import (
	"errors"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/demo-operator/uuid-controller/internal/kopf"
)

// A sweep queues exactly the objects whose status.uuid is not a UUID, reads
// them from the apiserver rather than the cache (a narrowed watch never
// holds them), replaces each with one write, and forgets them once done;
// the first object carrying kopf's finalizer keeps the full watch.
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
	kopfCalls := 0
	f.ctrl.sweeps.onKopfFinalizer = func() { kopfCalls++ }

	n, err := f.ctrl.sweeps.sweep(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n.found != 2 || n.listed != 5 {
		t.Errorf("sweep found %d of %d listed, want 2 of 5", n.found, n.listed)
	}
	if kopfCalls != 1 {
		t.Errorf("onKopfFinalizer called %d times, want once", kopfCalls)
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

// An object that arrives carrying kopf's finalizer (its UUID not yet
// written, so a narrowed watch sees it) keeps the full watch, without a
// sweep: once it has its UUID the narrowed watch would lose it, and its
// deletion would hang on kopf's finalizer unseen.
func TestKopfFinalizerSeenOnAnEvent(t *testing.T) {
	f := newFixture(t, Options{})
	kopfCalls := 0
	f.ctrl.sweeps.onKopfFinalizer = func() { kopfCalls++ }
	plain := newUUIDObject("ns", "plain", "1")
	f.ctrl.enqueue(klog.FromContext(f.ctx), toCached(plain))
	if kopfCalls != 0 {
		t.Fatalf("onKopfFinalizer called for an object without kopf's finalizer")
	}
	held := newUUIDObject("ns", "held", "2")
	held.SetFinalizers([]string{"other", kopf.Finalizer})
	f.ctrl.enqueue(klog.FromContext(f.ctx), toCached(held))
	if kopfCalls != 1 {
		t.Errorf("onKopfFinalizer called %d times for an object carrying kopf's finalizer, want once", kopfCalls)
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
