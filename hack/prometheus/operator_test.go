package monitoring

import (
	"path/filepath"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"sigs.k8s.io/yaml"
)

// TestOperatorObjectsDecodeStrictly: the ServiceMonitor and the
// PrometheusRule decode into prometheus-operator's own types with no
// unknown field, and the ServiceMonitor scrapes as documented: HTTPS, a
// bearer token from the scraper's Secret, the certificate verified against
// a CA, never skipped.
func TestOperatorObjectsDecodeStrictly(t *testing.T) {
	var sm monitoringv1.ServiceMonitor
	strict(t, "servicemonitor.yaml", &sm)
	var pr monitoringv1.PrometheusRule
	strict(t, "prometheusrule.yaml", &pr)
	if sm.Kind != monitoringv1.ServiceMonitorsKind || pr.Kind != monitoringv1.PrometheusRuleKind {
		t.Fatalf("kinds %q and %q", sm.Kind, pr.Kind)
	}
	if len(sm.Spec.Endpoints) != 1 {
		t.Fatalf("%d endpoints, want 1", len(sm.Spec.Endpoints))
	}
	ep := sm.Spec.Endpoints[0]
	if ep.Scheme == nil || ep.Scheme.String() != "https" {
		t.Errorf("scheme %v, want https", ep.Scheme)
	}
	if ep.Authorization == nil || ep.Authorization.Credentials == nil ||
		ep.Authorization.Credentials.Name != "uuid-controller-metrics-scraper-token" || ep.Authorization.Credentials.Key != "token" {
		t.Errorf("authorization %+v, want the scraper's token Secret", ep.Authorization)
	}
	tls := ep.TLSConfig
	if tls == nil || tls.CA.Secret == nil || tls.CA.Secret.Name != "uuid-controller-metrics-tls" || tls.CA.Secret.Key != "ca.crt" {
		t.Errorf("tlsConfig %+v, want the CA from uuid-controller-metrics-tls", tls)
	}
	if tls != nil && tls.InsecureSkipVerify != nil && *tls.InsecureSkipVerify {
		t.Error("the shipped ServiceMonitor skips certificate verification")
	}
	if n := len(pr.Spec.Groups); n == 0 {
		t.Error("the PrometheusRule has no group")
	}
}

func strict(t *testing.T, file string, v any) {
	t.Helper()
	if err := yaml.UnmarshalStrict(readFile(t, filepath.Join(monitoringDir, file)), v); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
}
