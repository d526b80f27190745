package metricsserver

import (
	"container/list"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// turns shares the budget for reviewing new tokens between the client
// addresses asking for it, in turns. Each review the budget allows goes to
// the waiting address served longest ago (one not served yet first, in the
// order they began to wait) and is kept for that address's next ask. An
// ask that finds no review kept for its address is refused and leaves the
// address waiting where it was: a refusal spends nothing and never moves
// an address back. So N addresses flooding get a review each per N/rate
// seconds, and an address that asks rarely, such as a Prometheus whose
// token was just rotated, gets the next review whatever the others send.
//
// It remembers at most max addresses, each for ttl after its last ask,
// forgetting the least recently asking first: memory is bounded however
// many addresses ask, and a forgotten address asks again as a new one.
type turns struct {
	mu     sync.Mutex
	budget *rate.Limiter
	addrs  map[string]*turn
	// waiting holds the turns that wait for a review.
	waiting map[*turn]struct{}
	recent  list.List // of *turn, the least recently asking at the front
	max     int
	ttl     time.Duration
	// seq numbers the services and the starts of waits, in order.
	seq uint64
}

// turn is what turns remembers of one address.
type turn struct {
	addr  string
	elem  *list.Element
	asked time.Time // its last ask
	// served is when (seq) a review was last kept for it, 0 for never;
	// waiting is since when (seq) it waits for one, 0 when it does not.
	served, waiting uint64
	// kept is a review kept for its next ask.
	kept bool
}

func newTurns(r rate.Limit, burst, max int, ttl time.Duration) *turns {
	return &turns{budget: rate.NewLimiter(r, burst), addrs: map[string]*turn{}, waiting: map[*turn]struct{}{}, max: max, ttl: ttl}
}

// take is whether addr may have a new token reviewed now: whether a review
// is kept for it, after handing out what the budget allows.
func (t *turns) take(addr string, now time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	a := t.remember(addr, now)
	if !a.kept && a.waiting == 0 {
		t.seq++
		a.waiting = t.seq
		t.waiting[a] = struct{}{}
	}
	t.handOut(now)
	if !a.kept {
		return false
	}
	a.kept = false
	return true
}

// handOut keeps each review the budget allows now for the waiting address
// whose turn it is.
func (t *turns) handOut(now time.Time) {
	for t.budget.TokensAt(now) >= 1 {
		next := t.next()
		if next == nil || !t.budget.AllowN(now, 1) {
			return
		}
		t.seq++
		next.kept, next.served, next.waiting = true, t.seq, 0
		delete(t.waiting, next)
	}
}

// next is the waiting address served longest ago, nil if none waits. It
// looks at every waiting address, at most max, once per review handed out.
func (t *turns) next() *turn {
	var best *turn
	for a := range t.waiting {
		if best == nil || a.served < best.served || (a.served == best.served && a.waiting < best.waiting) {
			best = a
		}
	}
	return best
}

// remember returns addr's turn, made if new, as the most recent asker,
// after forgetting the addresses that have not asked for ttl and, when
// full, the least recently asking one.
func (t *turns) remember(addr string, now time.Time) *turn {
	for e := t.recent.Front(); e != nil && now.Sub(e.Value.(*turn).asked) >= t.ttl; e = t.recent.Front() {
		t.forget(e)
	}
	a, ok := t.addrs[addr]
	if !ok {
		if len(t.addrs) >= t.max {
			t.forget(t.recent.Front())
		}
		a = &turn{addr: addr}
		a.elem = t.recent.PushBack(a)
		t.addrs[addr] = a
	}
	t.recent.MoveToBack(a.elem)
	a.asked = now
	return a
}

func (t *turns) forget(e *list.Element) {
	a := t.recent.Remove(e).(*turn)
	delete(t.addrs, a.addr)
	delete(t.waiting, a)
}

// remembered is how many addresses t remembers.
func (t *turns) remembered() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.addrs)
}
