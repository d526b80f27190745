package e2e

import (
	"bufio"
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/demo-operator/uuid-controller/internal/httpserver"
	"github.com/demo-operator/uuid-controller/test/cluster"
	"github.com/demo-operator/uuid-controller/test/framework"
)

// idleConns is how many connections TestIdleConnections opens to each
// port: the figure, and with the test's other files below the
// machine's open-file limit of 20,000 (the controller is another process).
const idleConns = 15000

// maxRSSGrowth is the bound on the memory those connections may
// take.
const maxRSSGrowth = 30 << 20

// TestIdleConnections: one client address opens 15,000 connections to each
// port (health, then metrics over TLS), sends one request on each and then
// holds it open without a word, as a hostile Pod could. The controller's
// memory grows by at most 30 MiB, the server closes every connection it
// does not keep (it keeps no more than its per-address cap), and all the
// while /healthz and a legitimate scrape from another address answer 200
// within a 1 s client timeout.
func TestIdleConnections(t *testing.T) {
	ctx := testCtx(t)
	ns := env.fw.NewNamespace(ctx, t)
	reader, _ := metricsTokens(ctx, t, ns)
	p := startSecureController(ctx, t, env.kubeconfig, ns, cluster.MetricsAuth{Token: reader})
	if _, err := p.Metrics(ctx); err != nil { // the first scrape's reviews and buffers happen before the baseline
		t.Fatal(err)
	}
	before, err := p.RSS()
	if err != nil {
		t.Fatal(err)
	}

	// The probes: new connections from 127.0.0.1 every 500 ms, as the
	// kubelet's, with a 1 s timeout.
	probeCtx, stopProbes := context.WithCancel(ctx)
	var health, scrapes answers
	probe := &http.Client{Timeout: time.Second, Transport: &http.Transport{
		DialContext:       dialerFrom(goodAddr).DialContext,
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true},
		DisableKeepAlives: true,
	}}
	waitProbes := every(probeCtx, 500*time.Millisecond, func() {
		health.add(timedGet(probeCtx, probe, p.HealthURL()+"/healthz", ""))
		scrapes.add(timedGet(probeCtx, probe, p.MetricsURL(), reader))
	})

	for _, port := range []struct {
		name, addr, path string
		tls              bool
	}{
		{"health", hostOf(t, p.HealthURL()), "/healthz", false},
		{"metrics", hostOf(t, p.MetricsURL()), "/metrics", true},
	} {
		h := holdIdle(ctx, port.addr, port.path, port.tls, idleConns)
		open := h.awaitClosed(ctx, httpserver.MaxConnsPerClient)
		t.Logf("%s port: %d connections from %s: %d refused or closed by the server before an answer, %d answered; %d still open, %d failed to connect",
			port.name, idleConns, abusiveAddr, h.closedEarly, len(h.conns), open, h.dialFailed)
		if h.dialFailed > 0 {
			t.Errorf("%s port: %d of %d connections could not be made (%v)", port.name, h.dialFailed, idleConns, h.firstErr)
		}
		if open > httpserver.MaxConnsPerClient {
			t.Errorf("%s port: the server holds %d of one client's idle connections open, want at most %d: it must close what it does not keep",
				port.name, open, httpserver.MaxConnsPerClient)
		}
		h.close()
	}
	stopProbes()
	waitProbes()
	peak, err := p.PeakRSS()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("controller RSS %s before, peak %s with %d idle connections to each port: +%s", framework.MiB(before), framework.MiB(peak), idleConns, framework.MiB(peak-before))
	if peak-before > maxRSSGrowth {
		t.Errorf("controller RSS grew by %s with %d idle connections per port, want at most %s", framework.MiB(peak-before), idleConns, framework.MiB(maxRSSGrowth))
	}
	health.check(t, "/healthz from "+goodAddr.String()+" meanwhile", http.StatusOK)
	scrapes.check(t, "scrapes from "+goodAddr.String()+" meanwhile", http.StatusOK)
	mustStayRunning(t, p)
}

// heldConns are the connections holdIdle made and kept.
type heldConns struct {
	conns       []net.Conn // answered, then left idle (the raw TCP connection)
	closedEarly int        // closed by the server before it answered
	dialFailed  int        // never connected
	firstErr    error
}

