package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/yaml"

	"github.com/demo-operator/uuid-controller/test/cluster"
	"github.com/demo-operator/uuid-controller/test/framework"
)

// The shipped monitoring files, loaded as they are (alertRules scales the
// rules' durations, nothing else).
const (
	shippedScrapeConfig = "../../deploy/monitoring/prometheus/scrape-config.yaml"
	shippedRules        = "../../deploy/monitoring/prometheus/rules.yaml"
)

// alertTimeScale divides the rules' evaluation interval and every for:,
// so an alert held back 5 minutes in production is 10 s here. The
// expressions, their range windows, labels and annotations are as shipped.
const alertTimeScale = 30

// scrapeInterval is the test Prometheus's scrape interval and timeout:
// short, but long enough for an HTTPS scrape with its reviews on a loaded
// machine. The rules are evaluated every second (30 s / alertTimeScale).
const (
	scrapeInterval = 2 * time.Second
	evalInterval   = time.Second
)

// scaledRules returns the shipped rules with the group interval and each
// rule's for: divided by alertTimeScale (at least 1 s).
func scaledRules(t *testing.T) []byte {
	t.Helper()
	raw, err := os.ReadFile(shippedRules)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Groups []map[string]any `json:"groups"`
	}
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("%s: %v", shippedRules, err)
	}
	scale := func(where string, v any) string {
		d, err := time.ParseDuration(fmt.Sprint(v))
		if err != nil {
			t.Fatalf("%s: duration %v: %v", where, v, err)
		}
		return max(d/alertTimeScale, time.Second).String()
	}
	for _, g := range doc.Groups {
		g["interval"] = scale("interval", g["interval"])
		rules, _ := g["rules"].([]any)
		for _, r := range rules {
			if r, ok := r.(map[string]any); ok && r["for"] != nil {
				r["for"] = scale(fmt.Sprint(r["alert"]), r["for"])
			}
		}
	}
	out, err := yaml.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// prometheusConfig is the shipped scrape job with its discovery replaced by
// targets, its interval by the test's and its file paths by the test's
// token and CA, and the scaled rules. The certificate the test writes is for localhost, not the
// Service's name.
func prometheusConfig(t *testing.T, dir string, targets []string, token string, caPEM []byte) []byte {
	t.Helper()
	job, err := cluster.ShippedScrapeJob(shippedScrapeConfig)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{"token": []byte(token), "ca.crt": caPEM, "rules.yaml": scaledRules(t)}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	delete(job, "kubernetes_sd_configs")
	delete(job, "relabel_configs")
	delete(job, "scrape_interval") // the global one below, scaled
	job["static_configs"] = []any{map[string]any{"targets": targets}}
	job["authorization"].(map[string]any)["credentials_file"] = filepath.Join(dir, "token")
	tlsConfig := job["tls_config"].(map[string]any)
	tlsConfig["ca_file"] = filepath.Join(dir, "ca.crt")
	tlsConfig["server_name"] = "localhost"
	if tlsConfig["insecure_skip_verify"] != nil {
		t.Fatalf("the shipped scrape job skips certificate verification")
	}
	cfg, err := yaml.Marshal(map[string]any{
		"global": map[string]any{
			"scrape_interval":     scrapeInterval.String(),
			"scrape_timeout":      scrapeInterval.String(),
			"evaluation_interval": evalInterval.String(),
		},
		"rule_files":     []string{filepath.Join(dir, "rules.yaml")},
		"scrape_configs": []any{job},
	})
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// monitored is a namespace whose controllers serve /metrics as deployed
// with a certificate from files, and a reader's token for Prometheus.
type monitored struct {
	ns, token string
	caPEM     []byte
	certArgs  []string
}

func newMonitored(ctx context.Context, t *testing.T) *monitored {
	t.Helper()
	m := &monitored{ns: env.fw.NewNamespace(ctx, t)}
	m.token, _ = metricsTokens(ctx, t, m.ns)
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	var err error
	if m.caPEM, err = cluster.WriteServingCert(cert, key); err != nil {
		t.Fatal(err)
	}
	m.certArgs = []string{"--metrics-cert-file", cert, "--metrics-key-file", key}
	return m
}

// launch starts a controller on m.ns serving /metrics with m's certificate,
// without waiting for it to be ready.
func (m *monitored) launch(ctx context.Context, t *testing.T, args ...string) *cluster.ControllerProcess {
	t.Helper()
	return m.launchVia(ctx, t, env.kubeconfig, args...)
}

// launchVia is launch with the controller's kubeconfig (a proxy's).
func (m *monitored) launchVia(ctx context.Context, t *testing.T, kubeconfig string, args ...string) *cluster.ControllerProcess {
	t.Helper()
	auth := cluster.MetricsAuth{Token: m.token, CA: m.caPEM}
	return framework.LaunchController(ctx, t, cluster.ControllerOptions{Binary: env.binary, Kubeconfig: kubeconfig, MetricsAuth: &auth},
		m.ns, append(slices.Clone(m.certArgs), args...)...)
}

// startPrometheus runs Prometheus scraping ps with m's token and CA and
// the shipped rules, and waits until every target is up.
func (m *monitored) startPrometheus(ctx context.Context, t *testing.T, ps ...*cluster.ControllerProcess) *cluster.Prometheus {
	t.Helper()
	var targets []string
	for _, p := range ps {
		u, err := url.Parse(p.MetricsURL())
		if err != nil {
			t.Fatal(err)
		}
		targets = append(targets, u.Host)
	}
	dir := t.TempDir()
	prom, err := env.cluster.StartPrometheus(ctx, dir, prometheusConfig(t, dir, targets, m.token, m.caPEM))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := prom.Stop(); err != nil {
			t.Errorf("stopping prometheus: %v", err)
		}
	})
	waitTargetsUp(ctx, t, prom, len(targets))
	return prom
}

