package main

import (
	"context"
	"log/slog"

	"strings"
	"testing"
	"time"
)

// TestBenchSmoke runs the whole benchmark at a tiny N against a real
// cluster, so the program does not rot. It checks the report's shape and
// the figures that must come out exact (writes per object); it never
// asserts on timing.
func TestBenchSmoke(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	const n = 20
	rep, err := Run(ctx, Config{
		Ns:           []int{n},
		Concurrency:  []int{4},
		Raw:          true,
		IdleCount:    5,
		IdleInterval: 50 * time.Millisecond,
		// A preload, then a warm-up that patches status: the CRD must
		// serve its status subresource again by then.
		Existing: 10,
		// The burst waits for the first sweep over those (narrowed).
		BurstAfterSweep: true,
		Warmup:          2 * time.Second,
		Settle:          time.Second,
		Command:         "TestBenchSmoke",
		Logger:          benchLogger(slog.LevelWarn),
	})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if len(rep.Results) != 1 {
		t.Fatalf("got %d results, want 1", len(rep.Results))
	}
	r := rep.Results[0]
	md := rep.Markdown()
	t.Log("\n" + md)

	for _, row := range rows {
		if !strings.Contains(md, "| "+row.label+" |") {
			t.Errorf("report has no row %q", row.label)
		}
	}
	if !strings.Contains(md, "each narrowed burst after the controller's first sweep") {
		t.Errorf("report does not say the burst waited for the sweep")
	}
	if !strings.Contains(md, "| N = 20, 4 creators |") {
		t.Errorf("report has no column for N = 20")
	}
	// The header, the separator and one line per row.
	if got := strings.Count(md, "\n|"); got != len(rows)+2 {
		t.Errorf("report has %d table lines, want %d", got, len(rows)+2)
	}

	// Exact by design: one status write per new object, none on restart.
	if r.BurstWritesController != 1 || r.BurstWritesAPI != 1 {
		t.Errorf("burst writes per object: controller %v, apiserver %v; want 1 and 1", r.BurstWritesController, r.BurstWritesAPI)
	}
	if r.RestartWritesController != 0 || r.RestartWritesAPI != 0 || r.RestartQueued != 0 {
		t.Errorf("restart: writes controller %v, apiserver %v, queued %v; want all 0",
			r.RestartWritesController, r.RestartWritesAPI, r.RestartQueued)
	}
	if r.IdleWritesController != 1 {
		t.Errorf("idle writes per object = %v, want 1", r.IdleWritesController)
	}
	// Every object was measured, and the figures are filled in.
	for name, s := range map[string]Summary{"raw before": r.RawBefore.Latency, "raw after": r.RawAfter.Latency, "burst": r.Burst.Latency} {
		if s.Count != n {
			t.Errorf("%s: %d latencies, want %d", name, s.Count, n)
		}
	}
	if r.Idle.Count != 5 {
		t.Errorf("idle: %d latencies, want 5", r.Idle.Count)
	}
	if r.Burst.PerSecond <= 0 || r.RawBefore.PerSecond <= 0 || r.RawAfter.PerSecond <= 0 || r.Ratio <= 0 {
		t.Errorf("throughputs not filled in: %+v", r)
	}
	if r.Memory.BaselineRSS <= 0 || r.Memory.BurstRSS <= 0 || r.Memory.RestartRSS <= 0 || r.Memory.BurstHeap <= 0 {
		t.Errorf("memory not filled in: %+v", r.Memory)
	}
	if r.RestartReady <= 0 {
		t.Errorf("restart time to ready not measured: %v", r.RestartReady)
	}
	// CPU time comes from /proc in 10 ms ticks, so at N = 20 zero is a
	// measurement (a restart over 20 objects can use less than a tick); a
	// failed read fails the run itself. Negative is a broken subtraction.
	if r.RestartCPU < 0 || r.BurstCPU < 0 {
		t.Errorf("CPU time: restart %v s, burst %v s; want both measured, ≥ 0", r.RestartCPU, r.BurstCPU)
	}
	if r.QueueSamples == 0 {
		t.Errorf("queue depth not measured: %d samples", r.QueueSamples)
	}
}

func TestParseCounts(t *testing.T) {
	got, err := parseCounts("1000, 10_000,100000")
	if err != nil || len(got) != 3 || got[0] != 1000 || got[1] != 10000 || got[2] != 100000 {
		t.Errorf("parseCounts = %v, %v", got, err)
	}
	for _, bad := range []string{"", "0", "-5", "1k", "10,,20"} {
		if _, err := parseCounts(bad); err == nil {
			t.Errorf("parseCounts(%q): no error", bad)
		}
	}
}

func TestParseCPU(t *testing.T) {
	// A command name with spaces and a ')' of its own.
	line := "4242 (uuid (ctl) x) S 1 4242 4242 0 -1 4194560 1000 0 0 0 150 25 0 0 20 0 12 0 100 0 0"
	if got, err := parseCPU(line); err != nil || got != 1.75 {
		t.Errorf("parseCPU = %v, %v; want 1.75 s (150 + 25 ticks)", got, err)
	}
	for _, bad := range []string{"", "4242 uuid S 1", "4242 (x) S 1 2 3 4 5 6 7 8 9 ten 11"} {
		if _, err := parseCPU(bad); err == nil {
			t.Errorf("parseCPU(%q): no error", bad)
		}
	}
}

func TestThousands(t *testing.T) {
	for n, want := range map[int]string{1: "1", 999: "999", 1000: "1,000", 10000: "10,000", 100000: "100,000", 1234567: "1,234,567"} {
		if got := thousands(n); got != want {
			t.Errorf("thousands(%d) = %q, want %q", n, got, want)
		}
	}
}
