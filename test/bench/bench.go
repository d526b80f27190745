package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/demo-operator/uuid-controller/test/cluster"
)

// Config is what one benchmark run measures.
type Config struct {
	// Ns are the object counts, each measured with every case.
	Ns []int
	// Concurrency lists the numbers of goroutines creating objects, in the
	// raw loop and in the controller's burst alike; every N is measured at
	// each.
	Concurrency []int
	// Raw runs the raw loop before and after the controller's cases (the
	// throughput ratio); off for a run at a very large N.
	Raw bool
	// RestartMemoryLimit, when positive, runs the restarted controller in a
	// memory cgroup of this many bytes, with GOMEMLIMIT at 90% of it.
	RestartMemoryLimit int64
	// Warmup is how long the raw loop runs on throwaway objects before
	// anything is measured: a fresh apiserver is slow for its first 20-30 s.
	Warmup time.Duration
	// IdleCount objects are created IdleInterval apart for the idle case.
	IdleCount    int
	IdleInterval time.Duration
	// Settle is how long a case waits after its last expected write before
	// it reads the write counters, so late or extra writes are counted.
	Settle time.Duration
	// ControllerArgs are appended to the controller's flags (after
	// --namespace), e.g. --workers=8.
	ControllerArgs []string
	// BurstAfterSweep starts each narrowed burst only once the controller's
	// first sweep for malformed UUIDs has completed, so over -existing
	// objects the burst is measured without that sweep beside it.
	BurstAfterSweep bool
	// Existing objects with a UUID are created in a namespace of their own
	// before anything is measured (preload.go); the controller then runs
	// over every namespace, so its restarts list them too.
	Existing int
	// Modes are the watches measured, each over every N: "narrowed"
	// (crd.yaml) and "full" (its fallback, crd.yaml without the selectable
	// field). Default: the one $UUID_WATCH names.
	Modes []string
	// Command is shown in the report as how it was produced.
	Command string
	// Logger receives progress. Default: slog.Default().
	Logger *slog.Logger
}

func (c *Config) validate() error {
	var errs []error
	if len(c.Ns) == 0 {
		errs = append(errs, errors.New("no object counts given"))
	}
	for _, n := range c.Ns {
		if n < 1 {
			errs = append(errs, fmt.Errorf("object count must be positive, got %d", n))
		}
	}
	if len(c.Concurrency) == 0 {
		errs = append(errs, errors.New("no concurrency given"))
	}
	for _, n := range c.Concurrency {
		if n < 1 {
			errs = append(errs, fmt.Errorf("concurrency must be at least 1, got %d", n))
		}
	}
	if c.RestartMemoryLimit < 0 {
		errs = append(errs, fmt.Errorf("memory limit must not be negative, got %d", c.RestartMemoryLimit))
	}
	if c.IdleCount < 1 || c.IdleInterval <= 0 {
		errs = append(errs, fmt.Errorf("idle case needs a positive count and interval, got %d and %s", c.IdleCount, c.IdleInterval))
	}
	if c.Warmup < 0 || c.Settle < 0 {
		errs = append(errs, errors.New("warm-up and settle must not be negative"))
	}
	return errors.Join(errs...)
}

// bench is one run's shared state: the cluster, the controller binary and
// the admin clients.
type bench struct {
	cfg        Config
	log        *slog.Logger
	cluster    *cluster.Cluster
	binary     string
	kubeconfig string
	dyn        dynamic.Interface
	kube       kubernetes.Interface
	// conc is the concurrency of the case being measured.
	conc int
	// cleanups run when the cluster has stopped.
	cleanups []func()
	// mode is the watch being measured; preloadTook how long -existing's
	// creates took.
	mode        string
	preloadTook time.Duration
}