type promTarget struct {
	ScrapeURL string `json:"scrapeUrl"`
	Health    string `json:"health"`
	LastError string `json:"lastError"`
}

// waitTargetsUp waits until Prometheus's n targets are all up.
func waitTargetsUp(ctx context.Context, t *testing.T, prom *cluster.Prometheus, n int) {
	t.Helper()
	var last []promTarget
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		var data struct {
			ActiveTargets []promTarget `json:"activeTargets"`
		}
		if _, err := prom.API(ctx, "targets", nil, &data); err != nil {
			return false, err
		}
		last = data.ActiveTargets
		up := 0
		for _, tg := range last {
			if tg.Health == "up" {
				up++
			}
		}
		return up == n && len(last) == n, nil
	})
	if err != nil {
		t.Fatalf("prometheus targets not all up: %v; targets: %+v", err, last)
	}
}

type promAlert struct {
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
	State       string            `json:"state"`
	ActiveAt    time.Time         `json:"activeAt"`
	Value       string            `json:"value"`
}

// alerts reads Prometheus's /api/v1/alerts: its alerts and the body as sent.
func alerts(ctx context.Context, t *testing.T, prom *cluster.Prometheus) ([]promAlert, string) {
	t.Helper()
	var data struct {
		Alerts []promAlert `json:"alerts"`
	}
	body, err := prom.API(ctx, "alerts", nil, &data)
	if err != nil {
		t.Fatal(err)
	}
	return data.Alerts, string(body)
}

