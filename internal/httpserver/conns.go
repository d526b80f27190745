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
// With evictBusy (the probe server's), the connection that goes is the
// one in its state longest of the client address holding the most, even
// with a request in progress: then no number of requests held in flight
// (slow bodies, answers never read) can fill the server, and however fast
// a flood from many addresses churns, a client holding one connection
// (the kubelet's probe) is not the one closed.
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
	ip    string    // the client's address, with evictBusy
}

func newConnCap(max int, evictBusy bool, evicted func()) *connCap {
	return &connCap{max: max, evictBusy: evictBusy, evicted: evicted, conns: map[net.Conn]connEntry{}}
}

func (c *connCap) track(conn net.Conn, state http.ConnState) {
	c.mu.Lock()
	var victim net.Conn
	switch state {
	case http.StateNew:
		e := connEntry{state: state, since: time.Now()}
		if c.evictBusy {
			e.ip = clientIP(conn.RemoteAddr())
		}
		c.conns[conn] = e
		if len(c.conns) > c.max {
			victim = c.longestWaiting(conn)
			delete(c.conns, victim)
		}
	case http.StateActive, http.StateIdle:
		if e, ok := c.conns[conn]; ok { // not already closed to make room
			e.state, e.since = state, time.Now()
			c.conns[conn] = e
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
	if c.evictBusy {
		return c.oldestOfBiggest(accepted)
	}
	victim, oldest := accepted, time.Time{}
	for conn, e := range c.conns {
		if conn == accepted || e.state == http.StateActive {
			continue
		}
		if oldest.IsZero() || e.since.Before(oldest) {
			victim, oldest = conn, e.since
		}
	}
	return victim
}

// oldestOfBiggest is, of the client address with the most connections
// open, the connection other than the one just accepted that has been in
// its state longest.
func (c *connCap) oldestOfBiggest(accepted net.Conn) net.Conn {
	open := map[string]int{}
	for conn, e := range c.conns {
		if conn != accepted {
			open[e.ip]++
		}
	}
	biggest := ""
	for ip, n := range open {
		if n > open[biggest] || (n == open[biggest] && ip < biggest) {
			biggest = ip
		}
	}
	victim, oldest := accepted, time.Time{}
	for conn, e := range c.conns {
		if conn == accepted || e.ip != biggest {
			continue
		}
		if oldest.IsZero() || e.since.Before(oldest) {
			victim, oldest = conn, e.since
		}
	}
	return victim
}
