package framework

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
)

// UUIDHistory records, from a watch on one namespace, every distinct
// status.uuid each object has had. Unlike the audit log, which can only say
// what the apiserver answered a client that may have gone, a watch sees each
// committed version, so it tells whether a UUID was ever overwritten.
type UUIDHistory struct {
	mu   sync.Mutex
	seen map[string][]string
	err  error // a watch.Error event: the watch broke off
	stop func()
	done chan struct{}
}

// WatchUUIDs starts recording ns: what a list finds now, then every change
// from a watch that resumes where it stopped when the apiserver closes it
// (as it does a watcher that falls behind a burst); CheckOnce or CheckUnchanged reads it.
func (c Clients) WatchUUIDs(ctx context.Context, t *testing.T, ns string) *UUIDHistory {
	t.Helper()
	h := &UUIDHistory{seen: map[string][]string{}, done: make(chan struct{})}
	list, err := c.Uuids(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("list %s: %v", ns, err)
	}
	for i := range list.Items {
		h.record(&list.Items[i])
	}
	wctx, cancel := context.WithCancel(ctx)
	w, err := watchtools.NewRetryWatcherWithContext(wctx, list.GetResourceVersion(), &cache.ListWatch{
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			return c.Uuids(ns).Watch(ctx, opts)
		},
	})
	if err != nil {
		cancel()
		t.Fatalf("watch %s: %v", ns, err)
	}
	h.stop = func() { cancel(); w.Stop() }
	go func() {
		defer close(h.done)
		for ev := range w.ResultChan() {
			if ev.Type == watch.Error {
				h.mu.Lock()
				h.err = fmt.Errorf("watch %s: %v", ns, ev.Object)
				h.mu.Unlock()
				continue
			}
			if u, ok := ev.Object.(*unstructured.Unstructured); ok && (ev.Type == watch.Added || ev.Type == watch.Modified) {
				h.record(u)
			}
		}
	}()
	t.Cleanup(h.Stop)
	return h
}

// record notes u's UUID when it differs from the last one seen.
func (h *UUIDHistory) record(u *unstructured.Unstructured) {
	id, _, _ := unstructured.NestedString(u.Object, "status", "uuid")
	h.mu.Lock()
	defer h.mu.Unlock()
	if ids := h.seen[u.GetName()]; id != "" && (len(ids) == 0 || ids[len(ids)-1] != id) {
		h.seen[u.GetName()] = append(ids, id)
	}
}

// Stop ends the watch and waits for the recorder to finish.
func (h *UUIDHistory) Stop() {
	h.stop()
	<-h.done
}

// CheckOnce waits up to 30 s for the watch to see each object in want with
// its UUID (a watch can trail the reads that found them), stops it, and
// fails the test unless each was seen with exactly one UUID, the one in want.
func (h *UUIDHistory) CheckOnce(ctx context.Context, t *testing.T, want map[string]string) {
	t.Helper()
	err := Poll(ctx, 30*time.Second, "the watch to see every UUID", func(context.Context) error {
		h.mu.Lock()
		defer h.mu.Unlock()
		behind := 0
		for name, id := range want {
			if ids := h.seen[name]; len(ids) == 0 || ids[len(ids)-1] != id {
				behind++
			}
		}
		if behind > 0 {
			return fmt.Errorf("%d of %d objects not seen with their UUID yet", behind, len(want))
		}
		return nil
	})
	h.Stop()
	if err != nil {
		t.Error(err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for name, id := range want {
		if got := h.seen[name]; len(got) != 1 || got[0] != id {
			t.Errorf("%s: the watch saw UUIDs %v, want only %s", name, got, id)
		}
	}
}

// CheckUnchanged fails the test if the watch saw an object's UUID change
// or broke off (a watch that broke off saw nothing after, and must not
// read as "no change"). It leaves the watch running.
func (h *UUIDHistory) CheckUnchanged(t *testing.T) {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.err != nil {
		t.Error(h.err)
	}
	var changes []string
	for name, ids := range h.seen {
		if len(ids) > 1 {
			changes = append(changes, fmt.Sprintf("%s: %q", name, ids))
		}
	}
	if len(changes) > 0 {
		slices.Sort(changes)
		t.Errorf("a watch saw %d UUIDs change: %v", len(changes), changes)
	}
}
