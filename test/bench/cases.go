package main

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/demo-operator/uuid-controller/test/cluster"
	"github.com/demo-operator/uuid-controller/test/framework"
)

// Throughput is one load of n new objects: how long until the last one was
// seen with a UUID, and each one's create-to-status latency.
type Throughput struct {
	// Elapsed runs from just before the first create to the watch's first
	// sighting of the last object's UUID.
	Elapsed   time.Duration
	PerSecond float64
	// CreatesDone is when the last create call returned, from the same start.
	CreatesDone time.Duration
	// Latency runs from an object's create call returning to the watch
	// seeing its UUID.
	Latency Summary
	// FromTimestamp runs from the object's creationTimestamp, which has
	// 1 s resolution (truncated), so it reads up to 1 s high.
	FromTimestamp Summary
	// Early counts sightings before the create call's response was read
	// (counted as 0 latency).
	Early int
	// Retries counts requests repeated after a transient error.
	Retries int64
	// Relists counts the benchmark's watch expiring (410) and starting
	// again from a list; objects found by a list count as seen then.
	Relists int
}

// load creates n objects obj-000000... in ns at b.conc, patching
// each one's status right after its create when patch is set, and waits
// until a watch has seen every one with a UUID.
func (b *bench) load(ctx context.Context, ns string, n int, patch bool) (Throughput, error) {
	ctx, cancel := context.WithTimeout(ctx, caseTimeout(n))
	defer cancel()
	obs, err := observe(ctx, b.dyn, ns, "obj-")
	if err != nil {
		return Throughput{}, err
	}
	defer obs.stop()
	l := &loader{
		client:      b.dyn.Resource(cluster.UuidGVR).Namespace(ns),
		concurrency: b.conc,
		patch:       patch,
		onCreated:   obs.markCreated,
	}
	start := time.Now()
	if err := l.run(ctx, objectNames("obj-", n)); err != nil {
		return Throughput{}, err
	}
	createsDone := time.Since(start)
	if err := obs.wait(ctx, n); err != nil {
		return Throughput{}, err
	}
	fromCreate, fromTS, early := obs.latencies()
	t := Throughput{
		Elapsed:       obs.lastSeen().Sub(start),
		CreatesDone:   createsDone,
		Latency:       Summarize(fromCreate),
		FromTimestamp: Summarize(fromTS),
		Early:         early,
		Retries:       l.retries.Load(),
		Relists:       obs.relisted(),
	}
	t.PerSecond = float64(n) / t.Elapsed.Seconds()
	b.log.Info("load done", "namespace", ns, "n", n, "statusPatches", patch, "createsDone", createsDone.Round(time.Millisecond),
		"elapsed", t.Elapsed.Round(time.Millisecond), "perSecond", int(t.PerSecond),
		"p50", t.Latency.P50, "p99", t.Latency.P99, "retries", t.Retries, "early", early, "relists", t.Relists)
	return t, nil
}

// rawCase is the limit: no controller, the benchmark itself creates each
// object and patches its status, the same two requests per object.
func (b *bench) rawCase(ctx context.Context, ns string, n int) (Throughput, error) {
	if err := createNamespace(ctx, b.kube, ns); err != nil {
		return Throughput{}, err
	}
	b.log.Info("raw loop", "namespace", ns, "n", n, "concurrency", b.conc)
	return b.load(ctx, ns, n, true)
}

// controllerCases runs a controller on an empty namespace (the memory
// baseline), bursts n objects at it, then restarts it over the n finished
// objects and measures idle latency with the restarted one.
func (b *bench) controllerCases(ctx context.Context, n int, r *Result) error {
	ns := fmt.Sprintf("bench-ctrl-%d-c%d-%s", n, b.conc, b.mode)
	if err := createNamespace(ctx, b.kube, ns); err != nil {
		return err
	}
	p, err := b.startController(ctx, ns, 0)
	if err != nil {
		return err
	}
	defer b.stopController(p)
	if b.cfg.BurstAfterSweep && b.mode == "narrowed" {
		start := time.Now()
		if _, err := b.waitSweep(ctx, p, caseTimeout(n+b.cfg.Existing)); err != nil {
			return fmt.Errorf("waiting for the first sweep before the burst: %w", err)
		}
		b.log.Info("first sweep done before the burst", "waited", time.Since(start).Round(time.Millisecond))
	}
	if err := b.burst(ctx, p, ns, n, r); err != nil {
		return fmt.Errorf("burst: %w", err)
	}
	b.stopController(p)

	p2, err := b.restart(ctx, ns, r)
	if err != nil {
		return fmt.Errorf("restart: %w", err)
	}
	defer b.stopController(p2)
	if err := b.idle(ctx, p2, ns, r); err != nil {
		return fmt.Errorf("idle: %w", err)
	}
	if r.Memory.RestartRSS, _, err = b.memory(ctx, p2, "restarted, after idle"); err != nil {
		return err
	}
	if b.cfg.RestartMemoryLimit > 0 {
		b.stopController(p2)
		return b.limitedRestart(ctx, ns, r)
	}
	return nil
}

