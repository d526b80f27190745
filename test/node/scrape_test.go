//go:build node

package node

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/demo-operator/uuid-controller/test/cluster"
	"github.com/demo-operator/uuid-controller/test/framework"
)

// The shipped monitoring, as deploy/monitoring names it.
const (
	shippedScrapeConfig = "deploy/monitoring/prometheus/scrape-config.yaml"
	monitoringComponent = "deploy/monitoring"
	metricsService      = "uuid-controller-metrics"
	metricsTLSSecret    = "uuid-controller-metrics-tls"
	scraperTokenSecret  = "uuid-controller-metrics-scraper-token"
	metricsJob          = "uuid-controller-metrics"
)

// TestShippedScrapeConfig runs deploy/monitoring/prometheus/scrape-config.yaml's
// job as shipped, on the node, in bin/prometheus (built with Kubernetes
// service discovery): deploy/ with the deploy/monitoring component (but
// prometheus-operator's kinds, which need the operator) and a Secret
// uuid-controller-metrics-tls for the Service's name, as docs/metrics.md
// asks. Only file paths change: the token file (the scraper's token
// Secret, filled by the token controller), the CA file (the Secret's
// ca.crt) and a kubeconfig for the discovery, which runs outside the
// cluster. Kubernetes service discovery finds the Service's endpoints; the
// relabeling keeps each replica's metrics port, and only it (the pods'
// other ports are discovered and dropped); the scrape verifies the
// certificate against the CA for the configured server name and is let in
// with the token: every replica's target is up with uuid_controller_*
// series, labelled with its pod.
func TestShippedScrapeConfig(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 12*time.Minute)
	defer cancel()
	if err := waitRolledOut(ctx); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	caPEM := createMetricsTLSSecret(ctx, t, dir)
	added := applyMonitoringComponent(ctx, t, dir)
	t.Cleanup(func() { removeMonitoringComponent(t, added) })
	if err := waitRolledOut(ctx); err != nil {
		t.Fatal(err)
	}
	pods, err := controllerPods(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(pods) == 0 {
		t.Fatal("no controller pod")
	}
	for _, p := range pods {
		if !slices.Contains(p.Spec.Containers[0].Args, "--metrics-cert-file=/etc/uuid-controller/metrics-tls/tls.crt") {
			t.Fatalf("pod %s: args %q, want metrics-cert.yaml's --metrics-cert-file", p.Name, p.Spec.Containers[0].Args)
		}
	}
	token := scraperToken(ctx, t)

	files := map[string][]byte{"token": []byte(token), "ca.crt": caPEM}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cfg := shippedJobWithPaths(t, filepath.Join(dir, "token"), filepath.Join(dir, "ca.crt"), env.cluster.AdminKubeconfig())
	start := time.Now()
	prom, err := env.cluster.StartPrometheus(ctx, dir, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := prom.Stop(); err != nil {
			t.Errorf("stopping prometheus: %v", err)
		}
	})

	// Every replica's metrics port, up, labelled with its pod; nothing else.
	want := map[string]string{} // pod -> scrape URL
	for _, p := range pods {
		want[p.Name] = "https://" + p.Status.PodIP + ":9090/metrics"
	}
	var last targetsData
	err = framework.Poll(ctx, 2*time.Minute, "the shipped job's targets to be every replica's metrics port, up", func(ctx context.Context) error {
		if _, err := prom.API(ctx, "targets", nil, &last); err != nil {
			return err
		}
		got := map[string]string{}
		for _, tg := range last.ActiveTargets {
			if tg.Health != "up" {
				return fmt.Errorf("target %s (pod %q) is %s: %s", tg.ScrapeURL, tg.Labels["pod"], tg.Health, tg.LastError)
			}
			got[tg.Labels["pod"]] = tg.ScrapeURL
		}
		if len(last.ActiveTargets) != len(want) || !maps.Equal(got, want) {
			return fmt.Errorf("active targets (pod: URL) %v, want %v", got, want)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%v\nactive targets: %+v\ndropped: %+v", err, last.ActiveTargets, last.DroppedTargets)
	}
	t.Logf("the shipped job: %d targets up in %s", len(want), time.Since(start).Round(time.Millisecond))
	for _, tg := range last.ActiveTargets {
		if tg.Labels["job"] != metricsJob {
			t.Errorf("target %s: job %q, want the shipped job's name", tg.ScrapeURL, tg.Labels["job"])
		}
	}
	// The discovery saw more than it kept: the pods' health ports, behind
	// the same Service but no port of it.
	dropped := 0
	for _, tg := range last.DroppedTargets {
		if tg.DiscoveredLabels["__meta_kubernetes_service_name"] == metricsService {
			dropped++
		}
	}
	if dropped == 0 {
		t.Errorf("no target of the Service %s was dropped: the discovery found only what the relabeling keeps, which tests nothing; dropped: %+v", metricsService, last.DroppedTargets)
	}

	// The scrapes got the controller's metrics, from each replica.
	var q struct {
		Result []struct {
			Metric map[string]string `json:"metric"`
		} `json:"result"`
	}
	if _, err := prom.API(ctx, "query", url.Values{"query": {`count by (pod) ({job="` + metricsJob + `", __name__=~"uuid_controller_.+"})`}}, &q); err != nil {
		t.Fatal(err)
	}
	var scraped []string
	for _, r := range q.Result {
		scraped = append(scraped, r.Metric["pod"])
	}
	slices.Sort(scraped)
	if wantPods := slices.Sorted(maps.Keys(want)); !slices.Equal(scraped, wantPods) {
		t.Errorf("uuid_controller_* series scraped from pods %q, want %q", scraped, wantPods)
	}
}

type promTarget struct {
	Labels           map[string]string `json:"labels"`
	DiscoveredLabels map[string]string `json:"discoveredLabels"`
	ScrapeURL        string            `json:"scrapeUrl"`
	Health           string            `json:"health"`
	LastError        string            `json:"lastError"`
}

type targetsData struct {
	ActiveTargets  []promTarget `json:"activeTargets"`
	DroppedTargets []promTarget `json:"droppedTargets"`
}

// shippedJobWithPaths is a prometheus.yml with the shipped job, only its
// token and CA files replaced and a kubeconfig given to its discovery.
func shippedJobWithPaths(t *testing.T, tokenFile, caFile, kubeconfig string) []byte {
	t.Helper()
	job, err := cluster.ShippedScrapeJob(filepath.Join(env.root, shippedScrapeConfig))
	if err != nil {
		t.Fatal(err)
	}
	// set replaces the value at path (keys, a list's one entry); a new key
	// only where added is true.
	set := func(path string, v any, added bool) {
		t.Helper()
		keys := strings.Split(path, ".")
		m := job
		for _, k := range keys[:len(keys)-1] {
			switch next := m[k].(type) {
			case map[string]any:
				m = next
			case []any: // the first of a list: the one discovery
				if len(next) != 1 {
					t.Fatalf("%s: %s has %d entries, want 1", shippedScrapeConfig, k, len(next))
				}
				m, _ = next[0].(map[string]any)
			}
			if m == nil {
				t.Fatalf("%s: no %s", shippedScrapeConfig, path)
			}
		}
		if _, ok := m[keys[len(keys)-1]]; !ok && !added {
			t.Fatalf("%s: no %s to replace", shippedScrapeConfig, path)
		}
		m[keys[len(keys)-1]] = v
	}
	set("authorization.credentials_file", tokenFile, false)
	set("tls_config.ca_file", caFile, false)
	// Out of the cluster, the discovery needs the apiserver and credentials.
	set("kubernetes_sd_configs.kubeconfig_file", kubeconfig, true)
	cfg, err := yaml.Marshal(map[string]any{"scrape_configs": []any{job}})
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// createMetricsTLSSecret creates the Secret metrics-cert.yaml mounts: a
// certificate for the metrics Service's name from a CA of the test's, as
// cert-manager would issue it (docs/metrics.md). It returns the CA.
func createMetricsTLSSecret(ctx context.Context, t *testing.T, dir string) []byte {
	t.Helper()
	cert, key := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	caPEM, err := cluster.WriteServingCertFor(cert, key, []string{metricsService + "." + ns + ".svc"})
	if err != nil {
		t.Fatal(err)
	}
	certPEM, err := os.ReadFile(cert)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := os.ReadFile(key)
	if err != nil {
		t.Fatal(err)
	}
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: metricsTLSSecret, Namespace: ns},
		Type:       corev1.SecretTypeTLS,
		Data:       map[string][]byte{"tls.crt": certPEM, "tls.key": keyPEM, "ca.crt": caPEM},
	}
	if _, err := env.Kube.CoreV1().Secrets(ns).Create(ctx, s, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		err := env.Kube.CoreV1().Secrets(ns).Delete(context.Background(), metricsTLSSecret, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting the Secret %s: %v", metricsTLSSecret, err)
		}
	})
	return caPEM
}

