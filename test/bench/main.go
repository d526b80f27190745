// Command bench measures the uuid-controller against the limit the API
// server sets: it starts a local etcd + kube-apiserver (test/cluster), runs
// the controller binary as its ServiceAccount, and for every N measures
//
//   - the raw loop: N creates, each followed by a status PATCH, sent by the
//     benchmark itself at the same concurrency (before and after the
//     controller's cases);
//   - burst: N concurrent creates with the controller running, until a watch
//     has seen every UUID; throughput, create-to-status latency, status
//     writes per object (controller and apiserver metrics), memory;
//   - restart: a new controller over the N done objects: time to ready and
//     writes (none expected);
//   - idle: objects created one at a time next to the N: latency.
//
// It prints one Markdown table on stdout; progress goes to stderr.
//
//	go run ./test/bench -n 10000,100000 -c 16,64
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
)

func main() {
	if err := mainErr(); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "bench:", err)
		}
		os.Exit(1)
	}
}

func mainErr() error {
	cfg, out, err := parseFlags(os.Args[1:])
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := Run(ctx, cfg)
	if rep != nil && len(rep.Results) > 0 {
		md := rep.Markdown()
		fmt.Print(md)
		if out != "" {
			if werr := os.WriteFile(out, []byte(md), 0o644); werr != nil {
				err = errors.Join(err, werr)
			}
		}
	}
	return err
}

func parseFlags(args []string) (Config, string, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	ns := fs.String("n", "1000,10000", "Comma-separated object counts, each measured with every case.")
	conc := fs.String("c", "16,64", "Comma-separated numbers of concurrent create (and raw-loop) requests; every N is measured at each.")
	raw := fs.Bool("raw", true, "Run the raw loop before and after the controller's cases (the throughput ratio); false for a very large N.")
	memLimit := fs.String("restart-memory-limit", "", "Run the restarted controller in a memory cgroup of this size (e.g. 256Mi; root, cgroup v1), with GOMEMLIMIT at 90% of it.")
	warmup := fs.Duration("warmup", 30*time.Second, "How long the raw loop runs on throwaway objects before measuring.")
	idleCount := fs.Int("idle-count", 100, "Objects created one at a time in the idle case.")
	idleInterval := fs.Duration("idle-interval", 100*time.Millisecond, "Time between the idle case's creates.")
	settle := fs.Duration("settle", 3*time.Second, "Wait after a case's last expected write before reading write counters.")
	ctrlArgs := fs.String("controller-args", "", "Extra controller flags, space-separated (e.g. \"--workers=8\").")
	afterSweep := fs.Bool("burst-after-sweep", false, "Start each narrowed burst only after the controller's first sweep for malformed UUIDs completed (over -existing objects the sweep otherwise runs beside the burst).")
	existing := fs.Int("existing", 0, "Objects with a UUID created (one create each) before anything is measured; the controller then watches every namespace.")
	modes := fs.String("modes", "", "Comma-separated watches to measure, each over every N: narrowed (crd.yaml), full (its fallback). Default: the one $UUID_WATCH names.")
	out := fs.String("o", "", "Also write the Markdown report to this file.")
	verbose := fs.Bool("v", false, "Log the cluster's own progress too.")
	if err := fs.Parse(args); err != nil {
		return Config{}, "", err
	}
	if fs.NArg() > 0 {
		return Config{}, "", fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	counts, err := parseCounts(*ns)
	if err != nil {
		return Config{}, "", fmt.Errorf("-n: %w", err)
	}
	concs, err := parseCounts(*conc)
	if err != nil {
		return Config{}, "", fmt.Errorf("-c: %w", err)
	}
	var limit int64
	if *memLimit != "" {
		q, err := resource.ParseQuantity(*memLimit)
		if err != nil || q.Sign() <= 0 {
			return Config{}, "", fmt.Errorf("-restart-memory-limit: %q is not a positive size", *memLimit)
		}
		limit = q.Value()
	}
	level := slog.LevelInfo
	if !*verbose {
		level = slog.LevelWarn
	}
	cfg := Config{
		Ns:                 counts,
		Concurrency:        concs,
		Raw:                *raw,
		RestartMemoryLimit: limit,
		Warmup:             *warmup,
		IdleCount:          *idleCount,
		IdleInterval:       *idleInterval,
		Settle:             *settle,
		ControllerArgs:     strings.Fields(*ctrlArgs),
		Existing:           *existing,
		BurstAfterSweep:    *afterSweep,
		Modes:              strings.FieldsFunc(*modes, func(r rune) bool { return r == ',' }),
		Command:            "go run ./test/bench " + strings.Join(args, " "),
		Logger:             benchLogger(level),
	}
	return cfg, *out, cfg.validate()
}

// benchLogger logs the benchmark's progress at info and, unless verbose,
// only warnings from the cluster package.
func benchLogger(clusterLevel slog.Level) *slog.Logger {
	h := slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})
	return slog.New(&componentLevel{Handler: h, level: clusterLevel})
}

// componentLevel drops records below level from the test-cluster component.
type componentLevel struct {
	slog.Handler
	level   slog.Level
	cluster bool
}

func (h *componentLevel) Enabled(ctx context.Context, l slog.Level) bool {
	if h.cluster && l < h.level {
		return false
	}
	return h.Handler.Enabled(ctx, l)
}

func (h *componentLevel) WithAttrs(attrs []slog.Attr) slog.Handler {
	c := &componentLevel{Handler: h.Handler.WithAttrs(attrs), level: h.level, cluster: h.cluster}
	for _, a := range attrs {
		if a.Key == "component" && a.Value.String() == "test-cluster" {
			c.cluster = true
		}
	}
	return c
}

func (h *componentLevel) WithGroup(name string) slog.Handler {
	return &componentLevel{Handler: h.Handler.WithGroup(name), level: h.level, cluster: h.cluster}
}

// parseCounts reads "1000,10000"; underscores are allowed as digit
// separators (10_000).
func parseCounts(s string) ([]int, error) {
	var counts []int
	for f := range strings.SplitSeq(s, ",") {
		f = strings.ReplaceAll(strings.TrimSpace(f), "_", "")
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a positive count", f)
		}
		counts = append(counts, n)
	}
	return counts, nil
}
