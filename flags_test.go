package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/demo-operator/uuid-controller/internal/crdcheck"
	"github.com/demo-operator/uuid-controller/internal/testlog"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
)

func parse(args ...string) (*config, error) {
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return parseFlags(fs, args)
}

func TestFlagDefaultsAreValid(t *testing.T) {
	c, err := parse()
	if err != nil {
		t.Fatal(err)
	}
	if c.workers < 1 || c.eventLevel != "Warning" || c.leader.Name != controllerName || c.leader.Namespace == "" || !c.secureMetrics.Secure {
		t.Errorf("defaults = %+v", c)
	}
	if c, err := parse("--namespace=team-a", "--leader-elect", "--leader-elect-name=uuid.controller"); err != nil || c.namespace != "team-a" {
		t.Errorf("valid names rejected: %v, %v", c, err)
	}
	if c, err := parse("--namespace=team-a,team-b"); err != nil || !slices.Equal(c.namespaces, []string{"team-a", "team-b"}) {
		t.Errorf("--namespace=team-a,team-b: namespaces %v, error %v; want [team-a team-b]", c.namespaces, err)
	}
	if c, err := parse(); err != nil || c.namespaces != nil {
		t.Errorf("no --namespace: namespaces %v, error %v; want nil (all)", c.namespaces, err)
	}
	if c, err := parse("--event-level=normal"); err != nil || c.eventLevel != "Normal" {
		t.Errorf("event level not normalised: %v, %v", c, err)
	}
}

func TestFlagErrors(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--workers=0"}, "--workers must be between 1 and 1000, got 0"},
		{[]string{"--workers=100000000"}, "--workers must be between 1 and 1000"},
		{[]string{"--error-after=0"}, "--error-after must be at least 1"},
		{[]string{"--max-retry-delay=0"}, "--max-retry-delay must be positive"},
		{[]string{"--kube-api-qps=NaN"}, "must be positive"},
		{[]string{"--kube-api-qps=+Inf"}, "must be positive"},
		{[]string{"--leader-elect", "--leader-elect-renew-deadline=10s", "--leader-elect-retry-period=9s"}, "1.2 times --leader-elect-retry-period"},
		{[]string{"--resync=-1s"}, "--resync must not be negative"},
		{[]string{"--kube-api-qps=0"}, "must be positive"},
		{[]string{"--kube-api-qps=-2"}, "--kube-api-qps (or -1 for no limit) and --kube-api-burst must be positive, got -2 and 1000"},
		{[]string{"--kube-api-qps=100", "--kube-api-burst=0"}, "must be positive, got 100 and 0"},
		{[]string{"--kube-api-read-idle-timeout=0"}, "must be whole seconds, at least 1s"},
		{[]string{"--kube-api-ping-timeout=1500ms"}, "must be whole seconds, at least 1s"},
		{[]string{"--shutdown-timeout=0"}, "--shutdown-timeout must be positive"},
		{[]string{"--event-level=Info"}, `--event-level must be Normal or Warning, got "Info"`},
		{[]string{"--leader-elect", "--leader-elect-lease-duration=5s"}, "must exceed"},
		{[]string{"--leader-elect", "--leader-elect-name="}, "--leader-elect-name must not be empty"},
		{[]string{"--leader-elect", "--leader-elect-retry-period=0"}, "durations must be positive"},
		{[]string{"--namespace=Bad_NS"}, `--namespace "Bad_NS" is not a valid name`},
		{[]string{"--namespace=team-a,Bad_NS"}, `--namespace "Bad_NS" is not a valid name`},
		{[]string{"--namespace=team-a,,team-b"}, `--namespace "team-a,,team-b": item 2 is empty`},
		{[]string{"--namespace=team-a,"}, `--namespace "team-a,": item 2 is empty`},
		{[]string{"--namespace=team-a,team-b,team-a"}, `--namespace "team-a,team-b,team-a": "team-a" is listed twice`},
		{[]string{"--leader-elect", "--leader-elect-name=a/b"}, `--leader-elect-name "a/b" is not a valid name`},
		{[]string{"--leader-elect", "--leader-elect-namespace=kube.system"}, `--leader-elect-namespace "kube.system" is not a valid name`},
		{[]string{"--metrics-cert-file=tls.crt"}, "--metrics-cert-file and --metrics-key-file must be given together"},
		{[]string{"--metrics-key-file=tls.key"}, "--metrics-cert-file and --metrics-key-file must be given together"},
		{[]string{"--metrics-secure=false", "--metrics-cert-file=tls.crt", "--metrics-key-file=tls.key"}, "need --metrics-secure"},
		{[]string{"extra"}, "unexpected arguments"},
		{[]string{"--no-such-flag"}, "not defined"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			_, err := parse(tt.args...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error = %v, want it to contain %q", err, tt.want)
			}
		})
	}
}

