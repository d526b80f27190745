package main

import (
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/klog/v2"

	"github.com/demo-operator/uuid-controller/internal/testlog"
	"github.com/demo-operator/uuid-controller/internal/version"
)

// --version wins over every other flag, even ones that would not validate.
func TestVersionFlag(t *testing.T) {
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	cfg, err := parseFlags(fs, []string{"--workers=0", "--version"})
	if err != nil || !cfg.printVersion {
		t.Fatalf("--version with a bad --workers: %v, printVersion %v", err, cfg != nil && cfg.printVersion)
	}
	cfg, err = parseFlags(flag.NewFlagSet("test", flag.ContinueOnError), nil)
	if err != nil || cfg.printVersion {
		t.Errorf("no --version: %v, printVersion %v", err, cfg.printVersion)
	}
}

// /metrics has uuid_controller_build_info at 1, labelled with the build.
func TestBuildInfoMetric(t *testing.T) {
	m := NewMetrics()
	rec := httptest.NewRecorder()
	metricsHandler(m.Registry, registerWorkqueueMetrics()).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	b := version.Get()
	want := fmt.Sprintf(`uuid_controller_build_info{goversion=%q,revision=%q,version=%q} 1`, b.GoVersion, b.Revision, b.Version)
	if !strings.Contains(rec.Body.String(), want) {
		t.Errorf("/metrics lacks %s", want)
	}
}

// The first line run logs names the build, before anything can fail.
func TestStartupLogCarriesVersion(t *testing.T) {
	logger, logs := testlog.New(t, 0)
	ctx := klog.NewContext(t.Context(), logger)
	err := run(ctx, &config{kubeconfig: filepath.Join(t.TempDir(), "missing")})
	if err == nil {
		t.Fatal("run with a missing kubeconfig: no error")
	}
	entries := logs.Entries()
	if len(entries) == 0 || entries[0].Message != "Starting uuid-controller" {
		t.Fatalf("first log line: %v", logs.Messages())
	}
	b := version.Get()
	kv := entries[0].ParameterKVList
	want := []any{"version", b.Version, "revision", b.Revision, "goVersion", b.GoVersion}
	if fmt.Sprint(kv) != fmt.Sprint(want) {
		t.Errorf("start-up line's key/values %v, want %v", kv, want)
	}
}
