package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/demo-operator/uuid-controller/test/cluster"
	"github.com/demo-operator/uuid-controller/test/framework"
)

// metricsReaderRole is deploy/rbac.yaml's ClusterRole for scrapers.
const metricsReaderRole = "uuid-controller-metrics-reader"

// metricsTokens returns tokens of two ServiceAccounts in ns: reader, bound
// to uuid-controller-metrics-reader as a user would bind Prometheus, and
// stranger, bound to nothing.
func metricsTokens(ctx context.Context, t *testing.T, ns string) (reader, stranger string) {
	t.Helper()
	var err error
	if reader, err = env.cluster.ServiceAccountToken(ctx, ns, "metrics-reader"); err != nil {
		t.Fatal(err)
	}
	if stranger, err = env.cluster.ServiceAccountToken(ctx, ns, "stranger"); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "metrics-reader-" + ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: metricsReaderRole},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "metrics-reader"}},
	}
	if _, err := env.kube.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = env.kube.RbacV1().ClusterRoleBindings().Delete(ctx, binding.Name, metav1.DeleteOptions{})
	})
	return reader, stranger
}

// startSecureController runs the controller with /metrics as deployed
// (HTTPS, delegated reviews); the process's Metrics reads it with auth.
func startSecureController(ctx context.Context, t *testing.T, kubeconfig, ns string, auth cluster.MetricsAuth, args ...string) *cluster.ControllerProcess {
	t.Helper()
	return framework.StartController(ctx, t, cluster.ControllerOptions{Binary: env.binary, Kubeconfig: kubeconfig, MetricsAuth: &auth}, ns, args...)
}

// getMetrics sends one GET to url with token ("" for none) on a new
// connection, trusting caPEM (nil: any certificate), and returns the
// status code and body.
func getMetrics(ctx context.Context, t *testing.T, url, token string, caPEM []byte) (int, string) {
	t.Helper()
	code, body, err := tryGetMetrics(ctx, url, token, caPEM)
	if err != nil {
		t.Fatal(err)
	}
	return code, body
}

func tryGetMetrics(ctx context.Context, url, token string, caPEM []byte) (int, string, error) {
	tlsConfig := &tls.Config{InsecureSkipVerify: true}
	if caPEM != nil {
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(caPEM)
		tlsConfig = &tls.Config{RootCAs: pool}
	}
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsConfig, DisableKeepAlives: true}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// mustRefuse fails the test unless /metrics answers token with code and
// without any metric in the body.
func mustRefuse(ctx context.Context, t *testing.T, p *cluster.ControllerProcess, token string, code int, why string) {
	t.Helper()
	got, body := getMetrics(ctx, t, p.MetricsURL(), token, nil)
	if got != code || strings.Contains(body, "uuid_controller_") || strings.Contains(body, "go_goroutines") {
		t.Errorf("%s: /metrics answered %d %q, want %d and no metrics", why, got, body[:min(len(body), 200)], code)
	}
}

