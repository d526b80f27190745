package httpserver

import (
	"context"
	"errors"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// dialFrom connects to addr from the loopback address ip (every 127.x
// address is loopback); nil when the connection was reset at once.
func dialFrom(t *testing.T, ip, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return nil // refused before the handshake ended: a reset
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closedByPeer is true when a read on c, which the peer never writes to,
// ends in anything but a timeout: EOF or a reset.
func closedByPeer(t *testing.T, c net.Conn) bool {
	t.Helper()
	if err := c.SetReadDeadline(time.Now().Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	_, err := c.Read(make([]byte, 1))
	ne, ok := err.(net.Error)
	return !ok || !ne.Timeout()
}

// TestLimitPerClient: a client address gets at most max connections at
// once; one more is closed as it is accepted (and reported), while
// another address is served; closing a connection frees its slot.
func TestLimitPerClient(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var refused []string
	ln := LimitPerClient(inner, 2, func(ip string) {
		mu.Lock()
		defer mu.Unlock()
		refused = append(refused, ip)
	})
	defer ln.Close()
	accepted := make(chan net.Conn, 10)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	accept := func(why string) net.Conn {
		t.Helper()
		select {
		case c := <-accepted:
			return c
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: not accepted within 5 s", why)
			return nil
		}
	}
	addr := inner.Addr().String()

	dialFrom(t, "127.0.0.2", addr)
	first := accept("the first connection from 127.0.0.2")
	dialFrom(t, "127.0.0.2", addr)
	accept("the second connection from 127.0.0.2")
	third := dialFrom(t, "127.0.0.2", addr)
	if third != nil && !closedByPeer(t, third) {
		t.Error("a third connection from 127.0.0.2 was kept open, want it closed at once")
	}
	dialFrom(t, "127.0.0.3", addr)
	accept("a connection from another address, 127.0.0.3")

	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	_ = first.Close() // a second Close frees nothing more
	again := dialFrom(t, "127.0.0.2", addr)
	accept("a connection from 127.0.0.2 after one of its two closed")
	if closedByPeer(t, again) {
		t.Error("the connection that took the freed slot was closed")
	}
	// A second Close of first freed nothing: this one is over the cap.
	dialFrom(t, "127.0.0.2", addr)
	err = wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		select {
		case <-accepted:
			return false, errors.New("a second Close of one connection freed two slots")
		default:
		}
		mu.Lock()
		defer mu.Unlock()
		return len(refused) == 2, nil
	})
	if err != nil && !wait.Interrupted(err) {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(refused, []string{"127.0.0.2", "127.0.0.2"}) {
		t.Errorf("refused reported %v, want 127.0.0.2 twice", refused)
	}
}