// limitedRestart starts one more controller over the namespace's objects,
// in a memory cgroup of cfg.RestartMemoryLimit with GOMEMLIMIT, and records
// whether it became ready and stayed up through cfg.Settle, its time to
// ready, and the cgroup's peak usage and OOM kills.
func (b *bench) limitedRestart(ctx context.Context, ns string, r *Result) error {
	m := &r.Memory
	m.Limit = b.cfg.RestartMemoryLimit
	start := time.Now()
	p, err := b.startController(ctx, ns, m.Limit)
	if err == nil {
		defer b.stopController(p)
		m.LimitReady = time.Since(start)
		err = sleep(ctx, b.cfg.Settle)
		if err == nil && p.Exited() {
			code, _ := p.Wait(0)
			err = fmt.Errorf("exited after it was ready, code %d", code)
			b.log.Warn("controller under the memory limit exited", "code", code, "output", framework.LastLines(p.Output(), 20))
		}
	}
	if err != nil {
		// The outcome to report, not a failure of the run: OOM kills
		// say whether the limit was the cause.
		m.LimitFailure = err.Error()
		b.log.Warn("controller under the memory limit did not hold", "err", err)
	}
	var cgErr error
	if m.LimitPeak, m.OOMKills, _, cgErr = cgroupMemory(ns); cgErr != nil {
		return cgErr
	}
	b.log.Info("memory cgroup", "limit", m.Limit, "ready", m.LimitReady, "peakUsage", m.LimitPeak, "oomKills", m.OOMKills)
	return nil
}

// burst creates n objects as fast as the apiserver takes them while the
// controller p runs, and counts its writes and memory.
func (b *bench) burst(ctx context.Context, p *cluster.ControllerProcess, ns string, n int, r *Result) error {
	// The baseline: a controller that is up, synced and has nothing cached.
	if err := sleep(ctx, time.Second); err != nil {
		return err
	}
	var err error
	if r.Memory.BaselineRSS, r.Memory.BaselineHeap, err = b.memory(ctx, p, "baseline"); err != nil {
		return err
	}
	ctrlBefore, err := controllerWrites(ctx, p)
	if err != nil {
		return err
	}
	apiBefore, err := b.cluster.APIStatusWrites(ctx)
	if err != nil {
		return err
	}
	cpuBefore, err := processCPU(p.PID())
	if err != nil {
		return err
	}
	peak := watchQueueDepth(ctx, p)
	b.log.Info("controller burst", "namespace", ns, "n", n, "concurrency", b.conc)
	if r.Burst, err = b.load(ctx, ns, n, false); err != nil {
		peak.stop()
		return err
	}
	ctrlAfter, err := b.settledWrites(ctx, p, ctrlBefore+float64(n))
	r.QueuePeak, r.QueueSamples = peak.stop()
	if err != nil {
		return err
	}
	// Read after the settle: the CPU of the burst's last writes and their
	// watch events is in, and an idle controller adds next to nothing.
	cpuAfter, err := processCPU(p.PID())
	if err != nil {
		return err
	}
	r.BurstCPU = cpuAfter - cpuBefore
	apiAfter, err := b.cluster.APIStatusWrites(ctx)
	if err != nil {
		return err
	}
	r.BurstWritesController = (ctrlAfter - ctrlBefore) / float64(n)
	r.BurstWritesAPI = (apiAfter - apiBefore) / float64(n)
	if r.Memory.BurstRSS, r.Memory.BurstHeap, err = b.memory(ctx, p, "after burst"); err != nil {
		return err
	}
	// The kernel updates VmHWM lazily, so a reading can come out below an
	// earlier one of the same process; the peak includes the baseline.
	r.Memory.BurstRSS = max(r.Memory.BurstRSS, r.Memory.BaselineRSS)
	b.log.Info("burst writes and memory", "writesPerObjectController", r.BurstWritesController,
		"writesPerObjectAPIServer", r.BurstWritesAPI, "peakRSS", r.Memory.BurstRSS, "heap", r.Memory.BurstHeap)
	return nil
}