// TestMetricsAuth: as deployed, /metrics is HTTPS and answers only a
// token the apiserver authorizes for get on /metrics: 401 without a token
// or with one it does not know, 403 for a ServiceAccount with no binding,
// and the metrics for one bound to uuid-controller-metrics-reader. The
// controller makes the reviews with deploy/rbac.yaml's grants only.
func TestMetricsAuth(t *testing.T) {
	ctx := testCtx(t)
	ns := env.fw.NewNamespace(ctx, t)
	reader, stranger := metricsTokens(ctx, t, ns)
	p := startSecureController(ctx, t, env.kubeconfig, ns, cluster.MetricsAuth{Token: reader})
	env.fw.WaitUUIDs(ctx, t, ns, env.fw.CreateUuids(ctx, t, ns, "scraped", 1), 30*time.Second)

	mustRefuse(ctx, t, p, "", http.StatusUnauthorized, "no token")
	mustRefuse(ctx, t, p, "not-a-token", http.StatusUnauthorized, "a token the apiserver does not know")
	mustRefuse(ctx, t, p, stranger, http.StatusForbidden, "a ServiceAccount without the reader binding")
	// The controller's own grants make the reviews and nothing more: its
	// ServiceAccount may not read the metrics either.
	own, err := env.cluster.ServiceAccountToken(ctx, cluster.ControllerNamespace, cluster.ControllerServiceAccount)
	if err != nil {
		t.Fatal(err)
	}
	mustRefuse(ctx, t, p, own, http.StatusForbidden, "the controller's own ServiceAccount")
	if got := metricReaches(ctx, t, p, "uuid_controller_uuids_assigned_total", nil, 1); got != 1 {
		t.Errorf("uuid_controller_uuids_assigned_total = %v read with the reader's token, want 1", got)
	}
	refused := func(result string) float64 {
		return controllerMetric(ctx, t, p, "uuid_controller_metrics_requests_total", func(l map[string]string) bool { return l["result"] == result })
	}
	if u, f := refused("unauthenticated"), refused("forbidden"); u != 2 || f != 2 {
		t.Errorf("metrics_requests_total unauthenticated %v, forbidden %v; want 2 and 2", u, f)
	}

	// Plain HTTP to the metrics port gets no metrics; /healthz and /readyz
	// stay plain HTTP for the kubelet (StartController's wait used them).
	plain := "http://" + strings.TrimPrefix(p.MetricsURL(), "https://")
	if code, body, err := tryGetMetrics(ctx, plain, reader, nil); err == nil && (code == http.StatusOK || strings.Contains(body, "uuid_controller_")) {
		t.Errorf("plain HTTP to the metrics port: %d %q", code, body)
	}
}

