package main

import (
	"strings"
	"testing"
	"time"
)

// cellOf returns the text of row label's first value cell in md.
func cellOf(t *testing.T, md, label string) string {
	t.Helper()
	for _, line := range strings.Split(md, "\n") {
		if strings.HasPrefix(line, "| "+label+" |") {
			return strings.TrimSpace(strings.Split(line, "|")[2])
		}
	}
	t.Fatalf("no row %q in:\n%s", label, md)
	return ""
}

func labelWithPrefix(t *testing.T, prefix string) string {
	t.Helper()
	for _, r := range rows {
		if strings.HasPrefix(r.label, prefix) {
			return r.label
		}
	}
	t.Fatalf("no row starts with %q", prefix)
	return ""
}

func TestMarkdownMarksGoals(t *testing.T) {
	r := &Result{
		N:         10000,
		RawBefore: Throughput{PerSecond: 200, Elapsed: 50 * time.Second},
		RawAfter:  Throughput{PerSecond: 200, Elapsed: 50 * time.Second},
		Burst:     Throughput{PerSecond: 170, Elapsed: 59 * time.Second},
		Ratio:     0.85,
		// One write too many: a conflict, say.
		BurstWritesController: 1.0001, BurstWritesAPI: 1,
		RestartWritesAPI:     1,
		Memory:               Memory{BaselineRSS: 20 << 20, BurstRSS: 70 << 20},
		Idle:                 Summary{Count: 100, P50: 5 * time.Millisecond, P99: 20 * time.Millisecond},
		IdleWritesController: 1,
		Servers:              ServerMemory{APIServerRSS: 300 << 20, APIServerPeak: 400 << 20, EtcdRSS: 50 << 20, EtcdPeak: 60 << 20},
	}
	small := *r
	small.N = 1000
	md := (&Report{Results: []*Result{r, &small}}).Markdown()

	for prefix, want := range map[string]string{
		"Controller / raw throughput":                "0.85 (0.85 / 0.85) ✗",
		"Status writes per new object: controller's": "1.000 ✗", // 1.0001 prints as 1.000 but is not exactly one write
		"Status writes per new object: apiserver":    "1.000 ✓",
		"Restart: status writes":                     "0 / 1 ✗",
		"Controller peak RSS after the burst":        "70.0 MiB ✗",
		"Peak RSS over baseline, per object":         "5243 B",
		"Idle create-to-status p50 / p99 / max":      "5.0 ms / 20.0 ms / 0.0 ms ✓",
		"kube-apiserver RSS after the case":          "300.0 MiB (400.0 MiB)",
		"etcd RSS after the case":                    "50.0 MiB (60.0 MiB)",
	} {
		label := labelWithPrefix(t, prefix)
		if got := cellOf(t, md, label); got != want {
			t.Errorf("%s: cell %q, want %q", label, got, want)
		}
	}
	// The throughput and memory goals are stated for N = 10,000; at 1,000
	// the ratio is shown without a mark.
	if !strings.Contains(md, "| 0.85 (0.85 / 0.85) ✗ | 0.85 (0.85 / 0.85) |") {
		t.Errorf("ratio at N = 1,000 should carry no mark:\n%s", md)
	}
}