// Run builds the controller, starts a local cluster, warms it up, measures
// every case for every N and stops everything. The report holds the Ns
// finished before any error.
func Run(ctx context.Context, cfg Config) (_ *Report, err error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	start := time.Now()
	b := &bench{cfg: cfg, log: cfg.Logger}
	if b.log == nil {
		b.log = slog.Default()
	}

	binDir, err := os.MkdirTemp("", "uuid-bench-bin-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(binDir)
	b.log.Info("building the controller")
	version := controllerVersion(ctx)
	if b.binary, err = cluster.BuildController(ctx, binDir); err != nil {
		return nil, err
	}

	b.log.Info("starting the cluster")
	opts := cluster.Options{Logger: b.log}
	if cfg.Existing > 0 {
		// etcd's default 2 GiB quota holds about a million objects with
		// their history; 8 GiB leaves room for the cases after.
		opts.ExtraEtcdArgs = []string{"--quota-backend-bytes=8589934592"}
	}
	if b.cluster, err = cluster.Start(ctx, opts); err != nil {
		return nil, err
	}
	defer func() {
		defer func() {
			for _, c := range b.cleanups {
				c()
			}
		}()
		if stopErr := b.cluster.Stop(); stopErr != nil {
			err = errors.Join(err, fmt.Errorf("stopping the cluster: %w", stopErr))
		}
	}()
	if b.kubeconfig, err = b.cluster.ControllerKubeconfig(ctx); err != nil {
		return nil, err
	}
	if b.dyn, err = dynamic.NewForConfig(b.cluster.AdminConfig()); err != nil {
		return nil, err
	}
	if b.kube, err = kubernetes.NewForConfig(b.cluster.AdminConfig()); err != nil {
		return nil, err
	}

	if cfg.Existing > 0 {
		if err := b.preload(ctx); err != nil {
			return nil, fmt.Errorf("preload: %w", err)
		}
	}
	rep := newReport(cfg)
	rep.Controller = version
	rep.Server = fmt.Sprintf("kube-apiserver %s, etcd %s",
		moduleVersion(filepath.Join(b.cluster.BinDir(), cluster.APIServerBinary)),
		moduleVersion(filepath.Join(b.cluster.BinDir(), cluster.EtcdBinary)))
	if err := b.warmup(ctx); err != nil {
		return nil, fmt.Errorf("warm-up: %w", err)
	}
	rep.PreloadTook = b.preloadTook
	modes := cfg.Modes
	if len(modes) == 0 {
		modes = []string{currentMode()}
	}
	for _, mode := range modes {
		if err := b.useMode(ctx, mode); err != nil {
			return rep, err
		}
		for _, n := range cfg.Ns {
			for _, c := range cfg.Concurrency {
				b.conc = c
				res, err := b.runN(ctx, n)
				rep.Took = time.Since(start)
				if err != nil {
					return rep, fmt.Errorf("run at N=%d, %d creators, %s watch: %w", n, c, mode, err)
				}
				rep.Results = append(rep.Results, res)
			}
		}
	}
	return rep, nil
}

// caseTimeout bounds one case at n objects: two minutes plus 50 ms an
// object (20 objects/s: a twentieth of what this apiserver does warm on a
// quiet machine; a machine shared by other builds and tests gave 50-85).
func caseTimeout(n int) time.Duration {
	return 2*time.Minute + time.Duration(n)*50*time.Millisecond
}

// warmup runs the raw loop on throwaway objects for cfg.Warmup.
func (b *bench) warmup(ctx context.Context) error {
	if b.cfg.Warmup <= 0 {
		return nil
	}
	const ns, batch = "bench-warmup", 200
	if err := createNamespace(ctx, b.kube, ns); err != nil {
		return err
	}
	b.log.Info("warming up the apiserver", "for", b.cfg.Warmup)
	l := &loader{client: b.dyn.Resource(cluster.UuidGVR).Namespace(ns), concurrency: b.cfg.Concurrency[0], patch: true}
	start := time.Now()
	total := 0
	for i := 0; time.Since(start) < b.cfg.Warmup; i++ {
		if err := l.run(ctx, objectNames(fmt.Sprintf("w%d-", i), batch)); err != nil {
			return err
		}
		total += batch
	}
	b.log.Info("warmed up", "objects", total, "perSecond", int(float64(total)/time.Since(start).Seconds()))
	return nil
}

// runN measures every case at n objects: the raw loop, the controller's
// burst, its restart and its idle latency, and the raw loop again, so the
// controller is compared with the limit measured on both sides of it.
func (b *bench) runN(ctx context.Context, n int) (*Result, error) {
	r := &Result{N: n, Concurrency: b.conc, Watch: b.mode, Existing: b.cfg.Existing}
	var err error
	if b.cfg.Raw {
		if r.RawBefore, err = b.rawCase(ctx, fmt.Sprintf("bench-raw-before-%d-c%d-%s", n, b.conc, b.mode), n); err != nil {
			return nil, fmt.Errorf("raw loop (before): %w", err)
		}
	}
	if err := b.controllerCases(ctx, n, r); err != nil {
		return nil, err
	}
	if r.Servers, err = b.serverMemory(); err != nil {
		return nil, err
	}
	if !b.cfg.Raw {
		return r, nil
	}
	if r.RawAfter, err = b.rawCase(ctx, fmt.Sprintf("bench-raw-after-%d-c%d-%s", n, b.conc, b.mode), n); err != nil {
		return nil, fmt.Errorf("raw loop (after): %w", err)
	}
	if raw := (r.RawBefore.PerSecond + r.RawAfter.PerSecond) / 2; raw > 0 {
		r.Ratio = r.Burst.PerSecond / raw
	}
	b.log.Info("done", "n", n, "rawBefore", int(r.RawBefore.PerSecond), "controller", int(r.Burst.PerSecond),
		"rawAfter", int(r.RawAfter.PerSecond), "ratio", fmt.Sprintf("%.3f", r.Ratio))
	return r, nil
}

// serverMemory reads the apiserver's and etcd's memory from /proc.
func (b *bench) serverMemory() (ServerMemory, error) {
	etcd, api := b.cluster.PIDs()
	var m ServerMemory
	var errs []error
	for _, f := range []struct {
		pid   int
		field string
		into  *int64
	}{{api, "VmRSS", &m.APIServerRSS}, {api, "VmHWM", &m.APIServerPeak}, {etcd, "VmRSS", &m.EtcdRSS}, {etcd, "VmHWM", &m.EtcdPeak}} {
		v, err := cluster.ProcMemory(f.pid, f.field)
		errs = append(errs, err)
		*f.into = v
	}
	if err := errors.Join(errs...); err != nil {
		return m, fmt.Errorf("servers' memory: %w", err)
	}
	b.log.Info("servers' memory", "apiserverRSS", m.APIServerRSS, "apiserverPeak", m.APIServerPeak, "etcdRSS", m.EtcdRSS, "etcdPeak", m.EtcdPeak)
	return m, nil
}

// controllerVersion names the checkout the controller is built from: `git
// describe --always --dirty` in the repo root ("-dirty": uncommitted changes
// to tracked files).
func controllerVersion(ctx context.Context) string {
	root, err := cluster.RepoRoot()
	if err != nil {
		return "unknown"
	}
	cmd := exec.CommandContext(ctx, "git", "describe", "--always", "--dirty")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}

// currentMode is the watch $UUID_WATCH asks for.
func currentMode() string {
	if cluster.FullWatch() {
		return "full"
	}
	return "narrowed"
}

// useMode installs the CRD that gives the controller the watch mode asks
// for: crd.yaml ("narrowed"), or crd.yaml without its selectable field
// ("full").
func (b *bench) useMode(ctx context.Context, mode string) error {
	b.mode = mode
	b.log.Info("watch", "mode", mode)
	switch mode {
	case "narrowed":
		return b.cluster.InstallCRDWithSelectableFields(ctx)
	case "full":
		return b.cluster.InstallCRDWithoutSelectableFields(ctx)
	}
	return fmt.Errorf("unknown watch mode %q (narrowed or full)", mode)
}
