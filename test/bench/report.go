package main

import (
	"bufio"
	"debug/buildinfo"
	"fmt"
	"github.com/demo-operator/uuid-controller/test/framework"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// Result is every figure measured at one N.
type Result struct {
	N int
	// Watch is the controller's watch: narrowed or full. Existing objects
	// with a UUID were there besides the N (-existing).
	Watch    string
	Existing int
	// The restarted leader's first sweep (narrowed only): its duration,
	// the CPU it took after ready, and the process's peak RSS after it.
	SweepSeconds, SweepCPU float64
	SweepPeakRSS           int64
	// SweepSkipped: the restarted leader skipped its sweep (a clean one
	// was recorded on its Lease under the same CRD: --leader-elect).
	SweepSkipped bool
	// Concurrency is the number of concurrent creators.
	Concurrency int
	// RawBefore and RawAfter are the raw loop run before and after the
	// controller's cases; Burst is the controller's burst.
	RawBefore, RawAfter, Burst Throughput
	// Ratio is Burst's objects/s over the mean of the two raw loops'.
	Ratio float64
	// Status writes per new object in the burst.
	BurstWritesController, BurstWritesAPI float64
	// BurstCPU is the controller's CPU time (s) from just before the
	// first create until its writes settled.
	BurstCPU float64
	// QueuePeak is the largest workqueue_depth of QueueSamples, taken
	// every queueDepthInterval through the burst.
	QueuePeak    float64
	QueueSamples int
	// RestartReady runs from starting the new process to its /readyz.
	RestartReady time.Duration
	// RestartCPU is the new process's CPU time (s) when it was ready.
	RestartCPU float64
	// Status writes (absolute) and workqueue adds of the restarted controller.
	RestartWritesController, RestartWritesAPI, RestartQueued float64
	Memory                                                   Memory
	// Servers is the apiserver's and etcd's memory after the case.
	Servers ServerMemory
	// Idle is create-to-status latency of objects created one at a time.
	Idle                 Summary
	IdleEarly            int
	IdleWritesController float64
}

// Memory is the controller's memory at one N, in bytes.
type Memory struct {
	// BaselineRSS and BaselineHeap: the burst's controller, synced on the
	// still empty namespace.
	BaselineRSS, BaselineHeap int64
	// BurstRSS is its peak RSS and BurstHeap its heap in use after the burst.
	BurstRSS, BurstHeap int64
	// RestartRSS is the restarted controller's peak RSS (after idle).
	RestartRSS int64
	// Limit is the memory cgroup limit (0: none) of one more restart
	// (after the idle case); LimitPeak the cgroup's peak usage, OOMKills
	// its count of OOM kills, LimitReady that controller's time to ready
	// and LimitFailure why it did not become ready or stay up ("": it did).
	Limit, LimitPeak, OOMKills int64
	LimitReady                 time.Duration
	LimitFailure               string
}

// ServerMemory is the apiserver's and etcd's resident set now (VmRSS) and
// at its peak so far (VmHWM), in bytes.
type ServerMemory struct {
	APIServerRSS, APIServerPeak, EtcdRSS, EtcdPeak int64
}

// Report is a whole run.
type Report struct {
	Date                     time.Time
	CPUs                     int
	CPUModel, Memory, GoInfo string
	// Server names the apiserver's and etcd's versions.
	Server string
	// Controller is the commit the controller was built from.
	Controller string
	// PreloadTook is how long creating the -existing objects took; Took
	// the whole run, building and the cluster's start included.
	PreloadTook, Took time.Duration
	Config            Config
	Results           []*Result
}

func newReport(cfg Config) *Report {
	return &Report{
		Date:     time.Now(),
		CPUs:     runtime.NumCPU(),
		CPUModel: procField("/proc/cpuinfo", "model name"),
		Memory:   memTotal(),
		GoInfo:   fmt.Sprintf("%s %s/%s", runtime.Version(), runtime.GOOS, runtime.GOARCH),
		Config:   cfg,
	}
}

// row is one line of the table: a label, the goal it is held against, and
// its cell at one N.
type row struct {
	label, goal string
	cell        func(r *Result) string
}

var rows = []row{
	{"Watch (narrowed: fieldSelector status.uuid=; full: the fallback over every object)", "", func(r *Result) string { return r.Watch }},
	{"Raw loop before (create + status PATCH each): objects/s (elapsed)", "the limit", func(r *Result) string { return rate(r.RawBefore) }},
	{"Raw loop after: objects/s (elapsed)", "the limit", func(r *Result) string { return rate(r.RawAfter) }},
	{"Raw loop create-to-status p50 / p99 / max", "", func(r *Result) string { return pcts(r.RawBefore.Latency, true) }},
	{"Controller burst: time until every object has a UUID (until the last create returned)", "", func(r *Result) string {
		return fmt.Sprintf("%s (%s)", dur(r.Burst.Elapsed), dur(r.Burst.CreatesDone))
	}},
	{"Controller burst: objects/s", "", func(r *Result) string { return fmt.Sprintf("%.0f/s", r.Burst.PerSecond) }},
	{"Controller / raw throughput: vs the mean of before and after (vs before / vs after)", "≥ 0.95 at N ≥ 10,000", func(r *Result) string {
		if r.Ratio == 0 {
			return notRun
		}
		return fmt.Sprintf("%.2f (%.2f / %.2f)", r.Ratio, r.Burst.PerSecond/r.RawBefore.PerSecond, r.Burst.PerSecond/r.RawAfter.PerSecond) +
			markIf(r.N >= 10000, r.Ratio >= 0.95)
	}},
	{"Burst create-to-status p50 / p99 / max (from create call's return)", "p99 ≤ 0.5 s at N = 10,000, ≤ 1 s at 100,000", func(r *Result) string {
		return pcts(r.Burst.Latency, true) + markIf(r.N == 10000 || r.N == 100000,
			r.N == 10000 && r.Burst.Latency.P99 <= 500*time.Millisecond || r.N == 100000 && r.Burst.Latency.P99 <= time.Second)
	}},
	{"Burst create-to-status p50 / p99 (from creationTimestamp, 1 s resolution)", "", func(r *Result) string { return pcts(r.Burst.FromTimestamp, false) }},
	{"Workqueue depth: peak during the burst (samples every 250 ms)", "near 0", func(r *Result) string {
		return fmt.Sprintf("%.0f (%d samples)", r.QueuePeak, r.QueueSamples)
	}},
	{"Controller CPU time per new object in the burst", "≤ 0.25 ms at N = 10,000", func(r *Result) string {
		per := r.BurstCPU / float64(r.N) * 1000
		return fmt.Sprintf("%.3f ms (%.1f s)", per, r.BurstCPU) + markIf(r.N == 10000, per <= 0.25)
	}},
	{"Status writes per new object: controller's uuid_controller_status_writes_total", "exactly 1.0", func(r *Result) string {
		return fmt.Sprintf("%.3f", r.BurstWritesController) + mark(r.BurstWritesController == 1)
	}},
	{"Status writes per new object: apiserver_request_total (uuid/status PATCH)", "exactly 1.0", func(r *Result) string {
		return fmt.Sprintf("%.3f", r.BurstWritesAPI) + mark(r.BurstWritesAPI == 1)
	}},
	{"Restart over the N done objects (and any existing): time to ready (cache synced, 100 ms polling)", "narrowed: ≤ 0.5 s at 100,000, ≤ 1 s at 1,000,000", func(r *Result) string {
		all := r.N + r.Existing
		return dur(r.RestartReady) + markIf(r.Watch == "narrowed" && (all == 100000 || all >= 1000000),
			all == 100000 && r.RestartReady <= 500*time.Millisecond || all >= 1000000 && r.RestartReady <= time.Second)
	}},
	{"Restart: controller CPU time until ready (per done object)", "full: ≤ 40 µs", func(r *Result) string {
		per := r.RestartCPU / float64(r.N+r.Existing) * 1e6
		return fmt.Sprintf("%.2f s (%.1f µs)", r.RestartCPU, per) + markIf(r.Watch == "full", per <= 40)
	}},
	{"Restarted leader's sweep for invalid UUIDs: time / CPU / peak RSS (narrowed only)", "", func(r *Result) string {
		if r.Watch != "narrowed" {
			return notRun
		}
		if r.SweepSkipped {
			return fmt.Sprintf("skipped (clean sweep recorded) / %.2f s / %s", r.SweepCPU, framework.MiB(r.SweepPeakRSS))
		}
		return fmt.Sprintf("%.2f s / %.2f s / %s", r.SweepSeconds, r.SweepCPU, framework.MiB(r.SweepPeakRSS))
	}},
	{"Restart: controller CPU until idle again, sweep included (narrowed only)", "≤ 0.1 s at 100,000 after a clean sweep was recorded", func(r *Result) string {
		if r.Watch != "narrowed" {
			return notRun
		}
		return fmt.Sprintf("%.2f s", r.RestartCPU+r.SweepCPU)
	}},
	{"Restart: status writes, controller / apiserver", "0", func(r *Result) string {
		return fmt.Sprintf("%.0f / %.0f", r.RestartWritesController, r.RestartWritesAPI) +
			mark(r.RestartWritesController == 0 && r.RestartWritesAPI == 0)
	}},
	{"Restart: keys queued (workqueue_adds_total)", "", func(r *Result) string { return fmt.Sprintf("%.0f", r.RestartQueued) }},
	{"Controller peak RSS, synced on an empty namespace (baseline)", "", func(r *Result) string { return framework.MiB(r.Memory.BaselineRSS) }},
	{"Controller peak RSS after the burst", "< 64 MiB at N = 10,000", func(r *Result) string {
		return framework.MiB(r.Memory.BurstRSS) + markIf(r.N <= 10000, r.Memory.BurstRSS < 64<<20)
	}},
	{"Peak RSS over baseline, per object", "flat in N (linear growth)", func(r *Result) string {
		return perObject(r.Memory.BurstRSS-r.Memory.BaselineRSS, r.N)
	}},
	{"Go heap in use after the burst (baseline)", "", func(r *Result) string {
		return fmt.Sprintf("%s (%s)", framework.MiB(r.Memory.BurstHeap), framework.MiB(r.Memory.BaselineHeap))
	}},
	{"Go heap over baseline, per object", "", func(r *Result) string {
		return perObject(r.Memory.BurstHeap-r.Memory.BaselineHeap, r.N)
	}},
	{"Restarted controller peak RSS (N objects cached)", "", func(r *Result) string { return framework.MiB(r.Memory.RestartRSS) }},
	{"Restarted controller peak RSS over baseline, per cached object", "≤ 512 B at N ≥ 100,000", func(r *Result) string {
		per := float64(r.Memory.RestartRSS-r.Memory.BaselineRSS) / float64(r.N)
		return perObject(r.Memory.RestartRSS-r.Memory.BaselineRSS, r.N) + markIf(r.N >= 100000, per <= 512)
	}},
	{"Restart in a memory cgroup with GOMEMLIMIT at 90%: limit / ready in / peak usage / OOM kills", "holds", func(r *Result) string {
		m := r.Memory
		if m.Limit == 0 {
			return notRun
		}
		held := m.LimitFailure == "" && m.OOMKills == 0
		out := fmt.Sprintf("%s / %s / %s / %d", framework.MiB(m.Limit), dur(m.LimitReady), framework.MiB(m.LimitPeak), m.OOMKills)
		if m.LimitFailure != "" {
			out += " (" + m.LimitFailure + ")"
		}
		return out + mark(held)
	}},
	{"kube-apiserver RSS after the case (peak so far)", "", func(r *Result) string {
		return fmt.Sprintf("%s (%s)", framework.MiB(r.Servers.APIServerRSS), framework.MiB(r.Servers.APIServerPeak))
	}},
	{"etcd RSS after the case (peak so far)", "", func(r *Result) string {
		return fmt.Sprintf("%s (%s)", framework.MiB(r.Servers.EtcdRSS), framework.MiB(r.Servers.EtcdPeak))
	}},
	{"Idle create-to-status p50 / p99 / max (next to N objects)", "p99 < 50 ms", func(r *Result) string {
		return pcts(r.Idle, true) + mark(r.Idle.P99 < 50*time.Millisecond)
	}},
	{"Idle: status writes per new object (controller)", "exactly 1.0", func(r *Result) string {
		return fmt.Sprintf("%.3f", r.IdleWritesController) + mark(r.IdleWritesController == 1)
	}},
}

// notRun fills the cells of a case the run left out (-raw=false).
const notRun = "not run"

// Markdown renders the run: how and where it ran, then one table with a
// column per N.
func (rep *Report) Markdown() string {
	var b strings.Builder
	c := rep.Config
	fmt.Fprintf(&b, "Date: %s  \n", rep.Date.Format("2006-01-02 15:04 MST"))
	fmt.Fprintf(&b, "Machine: %d CPUs (%s), %s memory, %s; %s on loopback, same machine  \n",
		rep.CPUs, rep.CPUModel, rep.Memory, rep.GoInfo, rep.Server)
	if rep.Controller != "" {
		fmt.Fprintf(&b, "Controller: built from commit %s  \n", rep.Controller)
	}
	if c.Existing > 0 {
		fmt.Fprintf(&b, "Existing: %s objects with a UUID, created in %s (one create each); the controller watches every namespace  \n",
			thousands(c.Existing), dur(rep.PreloadTook))
	}
	if c.Command != "" {
		fmt.Fprintf(&b, "Command: `%s`  \n", c.Command)
	}
	if rep.Took > 0 {
		fmt.Fprintf(&b, "Run took: %s, from building the controller to the last case  \n", dur(rep.Took))
	}
	ctrlArgs := "defaults"
	if len(c.ControllerArgs) > 0 {
		ctrlArgs = strings.Join(c.ControllerArgs, " ")
	}
	afterSweep := ""
	if c.BurstAfterSweep {
		afterSweep = "; each narrowed burst after the controller's first sweep"
	}
	fmt.Fprintf(&b, "Load: warm-up %s; idle: %d objects %s apart; controller flags: %s (plus --namespace)%s\n\n",
		c.Warmup, c.IdleCount, c.IdleInterval, ctrlArgs, afterSweep)

	b.WriteString("| |")
	for _, r := range rep.Results {
		fmt.Fprintf(&b, " N = %s, %d creators |", thousands(r.N), r.Concurrency)
	}
	b.WriteString(" goal |\n|---|")
	for range rep.Results {
		b.WriteString("---|")
	}
	b.WriteString("---|\n")
	for _, row := range rows {
		fmt.Fprintf(&b, "| %s |", row.label)
		for _, r := range rep.Results {
			fmt.Fprintf(&b, " %s |", row.cell(r))
		}
		fmt.Fprintf(&b, " %s |\n", row.goal)
	}
	for _, r := range rep.Results {
		for _, t := range []struct {
			name string
			t    Throughput
		}{{"raw loop before", r.RawBefore}, {"burst", r.Burst}, {"raw loop after", r.RawAfter}} {
			if t.t.Retries > 0 || t.t.Early > 0 {
				fmt.Fprintf(&b, "\nN = %s, %s: %d requests retried after transient errors; %d objects seen with a UUID before their create call returned (counted as 0 ms).\n",
					thousands(r.N), t.name, t.t.Retries, t.t.Early)
			}
			if t.t.Relists > 0 {
				fmt.Fprintf(&b, "\nN = %s, %s: the benchmark's watch fell behind and expired %d times; the objects a list then found count as seen at that list, so this latency errs long.\n",
					thousands(r.N), t.name, t.t.Relists)
			}
		}
		if r.IdleEarly > 0 {
			fmt.Fprintf(&b, "\nN = %s, idle: %d objects seen with a UUID before their create call returned (counted as 0 ms).\n",
				thousands(r.N), r.IdleEarly)
		}
	}
	return b.String()
}

func mark(ok bool) string {
	if ok {
		return " ✓"
	}
	return " ✗"
}

// markIf marks only the cells a goal applies to.
func markIf(applies, ok bool) string {
	if !applies {
		return ""
	}
	return mark(ok)
}

func rate(t Throughput) string {
	if t.PerSecond == 0 {
		return notRun
	}
	return fmt.Sprintf("%.0f/s (%s)", t.PerSecond, dur(t.Elapsed))
}

func pcts(s Summary, withMax bool) string {
	if s.Count == 0 {
		return notRun
	}
	out := dur(s.P50) + " / " + dur(s.P99)
	if withMax {
		out += " / " + dur(s.Max)
	}
	return out
}

// dur prints milliseconds below 1 s, seconds above.
func dur(d time.Duration) string {
	if d < time.Second {
		return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%.2f s", d.Seconds())
}

func perObject(b int64, n int) string {
	return fmt.Sprintf("%.0f B", float64(b)/float64(n))
}

// thousands prints n with comma separators.
func thousands(n int) string {
	s := strconv.Itoa(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// moduleVersion is the version of the module a Go binary was built from
// (the cluster's binaries are built by `make tools` from the module proxy).
func moduleVersion(path string) string {
	bi, err := buildinfo.ReadFile(path)
	if err != nil || bi.Main.Version == "" {
		return "(version unknown)"
	}
	return bi.Main.Version
}

// procField is the value of the first "key: value" line with key in file.
func procField(file, key string) string {
	f, err := os.Open(file)
	if err != nil {
		return "unknown"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

// memTotal is MemTotal from /proc/meminfo in GiB.
func memTotal() string {
	f := strings.Fields(procField("/proc/meminfo", "MemTotal"))
	if len(f) != 2 || f[1] != "kB" {
		return "unknown"
	}
	kb, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		return "unknown"
	}
	return fmt.Sprintf("%.1f GiB", float64(kb)/(1<<20))
}
