package cluster

import (
	"fmt"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// RequestTotal sums the counter apiserver_request_total over the series
// whose labels satisfy match (labels as name -> value; kube-apiserver uses
// verb, group, version, resource, subresource, scope, component, dry_run,
// code). metricsText is Prometheus text as returned by Cluster.Metrics.
func RequestTotal(metricsText string, match func(labels map[string]string) bool) (float64, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(metricsText))
	if err != nil {
		return 0, fmt.Errorf("cluster: parse metrics: %w", err)
	}
	fam, ok := fams["apiserver_request_total"]
	if !ok {
		return 0, nil
	}
	var sum float64
	for _, m := range fam.GetMetric() {
		if match == nil || match(labelMap(m)) {
			sum += m.GetCounter().GetValue()
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
