package httpserver

import (
	"context"
	"maps"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Sampled logs what clients cause (refused connections and requests) at
// a bounded rate, about once a second with a burst of 3, whatever the
// clients do: the first events are logged one by one, the rest are
// counted by kind and the counts ride on the next line logged.
type Sampled struct {
	limit *rate.Limiter
	now   func() time.Time // tests replace it

	mu       sync.Mutex
	unlogged map[string]int
}

// NewSampled allows one line a second with a burst of 3.
func NewSampled() *Sampled {
	return &Sampled{limit: rate.NewLimiter(rate.Every(time.Second), 3), now: time.Now, unlogged: map[string]int{}}
}

// Do calls log with the counts, by kind, of the events not logged since
// the last line, if the rate allows a line now; else it counts this event
// under kind.
func (s *Sampled) Do(kind string, log func(unlogged map[string]int)) {
	if !s.limit.AllowN(s.now(), 1) {
		s.mu.Lock()
		s.unlogged[kind]++
		s.mu.Unlock()
		return
	}
	log(s.take())
}

// Run calls log every second with the counts of events not yet logged,
// when there are some (and the rate allows a line), until ctx is done:
// the end of a flood is logged too, not only its start.
func (s *Sampled) Run(ctx context.Context, log func(unlogged map[string]int)) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		s.flush(log)
	}
}

// flush logs the counts not yet logged, if any and the rate allows.
func (s *Sampled) flush(log func(unlogged map[string]int)) {
	s.mu.Lock()
	pending := len(s.unlogged) > 0
	s.mu.Unlock()
	if pending && s.limit.AllowN(s.now(), 1) {
		log(s.take())
	}
}

func (s *Sampled) take() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	u := maps.Clone(s.unlogged)
	clear(s.unlogged)
	return u
}