// applyMonitoringComponent applies deploy/ with the deploy/monitoring
// component, its image the pushed one, as a user's overlay does, but the
// objects of prometheus-operator's kinds (no operator runs here). It
// returns the objects the component adds to deploy/.
func applyMonitoringComponent(ctx context.Context, t *testing.T, dir string) []*unstructured.Unstructured {
	t.Helper()
	overlay := filepath.Join(dir, "overlay")
	if out, err := exec.CommandContext(ctx, filepath.Join(env.root, "hack", "kustomize-overlay.sh"), overlay, env.image).CombinedOutput(); err != nil {
		t.Fatalf("hack/kustomize-overlay.sh: %v\n%s", err, out)
	}
	component, err := filepath.Rel(overlay, filepath.Join(env.root, monitoringComponent))
	if err != nil {
		t.Fatal(err)
	}
	kustomization := filepath.Join(overlay, "kustomization.yaml")
	k, err := os.ReadFile(kustomization)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(kustomization, append(k, "components:\n  - "+component+"\n"...), 0o644); err != nil {
		t.Fatal(err)
	}
	objs, err := renderKustomization(ctx, dir, overlay)
	if err != nil {
		t.Fatal(err)
	}
	deployObjs, err := renderKustomization(ctx, dir, filepath.Join(env.root, "deploy"))
	if err != nil {
		t.Fatal(err)
	}
	key := func(o *unstructured.Unstructured) string {
		return o.GetKind() + "/" + o.GetNamespace() + "/" + o.GetName()
	}
	inDeploy := map[string]bool{}
	for _, o := range deployObjs {
		inDeploy[key(o)] = true
	}
	list := map[string]any{"apiVersion": "v1", "kind": "List", "items": []any{}}
	var added []*unstructured.Unstructured
	for _, o := range objs {
		if strings.HasPrefix(o.GetAPIVersion(), "monitoring.coreos.com/") {
			continue
		}
		list["items"] = append(list["items"].([]any), o.Object)
		if !inDeploy[key(o)] && o.GetKind() != "CustomResourceDefinition" {
			added = append(added, o)
		}
	}
	if len(added) == 0 {
		t.Fatal("the monitoring component adds no object to deploy/")
	}
	b, err := json.Marshal(list)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "deploy-monitoring.json")
	if err := os.WriteFile(file, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := env.cluster.Kubectl(ctx, "apply", "-f", file); err != nil {
		t.Fatalf("kubectl apply deploy/ with deploy/monitoring: %v\n%s", err, out)
	}
	return added
}

