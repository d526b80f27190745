package httpserver

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"

	"github.com/demo-operator/uuid-controller/internal/testflood"
	"github.com/demo-operator/uuid-controller/internal/testlog"
)

// startServer runs serveOn on a loopback port, with Serve's timeouts,
// until the test ends and returns its address and log.
func startServer(t *testing.T, tlsConfig *tls.Config) (string, *testlog.Capture) {
	t.Helper()
	return startServerWith(t, tlsConfig, defaultTimeouts, func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
}

func startServerWith(t *testing.T, tlsConfig *tls.Config, to timeouts, h http.HandlerFunc) (string, *testlog.Capture) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	logger, logs := testlog.New(t, 0)
	ctx := klog.NewContext(t.Context(), logger)
	wait := serveOn(ctx, "test", ln, tlsConfig, h, to)
	t.Cleanup(wait)
	return ln.Addr().String(), logs
}

// matching counts the lines logged that hold s.
func matching(logs *testlog.Capture, s string) int {
	n := 0
	for _, e := range logs.Entries() {
		if strings.Contains(e.Message+fmt.Sprint(e.ParameterKVList...), s) {
			n++
		}
	}
	return n
}

// logged waits up to 5 s for a line holding s (net/http logs an error
// just after its answer) and returns how many lines hold it.
func logged(t *testing.T, logs *testlog.Capture, s string) int {
	t.Helper()
	_ = wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		return matching(logs, s) > 0, nil
	})
	return matching(logs, s)
}

// get sends GET / with extra headers on a new connection from ip and
// returns the connection (left open) and the status code, 0 when the
// server closed the connection without an answer.
func get(t *testing.T, ip, addr string, header string) (net.Conn, int) {
	t.Helper()
	c := dialFrom(t, ip, addr)
	if c == nil {
		return nil, 0
	}
	if _, err := fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: test\r\n%s\r\n", header); err != nil {
		return c, 0
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return c, 0
	}
	resp.Body.Close()
	return c, resp.StatusCode
}

// TestServeCapsHeaders: a request whose headers pass MaxHeaderBytes is
// refused with 431; one just under it is served.
func TestServeCapsHeaders(t *testing.T) {
	addr, _ := startServer(t, nil)
	if _, code := get(t, "127.0.0.1", addr, "X-Pad: "+strings.Repeat("a", MaxHeaderBytes/2)+"\r\n"); code != http.StatusOK {
		t.Errorf("headers of %d bytes: %d, want 200", MaxHeaderBytes/2, code)
	}
	if _, code := get(t, "127.0.0.1", addr, "X-Pad: "+strings.Repeat("a", 2*MaxHeaderBytes)+"\r\n"); code != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("headers of %d bytes: %d, want 431", 2*MaxHeaderBytes, code)
	}
}

// TestServeCapsClient: one address gets MaxConnsPerClient kept-alive
// connections answered; the ones over the cap are closed unanswered, and
// logged at a bounded rate, while another address is still served.
func TestServeCapsClient(t *testing.T) {
	addr, logs := startServer(t, nil)
	answered, closed := 0, 0
	for range MaxConnsPerClient + 10 {
		if _, code := get(t, "127.0.0.2", addr, ""); code == http.StatusOK {
			answered++
		} else {
			closed++
		}
	}
	if answered != MaxConnsPerClient || closed != 10 {
		t.Errorf("of %d connections from one address, %d answered and %d closed; want %d and 10", MaxConnsPerClient+10, answered, closed, MaxConnsPerClient)
	}
	if _, code := get(t, "127.0.0.3", addr, ""); code != http.StatusOK {
		t.Errorf("another address: %d, want 200", code)
	}
	if n := logged(t, logs, "over the per-client cap"); n < 1 || n > 3 {
		t.Errorf("%d log lines about the 10 connections over the cap, want 1 to 3 (sampled)", n)
	}
}

// TestServeSamplesErrors: net/http's error per failed TLS handshake (here
// plain HTTP to the TLS port, 20 times) is logged at most 3 times at once.
func TestServeSamplesErrors(t *testing.T) {
	cert := httptest.NewTLSServer(http.NotFoundHandler())
	cert.Close()
	addr, logs := startServer(t, &tls.Config{Certificates: cert.TLS.Certificates})
	for range 20 {
		if _, code := get(t, "127.0.0.1", addr, ""); code != http.StatusBadRequest {
			t.Fatalf("plain HTTP to the TLS port: %d, want 400", code)
		}
	}
	if n := logged(t, logs, "TLS handshake error"); n < 1 || n > 3 {
		t.Errorf("%d log lines for 20 failed handshakes, want 1 to 3", n)
	}
}