// waitFiring waits until Prometheus reports alert name firing, with the
// labels in match, and returns it with the /api/v1/alerts response that
// showed it.
func waitFiring(ctx context.Context, t *testing.T, prom *cluster.Prometheus, name string, match map[string]string, timeout time.Duration) (promAlert, string) {
	t.Helper()
	var (
		found promAlert
		body  string
		seen  []promAlert
	)
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		seen, body = alerts(ctx, t, prom)
		for _, a := range seen {
			if a.Labels["alertname"] == name && a.State == "firing" && hasLabels(a.Labels, match) {
				found = a
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("alert %s not firing within %s; alerts: %+v", name, timeout, seen)
	}
	for _, key := range []string{"summary", "description", "runbook_url"} {
		if found.Annotations[key] == "" || strings.Contains(found.Annotations[key], "<no value>") {
			t.Errorf("%s: annotation %s is %q", name, key, found.Annotations[key])
		}
	}
	return found, body
}

func hasLabels(have, want map[string]string) bool {
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

// alertValue is an alert's value as a number.
func alertValue(t *testing.T, a promAlert) float64 {
	t.Helper()
	v, err := strconv.ParseFloat(a.Value, 64)
	if err != nil {
		t.Fatalf("alert value %q: %v", a.Value, err)
	}
	return v
}

type promRule struct {
	Name           string    `json:"name"`
	Health         string    `json:"health"`
	LastError      string    `json:"lastError"`
	LastEvaluation time.Time `json:"lastEvaluation"`
}

// rules reads every rule Prometheus has loaded.
func rules(ctx context.Context, t *testing.T, prom *cluster.Prometheus) []promRule {
	t.Helper()
	var data struct {
		Groups []struct {
			Rules []promRule `json:"rules"`
		} `json:"groups"`
	}
	if _, err := prom.API(ctx, "rules", nil, &data); err != nil {
		t.Fatal(err)
	}
	var out []promRule
	for _, g := range data.Groups {
		out = append(out, g.Rules...)
	}
	return out
}

// waitEvaluatedSince waits until Prometheus has evaluated every rule at
// least once after since (so no state left from before is read).
func waitEvaluatedSince(ctx context.Context, t *testing.T, prom *cluster.Prometheus, since time.Time) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		loaded := rules(ctx, t, prom)
		for _, r := range loaded {
			if r.LastEvaluation.Before(since) {
				return false, nil
			}
		}
		return len(loaded) > 0, nil
	})
	if err != nil {
		t.Fatalf("rules not evaluated since %s: %v", since, err)
	}
}