// restart starts a fresh controller over the n objects that already have
// UUIDs and measures its time to ready and the writes it makes (none are
// expected). The returned controller is left running.
func (b *bench) restart(ctx context.Context, ns string, r *Result) (*cluster.ControllerProcess, error) {
	apiBefore, err := b.cluster.APIStatusWrites(ctx)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	p, err := b.startController(ctx, ns, 0)
	if err != nil {
		return nil, err
	}
	r.RestartReady = time.Since(start)
	if r.RestartCPU, err = processCPU(p.PID()); err != nil {
		return p, err
	}
	if b.mode == "narrowed" {
		if err := b.sweep(ctx, p, r); err != nil {
			return p, fmt.Errorf("sweep: %w", err)
		}
	}
	if err := sleep(ctx, b.cfg.Settle); err != nil {
		return p, err
	}
	text, err := p.Metrics(ctx)
	if err != nil {
		return p, err
	}
	if r.RestartWritesController, err = cluster.MetricSum(text, "uuid_controller_status_writes_total", nil); err != nil {
		return p, err
	}
	if r.RestartQueued, err = cluster.MetricSum(text, "workqueue_adds_total", byName("uuid")); err != nil {
		return p, err
	}
	apiAfter, err := b.cluster.APIStatusWrites(ctx)
	if err != nil {
		return p, err
	}
	r.RestartWritesAPI = apiAfter - apiBefore
	b.log.Info("restart", "namespace", ns, "ready", r.RestartReady.Round(time.Millisecond), "cpu", r.RestartCPU,
		"writesController", r.RestartWritesController, "writesAPIServer", r.RestartWritesAPI, "queued", r.RestartQueued)
	return p, nil
}

// idle creates cfg.IdleCount objects one at a time, cfg.IdleInterval apart,
// beside the n objects already there, and measures each one's latency.
func (b *bench) idle(ctx context.Context, p *cluster.ControllerProcess, ns string, r *Result) error {
	count := b.cfg.IdleCount
	ctx, cancel := context.WithTimeout(ctx, time.Duration(count)*b.cfg.IdleInterval+2*time.Minute)
	defer cancel()
	obs, err := observe(ctx, b.dyn, ns, "idle-")
	if err != nil {
		return err
	}
	defer obs.stop()
	ctrlBefore, err := controllerWrites(ctx, p)
	if err != nil {
		return err
	}
	l := &loader{client: b.dyn.Resource(cluster.UuidGVR).Namespace(ns), concurrency: 1, onCreated: obs.markCreated}
	b.log.Info("idle", "namespace", ns, "objects", count, "interval", b.cfg.IdleInterval)
	start := time.Now()
	for i, name := range objectNames("idle-", count) {
		if err := sleep(ctx, time.Until(start.Add(time.Duration(i)*b.cfg.IdleInterval))); err != nil {
			return err
		}
		if err := l.one(ctx, name); err != nil {
			return err
		}
	}
	if err := obs.wait(ctx, count); err != nil {
		return err
	}
	fromCreate, _, early := obs.latencies()
	r.Idle, r.IdleEarly = Summarize(fromCreate), early
	ctrlAfter, err := b.settledWrites(ctx, p, ctrlBefore+float64(count))
	if err != nil {
		return err
	}
	r.IdleWritesController = (ctrlAfter - ctrlBefore) / float64(count)
	b.log.Info("idle done", "p50", r.Idle.P50, "p99", r.Idle.P99, "max", r.Idle.Max, "early", early,
		"writesPerObject", r.IdleWritesController)
	return nil
}

// startController runs the controller as its ServiceAccount on ns only and
// waits until its cache has synced. With a positive memLimit it runs in a
// memory cgroup of that size (see limitedBinary).
func (b *bench) startController(ctx context.Context, ns string, memLimit int64) (*cluster.ControllerProcess, error) {
	binary := b.binary
	if memLimit > 0 {
		var cleanup func()
		var err error
		if binary, cleanup, err = limitedBinary(b.binary, ns, memLimit); err != nil {
			return nil, err
		}
		defer func() { b.cleanups = append(b.cleanups, cleanup) }()
	}
	p, err := cluster.StartController(ctx, cluster.ControllerOptions{
		Binary:     binary,
		Kubeconfig: b.kubeconfig,
		Args:       append(b.scope(ns), b.cfg.ControllerArgs...),
	})
	if err != nil {
		return nil, err
	}
	if err := p.WaitReady(ctx, 5*time.Minute); err != nil {
		b.stopController(p)
		return nil, err
	}
	return p, nil
}

