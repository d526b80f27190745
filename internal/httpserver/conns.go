package httpserver

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// connCap keeps a server at max connections: when one more is accepted,
// it closes one to make room. Unlike a listener that stops accepting, it
// never leaves a new client (the kubelet's next probe) waiting behind
// connections others hold open from many addresses. What it closes, in
// order:
//
//  1. a connection not protected (below): the one in its state longest
//     (idle, not yet through its headers, or past its handler);
//  2. when every other is protected, one still in its grace: from the
//     client address holding the most connections open, the one the server
//     began to read first (one not read yet goes last: the server, not its
//     client, is slow). Each connection thus has the time (max-1) later
//     arrivals take, from when the server is ready to read it, to send its
//     request; a probe sends it at once, so it is read, answered and gone;
//  3. when every other is serving a request, the new one: those end
//     within the write timeout.
//
// A connection is protected while it is serving a request (its handler
// is running, or its answer is being written just after, for at most
// WriteStall) and its writes make progress (none blocked for WriteStall),
// and, in its grace, from when it is accepted until its first request, for
// at most NewConnGrace after the server began to read it. Never by its
// address's order, and never for merely holding a request open: a slow
// body, headers that never end and answers never read protect nothing.
//
// capListener admits the accepted connections, handler marks the
// requests being served, track is the http.Server's ConnState and
// connContext its ConnContext.
type connCap struct {
	max     int
	evicted func(what string) // called once per connection closed to make room
	now     func() time.Time  // tests replace it

	mu    sync.Mutex
	conns map[*capConn]struct{}
}

// What the phases of a connection are, for its protection.
const (
	phaseNone      int32 = iota // no request being served
	phaseHandling               // its handler is running
	phaseAnswering              // its handler returned; the answer's last bytes not yet written
)

// capConn is a connection the cap counts.
type capConn struct {
	net.Conn
	cap      *connCap
	ip       string
	accepted time.Time
	close    func() error

	since time.Time // when it entered its http.ConnState; under cap.mu

	reading   atomic.Int64 // when the server began to read it, unix ns; 0 before
	served    atomic.Bool  // a handler has started on it
	phase     atomic.Int32 // phaseNone, phaseHandling or phaseAnswering
	answering atomic.Int64 // when its handler returned, unix ns
	writing   atomic.Int64 // when the Write in progress began, unix ns; 0 when none
}

func newConnCap(max int, evicted func(what string)) *connCap {
	return &connCap{max: max, evicted: evicted, now: time.Now, conns: map[*capConn]struct{}{}}
}

// admit counts conn, just accepted, and closes one connection to make room
// if the cap is passed; it returns nil when that one is conn itself.
func (c *connCap) admit(conn net.Conn) *capConn {
	now := c.now()
	cc := &capConn{Conn: conn, cap: c, ip: clientIP(conn.RemoteAddr()), accepted: now, since: now}
	cc.close = sync.OnceValue(func() error {
		c.forget(cc)
		return cc.Conn.Close()
	})
	c.mu.Lock()
	c.conns[cc] = struct{}{}
	var victim *capConn
	var what string
	if len(c.conns) > c.max {
		victim, what = c.victim(cc, now)
		delete(c.conns, victim)
	}
	c.mu.Unlock()
	if victim == nil {
		return cc
	}
	// Not on the accept loop: a Close waits for the victim's Read or Write
	// in progress to return, which takes its goroutine being scheduled.
	go victim.Close()
	c.evicted(what)
	if victim == cc {
		return nil
	}
	return cc
}

// The tiers of protection, from none up.
const (
	unprotected = iota
	inGrace
	serving
)

// tier is how cc is protected at now.
func (c *connCap) tier(cc *capConn, now time.Time) int {
	if w := cc.writing.Load(); w != 0 && now.Sub(time.Unix(0, w)) >= WriteStall {
		return unprotected // its client reads nothing
	}
	switch cc.phase.Load() {
	case phaseHandling:
		return serving
	case phaseAnswering:
		if now.Sub(time.Unix(0, cc.answering.Load())) < WriteStall {
			return serving
		}
	}
	if r := cc.reading.Load(); !cc.served.Load() && (r == 0 || now.Sub(time.Unix(0, r)) < NewConnGrace) {
		return inGrace
	}
	return unprotected
}