// TestServeLogsEveryPanic: a handler's panics are each logged, even while
// TLS handshake errors have spent the sampled log's burst.
func TestServeLogsEveryPanic(t *testing.T) {
	cert := httptest.NewTLSServer(http.NotFoundHandler())
	cert.Close()
	addr, logs := startServerWith(t, &tls.Config{Certificates: cert.TLS.Certificates}, defaultTimeouts, func(http.ResponseWriter, *http.Request) {
		panic("a bug")
	})
	for range 10 { // plain HTTP to the TLS port: handshake errors
		get(t, "127.0.0.1", addr, "")
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, DisableKeepAlives: true}}
	for range 5 {
		if resp, err := hc.Get("https://" + addr + "/"); err == nil {
			resp.Body.Close()
		}
	}
	if err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		return matching(logs, "HTTP handler panicked") >= 5, nil
	}); err != nil {
		t.Errorf("%d of 5 panics logged after 10 TLS handshake errors, want every one", matching(logs, "HTTP handler panicked"))
	}
}

// TestServeCapsTotal: with MaxConns connections held idle from many
// addresses (none over the per-client cap), a new client is still
// answered at once: the connection idle longest is closed to make room
// (and reported), the others stay, and the server holds no more than
// MaxConns.
func TestServeCapsTotal(t *testing.T) {
	addr, logs := startServer(t, nil)
	var held []net.Conn
	for i := range MaxConns {
		ip := fmt.Sprintf("127.0.%d.%d", 1+i/MaxConnsPerClient/250, 1+(i/MaxConnsPerClient)%250)
		c, code := get(t, ip, addr, "")
		if code != http.StatusOK {
			t.Fatalf("connection %d of %d (from %s): %d, want 200", i+1, MaxConns, ip, code)
		}
		held = append(held, c)
	}
	for i := range 3 {
		start := time.Now()
		if _, code := get(t, "127.0.9.9", addr, ""); code != http.StatusOK {
			t.Fatalf("new client %d with %d connections held: %d, want 200", i+1, MaxConns, code)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("new client %d with %d connections held: answered after %s, want at once", i+1, MaxConns, d)
		}
	}
	// The three longest idle went. Held connections were opened one after
	// another, but the server marks one idle just after its client has the
	// answer, so neighbours may swap places: the three are among the first
	// five, and none after.
	var closed []int
	for i, c := range held[:8] {
		if closedByPeer(t, c) {
			closed = append(closed, i+1)
		}
	}
	if len(closed) != 3 || closed[2] > 5 {
		t.Errorf("held connections closed: %v, want three of the five held longest", closed)
	}
	if n := logged(t, logs, "to make room"); n < 1 || n > 3 {
		t.Errorf("%d log lines about closing connections to make room, want 1 to 3 (sampled)", n)
	}
}

// TestServeProbesOneRequestPerConnection: the probe server answers one
// request per connection and closes it (no keep-alive), so a client
// cannot hold a connection by pipelining requests.
func TestServeProbesOneRequestPerConnection(t *testing.T) {
	addr, _ := startServerWith(t, nil, probeTimeouts, func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	c := dialFrom(t, "127.0.0.1", addr)
	fmt.Fprint(c, strings.Repeat("GET / HTTP/1.1\r\nHost: test\r\n\r\n", 2))
	r := bufio.NewReader(c)
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if _, err := http.ReadResponse(r, nil); err == nil {
		t.Error("a second pipelined request on one connection was answered, want the connection closed after the first")
	}
}

// TestServeTimeouts: the server closes a connection whose headers never
// end, one kept alive with no new request, and one whose handler outlasts
// the write timeout (with no answer), each after its timeout (shortened
// here to 200 ms; handlers take 0 or 1 s).
func TestServeTimeouts(t *testing.T) {
	// The read timeout is long: headers that never end must be cut by
	// the header timeout itself (net/http falls back to the read timeout
	// when it is 0).
	short, long := 200*time.Millisecond, 30*time.Second
	addr, _ := startServerWith(t, nil, timeouts{readHeader: short, read: long, write: short, idle: short, maxConns: MaxConns},
		func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/slow" {
				time.Sleep(time.Second) // a handler slower than the write timeout
			}
			fmt.Fprintln(w, "ok")
		})
	closedWithin := func(c net.Conn, what string) {
		t.Helper()
		// Far above the short timeouts, far below the long one.
		if err := c.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadAll(c); err != nil {
			t.Errorf("%s: %v, want the server to close the connection", what, err)
		}
	}

	partial := dialFrom(t, "127.0.0.1", addr)
	fmt.Fprint(partial, "GET / HTTP/1.1\r\nHost: test\r\n") // no blank line: the headers never end
	closedWithin(partial, "headers that never end")

	idle, code := get(t, "127.0.0.1", addr, "")
	if code != http.StatusOK {
		t.Fatalf("GET /: %d, want 200", code)
	}
	closedWithin(idle, "a kept-alive connection left idle")

	slow := dialFrom(t, "127.0.0.1", addr)
	fmt.Fprint(slow, "GET /slow HTTP/1.1\r\nHost: test\r\n\r\n")
	if _, err := http.ReadResponse(bufio.NewReader(slow), nil); err == nil {
		t.Error("a handler slower than the write timeout: its answer arrived, want the connection closed without one")
	}
}

