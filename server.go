package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/demo-operator/uuid-controller/internal/httpserver"
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
// cache not synced" alone would hide the problem and its fix. checks are
// the other parts (the CRD, the kopf migration's admission policy).
func readiness(synced func() bool, checks ...func() error) func() error {
	return func() error {
		var errs []error
		if !synced() {
			errs = append(errs, errors.New("informer cache not synced"))
		}
		for _, check := range checks {
			if err := check(); err != nil {
				errs = append(errs, err)
			}
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

// serve listens on addr ("" or "0" turns the server off) and serves h
// with httpserver's limits, over TLS when tlsConfig is not nil, until ctx
// is cancelled.
func serve(ctx context.Context, name, addr string, tlsConfig *tls.Config, h http.Handler) (wait func(), err error) {
	if !serverEnabled(addr) {
		return func() {}, nil
	}
	return httpserver.Serve(ctx, name, addr, tlsConfig, h)
}

// serveProbes is serve for the health server, with httpserver's probe
// limits (httpserver.ServeProbes).
func serveProbes(ctx context.Context, name, addr string, h http.Handler) (wait func(), err error) {
	if !serverEnabled(addr) {
		return func() {}, nil
	}
	return httpserver.ServeProbes(ctx, name, addr, h)
}

// serverEnabled is false for the addresses that turn a server off.
func serverEnabled(addr string) bool { return addr != "" && addr != "0" }
