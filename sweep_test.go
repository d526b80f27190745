package main

import (
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/cache"

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
	f.ctrl.onKopfFinalizer = func() { kopfCalls++ }

	found, listed, err := f.ctrl.sweep(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if found != 2 || listed != 5 {
		t.Errorf("sweep found %d of %d listed, want 2 of 5", found, listed)
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
		if f.ctrl.strays.has(k) {
			t.Errorf("%s is still a stray after its UUID was written", k)
		}
	}
	if n := len(f.patches()); n != 2 {
		t.Errorf("%d patches, want one for each invalid object", n)
	}
}
