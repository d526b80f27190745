package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/klog/v2"

	"github.com/demo-operator/uuid-controller/internal/httpserver"
)

// healthHandler serves /healthz (the process is alive and serving) and
// /readyz (ready finds no failed check: the informer's cache has synced and
// the CRD fits, true of the leader and of a standby alike, so a rollout
// waits for warm replicas). Not ready, the body names each failed check as
// kube components do, `[-]name failed: reason withheld`: anyone who reaches
// the port may read it, so the reasons (errors from the apiserver, names of
// objects) go to the log, sampled, and not to the body.
func healthHandler(ready func() []notReady) http.Handler {
	sampled := httpserver.NewSampled()
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		failed := ready()
		if len(failed) == 0 {
			fmt.Fprintln(w, "ok")
			return
		}
		sampled.Do("not_ready", func(unlogged map[string]int) {
			logger := klog.FromContext(r.Context())
			for _, f := range failed {
				logger.Info("Readiness check failed", "check", f.name, "reason", f.err.Error(), "notLogged", unlogged)
			}
		})
		var body strings.Builder
		for _, f := range failed {
			fmt.Fprintf(&body, "[-]%s failed: reason withheld\n", f.name)
		}
		body.WriteString("readyz check failed")
		http.Error(w, body.String(), http.StatusServiceUnavailable)
	})
	return mux
}

// readyCheck is a named part of /readyz: check returns why it is not ready.
type readyCheck struct {
	name  string
	check func() error
}

// notReady is a readiness check that failed, and why.
type notReady struct {
	name string
	err  error
}

// readiness is /readyz's check. It gives every failure at once: a CRD that
// is not installed also keeps the informer from syncing, and "informer
// cache not synced" alone would hide the problem and its fix. checks are
// the other parts (the CRD, the kopf migration's admission policy).
func readiness(synced func() bool, checks ...readyCheck) func() []notReady {
	return func() []notReady {
		var failed []notReady
		if !synced() {
			failed = append(failed, notReady{"informer-sync", errors.New("informer cache not synced")})
		}
		for _, c := range checks {
			if err := c.check(); err != nil {
				failed = append(failed, notReady{c.name, err})
			}
		}
		return failed
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
