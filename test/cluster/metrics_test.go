package cluster

import "testing"

const sampleMetrics = `# HELP apiserver_request_total [STABLE] Counter of apiserver requests broken out for each verb, dry run value, group, version, resource, scope, component, and HTTP response code.
# TYPE apiserver_request_total counter
apiserver_request_total{code="200",component="apiserver",dry_run="",group="demo.operator",resource="uuid",scope="resource",subresource="status",verb="PATCH",version="v1"} 7
apiserver_request_total{code="409",component="apiserver",dry_run="",group="demo.operator",resource="uuid",scope="resource",subresource="status",verb="PATCH",version="v1"} 2
apiserver_request_total{code="200",component="apiserver",dry_run="",group="demo.operator",resource="uuid",scope="resource",subresource="status",verb="APPLY",version="v1"} 3
apiserver_request_total{code="200",component="apiserver",dry_run="",group="demo.operator",resource="uuid",scope="resource",subresource="status",verb="PUT",version="v1"} 1
apiserver_request_total{code="200",component="apiserver",dry_run="All",group="demo.operator",resource="uuid",scope="resource",subresource="status",verb="PATCH",version="v1"} 100
apiserver_request_total{code="200",component="apiserver",dry_run="",group="demo.operator",resource="uuid",scope="resource",subresource="status",verb="GET",version="v1"} 50
apiserver_request_total{code="201",component="apiserver",dry_run="",group="demo.operator",resource="uuid",scope="resource",subresource="",verb="POST",version="v1"} 40
apiserver_request_total{code="200",component="apiserver",dry_run="",group="demo.operator",resource="uuid",scope="resource",subresource="",verb="PATCH",version="v1"} 30
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="status",verb="PATCH",version="v1"} 20
# HELP apiserver_request_duration_seconds x
# TYPE apiserver_request_duration_seconds histogram
apiserver_request_duration_seconds_bucket{resource="uuid",subresource="status",verb="PATCH",le="+Inf"} 9
apiserver_request_duration_seconds_sum{resource="uuid",subresource="status",verb="PATCH"} 0.5
apiserver_request_duration_seconds_count{resource="uuid",subresource="status",verb="PATCH"} 9
`

func TestStatusWrites(t *testing.T) {
	got, err := StatusWrites(sampleMetrics)
	if err != nil {
		t.Fatal(err)
	}
	if got != 13 { // 7 + 2 PATCH, 3 APPLY, 1 PUT
		t.Errorf("StatusWrites = %v, want 13", got)
	}
}

func TestRequestTotal(t *testing.T) {
	got, err := RequestTotal(sampleMetrics, func(l map[string]string) bool {
		return l["resource"] == "uuid" && l["verb"] == "POST"
	})
	if err != nil || got != 40 {
		t.Errorf("RequestTotal(POST uuid) = %v, %v; want 40", got, err)
	}
	if got, err := StatusWrites("# nothing here\n"); err != nil || got != 0 {
		t.Errorf("StatusWrites(empty) = %v, %v; want 0, nil", got, err)
	}
	if _, err := StatusWrites("not { valid"); err == nil {
		t.Error("StatusWrites(garbage) gave no error")
	}
}

func TestMetricSum(t *testing.T) {
	text := `# TYPE uuid_controller_status_writes_total counter
uuid_controller_status_writes_total{result="ok"} 5
uuid_controller_status_writes_total{result="conflict"} 2
# TYPE uuid_controller_leader gauge
uuid_controller_leader 1
# TYPE apiserver_request_duration_seconds histogram
apiserver_request_duration_seconds_bucket{le="+Inf"} 9
apiserver_request_duration_seconds_sum 0.5
apiserver_request_duration_seconds_count 9
`
	for _, tc := range []struct {
		name  string
		match func(map[string]string) bool
		want  float64
	}{
		{"uuid_controller_status_writes_total", nil, 7},
		{"uuid_controller_status_writes_total", func(l map[string]string) bool { return l["result"] == "ok" }, 5},
		{"uuid_controller_leader", nil, 1},
		{"absent_total", nil, 0},
	} {
		if got, err := MetricSum(text, tc.name, tc.match); err != nil || got != tc.want {
			t.Errorf("MetricSum(%s) = %v, %v; want %v", tc.name, got, err, tc.want)
		}
	}
	if _, err := MetricSum(text, "apiserver_request_duration_seconds", nil); err == nil {
		t.Error("MetricSum of a histogram gave no error")
	}
}
