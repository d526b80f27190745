package httpserver

import (
	"net"
	"net/http"
	"sync"
	"time"
)

// connCap keeps a server at max connections by closing, when one more
// arrives, the connection that has waited longest without a request in
// progress (idle between requests, or not yet through its headers). Unlike
// a listener that stops accepting, it never leaves a new client (the
// kubelet's next probe) waiting behind connections that others hold open
// from many addresses. Its track method is the http.Server's ConnState.
// With evictBusy (the probe server's), the connection open longest goes
// even with a request in progress: then no number of requests held in
// flight (slow bodies, answers never read) can fill the server.
type connCap struct {
	max       int
	evictBusy bool
	evicted   func() // called once per connection closed to make room

	mu    sync.Mutex
	conns map[net.Conn]connEntry
}

type connEntry struct {
	state http.ConnState
	since time.Time // when it entered state
}

func newConnCap(max int, evictBusy bool, evicted func()) *connCap {
	return &connCap{max: max, evictBusy: evictBusy, evicted: evicted, conns: map[net.Conn]connEntry{}}
}

func (c *connCap) track(conn net.Conn, state http.ConnState) {
	c.mu.Lock()
	var victim net.Conn
	switch state {
	case http.StateNew:
		c.conns[conn] = connEntry{state, time.Now()}
		if len(c.conns) > c.max {
			victim = c.longestWaiting(conn)
			delete(c.conns, victim)
		}
	case http.StateActive, http.StateIdle:
		if _, ok := c.conns[conn]; ok { // not already closed to make room
			c.conns[conn] = connEntry{state, time.Now()}
		}
	case http.StateHijacked, http.StateClosed:
		delete(c.conns, conn)
	}
	c.mu.Unlock()
	if victim != nil {
		// Not on the accept loop: a TLS close writes an alert, which a
		// client that reads nothing can hold up.
		go victim.Close()
		c.evicted()
	}
}

// longestWaiting is the new or idle connection, other than the one just
// accepted, that has been so the longest (with evictBusy, the connection
// other than the one just accepted whose state is oldest, busy or not);
// the one just accepted when every other has a request in progress (those
// end within WriteTimeout).
func (c *connCap) longestWaiting(accepted net.Conn) net.Conn {
	victim, oldest := accepted, time.Time{}
	for conn, e := range c.conns {
		if conn == accepted || (e.state == http.StateActive && !c.evictBusy) {
			continue
		}
		if oldest.IsZero() || e.since.Before(oldest) {
			victim, oldest = conn, e.since
		}
	}
	return victim
}
