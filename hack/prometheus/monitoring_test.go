// Package monitoring checks deploy/monitoring with Prometheus's own code:
// the rules file as Prometheus loads it, every PromQL query of the rules
// and the Grafana dashboard parsed by Prometheus's parser and naming only
// metrics the controller serves (as docs/metrics.md lists them; test/e2e
// checks that list against a running controller's /metrics) or that the
// Go and process collectors and Prometheus itself provide.
package monitoring

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/yaml"
)

const (
	monitoringDir = "../../deploy/monitoring"
	rulesFile     = monitoringDir + "/prometheus/rules.yaml"
	metricsDoc    = "../../docs/metrics.md"
	// runbookBase is where each alert's runbook_url points, plus
	// #<alert name in lower case>, the anchor of its docs heading.
	runbookBase = "https://github.com/demo-operator/uuid-controller/blob/main/docs/metrics.md"
)

// TestPrometheusRuleMatchesRulesFile: the PrometheusRule and the plain
// rules file hold the same groups, so operator users and plain Prometheus
// users get the same alerts.
func TestPrometheusRuleMatchesRulesFile(t *testing.T) {
	var plain map[string]any
	readYAML(t, rulesFile, &plain)
	var pr struct {
		APIVersion string         `json:"apiVersion"`
		Kind       string         `json:"kind"`
		Spec       map[string]any `json:"spec"`
	}
	readYAML(t, filepath.Join(monitoringDir, "prometheusrule.yaml"), &pr)
	if pr.APIVersion != "monitoring.coreos.com/v1" || pr.Kind != "PrometheusRule" {
		t.Fatalf("prometheusrule.yaml is a %s %s", pr.APIVersion, pr.Kind)
	}
	if !reflect.DeepEqual(pr.Spec, plain) {
		t.Errorf("prometheusrule.yaml's spec differs from prometheus/rules.yaml; run make monitoring-rules")
	}
}

// TestRulesLoad: Prometheus's own loader accepts the rules file with no
// unknown field, every rule is an alert with a severity, a summary, a
// description and a runbook_url whose anchor docs/metrics.md has.
func TestRulesLoad(t *testing.T) {
	groups := loadRules(t)
	doc := readFile(t, metricsDoc)
	anchors := headingAnchors(doc)
	var alerts int
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				t.Errorf("group %s: a recording rule %q; only alerts are expected", g.Name, r.Record)
				continue
			}
			alerts++
			for _, key := range []string{"summary", "description", "runbook_url"} {
				if strings.TrimSpace(r.Annotations[key]) == "" {
					t.Errorf("%s: no %s annotation", r.Alert, key)
				}
			}
			if s := r.Labels["severity"]; s != "critical" && s != "warning" {
				t.Errorf("%s: severity %q, want critical or warning", r.Alert, s)
			}
			anchor := strings.ToLower(r.Alert)
			if want := runbookBase + "#" + anchor; r.Annotations["runbook_url"] != want {
				t.Errorf("%s: runbook_url %q, want %q", r.Alert, r.Annotations["runbook_url"], want)
			}
			if !anchors[anchor] {
				t.Errorf("%s: docs/metrics.md has no heading %q for its runbook", r.Alert, r.Alert)
			}
		}
	}
	if alerts == 0 {
		t.Fatal("no alert in the rules file")
	}
}

// TestQueriesNameServedMetrics: every query of the rules and the dashboard
// parses as PromQL and selects by metric name only metrics that are served.
func TestQueriesNameServedMetrics(t *testing.T) {
	served := servedMetrics(t)
	queries := map[string]string{}
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			queries["rule "+r.Alert] = r.Expr
		}
	}
	maps := dashboardQueries(t)
	for k, v := range maps {
		queries[k] = v
	}
	if len(maps) == 0 {
		t.Fatal("the dashboard has no query")
	}
	p := parser.NewParser(parser.Options{})
	for where, q := range queries {
		names, err := metricNames(p, q)
		if err != nil {
			t.Errorf("%s: %v", where, err)
			continue
		}
		for _, n := range names {
			if !served[n] {
				t.Errorf("%s: names %s, which neither the controller, the Go and process collectors nor Prometheus serves\n\tquery: %s", where, n, q)
			}
		}
	}
}

