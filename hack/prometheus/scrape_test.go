package monitoring

import (
	"cmp"
	"fmt"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/relabel"
	"github.com/prometheus/prometheus/promql/parser"
	yamlv2 "go.yaml.in/yaml/v2"
)

// shippedJob is the part of deploy/monitoring/prometheus/scrape-config.yaml's
// one job this package checks, decoded as Prometheus decodes it.
type shippedJob struct {
	JobName  string            `yaml:"job_name"`
	Scheme   string            `yaml:"scheme"`
	Path     string            `yaml:"metrics_path"`
	Interval string            `yaml:"scrape_interval"`
	Relabel  []*relabel.Config `yaml:"relabel_configs"`
	SD       []map[string]any  `yaml:"kubernetes_sd_configs"`
	TLS      map[string]any    `yaml:"tls_config"`
	Auth     map[string]any    `yaml:"authorization"`
}

func loadShippedJob(t *testing.T) shippedJob {
	t.Helper()
	var doc struct {
		ScrapeConfigs []shippedJob `yaml:"scrape_configs"`
	}
	if err := yamlv2.Unmarshal(readFile(t, filepath.Join(monitoringDir, "prometheus", "scrape-config.yaml")), &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.ScrapeConfigs) != 1 {
		t.Fatalf("scrape-config.yaml has %d jobs, want 1", len(doc.ScrapeConfigs))
	}
	job := doc.ScrapeConfigs[0]
	for _, c := range job.Relabel {
		if err := c.Validate(model.UTF8Validation); err != nil {
			t.Fatalf("relabel config %+v: %v", c, err)
		}
	}
	return job
}

// TestScrapeConfigKeepsTheService applies the shipped job's relabeling, with
// Prometheus's own code, to the targets Kubernetes service discovery
// (role endpoints) makes for deploy/monitoring/service.yaml's port and for
// the other ports and Services of its namespace: it keeps exactly the
// metrics port of the metrics Service, in the Service's namespace, and
// labels it with the Pod. The discovery itself runs only in a cluster.
func TestScrapeConfigKeepsTheService(t *testing.T) {
	job := loadShippedJob(t)
	var svc struct {
		Metadata struct{ Name, Namespace string }
		Spec     struct {
			Ports []struct{ Name string }
		}
	}
	readYAML(t, filepath.Join(monitoringDir, "service.yaml"), &svc)
	if len(svc.Spec.Ports) != 1 {
		t.Fatalf("service.yaml has %d ports, want 1", len(svc.Spec.Ports))
	}
	if len(job.SD) != 1 || job.SD[0]["role"] != "endpoints" {
		t.Fatalf("kubernetes_sd_configs %v, want one with role endpoints", job.SD)
	}
	ns, _ := job.SD[0]["namespaces"].(map[any]any)
	if names, _ := ns["names"].([]any); len(names) != 1 || names[0] != svc.Metadata.Namespace {
		t.Errorf("discovery in namespaces %v, want only the Service's %s", ns, svc.Metadata.Namespace)
	}
	target := func(service, port string) labels.Labels {
		return labels.FromStrings(
			model.AddressLabel, "10.88.0.5:9090",
			"__meta_kubernetes_namespace", svc.Metadata.Namespace,
			"__meta_kubernetes_service_name", service,
			"__meta_kubernetes_endpoint_port_name", port,
			"__meta_kubernetes_pod_name", "uuid-controller-abc",
		)
	}
	kept := func(lset labels.Labels) (labels.Labels, bool) {
		lb := labels.NewBuilder(lset)
		keep := relabel.ProcessBuilder(lb, job.Relabel...)
		return lb.Labels(), keep
	}
	got, ok := kept(target(svc.Metadata.Name, svc.Spec.Ports[0].Name))
	if !ok {
		t.Fatalf("the shipped relabeling drops the Service %s's port %s", svc.Metadata.Name, svc.Spec.Ports[0].Name)
	}
	if got.Get("pod") != "uuid-controller-abc" {
		t.Errorf("kept target %v has no pod label", got)
	}
	for _, other := range [][2]string{{svc.Metadata.Name, "health"}, {"kubernetes", svc.Spec.Ports[0].Name}, {"uuid-controller-webhook", "https"}} {
		if lset, ok := kept(target(other[0], other[1])); ok {
			t.Errorf("the shipped relabeling keeps Service %s port %s: %v", other[0], other[1], lset)
		}
	}
	if job.Scheme != "https" || job.Path != "/metrics" {
		t.Errorf("scheme %q path %q, want https and /metrics", job.Scheme, job.Path)
	}
	if want := svc.Metadata.Name + "." + svc.Metadata.Namespace + ".svc"; job.TLS["server_name"] != want {
		t.Errorf("tls_config server_name %v, want the Service's name %s", job.TLS["server_name"], want)
	}
}