// TestHealthHandler: /readyz names each failed check and withholds the
// reason, which goes to the log.
func TestHealthHandler(t *testing.T) {
	failed := []notReady{{"informer-sync", errors.New("informer cache not synced")}, {"crd", errors.New("secret detail")}}
	h := healthHandler(func() []notReady { return failed })
	logger, logs := testlog.New(t, 0)
	get := func(path string) (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil).WithContext(klog.NewContext(t.Context(), logger)))
		return rec.Code, rec.Body.String()
	}
	if code, _ := get("/healthz"); code != http.StatusOK {
		t.Errorf("/healthz = %d", code)
	}
	code, body := get("/readyz")
	want := "[-]informer-sync failed: reason withheld\n[-]crd failed: reason withheld\nreadyz check failed\n"
	if code != http.StatusServiceUnavailable || body != want {
		t.Errorf("/readyz not ready = %d %q, want 503 %q", code, body, want)
	}
	if out := logs.String(); !strings.Contains(out, "informer cache not synced") || !strings.Contains(out, "secret detail") {
		t.Errorf("the log does not give the reasons:\n%s", out)
	}
	failed = nil
	if code, _ := get("/readyz"); code != http.StatusOK {
		t.Errorf("/readyz after sync = %d, want 200", code)
	}
}

// A missing CRD keeps the informer from syncing: /readyz must name the CRD
// problem and its fix, not only the unsynced cache.
func TestReadinessGivesEveryReason(t *testing.T) {
	crdErr := fmt.Errorf("%w: demo.operator/v1 is not served; %s", crdcheck.ErrNotReady, crdFix)
	for _, tc := range []struct {
		name   string
		synced bool
		crd    error
		want   []string
	}{
		{"not synced, CRD missing", false, crdErr, []string{"informer-sync: informer cache not synced", "crd: " + crdErr.Error()}},
		{"not synced, CRD fits", false, nil, []string{"informer-sync: informer cache not synced"}},
		{"synced, CRD wrong", true, crdErr, []string{"crd: " + crdErr.Error()}},
		{"ready", true, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, f := range readiness(func() bool { return tc.synced }, readyCheck{"crd", func() error { return tc.crd }})() {
				got = append(got, f.name+": "+f.err.Error())
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("readiness = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestMetricsHandlerServesControllerAndQueueMetrics(t *testing.T) {
	m := NewMetrics()
	m.Assigned.Inc()
	queues := registerWorkqueueMetrics()
	f := newFixture(t, Options{}) // its queue is named, so it reports to the provider
	f.ctrl.queue.Add(key("ns", "a"))
	h := metricsHandler(m.Registry, queues)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	body := rec.Body.String()
	for _, want := range []string{"uuid_controller_uuids_assigned_total 1", `workqueue_adds_total{name="uuid"}`} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

func TestServeRejectsBadAddress(t *testing.T) {
	f := newFixture(t, Options{})
	if _, err := serve(f.ctx, "health", "not-an-address", nil, http.NewServeMux()); err == nil {
		t.Error("a bad listen address was accepted")
	}
	wait, err := serve(f.ctx, "health", "0", nil, http.NewServeMux())
	if err != nil {
		t.Fatal(err)
	}
	wait() // a disabled server returns at once
}

// In a pod the Lease goes to the pod's own namespace: $POD_NAMESPACE (the
// Deployment's downward API), else the ServiceAccount mount; elsewhere, or
// when both are empty, uuid-system.
func TestDefaultLeaseNamespace(t *testing.T) {
	t.Setenv("POD_NAMESPACE", "")
	orig := serviceAccountNamespaceFile
	t.Cleanup(func() { serviceAccountNamespaceFile = orig })
	dir := t.TempDir()
	for _, tc := range []struct{ content, want string }{
		{"team-a\n", "team-a"},
		{"  \n", "uuid-system"},
		{"", "uuid-system"},
	} {
		serviceAccountNamespaceFile = filepath.Join(dir, "namespace")
		if err := os.WriteFile(serviceAccountNamespaceFile, []byte(tc.content), 0o600); err != nil {
			t.Fatal(err)
		}
		if got := defaultLeaseNamespace(); got != tc.want {
			t.Errorf("namespace file %q: lease namespace %q, want %q", tc.content, got, tc.want)
		}
	}
	serviceAccountNamespaceFile = filepath.Join(dir, "missing")
	if got := defaultLeaseNamespace(); got != "uuid-system" {
		t.Errorf("no namespace file: lease namespace %q, want uuid-system", got)
	}
	t.Setenv("POD_NAMESPACE", "team-b")
	if got := defaultLeaseNamespace(); got != "team-b" {
		t.Errorf("POD_NAMESPACE=team-b: lease namespace %q, want team-b", got)
	}
}

func TestTuneClient(t *testing.T) {
	c, err := parse("--kube-api-qps=250", "--kube-api-burst=300")
	if err != nil {
		t.Fatal(err)
	}
	rc := &rest.Config{}
	tuneClient(rc, c)
	if rc.QPS != 250 || rc.Burst != 300 || rc.UserAgent != controllerName || !rc.DisableCompression {
		t.Errorf("client config = QPS %v, burst %d, user agent %q, compression disabled %v; want 250, 300, %q, true",
			rc.QPS, rc.Burst, rc.UserAgent, rc.DisableCompression, controllerName)
	}
	d, err := parse()
	if err != nil {
		t.Fatal(err)
	}
	tuneClient(rc, d)
	if rc.QPS >= 0 {
		t.Errorf("default QPS = %v, want client-side limiting off (< 0)", rc.QPS)
	}
}