// TestMetricNamesCatchesUnknown: the check above fails on a query naming
// a metric nobody serves, or one that does not parse.
func TestMetricNamesCatchesUnknown(t *testing.T) {
	p := parser.NewParser(parser.Options{})
	names, err := metricNames(p, `sum(rate(uuid_controller_typo_total[5m])) / on() group_left up`)
	if err != nil || !slices.Equal(names, []string{"uuid_controller_typo_total", "up"}) {
		t.Errorf("metricNames = %v, %v", names, err)
	}
	if _, err := metricNames(p, `sum(rate(x[5m])`); err == nil {
		t.Error("an unbalanced query parsed")
	}
	if _, err := metricNames(p, `{__name__=~"uuid_.*"}`); err == nil {
		t.Error("a selector without a metric name was accepted")
	}
	if served := servedMetrics(t); served["uuid_controller_typo_total"] || !served["uuid_controller_assignment_latency_seconds_bucket"] {
		t.Error("servedMetrics does not follow docs/metrics.md")
	}
}

// metricNames parses q and returns the metric names it selects, in order.
// A selector by other labels only is an error: it cannot be checked.
func metricNames(p parser.Parser, q string) ([]string, error) {
	expr, err := p.ParseExpr(q)
	if err != nil {
		return nil, fmt.Errorf("does not parse as PromQL: %w", err)
	}
	var names []string
	var bad error
	parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			if vs.Name == "" {
				bad = fmt.Errorf("selector %s names no metric", vs)
			}
			names = append(names, vs.Name)
		}
		return nil
	})
	return names, bad
}

// grafanaVars are the dashboard's Grafana variables, given the values
// Grafana would put in their place.
var grafanaVars = strings.NewReplacer("$__rate_interval", "2m", "$__interval", "30s", "$__range", "6h")

// dashboardQueries reads every panel query of dashboard.json, with
// Grafana's variables substituted, keyed by panel title and refId.
func dashboardQueries(t *testing.T) map[string]string {
	t.Helper()
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				RefID string `json:"refId"`
				Expr  string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(readFile(t, filepath.Join(monitoringDir, "dashboard.json")), &d); err != nil {
		t.Fatalf("dashboard.json: %v", err)
	}
	out := map[string]string{}
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			out["panel "+p.Title+" "+tg.RefID] = grafanaVars.Replace(tg.Expr)
		}
	}
	return out
}

// docMetric is a row of docs/metrics.md's metrics tables:
// | `name` | type | labels | meaning |
var docMetric = regexp.MustCompile("(?m)^\\| `([a-zA-Z_:][a-zA-Z0-9_:]*)` \\| (counter|gauge|histogram) \\|")

// servedMetrics is every series name a scrape of the controller can give:
// docs/metrics.md's metrics (a histogram's _bucket, _sum and _count),
// the Go and process collectors' (as client_golang registers them), and
// up, which Prometheus adds to every target.
func servedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	served := map[string]bool{"up": true}
	rows := docMetric.FindAllStringSubmatch(string(readFile(t, metricsDoc)), -1)
	if len(rows) == 0 {
		t.Fatal("docs/metrics.md lists no metric")
	}
	for _, m := range rows {
		if m[2] == "histogram" {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				served[m[1]+s] = true
			}
			continue
		}
		served[m[1]] = true
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		served[f.GetName()] = true
		if f.GetType().String() == "HISTOGRAM" || f.GetType().String() == "SUMMARY" {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				served[f.GetName()+s] = true
			}
		}
	}
	return served
}

// headingAnchors returns the GitHub anchors of the Markdown headings in doc.
func headingAnchors(doc []byte) map[string]bool {
	out := map[string]bool{}
	for _, line := range strings.Split(string(doc), "\n") {
		if h, ok := strings.CutPrefix(line, "#"); ok {
			h = strings.ToLower(strings.TrimSpace(strings.TrimLeft(h, "#")))
			h = regexp.MustCompile(`[^a-z0-9 _-]`).ReplaceAllString(h, "")
			out[strings.ReplaceAll(h, " ", "-")] = true
		}
	}
	return out
}

func loadRules(t *testing.T) *rulefmt.RuleGroups {
	t.Helper()
	groups, errs := rulefmt.ParseFile(rulesFile, false, model.UTF8Validation, parser.NewParser(parser.Options{}), slog.New(slog.DiscardHandler))
	if len(errs) > 0 {
		t.Fatalf("Prometheus refuses %s: %v", rulesFile, errs)
	}
	return groups
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	if err := yaml.Unmarshal(readFile(t, path), v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
