package main

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/tools/cache"
)

// TestSyncsFollowTheQueue: with many keys queued and syncs that answer
// quickly, the syncs at once rise from the floor to Run's workers and
// never above (internal/inflight's tests hold the rest of the limit).
func TestSyncsFollowTheQueue(t *testing.T) {
	f := newFixture(t, Options{})
	var mu sync.Mutex
	running, peak, done := 0, 0, 0
	all := make(chan struct{})
	const keys, workers = 3000, 64
	f.ctrl.syncHandler = func(ctx context.Context, key cache.ObjectName) error {
		mu.Lock()
		running++
		peak = max(peak, running)
		mu.Unlock()
		time.Sleep(2 * time.Millisecond)
		mu.Lock()
		running--
		if done++; done == keys {
			close(all)
		}
		mu.Unlock()
		return nil
	}
	ctx, cancel := context.WithCancel(f.ctx)
	errc := make(chan error, 1)
	go func() { errc <- f.ctrl.Run(ctx, workers) }()
	for i := range keys {
		f.ctrl.queue.Add(key("ns", strconv.Itoa(i)))
	}
	select {
	case <-all:
	case <-time.After(time.Minute):
		t.Fatalf("only %d of %d keys synced in a minute", done, keys)
	}
	limit := f.ctrl.inFlight.Load().Limit()
	t.Logf("%d keys: peak %d syncs at once, limit %d (floor %d, cap %d)", keys, peak, limit, minInFlight, workers)
	if peak != workers || limit != workers {
		t.Errorf("peak %d syncs at once and limit %d, want both at the cap %d", peak, limit, workers)
	}
	cancel()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}
