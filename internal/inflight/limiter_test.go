package inflight

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time       { return c.t }
func (c *clock) step(d time.Duration) { c.t = c.t.Add(d) }
func newTest(min, max int) (*Limiter, *clock) {
	c := &clock{t: time.Unix(1e9, 0)}
	return New(Config{Min: min, Max: max, Now: c.now}), c
}

// round takes every free slot, lets rtt pass and releases them all: one
// round trip of a queue that always has more work than slots.
func round(t *testing.T, l *Limiter, c *clock, rtt time.Duration) {
	t.Helper()
	var slots []*Slot
	for range l.Limit() {
		s, err := l.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		slots = append(slots, s)
	}
	c.step(rtt)
	for _, s := range slots {
		s.Release()
	}
}

// TestGrowsWhileSaturated: with more work than slots and steady round
// trips, the limit doubles each round (slow start) up to Max.
func TestGrowsWhileSaturated(t *testing.T) {
	l, c := newTest(4, 256)
	var seen []int
	for range 8 {
		round(t, l, c, 10*time.Millisecond)
		seen = append(seen, l.Limit())
	}
	t.Logf("limit after each round: %v", seen)
	if seen[0] != 8 || seen[1] != 16 || seen[5] != 256 || seen[7] != 256 {
		t.Errorf("limits %v, want 8, 16, ... 256 and no more", seen)
	}
}

// TestIdleDoesNotGrow: one sync at a time never saturates a limit of 4,
// so the limit stays where it started.
func TestIdleDoesNotGrow(t *testing.T) {
	l, c := newTest(4, 256)
	for range 100 {
		s, _ := l.Acquire(context.Background())
		c.step(10 * time.Millisecond)
		s.Release()
	}
	if got := l.Limit(); got != 4 {
		t.Errorf("limit %d after 100 lone syncs, want 4", got)
	}
}

// TestPushBackCuts: a 429 cuts the limit to 70 %, once per burst, never
// below Min; growth after it is additive (about one per round).
func TestPushBackCuts(t *testing.T) {
	l, c := newTest(4, 1000)
	for range 6 {
		round(t, l, c, 10*time.Millisecond)
	}
	before := l.Limit()
	for range 50 {
		l.PushBack() // one burst: every write in flight answered 429
	}
	after := l.Limit()
	t.Logf("limit %d, after a burst of 50 push backs %d", before, after)
	if before != 256 || after != 179 || l.Cuts(Throttled) != 1 || l.Cuts(Slow) != 0 {
		t.Errorf("limit %d then %d after %d cuts (%d slow), want 256 then 179 after 1 (0 slow)", before, after, l.Cuts(Throttled), l.Cuts(Slow))
	}
	round(t, l, c, 10*time.Millisecond)
	if got := l.Limit(); got != 180 {
		t.Errorf("a round after a cut grew the limit to %d, want 180 (additive)", got)
	}
	for range 40 {
		c.step(time.Second)
		l.PushBack()
	}
	if got := l.Limit(); got != 4 {
		t.Errorf("limit %d after 40 cuts, want the floor 4", got)
	}
}

// TestSlowRoundTripCuts: a round trip over 4 times and 250 ms beyond the
// fastest counts as push back; one merely 3 times slower does not.
func TestSlowRoundTripCuts(t *testing.T) {
	l, c := newTest(4, 1000)
	for range 4 {
		round(t, l, c, 10*time.Millisecond)
	}
	if got := l.Limit(); got != 64 {
		t.Fatalf("limit %d, want 64", got)
	}
	round(t, l, c, 30*time.Millisecond)
	if l.Cuts(Slow) != 0 {
		t.Errorf("a 30 ms round after 10 ms ones cut the limit")
	}
	grown := l.Limit()
	round(t, l, c, 300*time.Millisecond)
	t.Logf("limit %d, after a 300 ms round %d (cuts %d)", grown, l.Limit(), l.Cuts(Slow))
	if l.Cuts(Slow) != 1 || l.Cuts(Throttled) != 0 || l.Limit() >= grown {
		t.Errorf("a 300 ms round after 10 ms ones: limit %d from %d, %d slow cuts, %d throttled", l.Limit(), grown, l.Cuts(Slow), l.Cuts(Throttled))
	}
}

// TestWaitersServedInOrder: a waiter gets the slot a release frees, in
// the order they asked; one whose context ends gives up its place.
func TestWaitersServedInOrder(t *testing.T) {
	l, c := newTest(1, 1)
	first, _ := l.Acquire(context.Background())
	got := make(chan int, 2)
	ctx, cancel := context.WithCancel(context.Background())
	gone := make(chan error)
	go func() { _, err := l.Acquire(ctx); gone <- err }()
	waitWaiters(t, l, 1)
	for i := range 2 {
		go func() {
			s, err := l.Acquire(context.Background())
			if err == nil {
				got <- i
				c.step(time.Millisecond)
				s.Release()
			}
		}()
		waitWaiters(t, l, 2+i)
	}
	cancel()
	if err := <-gone; err == nil {
		t.Error("Acquire returned a slot after its context ended")
	}
	first.Release()
	var a, b int
	for i, p := range []*int{&a, &b} {
		select {
		case *p = <-got:
		case <-time.After(5 * time.Second):
			t.Fatalf("waiter %d never served: a slot went to the waiter that gave up", i)
		}
	}
	if a != 0 || b != 1 {
		t.Errorf("served %d then %d, want 0 then 1", a, b)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.inFlight != 0 || len(l.waiters) != 0 {
		t.Errorf("after all released: %d in flight, %d waiting", l.inFlight, len(l.waiters))
	}
}

func waitWaiters(t *testing.T, l *Limiter, n int) {
	t.Helper()
	for range 1000 {
		l.mu.Lock()
		w := len(l.waiters)
		l.mu.Unlock()
		if w == n {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("never %d waiters", n)
}

// TestTransportReports429: only a 429 through the wrapped transport cuts.
func TestTransportReports429(t *testing.T) {
	codes := []int{200, 500, 429}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(codes[0])
		codes = codes[1:]
	}))
	defer srv.Close()
	l, _ := newTest(100, 100)
	client := &http.Client{Transport: l.WrapTransport(http.DefaultTransport)}
	for i := range 3 {
		resp, err := client.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if want := map[bool]int{true: 1, false: 0}[i == 2]; l.Cuts(Throttled) != want {
			t.Errorf("after answer %d (%d): %d cuts, want %d", i, resp.StatusCode, l.Cuts(Throttled), want)
		}
	}
}
