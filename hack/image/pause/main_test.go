package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func buildPause(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "pause")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func TestExitsZeroOnSignal(t *testing.T) {
	bin := buildPause(t)
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		cmd := exec.Command(bin)
		var stderr syncBuffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		// Once it catches the signals (before, SIGTERM would kill it), a
		// SIGCHLD (no child exited) must not end it.
		waitFor(t, "pause to catch its signals", func() int {
			if strings.Contains(stderr.String(), ready) {
				return 1
			}
			return 0
		})
		if err := cmd.Process.Signal(syscall.SIGCHLD); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			t.Fatalf("exited on SIGCHLD: %v", err)
		case <-time.After(500 * time.Millisecond):
		}
		if err := cmd.Process.Signal(sig); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%v: exit %v, want 0", sig, err)
			}
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			t.Fatalf("%v: still running after 10 s", sig)
		}
	}
}

// syncBuffer is a bytes.Buffer that a process writes while the test reads.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// As PID 1 of its own PID namespace, as in a pod, pause inherits orphans and
// must reap them, or they stay zombies for the pod's life.
func TestReapsOrphans(t *testing.T) {
	bin := buildPause(t)
	// unshare forks pause as PID 1 of a new PID namespace.
	cmd := exec.Command("unshare", "--pid", "--fork", "--kill-child", bin)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	pausePID := waitFor(t, "pause under unshare", func() int { return childOf(t, cmd.Process.Pid) })

	// sh starts sleep in pause's namespace and exits at once, so sleep is
	// orphaned and reparented to pause. Its output goes to /dev/null, or it would
	// hold the pipe CombinedOutput waits on.
	orphaner := exec.Command("nsenter", "--target", strconv.Itoa(pausePID), "--pid", "--", "sh", "-c", "sleep 2 >/dev/null 2>&1 & exit 0")
	if out, err := orphaner.CombinedOutput(); err != nil {
		t.Fatalf("nsenter: %v\n%s", err, out)
	}
	sleepPID := waitFor(t, "the orphan under pause", func() int { return childOf(t, pausePID) })
	// Once sleep exits, nothing but pause can reap it.
	waitFor(t, "the orphan reaped", func() int {
		if childOf(t, pausePID) == 0 {
			return 1
		}
		return 0
	})
	if _, err := os.Stat("/proc/" + strconv.Itoa(sleepPID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("orphan %d still in /proc: %v", sleepPID, err)
	}
}

// childOf returns a child of parent (any state, zombies included), or 0.
func childOf(t *testing.T, parent int) int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // exited meanwhile
		}
		// pid (comm) state ppid ...; comm may hold spaces, so split after ')'.
		fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if len(fields) > 1 && fields[1] == strconv.Itoa(parent) {
			return pid
		}
	}
	return 0
}

// waitFor polls f every 50 ms until it returns a value other than 0,
// within a context that ends after 20 s (or with the test).
func waitFor(t *testing.T, what string, f func() int) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if v := f(); v != 0 {
			return v
		}
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s: %v", what, context.Cause(ctx))
			return 0
		case <-tick.C:
		}
	}
}
