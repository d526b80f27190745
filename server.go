package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/klog/v2"
)

// healthHandler serves /healthz (the process is alive and serving) and
// /readyz (ready returns nil: the informer's cache has synced and the CRD
// fits, true of the leader and of a standby alike, so a rollout waits for
// warm replicas); not ready, the body says why.
func healthHandler(ready func() error) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := ready(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	return mux
}

// readiness is /readyz's check. It gives every reason at once: a CRD that
// is not installed also keeps the informer from syncing, and "informer
// cache not synced" alone would hide the problem and its fix.
func readiness(synced func() bool, crdReady func() error) func() error {
	return func() error {
		var errs []error
		if !synced() {
			errs = append(errs, errors.New("informer cache not synced"))
		}
		if err := crdReady(); err != nil {
			errs = append(errs, err)
		}
		return errors.Join(errs...)
	}
}

// metricsHandler serves /metrics from the given registries.
func metricsHandler(registries ...*prometheus.Registry) http.Handler {
	gatherers := make(prometheus.Gatherers, 0, len(registries))
	for _, r := range registries {
		gatherers = append(gatherers, r)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(gatherers, promhttp.HandlerOpts{}))
	return mux
}

// serve listens on addr ("" or "0" turns the server off) and serves h, over
// TLS when tlsConfig is not nil, until ctx is cancelled. Listening happens
// before serve returns, so a port that is taken is a start-up error, not a
// log line later.
func serve(ctx context.Context, name, addr string, tlsConfig *tls.Config, h http.Handler) (wait func(), err error) {
	if !serverEnabled(addr) {
		return func() {}, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listening for %s on %q: %w", name, addr, err)
	}
	if tlsConfig != nil {
		ln = tls.NewListener(ln, tlsConfig)
	}
	logger := klog.LoggerWithValues(klog.FromContext(ctx), "server", name)
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second, // also bounds the TLS handshake
		// Handlers log with ctx's logger; a request is not cancelled by
		// shutdown, which waits for it instead.
		BaseContext: func(net.Listener) context.Context { return klog.NewContext(context.WithoutCancel(ctx), logger) },
		// net/http's own errors (a failed TLS handshake, say) go to the
		// same structured log, not to the standard logger.
		ErrorLog: slog.NewLogLogger(logr.ToSlogHandler(logger), slog.LevelWarn),
	}
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
	return func() { <-done }, nil
}

// serverEnabled is false for the addresses that turn a server off.
func serverEnabled(addr string) bool { return addr != "" && addr != "0" }