// removeMonitoringComponent deletes the objects the component added and
// applies deploy/ again, which takes metrics-cert.yaml's patch out of the
// Deployment, and waits for it to roll out.
func removeMonitoringComponent(t *testing.T, added []*unstructured.Unstructured) {
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	for _, o := range added {
		args := []string{"delete", strings.ToLower(o.GetKind()) + "/" + o.GetName(), "--ignore-not-found"}
		if o.GetNamespace() != "" {
			args = append(args, "-n", o.GetNamespace())
		}
		if out, err := env.cluster.Kubectl(ctx, args...); err != nil {
			t.Errorf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	if err := applyDeploy(ctx); err != nil {
		t.Error(err)
	}
	if err := waitRolledOut(ctx); err != nil {
		t.Errorf("deploy/ again: %v", err)
	}
}

// scraperToken waits for the token controller to fill the scraper's token
// Secret (deploy/monitoring/scraper.yaml) and returns the token.
func scraperToken(ctx context.Context, t *testing.T) string {
	t.Helper()
	var token string
	if err := framework.Poll(ctx, time.Minute, "the token controller to fill "+scraperTokenSecret, func(ctx context.Context) error {
		s, err := env.Kube.CoreV1().Secrets(ns).Get(ctx, scraperTokenSecret, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if token = string(s.Data["token"]); token == "" {
			return fmt.Errorf("%s has no token yet", scraperTokenSecret)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return token
}