// shippedAlertNames are the alerts of the shipped rules file.
func shippedAlertNames(t *testing.T) []string {
	t.Helper()
	var doc struct {
		Groups []struct {
			Rules []struct {
				Alert string `json:"alert"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(scaledRules(t), &doc); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, g := range doc.Groups {
		for _, r := range g.Rules {
			names = append(names, r.Alert)
		}
	}
	return names
}

// TestAlertsQuietWhenHealthy: a leader and a standby serving /metrics as
// deployed, scraped by a real Prometheus over HTTPS with a reader's token,
// verifying their certificate; with objects created and given UUIDs, every
// shipped rule evaluates without error, over 15 evaluations no alert is
// pending or firing, and the latency histogram counts every assignment.
func TestAlertsQuietWhenHealthy(t *testing.T) {
	ctx := testCtx(t)
	m := newMonitored(ctx, t)
	// Kubernetes' own lease duration: a loaded machine must not make a
	// healthy leader lose its lease.
	args := leaderArgs(ctx, t, m.ns, 15*time.Second)
	a, b := m.launch(ctx, t, args...), m.launch(ctx, t, args...)
	for _, p := range []*cluster.ControllerProcess{a, b} {
		if err := p.WaitReady(ctx, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	waitLeader(ctx, t, 30*time.Second, a, b)
	prom := m.startPrometheus(ctx, t, a, b)
	const n = 20
	env.fw.WaitUUIDs(ctx, t, m.ns, env.fw.CreateUuids(ctx, t, m.ns, "healthy", n), time.Minute)

	// The scraped histogram counts every assignment.
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		var res struct {
			Result []struct {
				Value [2]any `json:"value"`
			} `json:"result"`
		}
		q := url.Values{"query": {`sum(uuid_controller_assignment_latency_seconds_count{job="uuid-controller-metrics"})`}}
		if _, err := prom.API(ctx, "query", q, &res); err != nil {
			return false, err
		}
		return len(res.Result) == 1 && res.Result[0].Value[1] == fmt.Sprint(n), nil
	})
	if err != nil {
		t.Errorf("prometheus did not see %d assignments in the latency histogram: %v", n, err)
	}

	// An evaluation before the first scrape may have left an alert
	// pending; the next one, with the controllers' metrics, clears it.
	waitEvaluatedSince(ctx, t, prom, time.Now().Add(evalInterval))
	start := time.Now()
	const cycles = 15
	want := shippedAlertNames(t)
	err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		if active, _ := alerts(ctx, t, prom); len(active) > 0 {
			return false, fmt.Errorf("healthy controllers, yet alerts %+v", active)
		}
		loaded := rules(ctx, t, prom)
		if len(loaded) != len(want) {
			return false, fmt.Errorf("prometheus loaded %d rules, the shipped file has %d (%v)", len(loaded), len(want), want)
		}
		for _, r := range loaded {
			if r.Health == "err" {
				return false, fmt.Errorf("rule %s fails to evaluate: %s", r.Name, r.LastError)
			}
			if r.Health != "ok" || r.LastEvaluation.Before(start.Add(cycles*evalInterval)) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d rules evaluated for %s with no alert pending or firing", len(want), time.Since(start).Round(time.Second))
}

// TestAlertCRDNotReady: on the article's CRD (no status subresource) the
// shipped rules fire UuidControllerCRDNotReady.
func TestAlertCRDNotReady(t *testing.T) {
	ctx := testCtx(t)
	m := newMonitored(ctx, t)
	useArticleCRD(ctx, t)
	env.fw.CreateUuids(ctx, t, m.ns, "waiting", 2)
	p := m.launch(ctx, t)
	prom := m.startPrometheus(ctx, t, p)
	a, body := waitFiring(ctx, t, prom, "UuidControllerCRDNotReady", nil, 2*time.Minute)
	t.Logf("/api/v1/alerts: %s", body)
	if a.Labels["severity"] != "critical" || alertValue(t, a) != 0 {
		t.Errorf("alert %+v, want severity critical and value 0", a)
	}
}

// TestAlertAssignmentsFailing: an admission policy denying UUID writes
// with 403 (retried) fires UuidControllerAssignmentsFailing with reason
// Forbidden; one denying them with 422 (given up) fires
// UuidControllerObjectsDropped.
func TestAlertAssignmentsFailing(t *testing.T) {
	ctx := testCtx(t)
	retried := newMonitored(ctx, t)
	// A second namespace and controller, with the same token and
	// certificate: one Prometheus job scrapes both.
	rejected := *retried
	rejected.ns = env.fw.NewNamespace(ctx, t)
	for _, c := range []struct {
		m      *monitored
		reason metav1.StatusReason
	}{{retried, metav1.StatusReasonForbidden}, {&rejected, metav1.StatusReasonInvalid}} {
		remove, err := env.cluster.RejectUUIDWrites(ctx, "deny-"+c.m.ns, c.m.ns, c.reason)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = remove(context.Background()) })
	}
	p1 := retried.launch(ctx, t)
	p2 := rejected.launch(ctx, t)
	prom := retried.startPrometheus(ctx, t, p1, p2)
	// Objects come once Prometheus scrapes: a counter that is already 1
	// at its first scrape shows no increase.
	env.fw.CreateUuids(ctx, t, retried.ns, "denied", 2)
	env.fw.CreateUuids(ctx, t, rejected.ns, "denied", 2)
	_, body := waitFiring(ctx, t, prom, "UuidControllerAssignmentsFailing",
		map[string]string{"reason": string(metav1.StatusReasonForbidden)}, 2*time.Minute)
	t.Logf("/api/v1/alerts: %s", body)
	waitFiring(ctx, t, prom, "UuidControllerObjectsDropped", nil, 2*time.Minute)
}

// TestAlertQueueBackingUp: a leader and a standby, each with one worker
// held to 2 API requests a second (--kube-api-qps): the leader keeps more
// than 100 of 300 new objects queued for longer than the alert's scaled
// for:, and the backlog alert fires for it. The standby's queue holds the
// same keys (it works none until it leads), as Prometheus scrapes, yet it
// never alerts: only the leader's backlog counts. Their metrics reviews
// have a client of their own, so Prometheus still scrapes them. (With many
// workers the writes would time out in the rate limiter and leave the
// queue for their backoff instead.)
func TestAlertQueueBackingUp(t *testing.T) {
	ctx := testCtx(t)
	m := newMonitored(ctx, t)
	// Kubernetes' own lease duration: the throttled client must not cost
	// the leader its lease.
	args := append(leaderArgs(ctx, t, m.ns, 15*time.Second), "--workers=1", "--kube-api-qps=2", "--kube-api-burst=1")
	a, b := m.launch(ctx, t, args...), m.launch(ctx, t, args...)
	for _, p := range []*cluster.ControllerProcess{a, b} {
		if err := p.WaitReady(ctx, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	leader := waitLeader(ctx, t, 30*time.Second, a, b)
	standby := a
	if leader == a {
		standby = b
	}
	instance := func(p *cluster.ControllerProcess) string {
		u, err := url.Parse(p.MetricsURL())
		if err != nil {
			t.Fatal(err)
		}
		return u.Host
	}
	prom := m.startPrometheus(ctx, t, a, b)
	env.fw.CreateUuids(ctx, t, m.ns, "backlog", 300)
	fired, body := waitFiring(ctx, t, prom, "UuidControllerQueueBackingUp", map[string]string{"instance": instance(leader)}, 2*time.Minute)
	t.Logf("/api/v1/alerts: %s", body)
	if v := alertValue(t, fired); v <= 100 {
		t.Errorf("UuidControllerQueueBackingUp fired at a queue depth of %v, want over 100", v)
	}
	active, _ := alerts(ctx, t, prom)
	for _, al := range active {
		if al.Labels["alertname"] == "UuidControllerQueueBackingUp" && al.Labels["instance"] == instance(standby) {
			t.Errorf("the standby's backlog alerts (%s): %+v", al.State, al)
		}
	}
	// The clause is what kept the standby quiet: its scraped queue is as deep.
	var res struct {
		Result []struct {
			Value [2]any `json:"value"`
		} `json:"result"`
	}
	q := url.Values{"query": {fmt.Sprintf(`workqueue_depth{job="uuid-controller-metrics", name="uuid", instance=%q}`, instance(standby))}}
	if _, err := prom.API(ctx, "query", q, &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Result) != 1 {
		t.Fatalf("the standby's workqueue_depth: %+v", res.Result)
	}
	if d, err := strconv.ParseFloat(fmt.Sprint(res.Result[0].Value[1]), 64); err != nil || d <= 100 {
		t.Errorf("the standby's scraped queue depth is %v (%v), want over 100: the test proves nothing", res.Result[0].Value[1], err)
	}
	if isLeader(ctx, t, standby) || !isLeader(ctx, t, leader) {
		t.Error("the lease moved during the test")
	}
}

// TestAlertControllerStopped: once the only controller stops, the shipped
// rules fire UuidControllerDown and UuidControllerNoLeader.
func TestAlertControllerStopped(t *testing.T) {
	ctx := testCtx(t)
	m := newMonitored(ctx, t)
	p := m.launch(ctx, t, leaderArgs(ctx, t, m.ns, 4*time.Second)...)
	waitLeader(ctx, t, 30*time.Second, p)
	prom := m.startPrometheus(ctx, t, p)
	// An evaluation before the first scrape may have left an alert
	// pending; the next one, with the controller's metrics, clears it.
	waitEvaluatedSince(ctx, t, prom, time.Now().Add(evalInterval))
	if active, _ := alerts(ctx, t, prom); len(active) > 0 {
		t.Fatalf("alerts while the controller runs: %+v", active)
	}
	if code := sigterm(t, p, 30*time.Second); code != 0 {
		t.Errorf("controller exit code %d on SIGTERM", code)
	}
	_, body := waitFiring(ctx, t, prom, "UuidControllerDown", nil, 2*time.Minute)
	t.Logf("/api/v1/alerts: %s", body)
	waitFiring(ctx, t, prom, "UuidControllerNoLeader", nil, 2*time.Minute)
}

// TestAlertKopfFinalizerStuck: a deleted object that carries kopf's
// finalizer, under a controller without --remove-kopf-finalizer, fires
// UuidControllerKopfFinalizerStuck.
func TestAlertKopfFinalizerStuck(t *testing.T) {
	ctx := testCtx(t)
	m := newMonitored(ctx, t)
	createBare(ctx, t, m.ns, "held", kopfFinalizer)
	t.Cleanup(func() {
		// Let the deletion finish, so the namespace holds nothing stuck.
		_, _ = env.fw.Uuids(m.ns).Patch(context.Background(), "held", types.MergePatchType,
			[]byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
	})
	p := m.launch(ctx, t)
	env.fw.WaitUUIDs(ctx, t, m.ns, []string{"held"}, time.Minute)
	if err := env.fw.Uuids(m.ns).Delete(ctx, "held", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if u := object(ctx, t, m.ns, "held"); u == nil || u.GetDeletionTimestamp() == nil {
		t.Fatalf("the object is not held by its finalizer: %v", u)
	}
	prom := m.startPrometheus(ctx, t, p)
	a, body := waitFiring(ctx, t, prom, "UuidControllerKopfFinalizerStuck", nil, 2*time.Minute)
	t.Logf("/api/v1/alerts: %s", body)
	if alertValue(t, a) != 1 {
		t.Errorf("alert value %q, want 1 object", a.Value)
	}
}

// TestAlertMetricsReviewsFailing: the apiserver's answer to every other
// TokenReview the controller makes is lost (a proxy closes the connection
// unanswered), so each re-review of Prometheus's token (its cached answer
// lasts 10 s) fails that scrape with 503 and the next scrape, reviewed
// again, gets through with the count: the shipped rules fire
// UuidControllerMetricsReviewsFailing for that instance.
func TestAlertMetricsReviewsFailing(t *testing.T) {
	ctx := testCtx(t)
	m := newMonitored(ctx, t)
	var reviews, dropped atomic.Int64
	kc := apiProxy(t, func(w http.ResponseWriter, r *http.Request) bool {
		if r.Method != http.MethodPost || !strings.HasSuffix(r.URL.Path, "/tokenreviews") || reviews.Add(1)%2 == 1 {
			return false
		}
		dropped.Add(1)
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			conn.Close()
		}
		return true
	})
	p := m.launchVia(ctx, t, kc)
	prom := m.startPrometheus(ctx, t, p)
	u, err := url.Parse(p.MetricsURL())
	if err != nil {
		t.Fatal(err)
	}
	a, body := waitFiring(ctx, t, prom, "UuidControllerMetricsReviewsFailing", map[string]string{"instance": u.Host}, 3*time.Minute)
	t.Logf("/api/v1/alerts: %s", body)
	if v := alertValue(t, a); v <= 0 {
		t.Errorf("alert value %v, want a rate of failed reviews above 0", v)
	}
	// The rate needs two scraped counts apart: two failed reviews at least.
	if n := dropped.Load(); n < 2 {
		t.Errorf("the alert fired with %d TokenReviews dropped, want 2 or more", n)
	}
}

// TestAlertWatchRefused: a controller whose ClusterRole is the shipped one
// without list and watch on uuid is refused by the apiserver's RBAC: the
// shipped rules fire UuidControllerWatchRefused for its namespace, /readyz
// names the watch check, and the refusal is logged once. Bound to the
// shipped ClusterRole, the same process serves the namespace without a
// restart and logs that once too.
func TestAlertWatchRefused(t *testing.T) {
	ctx := testCtx(t)
	m := newMonitored(ctx, t)
	const sa = "uuid-controller-no-list"
	kc := withoutRule(t, sa, "uuid")
	user := "system:serviceaccount:" + cluster.ControllerNamespace + ":" + sa
	if err := env.fw.WaitAllowed(ctx, 10*time.Second, user+" to be allowed its reviews", authorizationv1.SubjectAccessReviewSpec{
		User: user, ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "create", Group: "authentication.k8s.io", Resource: "tokenreviews"},
	}); err != nil {
		t.Fatal(err)
	}

	p := m.launchVia(ctx, t, kc)
	prom := m.startPrometheus(ctx, t, p)
	a, body := waitFiring(ctx, t, prom, "UuidControllerWatchRefused", map[string]string{"namespace": m.ns, "reason": "Forbidden"}, 2*time.Minute)
	t.Logf("/api/v1/alerts: %s", body)
	if a.Labels["severity"] != "critical" || alertValue(t, a) != 1 {
		t.Errorf("alert %+v, want severity critical and value 1", a)
	}
	if code, body, err := p.Readyz(ctx); err != nil || code != http.StatusServiceUnavailable || !strings.Contains(body, "[-]watch failed") {
		t.Errorf("/readyz = %d %q (%v) while refused, want 503 naming the watch check", code, body, err)
	}
	const refusedLine, allowedLine = "Listing or watching Uuid objects refused", "Listing and watching Uuid objects allowed again"
	if n := strings.Count(p.Output(), refusedLine); n != 1 {
		t.Errorf("the log has %d lines %q, want one:\n%s", n, refusedLine, p.Output())
	}

	grantFull(ctx, t, sa)
	env.fw.WaitUUIDs(ctx, t, m.ns, env.fw.CreateUuids(ctx, t, m.ns, "granted", 2), 2*time.Minute)
	if err := p.WaitReady(ctx, time.Minute); err != nil {
		t.Errorf("not ready once granted: %v", err)
	}
	if v := metricReachesWithin(ctx, t, p, "uuid_controller_watch_refused", func(l map[string]string) bool {
		return l["namespace"] == m.ns && l["reason"] == "Forbidden"
	}, 0); v != 0 {
		t.Errorf("uuid_controller_watch_refused = %v once granted, want 0", v)
	}
	if n := strings.Count(p.Output(), allowedLine); n != 1 {
		t.Errorf("the log has %d lines %q once granted, want one", n, allowedLine)
	}
	mustStayRunning(t, p)
}

// docMetricRow is a row of docs/metrics.md's metrics table; hack/prometheus
// reads it with the same pattern.
var docMetricRow = regexp.MustCompile("(?m)^\\| `([a-zA-Z_:][a-zA-Z0-9_:]*)` \\| (counter|gauge|histogram) \\|")

// TestMetricsListedInDocs: docs/metrics.md lists exactly the
// uuid_controller_ and workqueue_ metrics a controller serves, read after
// a failed write so the labelled counters that start empty are served too.
func TestMetricsListedInDocs(t *testing.T) {
	ctx := testCtx(t)
	m := newMonitored(ctx, t)
	remove, err := env.cluster.RejectUUIDWrites(ctx, "deny-"+m.ns, m.ns, metav1.StatusReasonForbidden)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = remove(context.Background()) })
	env.fw.CreateUuids(ctx, t, m.ns, "denied", 1)
	p := m.launch(ctx, t)
	// patch_failures_total has no series before the first failure.
	var text string
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		var err error
		text, err = p.Metrics(ctx)
		return err == nil && strings.Contains(text, "\nuuid_controller_patch_failures_total{"), nil
	})
	if err != nil {
		t.Fatalf("no failed write counted: %v", err)
	}
	served := map[string]bool{}
	for _, line := range strings.Split(text, "\n") {
		if f := strings.Fields(line); len(f) >= 4 && f[0] == "#" && f[1] == "TYPE" &&
			(strings.HasPrefix(f[2], "uuid_controller_") || strings.HasPrefix(f[2], "workqueue_")) {
			served[f[2]+" "+f[3]] = true
		}
	}
	doc, err := os.ReadFile("../../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	// A row of the metrics table: | `name` | type | labels | meaning |
	listed := map[string]bool{}
	for _, m := range docMetricRow.FindAllStringSubmatch(string(doc), -1) {
		listed[m[1]+" "+m[2]] = true
	}
	for name := range served {
		if !listed[name] {
			t.Errorf("/metrics serves %s, which docs/metrics.md does not list (name and type)", name)
		}
	}
	for name := range listed {
		if !served[name] {
			t.Errorf("docs/metrics.md lists %s, which /metrics does not serve", name)
		}
	}
	if len(served) == 0 {
		t.Fatal("no uuid_controller_ metric served")
	}
}
