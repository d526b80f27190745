// Package testflood holds requests in flight on many connections to an
// HTTP server, as hostile Pods could, for the tests of the servers' limits.
package testflood

import (
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Kind is how a connection holds its request in flight.
type Kind int

const (
	// SlowHeaders sends a request line and then one header line every
	// tick, never the blank line that ends the headers.
	SlowHeaders Kind = iota
	// SlowBody sends a POST's headers with a Content-Length under what
	// net/http discards after the handler (256 KiB), then one
	// byte of body every tick.
	SlowBody
	// Pipelined sends a batch of GETs at once, and another every tick,
	// and never reads an answer (its receive buffer is small, so the
	// answers back up on the server).
	Pipelined
)

func (k Kind) String() string { return [...]string{"slow headers", "slow body", "pipelined"}[k] }

// tick is how often a connection sends its next bytes.
const tick = time.Second

// refusedWithin is, for StartReopening, how soon a close counts as a
// refusal (a reset as the server accepts it, over a cap): the connection
// is made again only a tick later, not in a tight loop.
const refusedWithin = 10 * time.Millisecond

// Flood is a running flood; Stop ends it.
type Flood struct {
	// Dials counts connections made; Closed those the server closed.
	Dials, Closed atomic.Int64
	stop          context.CancelFunc
	wg            sync.WaitGroup
	// reopening: a close is seen at once (StartReopening).
	reopening bool
}

// Start keeps n connections to addr open, from the addresses from in turn
// (connection i from from[i%len(from)]), each holding a request in flight
// of kind kinds[i%len(kinds)] for path. A connection the server closes is
// made again when its next write (each tick) fails, so n stay in flight
// until Stop.
func Start(ctx context.Context, addr, path string, from []net.IP, n int, kinds ...Kind) *Flood {
	return start(ctx, addr, path, from, n, false, kinds)
}

// StartReopening is Start, but a connection the server closes is made
// again the moment the close arrives (but for Pipelined, which reads
// nothing: at its next write): what the server answers is read and
// dropped, and the read ends with the close.
func StartReopening(ctx context.Context, addr, path string, from []net.IP, n int, kinds ...Kind) *Flood {
	return start(ctx, addr, path, from, n, true, kinds)
}

func start(ctx context.Context, addr, path string, from []net.IP, n int, reopening bool, kinds []Kind) *Flood {
	ctx, cancel := context.WithCancel(ctx)
	f := &Flood{stop: cancel, reopening: reopening}
	refused := tick
	if reopening {
		refused = refusedWithin
	}
	for i := range n {
		ip, kind := from[i%len(from)], kinds[i%len(kinds)]
		f.wg.Go(func() {
			for ctx.Err() == nil {
				start := time.Now()
				f.hold(ctx, ip, addr, path, kind)
				if time.Since(start) < refused {
					// Refused at once (over a cap): no tight loop.
					select {
					case <-ctx.Done():
					case <-time.After(tick):
					}
				}
			}
		})
	}
	return f
}

// Stop ends the flood and closes its connections.
func (f *Flood) Stop() {
	f.stop()
	f.wg.Wait()
}

// hold makes one connection and keeps its request in flight until the
// server closes it (a write fails) or ctx is done.
func (f *Flood) hold(ctx context.Context, ip net.IP, addr, path string, kind Kind) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: ip}, Timeout: 5 * time.Second}
	if kind == Pipelined {
		d.Control = func(_, _ string, c syscall.RawConn) error {
			var err error
			_ = c.Control(func(fd uintptr) { err = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
			return err
		}
	}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return
	}
	f.Dials.Add(1)
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	// closed is done when the server closes the connection (reopening).
	var closed chan struct{}
	if f.reopening && kind != Pipelined {
		closed = make(chan struct{})
		go func() {
			defer close(closed)
			_, _ = io.Copy(io.Discard, conn)
		}()
		defer func() { conn.Close(); <-closed }()
	}
	get := fmt.Sprintf("GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", path, addr)
	var first, next string
	switch kind {
	case SlowHeaders:
		first, next = fmt.Sprintf("GET %s HTTP/1.1\r\nHost: %s\r\n", path, addr), "X-Slow: a\r\n"
	case SlowBody:
		first, next = fmt.Sprintf("POST %s HTTP/1.1\r\nHost: %s\r\nContent-Length: 100000\r\n\r\n", path, addr), "a"
	case Pipelined:
		first, next = strings.Repeat(get, 2000), strings.Repeat(get, 20)
	}
	msg := first
	for {
		if err := conn.SetWriteDeadline(time.Now().Add(tick)); err != nil {
			return
		}
		if _, err := conn.Write([]byte(msg)); err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() && ctx.Err() == nil {
				continue // the server reads nothing more: still held
			}
			if ctx.Err() == nil {
				f.Closed.Add(1)
			}
			return
		}
		msg = next
		select {
		case <-ctx.Done():
			return
		case <-closed:
			f.Closed.Add(1)
			return
		case <-time.After(tick):
		}
	}
}

// Shape is a flood the probe servers' tests hold against them.
type Shape struct {
	Name         string
	Addrs, Conns int
	Kinds        []Kind
	// Reopening: StartReopening, else Start.
	Reopening bool
}

// ProbeShapes are the floods the probe servers' tests hold: 400 addresses
// one each (slow headers, made again the moment they are closed, so a
// full server finds every slot in its grace and every address holding
// one), and 1,100 connections from 35 addresses (31-32 each, under the
// per-client cap: one in 19 slow headers, the rest slow bodies and
// pipelined requests whose answers are never read).
func ProbeShapes() []Shape {
	mixed := []Kind{SlowHeaders}
	for range 9 {
		mixed = append(mixed, SlowBody, Pipelined)
	}
	return []Shape{
		{Name: "400 addresses, one each", Addrs: 400, Conns: 400, Kinds: []Kind{SlowHeaders}, Reopening: true},
		{Name: "35 addresses, 31-32 each", Addrs: 35, Conns: 1100, Kinds: mixed},
	}
}

// Start starts s against path on addr, address i being 127.0.x.y from
// 127.0.1.1 on (250 a /24), so 127.0.0.1 sorts before all.
func (s Shape) Start(ctx context.Context, addr, path string) *Flood {
	var from []net.IP
	for i := range s.Addrs {
		from = append(from, net.IPv4(127, 0, byte(1+i/250), byte(1+i%250)))
	}
	if s.Reopening {
		return StartReopening(ctx, addr, path, from, s.Conns, s.Kinds...)
	}
	return Start(ctx, addr, path, from, s.Conns, s.Kinds...)
}