// holdIdle opens n connections to addr from abusiveAddr, 64 at a time;
// on each it sends GET path (over TLS with useTLS) and reads the answer,
// then leaves the connection open and silent.
func holdIdle(ctx context.Context, addr, path string, useTLS bool, n int) *heldConns {
	h := &heldConns{}
	var mu sync.Mutex
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for next.Add(1) <= int64(n) {
				conn, outcome, err := oneIdle(ctx, addr, path, useTLS)
				mu.Lock()
				switch outcome {
				case outcomeAnswered:
					h.conns = append(h.conns, conn)
				case outcomeClosed:
					h.closedEarly++
				case outcomeFailed:
					h.dialFailed++
					h.firstErr = cmp.Or(h.firstErr, err)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return h
}

// What became of one of holdIdle's connections.
type idleOutcome int

const (
	outcomeAnswered idleOutcome = iota // answered, then left open and idle
	outcomeClosed                      // closed (or reset) by the server before an answer
	outcomeFailed                      // never connected, or the server did not answer in time
)

// oneIdle makes one connection and sends one request on it; conn is the
// raw connection, open, when answered.
func oneIdle(ctx context.Context, addr, path string, useTLS bool) (net.Conn, idleOutcome, error) {
	raw, err := dialerFrom(abusiveAddr).DialContext(ctx, "tcp", addr)
	if errors.Is(err, syscall.ECONNRESET) {
		return nil, outcomeClosed, nil // accepted and reset before the dial returned
	}
	if err != nil {
		return nil, outcomeFailed, err
	}
	if err := raw.SetDeadline(time.Now().Add(15 * time.Second)); err != nil {
		raw.Close()
		return nil, outcomeFailed, err
	}
	var rw net.Conn = raw
	if useTLS {
		tc := tls.Client(raw, &tls.Config{InsecureSkipVerify: true})
		if err := tc.HandshakeContext(ctx); err != nil {
			raw.Close()
			if isTimeout(err) {
				return nil, outcomeFailed, fmt.Errorf("TLS handshake: %w", err)
			}
			return nil, outcomeClosed, nil
		}
		rw = tc
	}
	resp, err := func() (*http.Response, error) {
		if _, err := fmt.Fprintf(rw, "GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", path, addr); err != nil {
			return nil, err
		}
		return http.ReadResponse(bufio.NewReader(rw), nil)
	}()
	if err != nil {
		raw.Close()
		if isTimeout(err) {
			return nil, outcomeFailed, fmt.Errorf("request: %w", err)
		}
		return nil, outcomeClosed, nil
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err := raw.SetDeadline(time.Time{}); err != nil {
		raw.Close()
		return nil, outcomeFailed, err
	}
	return raw, outcomeAnswered, nil
}

// awaitClosed polls, for up to 15 s, until the server holds at most keep
// of the connections open, and returns how many it holds.
func (h *heldConns) awaitClosed(ctx context.Context, keep int) int {
	closed := make([]bool, len(h.conns))
	open := len(h.conns)
	_ = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 15*time.Second, true, func(context.Context) (bool, error) {
		var mu sync.Mutex
		var wg sync.WaitGroup
		sem := make(chan struct{}, 64)
		open = 0
		for i, c := range h.conns {
			if closed[i] {
				continue
			}
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				gone := closedByServer(c)
				mu.Lock()
				defer mu.Unlock()
				closed[i] = gone
				if !gone {
					open++
				}
			})
		}
		wg.Wait()
		return open <= keep, nil
	})
	return open
}

// closedByServer reads a connection the client has gone silent on: the
// server sends nothing on an idle HTTP/1.1 connection until it closes it
// (a TLS close_notify, then EOF), so anything but a timeout means closed.
func closedByServer(c net.Conn) bool {
	if err := c.SetReadDeadline(time.Now().Add(5 * time.Millisecond)); err != nil {
		return true
	}
	_, err := c.Read(make([]byte, 1))
	return !isTimeout(err)
}

func (h *heldConns) close() {
	for _, c := range h.conns {
		c.Close()
	}
}