// victim is the connection to close to make room for accepted, and why;
// c.mu is held.
func (c *connCap) victim(accepted *capConn, now time.Time) (*capConn, string) {
	var oldest *capConn // unprotected, in its state longest
	graced := false
	for cc := range c.conns {
		if cc == accepted {
			continue
		}
		switch c.tier(cc, now) {
		case unprotected:
			if oldest == nil || cc.since.Before(oldest.since) {
				oldest = cc
			}
		case inGrace:
			graced = true
		}
	}
	if oldest != nil {
		return oldest, "the unprotected connection in its state longest"
	}
	if !graced {
		return accepted, "the new connection, every other serving a request"
	}
	open := map[string]int{}
	for cc := range c.conns {
		open[cc.ip]++
	}
	var first *capConn
	for cc := range c.conns {
		if cc == accepted || c.tier(cc, now) != inGrace {
			continue
		}
		if first == nil {
			first = cc
			continue
		}
		if n, m := open[cc.ip], open[first.ip]; n > m || (n == m && readBefore(cc, first)) {
			first = cc
		}
	}
	if first == nil { // served since the first pass
		return accepted, "the new connection, every other serving a request"
	}
	return first, "the connection in its grace read first, of the address holding the most, every other protected"
}

// readBefore is true when the server began to read a before b (one not
// read yet comes last), or at the same time and a was accepted first.
func readBefore(a, b *capConn) bool {
	ra, rb := a.reading.Load(), b.reading.Load()
	switch {
	case ra == rb: // neither read yet, or both at once
		return a.accepted.Before(b.accepted)
	case ra == 0 || rb == 0:
		return rb == 0
	}
	return ra < rb
}

// forget stops counting cc (closed).
func (c *connCap) forget(cc *capConn) {
	c.mu.Lock()
	delete(c.conns, cc)
	c.mu.Unlock()
}

// track is the http.Server's ConnState: it records when a connection
// enters a state, and an idle one serves no request.
func (c *connCap) track(conn net.Conn, state http.ConnState) {
	cc := unwrap(conn)
	if cc == nil {
		return
	}
	switch state {
	case http.StateActive, http.StateIdle:
		if state == http.StateIdle {
			cc.phase.Store(phaseNone)
		}
		c.mu.Lock()
		if _, ok := c.conns[cc]; ok { // not already closed to make room
			cc.since = c.now()
		}
		c.mu.Unlock()
	case http.StateHijacked, http.StateClosed:
		c.forget(cc)
	}
}

type capConnKey struct{}

// connContext is the http.Server's ConnContext: it lets handler find the
// connection a request came on.
func (c *connCap) connContext(ctx context.Context, conn net.Conn) context.Context {
	if cc := unwrap(conn); cc != nil {
		return context.WithValue(ctx, capConnKey{}, cc)
	}
	return ctx
}

// handler marks each request's connection as serving while h runs and
// until the first write after it returns (net/http writes the buffered
// answer then).
func (c *connCap) handler(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cc, _ := r.Context().Value(capConnKey{}).(*capConn)
		if cc == nil {
			h.ServeHTTP(w, r)
			return
		}
		cc.served.Store(true)
		cc.phase.Store(phaseHandling)
		defer func() {
			cc.answering.Store(c.now().UnixNano())
			cc.phase.Store(phaseAnswering)
		}()
		h.ServeHTTP(w, r)
	})
}

// unwrap is the capConn under conn (a TLS connection's underlying one).
func unwrap(conn net.Conn) *capConn {
	if tc, ok := conn.(*tls.Conn); ok {
		conn = tc.NetConn()
	}
	cc, _ := conn.(*capConn)
	return cc
}

func (cc *capConn) Read(b []byte) (int, error) {
	if cc.reading.Load() == 0 {
		cc.reading.CompareAndSwap(0, cc.cap.now().UnixNano())
	}
	return cc.Conn.Read(b)
}

func (cc *capConn) Write(b []byte) (int, error) {
	cc.writing.Store(cc.cap.now().UnixNano())
	n, err := cc.Conn.Write(b)
	cc.writing.Store(0)
	cc.phase.CompareAndSwap(phaseAnswering, phaseNone) // the answer is out
	return n, err
}

// Close closes the connection once and stops counting it.
func (cc *capConn) Close() error { return cc.close() }

// CloseWrite keeps net/http's graceful close (a half-close, then a short
// wait for the client's last bytes) working through the wrapper.
func (cc *capConn) CloseWrite() error {
	if cw, ok := cc.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// capListener admits each connection it accepts to its cap.
type capListener struct {
	net.Listener
	cap *connCap
}

func (l capListener) Accept() (net.Conn, error) {
	for {
		conn, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if cc := l.cap.admit(conn); cc != nil {
			return cc, nil
		}
	}
}