// TestAlertsSelectTheScrapeJob: every selector in the rules that names a
// job names the shipped scrape job, and the ServiceMonitor (no jobLabel,
// so prometheus-operator names the job after the Service) gets the same
// job, so the alerts see what either way of scraping collects.
func TestAlertsSelectTheScrapeJob(t *testing.T) {
	job := loadShippedJob(t)
	var svc struct{ Metadata struct{ Name string } }
	readYAML(t, filepath.Join(monitoringDir, "service.yaml"), &svc)
	if job.JobName != svc.Metadata.Name {
		t.Errorf("scrape job %q, the Service (the ServiceMonitor's job) %q", job.JobName, svc.Metadata.Name)
	}
	var sm struct {
		Spec struct {
			JobLabel string `json:"jobLabel"`
		}
	}
	readYAML(t, filepath.Join(monitoringDir, "servicemonitor.yaml"), &sm)
	if sm.Spec.JobLabel != "" {
		t.Errorf("the ServiceMonitor's jobLabel %q renames the job", sm.Spec.JobLabel)
	}
	p := parser.NewParser(parser.Options{})
	selectors := 0
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			expr, err := p.ParseExpr(r.Expr)
			if err != nil {
				t.Fatalf("%s: %v", r.Alert, err)
			}
			parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
				vs, ok := n.(*parser.VectorSelector)
				if !ok {
					return nil
				}
				selectors++
				named := false
				for _, m := range vs.LabelMatchers {
					if m.Name == "job" {
						named = true
						if m.Type != labels.MatchEqual || m.Value != job.JobName {
							t.Errorf("%s: selector %s, want job=%q", r.Alert, vs, job.JobName)
						}
					}
				}
				if !named {
					t.Errorf("%s: selector %s names no job; another job's series would count", r.Alert, vs)
				}
				return nil
			})
		}
	}
	if selectors == 0 {
		t.Fatal("no selector found in the rules")
	}
}

