// Package inflight bounds how many syncs the controller runs at once, and
// moves that bound with the apiserver's answers: up while every slot is
// taken and round trips stay fast, down when the apiserver pushes back (an
// HTTP 429 from API Priority and Fairness, or a round trip far slower than
// the fastest seen lately). It is additive increase, multiplicative
// decrease, as TCP's congestion window, so a fixed worker count no longer
// has to outnumber the clients creating objects.
package inflight

import (
	"context"
	"net/http"
	"sync"
	"time"
)

// Config bounds a Limiter. Min is where it starts and the least it falls
// to; Max is the most syncs it ever allows at once.
type Config struct {
	Min, Max int
	// Now is the clock (tests); time.Now when nil.
	Now func() time.Time
}

const (
	// backoff is what a push back multiplies the limit by.
	backoff = 0.7
	// slowFactor and slowSlack: a round trip over both slowFactor times the
	// fastest of the window and that fastest plus slowSlack counts as a
	// push back; the slack keeps a 2 ms apiserver that answers in 8 ms
	// under a burst from halving the limit.
	slowFactor = 4
	slowSlack  = 250 * time.Millisecond
	// rttWindow is how long the fastest round trip is remembered, so the
	// baseline follows an apiserver whose speed changes.
	rttWindow = 30 * time.Second
	// minCutInterval: one burst of push backs (every write in flight
	// answered 429 at once) cuts the limit once, not once per write.
	minCutInterval = 100 * time.Millisecond
)

// Limiter hands out slots. Its zero value is not usable; use New.
type Limiter struct {
	cfg Config

	mu        sync.Mutex
	limit     float64
	inFlight  int
	slowStart bool
	waiters   []chan time.Time
	// minRTT is the fastest round trip of the last window, windowMin the
	// fastest of the current one.
	minRTT, windowMin time.Duration
	windowEnd         time.Time
	lastCut           time.Time
	cuts              [2]int
	// lastFull is when every slot was last taken (or a caller waited): a
	// slot held since before then saw demand at the limit.
	lastFull time.Time
}

// New returns a Limiter at cfg.Min. Min is raised to 1 and Max to Min.
func New(cfg Config) *Limiter {
	cfg.Min = max(cfg.Min, 1)
	cfg.Max = max(cfg.Max, cfg.Min)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Limiter{cfg: cfg, limit: float64(cfg.Min), slowStart: true}
}

// Slot is one sync's share of the limit, from Acquire to Release.
type Slot struct {
	l     *Limiter
	start time.Time
}

// Acquire waits for a slot, in the order callers asked, until ctx ends.
func (l *Limiter) Acquire(ctx context.Context) (*Slot, error) {
	l.mu.Lock()
	now := l.cfg.Now()
	if l.inFlight < int(l.limit) {
		l.inFlight++
		if l.inFlight >= int(l.limit) {
			l.lastFull = now
		}
		l.mu.Unlock()
		return &Slot{l: l, start: now}, nil
	}
	l.lastFull = now
	ready := make(chan time.Time, 1)
	l.waiters = append(l.waiters, ready)
	l.mu.Unlock()
	select {
	case granted := <-ready:
		return &Slot{l: l, start: granted}, nil
	case <-ctx.Done():
		l.mu.Lock()
		defer l.mu.Unlock()
		for i, w := range l.waiters {
			if w == ready {
				l.waiters = append(l.waiters[:i], l.waiters[i+1:]...)
				return nil, ctx.Err()
			}
		}
		// The slot was handed over as ctx ended: give it back.
		l.inFlight--
		l.wake()
		return nil, ctx.Err()
	}
}

// Release returns the slot and feeds its round trip to the limit.
func (s *Slot) Release() {
	l := s.l
	now := l.cfg.Now()
	rtt := now.Sub(s.start)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.inFlight--
	// Demand reached the limit while this slot was held: a fast answer
	// means the apiserver could take more.
	saturated := !l.lastFull.Before(s.start)
	slow := l.minRTT > 0 && rtt > max(slowFactor*l.minRTT, l.minRTT+slowSlack)
	l.observe(now, rtt)
	switch {
	case slow:
		l.cut(now, Slow)
	case saturated && l.slowStart:
		l.limit++
	case saturated:
		l.limit += 1 / l.limit
	}
	l.limit = min(l.limit, float64(l.cfg.Max))
	l.wake()
}

// PushBack lowers the limit: the apiserver answered 429.
func (l *Limiter) PushBack() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cut(l.cfg.Now(), Throttled)
}

// Cause is why the limit was cut.
type Cause int

const (
	// Throttled: the apiserver answered 429.
	Throttled Cause = iota
	// Slow: a round trip far slower than the fastest of the window.
	Slow
)

func (c Cause) String() string { return [...]string{"throttled", "slow"}[c] }

// Limit is the number of slots now.
func (l *Limiter) Limit() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return int(l.limit)
}

// Cuts is how many times the limit was lowered for cause since New.
func (l *Limiter) Cuts(cause Cause) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cuts[cause]
}

func (l *Limiter) observe(now time.Time, rtt time.Duration) {
	if now.After(l.windowEnd) {
		if l.windowMin > 0 {
			l.minRTT = l.windowMin
		}
		l.windowMin, l.windowEnd = 0, now.Add(rttWindow)
	}
	if l.windowMin == 0 || rtt < l.windowMin {
		l.windowMin = rtt
	}
	if l.minRTT == 0 || rtt < l.minRTT {
		l.minRTT = rtt
	}
}

func (l *Limiter) cut(now time.Time, cause Cause) {
	l.slowStart = false
	if now.Sub(l.lastCut) < minCutInterval {
		return
	}
	l.lastCut = now
	l.cuts[cause]++
	l.limit = max(float64(l.cfg.Min), l.limit*backoff)
}

// wake hands free slots to the longest waiters, with the time they got
// them: their round trips start there, and demand was at the limit then.
func (l *Limiter) wake() {
	for len(l.waiters) > 0 && l.inFlight < int(l.limit) {
		l.inFlight++
		l.lastFull = l.cfg.Now()
		l.waiters[0] <- l.lastFull
		l.waiters = l.waiters[1:]
	}
}

// WrapTransport reports each 429 answer through rt to PushBack; client-go
// retries those itself, so its callers never see them.
func (l *Limiter) WrapTransport(rt http.RoundTripper) http.RoundTripper {
	return pushBackTransport{rt: rt, l: l}
}

type pushBackTransport struct {
	rt http.RoundTripper
	l  *Limiter
}

func (t pushBackTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.rt.RoundTrip(req)
	if err == nil && resp.StatusCode == http.StatusTooManyRequests {
		t.l.PushBack()
	}
	return resp, err
}
