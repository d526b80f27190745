package httpserver

import (
	"net"
	"sync"
)

// LimitPerClient returns a listener that accepts at most max connections
// open at once from each client IP address: a connection over the cap is
// closed as it is accepted (with a reset, so it leaves no state behind on
// this side), before any TLS handshake or read, and refused is called with
// the address. A connection's slot is freed when it is closed.
func LimitPerClient(ln net.Listener, max int, refused func(ip string)) net.Listener {
	return &perClientListener{Listener: ln, max: max, refused: refused, open: map[string]int{}}
}

type perClientListener struct {
	net.Listener
	max     int
	refused func(ip string)

	mu   sync.Mutex
	open map[string]int // connections open, by client IP
}

func (l *perClientListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		ip := clientIP(c.RemoteAddr())
		if l.acquire(ip) {
			return &clientConn{Conn: c, release: sync.OnceFunc(func() { l.release(ip) })}, nil
		}
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		_ = c.Close()
		if l.refused != nil {
			l.refused(ip)
		}
	}
}

func (l *perClientListener) acquire(ip string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[ip] >= l.max {
		return false
	}
	l.open[ip]++
	return true
}

func (l *perClientListener) release(ip string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[ip]--; l.open[ip] <= 0 {
		delete(l.open, ip) // the map holds only addresses with connections open
	}
}

// clientIP is the IP address of a remote address, without the port.
func clientIP(a net.Addr) string {
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.IP.String()
	}
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	return host
}

// clientConn frees its client's slot once, on the first Close.
type clientConn struct {
	net.Conn
	release func()
}

func (c *clientConn) Close() error {
	err := c.Conn.Close()
	c.release()
	return err
}

// CloseWrite keeps net/http's graceful close (a half-close, then a short
// wait for the client's last bytes) working through the wrapper.
func (c *clientConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