// TestServiceMonitorMatchesScrapeConfig: the ServiceMonitor asks
// prometheus-operator for what the plain scrape job does, field by field:
// the metrics Service (selected by its labels, in its namespace), its
// metrics port (the one the job's relabeling keeps), HTTPS, /metrics, the
// same server name to verify.
func TestServiceMonitorMatchesScrapeConfig(t *testing.T) {
	job := loadShippedJob(t)
	var sm monitoringv1.ServiceMonitor
	strict(t, "servicemonitor.yaml", &sm)
	var svc struct {
		Metadata struct {
			Name, Namespace string
			Labels          map[string]string
		}
		Spec struct {
			Ports []struct{ Name string }
		}
	}
	readYAML(t, filepath.Join(monitoringDir, "service.yaml"), &svc)
	if sm.Namespace != svc.Metadata.Namespace {
		t.Errorf("ServiceMonitor in %q, the Service in %q", sm.Namespace, svc.Metadata.Namespace)
	}
	for k, v := range sm.Spec.Selector.MatchLabels {
		if svc.Metadata.Labels[k] != v {
			t.Errorf("ServiceMonitor selects %s=%s, which the Service's labels %v lack", k, v, svc.Metadata.Labels)
		}
	}
	if len(sm.Spec.Endpoints) != 1 {
		t.Fatalf("%d endpoints, want 1", len(sm.Spec.Endpoints))
	}
	ep := sm.Spec.Endpoints[0]
	if ep.Port != svc.Spec.Ports[0].Name {
		t.Errorf("ServiceMonitor port %q, the Service's metrics port %q", ep.Port, svc.Spec.Ports[0].Name)
	}
	if ep.Scheme == nil || ep.Scheme.String() != job.Scheme || ep.Path != job.Path {
		t.Errorf("ServiceMonitor scheme %v path %q, the scrape job %q %q", ep.Scheme, ep.Path, job.Scheme, job.Path)
	}
	if ep.TLSConfig == nil || ep.TLSConfig.ServerName == nil || *ep.TLSConfig.ServerName != job.TLS["server_name"] {
		t.Errorf("ServiceMonitor tlsConfig %+v, want serverName %v as the scrape job", ep.TLSConfig, job.TLS["server_name"])
	}
}