// TestMetricsCertFromFiles: with --metrics-cert-file/--metrics-key-file the
// controller serves that certificate (a client verifies it against its CA,
// and one trusting another CA refuses it); a broken file written over it is
// logged and the old certificate stays; when new files replace it on disk,
// new connections get the new certificate without a restart.
func TestMetricsCertFromFiles(t *testing.T) {
	ctx := testCtx(t)
	ns := env.fw.NewNamespace(ctx, t)
	reader, _ := metricsTokens(ctx, t, ns)
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	caOld, err := cluster.WriteServingCert(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	// A certificate the controller never sees, for its CA only.
	caOther, err := cluster.WriteServingCert(filepath.Join(dir, "other.crt"), filepath.Join(dir, "other.key"))
	if err != nil {
		t.Fatal(err)
	}
	p := startSecureController(ctx, t, env.kubeconfig, ns, cluster.MetricsAuth{Token: reader, CA: caOld},
		"--metrics-cert-file", certFile, "--metrics-key-file", keyFile)
	if _, err := p.Metrics(ctx); err != nil {
		t.Fatalf("reading /metrics, verifying the served certificate against its CA: %v", err)
	}
	if _, _, err := tryGetMetrics(ctx, p.MetricsURL(), reader, caOther); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("a client trusting another CA: err = %v, want a certificate error", err)
	}

	// A broken certificate on disk is read, refused and logged, and the
	// last good one stays in use.
	if err := os.WriteFile(certFile, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	if !framework.Reaches(true, func() bool { return strings.Contains(p.Output(), "failed to find any PEM data") }) {
		t.Fatal("the controller did not log the broken certificate file")
	}
	if _, _, err := tryGetMetrics(ctx, p.MetricsURL(), reader, caOld); err != nil {
		t.Fatalf("with a broken certificate file on disk, the last good one is no longer served: %v", err)
	}

	// Rotate as a Secret volume update does: new files moved into place.
	caNew, err := cluster.WriteServingCert(filepath.Join(dir, "new.crt"), filepath.Join(dir, "new.key"))
	if err != nil {
		t.Fatal(err)
	}
	for _, mv := range [][2]string{{"new.crt", "tls.crt"}, {"new.key", "tls.key"}} {
		if err := os.Rename(filepath.Join(dir, mv[0]), filepath.Join(dir, mv[1])); err != nil {
			t.Fatal(err)
		}
	}
	if err := framework.Poll(ctx, 90*time.Second, "a client trusting the new CA to read /metrics", func(ctx context.Context) error {
		code, body, err := tryGetMetrics(ctx, p.MetricsURL(), reader, caNew)
		if err == nil && code == http.StatusOK && strings.Contains(body, "uuid_controller_uuids_assigned_total") {
			return nil
		}
		return fmt.Errorf("answered %d, error %v", code, err)
	}); err != nil {
		t.Fatalf("after the files were replaced: %v", err)
	}
	if _, _, err := tryGetMetrics(ctx, p.MetricsURL(), reader, caOld); err == nil {
		t.Error("after rotation a client trusting only the old CA still connects")
	}
	mustStayRunning(t, p)
}

// TestMetricsReviewsUnavailable: when the apiserver cannot be reached for
// the TokenReview or for the SubjectAccessReview, /metrics answers 503 and
// never the metrics, and the log says why; once the reviews go through
// again, the same token reads the metrics (a failure is not cached).
func TestMetricsReviewsUnavailable(t *testing.T) {
	ctx := testCtx(t)
	ns := env.fw.NewNamespace(ctx, t)
	reader, _ := metricsTokens(ctx, t, ns)
	var cut atomic.Value // which review's requests the proxy drops: "tokenreviews", "subjectaccessreviews" or ""
	cut.Store("tokenreviews")
	kc := apiProxy(t, func(w http.ResponseWriter, r *http.Request) bool {
		review := cut.Load().(string)
		if review == "" || r.Method != http.MethodPost || !strings.HasSuffix(r.URL.Path, "/"+review) {
			return false
		}
		// The connection dies without an answer, as with an apiserver
		// that went away mid-request.
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			conn.Close()
		}
		return true
	})
	p := startSecureController(ctx, t, kc, ns, cluster.MetricsAuth{Token: reader})
	for _, review := range []string{"tokenreviews", "subjectaccessreviews"} {
		cut.Store(review)
		mustRefuse(ctx, t, p, reader, http.StatusServiceUnavailable, review+" unreachable")
	}
	cut.Store("")
	if _, err := p.Metrics(ctx); err != nil {
		t.Errorf("once the reviews go through again: %v", err)
	}
	for _, want := range []string{"TokenReview: ", "SubjectAccessReview for user ", "could not review"} {
		if !framework.Reaches(true, func() bool { return strings.Contains(p.Output(), want) }) {
			t.Errorf("the log does not mention %q", want)
		}
	}
	if n := controllerMetric(ctx, t, p, "uuid_controller_metrics_requests_total", func(l map[string]string) bool { return l["result"] == "review_failed" }); n != 2 {
		t.Errorf("metrics_requests_total{result=review_failed} = %v, want 2", n)
	}
}

// TestMetricsWithoutReviewPermission: a controller whose ClusterRole lacks
// tokenreviews create (deploy/rbac.yaml's rule removed) cannot check a
// scraper: /metrics answers 503, never the metrics, and the log names the
// forbidden review.
func TestMetricsWithoutReviewPermission(t *testing.T) {
	ctx := testCtx(t)
	ns := env.fw.NewNamespace(ctx, t)
	reader, _ := metricsTokens(ctx, t, ns)
	kc := withoutRule(t, "uuid-controller-no-reviews", "tokenreviews")
	p := startSecureController(ctx, t, kc, ns, cluster.MetricsAuth{Token: reader})
	mustRefuse(ctx, t, p, reader, http.StatusServiceUnavailable, "no permission to create tokenreviews")
	// The log reaches the test through a pipe, a moment after the answer.
	if !framework.Reaches(true, func() bool { return strings.Contains(p.Output(), "tokenreviews.authentication.k8s.io is forbidden") }) {
		t.Errorf("the log does not say the TokenReview was forbidden:\n%s", p.Output())
	}
}