// TestServeProbesUnderHeldRequests: requests held in flight fill the
// probe server, in each of testflood.ProbeShapes (400 addresses one each,
// made again the moment they are closed; 1,100 from 35 addresses).
// Meanwhile /healthz and /readyz from an address that sorts before all of
// theirs, on a new connection each as the kubelet's, are answered within
// 1 s every time. The 60 s runs against the controller, with its memory,
// are e2e's TestProbesUnderHeldRequests.
func TestServeProbesUnderHeldRequests(t *testing.T) {
	for _, shape := range testflood.ProbeShapes() {
		t.Run(shape.Name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			logger, _ := testlog.New(t, 0)
			stop := serveOn(klog.NewContext(t.Context(), logger), "health", ln, nil, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") }), probeTimeouts)
			t.Cleanup(stop)
			addr := ln.Addr().String()

			flood := shape.Start(t.Context(), addr, "/healthz")
			defer flood.Stop()
			// The flood is in place once it has made its connections and
			// the server has closed some to make room.
			if err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
				return flood.Dials.Load() >= int64(shape.Conns) && flood.Closed.Load() > 0, nil
			}); err != nil {
				t.Fatalf("the flood made %d of %d connections in 30 s, %d closed", flood.Dials.Load(), shape.Conns, flood.Closed.Load())
			}

			probe := &http.Client{Timeout: time.Second, Transport: &http.Transport{
				DialContext:       (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)}}).DialContext,
				DisableKeepAlives: true,
			}}
			var failed []string
			var slowest time.Duration
			// run counts the failures in a row of one path: the kubelet
			// restarts a container after 3 (its failureThreshold).
			probes, longest, run := 0, 0, map[string]int{}
			fail := func(path, why string) {
				failed = append(failed, why)
				run[path]++
				longest = max(longest, run[path])
			}
			dials := flood.Dials.Load()
			for end := time.Now().Add(15 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
				for _, path := range []string{"/healthz", "/readyz"} {
					start := time.Now()
					resp, err := probe.Get("http://" + addr + path)
					took := time.Since(start)
					slowest = max(slowest, took)
					probes++
					if err != nil {
						fail(path, err.Error())
						continue
					}
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						fail(path, resp.Status)
						continue
					}
					run[path] = 0
				}
			}
			t.Logf("%d probes, slowest %s; the flood made %d connections while they ran, %d in all, the server closed %d", probes, slowest, flood.Dials.Load()-dials, flood.Dials.Load(), flood.Closed.Load())
			switch {
			case shape.Reopening && longest >= 3:
				// Every connection in its grace: a lone probe may lose
				// its slot (docs/security.md); three in a row restart.
				t.Errorf("%d of %d probes failed, %d of one path in a row, with %d requests held in flight from %d addresses, first: %s", len(failed), probes, longest, shape.Conns, shape.Addrs, failed[0])
			case shape.Reopening && len(failed) > 0:
				t.Logf("%d of %d probes failed, at most %d of one path in a row, first: %s", len(failed), probes, longest, failed[0])
			case len(failed) > 0:
				t.Errorf("%d of %d probes failed with %d requests held in flight from %d addresses, first: %s", len(failed), probes, shape.Conns, shape.Addrs, failed[0])
			}
		})
	}
}