// TestServiceMonitorIsTheScrapeJob checks the rest of the two field by
// field, and that neither has a field this test does not compare, so they
// cannot drift apart: the interval; the bearer token (the Secret's key is
// the file name the job reads, as the Secret mounted in a directory gives
// it); the CA (the same) and that neither skips verification nor sends a
// client certificate; the discovery (role endpoints, the ServiceMonitor's
// own namespace); and the relabeling, which for the job must keep what
// prometheus-operator keeps (the selected Service's port, by name) and add
// only the pod label, which the operator adds to every target.
func TestServiceMonitorIsTheScrapeJob(t *testing.T) {
	job := loadShippedJob(t)
	var sm monitoringv1.ServiceMonitor
	strict(t, "servicemonitor.yaml", &sm)
	if len(sm.Spec.Endpoints) != 1 {
		t.Fatalf("%d endpoints, want 1", len(sm.Spec.Endpoints))
	}
	ep := sm.Spec.Endpoints[0]

	// Only the fields compared below.
	var raw struct {
		Spec struct {
			Raw []map[string]any `json:"endpoints"`
		} `json:"spec"`
	}
	readYAML(t, filepath.Join(monitoringDir, "servicemonitor.yaml"), &raw)
	onlyKeys(t, "the ServiceMonitor's endpoint", raw.Spec.Raw[0], "port", "scheme", "path", "interval", "authorization", "tlsConfig")
	onlyKeys(t, "its authorization", raw.Spec.Raw[0]["authorization"], "type", "credentials")
	onlyKeys(t, "its tlsConfig", raw.Spec.Raw[0]["tlsConfig"], "ca", "serverName")
	var rawJob struct {
		ScrapeConfigs []map[string]any `yaml:"scrape_configs"`
	}
	if err := yamlv2.Unmarshal(readFile(t, filepath.Join(monitoringDir, "prometheus", "scrape-config.yaml")), &rawJob); err != nil {
		t.Fatal(err)
	}
	onlyKeys(t, "the scrape job", rawJob.ScrapeConfigs[0], "job_name", "scheme", "metrics_path", "scrape_interval",
		"authorization", "tls_config", "kubernetes_sd_configs", "relabel_configs")
	onlyKeys(t, "its authorization", job.Auth, "type", "credentials_file")
	onlyKeys(t, "its tls_config", job.TLS, "ca_file", "server_name")

	if string(ep.Interval) != job.Interval {
		t.Errorf("ServiceMonitor interval %q, the scrape job's scrape_interval %q", ep.Interval, job.Interval)
	}
	// The bearer token.
	jobType, _ := job.Auth["type"].(string)
	if a := ep.Authorization; a == nil || !strings.EqualFold(cmp.Or(a.Type, "Bearer"), "Bearer") || !strings.EqualFold(cmp.Or(jobType, "Bearer"), "Bearer") {
		t.Errorf("authorization: ServiceMonitor %+v, scrape job %v: want Bearer in both", ep.Authorization, job.Auth)
	} else if file, _ := job.Auth["credentials_file"].(string); a.Credentials == nil || path.Base(file) != a.Credentials.Key {
		t.Errorf("the ServiceMonitor's token is key %+v of its Secret, the scrape job reads the file %q", a.Credentials, file)
	}
	// The CA.
	caFile, _ := job.TLS["ca_file"].(string)
	if ep.TLSConfig == nil || ep.TLSConfig.CA.Secret == nil || path.Base(caFile) != ep.TLSConfig.CA.Secret.Key {
		t.Errorf("the ServiceMonitor's CA %+v, the scrape job reads the file %q", ep.TLSConfig, caFile)
	}
	// The discovery: the operator's role endpoints, in the ServiceMonitor's
	// own namespace (no namespaceSelector).
	if r := sm.Spec.ServiceDiscoveryRole; r != nil && *r != monitoringv1.EndpointsRole {
		t.Errorf("ServiceMonitor serviceDiscoveryRole %s, the scrape job's role endpoints", *r)
	}
	if ns := sm.Spec.NamespaceSelector; ns.Any || len(ns.MatchNames) > 0 {
		t.Errorf("ServiceMonitor namespaceSelector %+v, the scrape job only its namespace", ns)
	}
	sdNS, _ := job.SD[0]["namespaces"].(map[any]any)
	if names, _ := sdNS["names"].([]any); len(names) != 1 || names[0] != sm.Namespace {
		t.Errorf("the scrape job discovers in %v, the ServiceMonitor in its namespace %s", sdNS, sm.Namespace)
	}
	// The relabeling: the job keeps the Service's port the ServiceMonitor
	// names and nothing else of it, then labels the pod.
	var svc struct{ Metadata struct{ Name string } }
	readYAML(t, filepath.Join(monitoringDir, "service.yaml"), &svc)
	if len(job.Relabel) != 2 || job.Relabel[0].Action != relabel.Keep {
		t.Fatalf("the scrape job's relabel_configs %v, want a keep then the pod label", job.Relabel)
	}
	keep := func(service, port string) bool {
		lb := labels.NewBuilder(labels.FromStrings("__meta_kubernetes_service_name", service, "__meta_kubernetes_endpoint_port_name", port))
		return relabel.ProcessBuilder(lb, job.Relabel[0])
	}
	if !keep(svc.Metadata.Name, ep.Port) || keep(svc.Metadata.Name, ep.Port+"x") || keep(svc.Metadata.Name, "") || keep(svc.Metadata.Name+"x", ep.Port) {
		t.Errorf("the scrape job's keep %+v does not keep exactly the Service %s's port %s, as the ServiceMonitor does", job.Relabel[0], svc.Metadata.Name, ep.Port)
	}
	pod := job.Relabel[1]
	if pod.Action != relabel.Replace || pod.TargetLabel != "pod" || len(pod.SourceLabels) != 1 || pod.SourceLabels[0] != "__meta_kubernetes_pod_name" {
		t.Errorf("the scrape job's second relabeling %+v, want the pod label prometheus-operator adds", pod)
	}
}

// onlyKeys fails the test when m (a map decoded from YAML or JSON) has a
// key not in keys.
func onlyKeys(t *testing.T, what string, m any, keys ...string) {
	t.Helper()
	var got []string
	switch m := m.(type) {
	case map[string]any:
		for k := range m {
			got = append(got, k)
		}
	case map[any]any:
		for k := range m {
			got = append(got, fmt.Sprint(k))
		}
	default:
		t.Errorf("%s: %T, want a map", what, m)
		return
	}
	for _, k := range got {
		if !slices.Contains(keys, k) {
			t.Errorf("%s has %s, which no test compares between the ServiceMonitor and the scrape job", what, k)
		}
	}
}
