package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	"github.com/demo-operator/uuid-controller/test/framework"
)

// uuidHistory records, from a watch on one namespace, every distinct
// status.uuid each object has had. Unlike the audit log, which can only say
// what the apiserver answered a client that may have gone, a watch sees each
// committed version, so it tells whether a UUID was ever overwritten.
type uuidHistory struct {
	mu   sync.Mutex
	seen map[string][]string
	stop func()
	done chan struct{}
}

// watchUUIDs starts recording ns: what a list finds now, then every change
// from a watch that resumes where it stopped when the apiserver closes it
// (as it does a watcher that falls behind a burst); checkOnce reads it.
func watchUUIDs(ctx context.Context, t *testing.T, ns string) *uuidHistory {
	t.Helper()
	h := &uuidHistory{seen: map[string][]string{}, done: make(chan struct{})}
	list, err := uuids(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("list %s: %v", ns, err)
	}
	for i := range list.Items {
		h.record(&list.Items[i])
	}
	wctx, cancel := context.WithCancel(ctx)
	w, err := watchtools.NewRetryWatcherWithContext(wctx, list.GetResourceVersion(), &cache.ListWatch{
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			return uuids(ns).Watch(ctx, opts)
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
			if u, ok := ev.Object.(*unstructured.Unstructured); ok && (ev.Type == watch.Added || ev.Type == watch.Modified) {
				h.record(u)
			}
		}
	}()
	t.Cleanup(h.Stop)
	return h
}

// record notes u's UUID when it differs from the last one seen.
func (h *uuidHistory) record(u *unstructured.Unstructured) {
	id, _, _ := unstructured.NestedString(u.Object, "status", "uuid")
	h.mu.Lock()
	defer h.mu.Unlock()
	if ids := h.seen[u.GetName()]; id != "" && (len(ids) == 0 || ids[len(ids)-1] != id) {
		h.seen[u.GetName()] = append(ids, id)
	}
}

// Stop ends the watch and waits for the recorder to finish.
func (h *uuidHistory) Stop() {
	h.stop()
	<-h.done
}

// checkOnce waits up to 30 s for the watch to see each object in want with
// its UUID (a watch can trail the reads that found them), stops it, and
// fails the test unless each was seen with exactly one UUID, the one in want.
func (h *uuidHistory) checkOnce(ctx context.Context, t *testing.T, want map[string]string) {
	t.Helper()
	err := framework.Poll(ctx, 30*time.Second, "the watch to see every UUID", func(context.Context) error {
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
