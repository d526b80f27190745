package cluster

import (
	"fmt"
	"strings"

	"context"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// RequestTotal sums the counter apiserver_request_total over the series
// whose labels satisfy match (labels as name -> value; kube-apiserver uses
// verb, group, version, resource, subresource, scope, component, dry_run,
// code). metricsText is Prometheus text as returned by Cluster.Metrics.
func RequestTotal(metricsText string, match func(labels map[string]string) bool) (float64, error) {
	return MetricSum(metricsText, "apiserver_request_total", match)
}

// MetricSum sums the values of the counter, gauge or untyped family name
// over the series whose labels satisfy match (nil matches all). A family
// that is absent sums to 0: Prometheus client libraries leave out a
// labelled counter until it is first incremented.
func MetricSum(metricsText, name string, match func(labels map[string]string) bool) (float64, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(metricsText))
	if err != nil {
		return 0, fmt.Errorf("cluster: parse metrics: %w", err)
	}
	fam, ok := fams[name]
	if !ok {
		return 0, nil
	}
	var sum float64
	for _, m := range fam.GetMetric() {
		if match != nil && !match(labelMap(m)) {
			continue
		}
		switch {
		case m.Counter != nil:
			sum += m.GetCounter().GetValue()
		case m.Gauge != nil:
			sum += m.GetGauge().GetValue()
		case m.Untyped != nil:
			sum += m.GetUntyped().GetValue()
		default:
			return 0, fmt.Errorf("cluster: metric %s is not a counter, gauge or untyped value", name)
		}
	}
	return sum, nil
}

func labelMap(m *dto.Metric) map[string]string {
	l := make(map[string]string, len(m.GetLabel()))
	for _, lp := range m.GetLabel() {
		l[lp.GetName()] = lp.GetValue()
	}
	return l
}

// statusWriteVerbs are the verb label values of writes to a subresource:
// kube-apiserver reports a server-side apply as APPLY, other patches as
// PATCH, and an update (HTTP PUT) as PUT. UPDATE is included in case a
// version names it so.
var statusWriteVerbs = map[string]bool{"PATCH": true, "APPLY": true, "PUT": true, "UPDATE": true}

// StatusWrites sums apiserver_request_total for writes (PATCH, APPLY, PUT)
// to the status subresource of resource "uuid" in group demo.operator,
// whatever their response code, dry runs excluded.
func StatusWrites(metricsText string) (float64, error) {
	return RequestTotal(metricsText, func(l map[string]string) bool {
		return l["resource"] == UuidGVR.Resource &&
			l["subresource"] == "status" &&
			(l["group"] == "" || l["group"] == UuidGVR.Group) &&
			l["dry_run"] == "" &&
			statusWriteVerbs[l["verb"]]
	})
}

// APIStatusWrites is the apiserver's count of status writes to Uuid objects
// so far (StatusWrites on its /metrics). The apiserver counts a request as
// its handler returns, which can trail the response: a caller that wants a
// final count reads it until it stops moving.
func (c *Cluster) APIStatusWrites(ctx context.Context) (float64, error) {
	text, err := c.Metrics(ctx)
	if err != nil {
		return 0, err
	}
	return StatusWrites(text)
}
