package main

import (
	"context"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// runScript runs script with bash and returns exitCode's answer, sending the
// command SIGTERM (as runCommand does on Ctrl-C) after it has started when
// stop is set.
func runScript(t *testing.T, script string, stop bool) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", script)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The script says "started" once its traps are set.
	buf := make([]byte, len("started\n"))
	if _, err := io.ReadFull(stdout, buf); err != nil {
		t.Fatalf("script output: %v", err)
	}
	if stop {
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
	}
	return exitCode(cmd.Wait(), stop)
}

func TestExitCode(t *testing.T) {
	tests := []struct {
		name   string
		script string
		stop   bool
		want   int
	}{
		{"success", "echo started", false, 0},
		{"failure", "echo started; exit 3", false, 3},
		{"killed by SIGTERM, asked to stop", "echo started; sleep 60", true, 0},
		{"exit 143 on SIGTERM, asked to stop", "trap 'kill $!; exit 143' TERM; echo started; sleep 60 & wait", true, 0},
		{"exit 130 on SIGINT-like stop", "trap 'kill $!; exit 130' TERM; echo started; sleep 60 & wait", true, 0},
		{"failing on its own way out, asked to stop", "trap 'kill $!; exit 1' TERM; echo started; sleep 60 & wait", true, 1},
		{"killed by SIGTERM from elsewhere", "echo started; kill -TERM $$", false, 143},
		{"exit 130 unasked", "echo started; exit 130", false, 130},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := runScript(t, tt.script, tt.stop); got != tt.want {
				t.Errorf("exit code %d, want %d", got, tt.want)
			}
		})
	}
	if got := exitCode(exec.ErrNotFound, false); got != 127 {
		t.Errorf("a command that could not run: exit code %d, want 127", got)
	}
}

// TestRunCommandStop: a command run as `make demo` runs hack/demo.sh,
// stopped as Ctrl-C stops it: the context ends (SIGINT reached this
// program) and the command gets SIGTERM. Dying of it, or exiting 0 as
// hack/demo.sh does, is a clean stop; failing on the way out is not.
func TestRunCommandStop(t *testing.T) {
	tests := []struct {
		name, script string
		want         int
	}{
		{"killed by SIGTERM", `touch "$1"; sleep 60`, 0},
		{"exits 0 on SIGTERM", `trap 'kill $!; exit 0' TERM; touch "$1"; sleep 60 & wait`, 0},
		{"exits 1 on SIGTERM", `trap 'kill $!; exit 1' TERM; touch "$1"; sleep 60 & wait`, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			started := filepath.Join(t.TempDir(), "started")
			done := make(chan int, 1)
			go func() {
				done <- runCommand(ctx, slog.New(slog.DiscardHandler), []string{"bash", "-c", tt.script, "demo", started}, "kc", "ckc", t.TempDir())
			}()
			err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
				_, err := os.Stat(started)
				return err == nil, nil
			})
			if err != nil {
				t.Fatalf("the command did not start: %v", err)
			}
			cancel()
			select {
			case code := <-done:
				if code != tt.want {
					t.Errorf("runCommand after a requested stop: exit code %d, want %d", code, tt.want)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("runCommand still running 30 s after the stop")
			}
		})
	}
}
