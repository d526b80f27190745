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

// watchUUIDs starts recording ns; checkOnce reads it.
func watchUUIDs(ctx context.Context, t *testing.T, ns string) *uuidHistory {
	t.Helper()
	w, err := uuids(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("watch %s: %v", ns, err)
	}
	h := &uuidHistory{seen: map[string][]string{}, stop: w.Stop, done: make(chan struct{})}
	go func() {
		defer close(h.done)
		for ev := range w.ResultChan() {
			u, ok := ev.Object.(*unstructured.Unstructured)
			if !ok || (ev.Type != watch.Added && ev.Type != watch.Modified) {
				continue
			}
			id, _, _ := unstructured.NestedString(u.Object, "status", "uuid")
			h.mu.Lock()
			if ids := h.seen[u.GetName()]; id != "" && (len(ids) == 0 || ids[len(ids)-1] != id) {
				h.seen[u.GetName()] = append(ids, id)
			}
			h.mu.Unlock()
		}
	}()
	t.Cleanup(h.Stop)
	return h
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
