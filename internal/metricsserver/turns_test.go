package metricsserver

import (
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"
)

// floodAddrs is how many addresses flood in TestDelegatedAuthShareOfReviewsPerClient.
const floodAddrs = 50

// tokenFlood drives a delegatedAuth on a clock of its own: each step, each
// of floodAddrs addresses sends a new well-formed token (half made-up,
// refused by the TokenReview; half of a ServiceAccount bound to nothing,
// refused by the SubjectAccessReview), then 100 ms pass.
type tokenFlood struct {
	a        *delegatedAuth
	h        http.Handler
	now      time.Time
	made     int
	reviewed map[string]int // the tokens reviewed (401 or 403), by address
}

func newTokenFlood(r *reviewer) *tokenFlood {
	f := &tokenFlood{a: newTestAuth(r), now: time.Unix(1000, 0), reviewed: map[string]int{}}
	f.a.now = func() time.Time { return f.now }
	f.h = f.a.wrap(http.NotFoundHandler())
	return f
}

func (f *tokenFlood) step() {
	for i := range floodAddrs {
		f.made++
		ip := fmt.Sprintf("10.1.0.%d", i+1)
		token := fmt.Sprintf("Bearer made-up-%d", f.made)
		if i%2 == 1 {
			token = fmt.Sprintf("Bearer unbound-%d", f.made)
		}
		if c := scrapeFrom(f.h, ip, token).Code; c == http.StatusUnauthorized || c == http.StatusForbidden {
			f.reviewed[ip]++
		}
	}
	f.now = f.now.Add(100 * time.Millisecond)
}

// TestDelegatedAuthShareOfReviewsPerClient: while 50 addresses flood new
// well-formed tokens (10 a second each), a scraper from another address
// whose token was just rotated is served within 10 s, retrying each
// second: during the flood, and right after a restart (nothing
// remembered, the flood's addresses asking first). A Prometheus asking
// every 30 s is served at its second scrape: the review is kept for it.
// The flood's addresses get a review each in turn (at most one apart)
// and, together, no more than the global budget.
func TestDelegatedAuthShareOfReviewsPerClient(t *testing.T) {
	for _, tc := range []struct {
		name         string
		before       time.Duration // of flood before the scraper's first try
		every, tries int           // the scraper's tries, every so many seconds
	}{
		{"rotated during the flood", 20 * time.Second, 1, 10},
		{"right after a restart", 0, 1, 10},
		{"scraping every 30 s", 20 * time.Second, 30, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &reviewer{users: map[string]string{"t-rotated": "reader"}, allowed: map[string]bool{"reader": true}}
			f := newTokenFlood(r)
			start := f.now
			for range tc.before / (100 * time.Millisecond) {
				f.step()
			}
			var codes []int
			for range tc.tries {
				f.step() // the flood asks first
				code := scrapeFrom(f.h, "10.0.0.1", "Bearer t-rotated").Code
				codes = append(codes, code)
				if code == http.StatusNotFound {
					break
				}
				for range tc.every*10 - 1 {
					f.step()
				}
			}
			took := f.now.Sub(start)
			reviews := slices.Sorted(func(yield func(int) bool) {
				for i := range floodAddrs {
					if !yield(f.reviewed[fmt.Sprintf("10.1.0.%d", i+1)]) {
						return
					}
				}
			})
			total := 0
			for _, n := range reviews {
				total += n
			}
			t.Logf("the scraper's answers, %d s apart: %v; reviews per flooding address in %s: %d to %d, %d in all",
				tc.every, codes, took, reviews[0], reviews[len(reviews)-1], total)
			if codes[len(codes)-1] != http.StatusNotFound {
				t.Errorf("the rotated token got %v in %d tries %d s apart while %d addresses flooded; want served", codes, tc.tries, tc.every, floodAddrs)
			}
			if reviews[len(reviews)-1]-reviews[0] > 1 {
				t.Errorf("the flooding addresses got %d to %d reviews each, want at most one apart (in turns)", reviews[0], reviews[len(reviews)-1])
			}
			if most := unknownReviewBurst + int(took/time.Second)*unknownReviewQPS; total > most {
				t.Errorf("%d addresses got %d reviews in %s, want at most %d (the global budget)", floodAddrs, total, took, most)
			}
		})
	}
}

// TestTurnsBounded: turns remembers at most max addresses (the least
// recently asking forgotten first), and forgets one ttl after its last
// ask, whatever it was waiting for.
func TestTurnsBounded(t *testing.T) {
	tu := newTurns(0, 0, 100, time.Minute) // no review ever: every address waits
	now := time.Unix(1000, 0)
	for i := range 1000 {
		tu.take(fmt.Sprintf("10.2.%d.%d", i/250, i%250), now)
	}
	if n, l, w := tu.remembered(), tu.recent.Len(), len(tu.waiting); n != 100 || l != 100 || w != 100 {
		t.Errorf("after 1,000 addresses asked: %d remembered (%d in the order, %d waiting), want 100", n, l, w)
	}
	if _, ok := tu.addrs["10.2.3.249"]; !ok {
		t.Error("the last address to ask was forgotten, want the least recent ones forgotten")
	}
	now = now.Add(time.Minute)
	tu.take("10.3.0.1", now)
	if n, w := tu.remembered(), len(tu.waiting); n != 1 || w != 1 {
		t.Errorf("a minute (the ttl) later: %d remembered (%d waiting), want only the new asker", n, w)
	}
}
