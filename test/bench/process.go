package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/demo-operator/uuid-controller/test/cluster"
)

// clockTick is the unit of utime and stime in /proc/PID/stat (USER_HZ,
// 100 on Linux).
const clockTick = 10 * time.Millisecond

// processCPU is the CPU time (user + system) process pid has used so far, in
// seconds. CPU time, unlike elapsed time, hardly changes with what else
// runs on the machine.
func processCPU(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("reading the controller's CPU time: %w", err)
	}
	return parseCPU(string(b))
}

// parseCPU reads utime and stime, fields 14 and 15 of a /proc/PID/stat line;
// the command name (field 2) may hold spaces but ends at the last ')'.
func parseCPU(stat string) (float64, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("unexpected /proc stat line %q", stat)
	}
	f := strings.Fields(stat[i+1:])
	// f[0] is field 3 (state), so utime (14) is f[11] and stime (15) f[12].
	if len(f) < 13 {
		return 0, fmt.Errorf("unexpected /proc stat line %q", stat)
	}
	var ticks int64
	for _, s := range f[11:13] {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("unexpected /proc stat line %q: %w", stat, err)
		}
		ticks += v
	}
	return (time.Duration(ticks) * clockTick).Seconds(), nil
}

// queueDepthInterval is how often watchQueueDepth samples: often enough to
// see a backlog that lasts, seldom enough that the scrapes add little of
// the controller's CPU.
const queueDepthInterval = 250 * time.Millisecond

// depthWatcher samples the controller's workqueue_depth until stopped.
type depthWatcher struct {
	cancel  context.CancelFunc
	done    chan struct{}
	peak    float64
	samples int
}

func watchQueueDepth(ctx context.Context, p *cluster.ControllerProcess) *depthWatcher {
	ctx, cancel := context.WithCancel(ctx)
	w := &depthWatcher{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		t := time.NewTicker(queueDepthInterval)
		defer t.Stop()
		for {
			if text, err := p.Metrics(ctx); err == nil {
				if d, err := cluster.MetricSum(text, "workqueue_depth", byName("uuid")); err == nil {
					w.peak = max(w.peak, d)
					w.samples++
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return w
}

// stop ends the sampling and returns the peak depth and the number of
// samples it was taken from.
func (w *depthWatcher) stop() (float64, int) {
	w.cancel()
	<-w.done
	return w.peak, w.samples
}

// memoryCgroupRoot is where the cgroup v1 memory controller is mounted on
// this machine (docs/testing.md: a hybrid layout).
const memoryCgroupRoot = "/sys/fs/cgroup/memory"

// limitedBinary writes a script that moves itself into a new memory cgroup
// of limit bytes and then runs binary with GOMEMLIMIT at 90% of the limit,
// as the Deployment passes its limit to the Go runtime. cleanup removes the
// cgroup once the process has exited.
func limitedBinary(binary, name string, limit int64) (script string, cleanup func(), err error) {
	cg := filepath.Join(memoryCgroupRoot, fmt.Sprintf("uuid-bench-%s-%d", name, os.Getpid()))
	if err := os.Mkdir(cg, 0o755); err != nil {
		return "", nil, fmt.Errorf("creating a memory cgroup (needs root and cgroup v1 memory at %s): %w", memoryCgroupRoot, err)
	}
	cleanup = func() {
		// The cgroup can go only once its process has exited.
		for range 50 {
			if err := os.Remove(cg); err == nil || errors.Is(err, os.ErrNotExist) {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	if err := os.WriteFile(filepath.Join(cg, "memory.limit_in_bytes"), []byte(strconv.FormatInt(limit, 10)), 0o644); err != nil {
		cleanup()
		return "", nil, err
	}
	script = filepath.Join(filepath.Dir(binary), "limited-"+name)
	body := fmt.Sprintf("#!/bin/sh\necho $$ > %s/cgroup.procs || exit 1\nGOMEMLIMIT=%d exec %s \"$@\"\n",
		cg, limit/10*9, binary)
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		cleanup()
		return "", nil, err
	}
	limitedCgroups.Store(name, cg)
	return script, cleanup, nil
}

// limitedCgroups maps a namespace to the cgroup its restarted controller
// runs in.
var limitedCgroups sync.Map

// cgroupMemory reads the peak usage and the number of OOM kills of the
// cgroup the restarted controller of ns runs in; ok is false when it runs
// in none.
func cgroupMemory(ns string) (peak int64, oomKills int64, ok bool, err error) {
	v, found := limitedCgroups.Load(ns)
	if !found {
		return 0, 0, false, nil
	}
	cg := v.(string)
	b, err := os.ReadFile(filepath.Join(cg, "memory.max_usage_in_bytes"))
	if err != nil {
		return 0, 0, true, err
	}
	if peak, err = strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err != nil {
		return 0, 0, true, err
	}
	b, err = os.ReadFile(filepath.Join(cg, "memory.oom_control"))
	if err != nil {
		return 0, 0, true, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
			oomKills, err = strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	return peak, oomKills, true, err
}
