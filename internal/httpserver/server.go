package httpserver

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"strings"
	"time"

	"k8s.io/klog/v2"
)

// Serve listens on addr and serves h, over TLS when tlsConfig is not nil,
// with this package's limits, until ctx is cancelled; then it waits up to
// 5 s for requests in flight. Listening happens before Serve returns, so a
// port that is taken is a start-up error, not a log line later. wait
// returns once the server has stopped.
func Serve(ctx context.Context, name, addr string, tlsConfig *tls.Config, h http.Handler) (wait func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listening for %s on %q: %w", name, addr, err)
	}
	return serveOn(ctx, name, ln, tlsConfig, h, defaultTimeouts), nil
}

// ServeProbes is Serve for the kubelet's probes (/healthz, /readyz) over
// plain HTTP, with limits of its own: the probes must be answered whatever
// other Pods hold open, since a probe that fails restarts the Pod. A probe
// is one request on a new connection, answered at once, so the server
// keeps no connection alive, gives each ProbeTimeout for everything, and
// holds at most ProbeMaxConns; when full, a new connection makes room as on
// Serve (connCap): a request held in flight (a slow body, an answer never
// read) protects no slot, and a connection just accepted has its grace.
func ServeProbes(ctx context.Context, name, addr string, h http.Handler) (wait func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listening for %s on %q: %w", name, addr, err)
	}
	return serveOn(ctx, name, ln, nil, h, probeTimeouts), nil
}

// timeouts are the http.Server's and how a full server makes room; tests
// shorten them.
type timeouts struct {
	readHeader, read, write, idle time.Duration
	// maxConns is the cap on the connections open from all clients.
	maxConns int
	// probes turns keep-alive off (ServeProbes).
	probes bool
}

var (
	defaultTimeouts = timeouts{readHeader: ReadHeaderTimeout, read: ReadTimeout, write: WriteTimeout, idle: IdleTimeout, maxConns: MaxConns}
	probeTimeouts   = timeouts{readHeader: ProbeTimeout, read: ProbeTimeout, write: ProbeTimeout, idle: ProbeTimeout, maxConns: ProbeMaxConns, probes: true}
)

// serveOn is Serve on a listener of the caller's.
func serveOn(ctx context.Context, name string, ln net.Listener, tlsConfig *tls.Config, h http.Handler, to timeouts) (wait func()) {
	logger := klog.LoggerWithValues(klog.FromContext(ctx), "server", name)
	sampled := NewSampled()
	go sampled.Run(ctx, func(unlogged map[string]int) {
		logger.Info("Refused connections or failed requests, not logged one by one", "counts", unlogged)
	})
	// The per-client cap comes first, so a connection over it costs no
	// TLS handshake and takes no slot of the total.
	ln = LimitPerClient(ln, MaxConnsPerClient, func(ip string) {
		sampled.Do("over_client_cap", func(unlogged map[string]int) {
			logger.Info("Closed a connection over the per-client cap", "client", ip, "max", MaxConnsPerClient, "notLogged", unlogged)
		})
	})
	total := newConnCap(to.maxConns, func(what string) {
		sampled.Do("over_total_cap", func(unlogged map[string]int) {
			logger.Info("Closed a connection to make room for a new one", "closed", what, "max", to.maxConns, "notLogged", unlogged)
		})
	})
	// Below TLS, so the cap sees the writes that carry the answers.
	ln = capListener{ln, total}
	if tlsConfig != nil {
		ln = tls.NewListener(ln, tlsConfig)
	}
	srv := &http.Server{
		Handler:           total.handler(h),
		ReadHeaderTimeout: to.readHeader, // also bounds the TLS handshake
		ReadTimeout:       to.read,
		WriteTimeout:      to.write,
		IdleTimeout:       to.idle,
		MaxHeaderBytes:    MaxHeaderBytes,
		ConnState:         total.track,
		ConnContext:       total.connContext,
		// Handlers log with ctx's logger; a request is not cancelled by
		// shutdown, which waits for it instead.
		BaseContext: func(net.Listener) context.Context { return klog.NewContext(context.WithoutCancel(ctx), logger) },
		// net/http's own errors (a failed TLS handshake, say) are a
		// client's doing, one per connection: sampled, never one line each.
		ErrorLog: log.New(errorLog{logger, sampled}, "", 0),
	}
	// A probe server answers one request per connection, so no client can
	// keep a connection alive to hold a slot.
	srv.SetKeepAlivesEnabled(!to.probes)
	done := make(chan struct{})
	go func() {
		defer close(done)
		logger.Info("Serving", "addr", ln.Addr().String(), "tls", tlsConfig != nil)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error(err, "Server stopped")
		}
	}()
	go func() {
		<-ctx.Done()
		shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdownCtx)
	}()
	return func() { <-done }
}

// errorLog writes net/http's error lines to the structured log, sampled.
type errorLog struct {
	logger  klog.Logger
	sampled *Sampled
}

func (e errorLog) Write(p []byte) (int, error) {
	msg := strings.TrimSpace(string(p))
	// A handler's panic is a bug of ours, not a client's noise: always
	// logged, with its stack, never sampled away.
	if strings.HasPrefix(msg, "http: panic serving") {
		e.logger.Error(errors.New(msg), "HTTP handler panicked")
		return len(p), nil
	}
	e.sampled.Do("http_error", func(unlogged map[string]int) {
		e.logger.Info("HTTP server error", "error", msg, "notLogged", unlogged)
	})
	return len(p), nil
}