// stopController stops p (SIGTERM) if it still runs; an unclean exit is
// logged, not fatal: shutdown is not what is measured here.
func (b *bench) stopController(p *cluster.ControllerProcess) {
	if p.Exited() {
		return
	}
	if code, took := p.Stop(); code != 0 {
		b.log.Warn("controller exited uncleanly", "pid", p.PID(), "code", code, "took", took)
	}
}

// settledWrites waits until the controller has counted at least want status
// writes, then cfg.Settle more for stray ones, and returns its count.
func (b *bench) settledWrites(ctx context.Context, p *cluster.ControllerProcess, want float64) (float64, error) {
	// Reaching 30 s is not an error: the count read after settling is the answer.
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		got, err := controllerWrites(ctx, p)
		return got >= want, err
	})
	if err != nil && (!wait.Interrupted(err) || ctx.Err() != nil) {
		return 0, err
	}
	if err := sleep(ctx, b.cfg.Settle); err != nil {
		return 0, err
	}
	return controllerWrites(ctx, p)
}

// controllerWrites is the controller's count of status writes, whatever
// their result.
func controllerWrites(ctx context.Context, p *cluster.ControllerProcess) (float64, error) {
	text, err := p.Metrics(ctx)
	if err != nil {
		return 0, err
	}
	return cluster.MetricSum(text, "uuid_controller_status_writes_total", nil)
}

// memory is p's peak RSS (VmHWM) and its Go heap in use now. The runtime's
// other figures are logged, to tell cache from garbage-collector headroom.
func (b *bench) memory(ctx context.Context, p *cluster.ControllerProcess, when string) (peakRSS, heap int64, err error) {
	if peakRSS, err = p.PeakRSS(); err != nil {
		return 0, 0, err
	}
	text, err := p.Metrics(ctx)
	if err != nil {
		return 0, 0, err
	}
	attrs := []any{"when", when, "peakRSS", peakRSS}
	for _, name := range []string{"process_resident_memory_bytes", "go_memstats_heap_alloc_bytes",
		"go_memstats_heap_inuse_bytes", "go_memstats_next_gc_bytes", "go_memstats_sys_bytes"} {
		v, err := cluster.MetricSum(text, name, nil)
		if err != nil {
			return 0, 0, err
		}
		attrs = append(attrs, name, int64(v))
		if name == "go_memstats_heap_alloc_bytes" {
			heap = int64(v)
		}
	}
	b.log.Info("controller memory", attrs...)
	return peakRSS, heap, nil
}

func byName(name string) func(map[string]string) bool {
	return func(l map[string]string) bool { return l["name"] == name }
}

func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}

// scope is the controller's --namespace: the case's namespace, or every
// namespace when -existing objects must be in its restarts.
func (b *bench) scope(ns string) []string {
	if b.cfg.Existing > 0 {
		return nil
	}
	return []string{"--namespace", ns}
}

// waitSweep waits up to timeout for controller p's first completed (or,
// with --leader-elect and a clean sweep recorded, skipped) sweep and
// returns its metrics then.
func (b *bench) waitSweep(ctx context.Context, p *cluster.ControllerProcess, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var text string
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		var err error
		if text, err = p.Metrics(ctx); err != nil {
			return false, err
		}
		n, err := cluster.MetricSum(text, "uuid_controller_sweeps_total", func(l map[string]string) bool {
			return l["result"] == "ok" || l["result"] == "skipped"
		})
		return n >= 1, err
	})
	return text, err
}

// sweep waits for the restarted leader's first sweep (narrowed watch) and
// records its time (the controller's metric), CPU (the process's CPU since
// it was ready) and the peak RSS so far.
func (b *bench) sweep(ctx context.Context, p *cluster.ControllerProcess, r *Result) error {
	text, err := b.waitSweep(ctx, p, caseTimeout(r.N+r.Existing))
	if err != nil {
		return err
	}
	if r.SweepSeconds, err = cluster.MetricSum(text, "uuid_controller_sweep_duration_seconds", nil); err != nil {
		return err
	}
	skipped, err := cluster.MetricSum(text, "uuid_controller_sweeps_total", func(l map[string]string) bool { return l["result"] == "skipped" })
	if err != nil {
		return err
	}
	r.SweepSkipped = skipped > 0
	cpu, err := processCPU(p.PID())
	if err != nil {
		return err
	}
	r.SweepCPU = cpu - r.RestartCPU
	if r.SweepPeakRSS, err = p.PeakRSS(); err != nil {
		return err
	}
	b.log.Info("sweep", "seconds", r.SweepSeconds, "cpu", r.SweepCPU, "peakRSS", r.SweepPeakRSS)
	return nil
}
