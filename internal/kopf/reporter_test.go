package kopf

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/klog/v2"

	"github.com/demo-operator/uuid-controller/internal/testlog"
)

// heldMeta is ns/name's metadata as the reporter's watch sends it, held by
// kopf's finalizer when held.
func heldMeta(name string, held bool) *metav1.PartialObjectMetadata {
	m := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name),
		DeletionTimestamp: &metav1.Time{Time: time.Now()}}}
	if held {
		m.Finalizers = []string{"example.com/other", Finalizer}
	}
	return m
}

// TestReporterNamesEachHeldObjectOnce: the reporter's watch keeps the key
// of each object held by kopf's finalizer and names it once at -v=0,
// whatever the number of its events; it forgets the object once released
// or gone, and no event of a live object or an object not held is named.
func TestReporterNamesEachHeldObjectOnce(t *testing.T) {
	r := newReporter(Config{})
	logger, logs := testlog.New(t, 0)
	ctx := klog.NewContext(t.Context(), logger)
	live := heldMeta("live", true)
	live.DeletionTimestamp = nil
	for _, ev := range []watch.Event{
		{Type: watch.Modified, Object: live},
		{Type: watch.Modified, Object: heldMeta("a", true)},
		{Type: watch.Modified, Object: heldMeta("a", true)},
		{Type: watch.Added, Object: heldMeta("b", true)},
		{Type: watch.Bookmark, Object: &metav1.PartialObjectMetadata{}},
	} {
		if err := r.observe(ctx, ev); err != nil {
			t.Fatal(err)
		}
	}
	if n := r.countWith(nil); n != 2 {
		t.Errorf("%d objects counted held, want 2", n)
	}
	if n := r.countWith([]any{heldMeta("a", true), heldMeta("cached", true)}); n != 3 {
		t.Errorf("%d counted with the cache's index, want 3: a is not counted twice", n)
	}
	out := logs.String()
	if n := strings.Count(out, "waits for kopf's finalizer"); n != 2 {
		t.Errorf("%d lines for two held objects, want 2:\n%s", n, out)
	}
	if !strings.Contains(out, "ns/a") || !strings.Contains(out, "ns/b") || strings.Contains(out, "ns/live") {
		t.Errorf("the lines do not name exactly ns/a and ns/b:\n%s", out)
	}
	for _, ev := range []watch.Event{
		{Type: watch.Modified, Object: heldMeta("a", false)},
		{Type: watch.Deleted, Object: heldMeta("b", true)},
	} {
		if err := r.observe(ctx, ev); err != nil {
			t.Fatal(err)
		}
	}
	if n := r.countWith(nil); n != 0 {
		t.Errorf("%d objects counted held after one was released and one deleted, want 0", n)
	}
}
