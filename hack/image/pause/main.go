// Command pause is the node's pod sandbox process: it holds the pod's
// namespaces open, reaps the children it inherits as PID 1, and exits 0 on
// SIGTERM or SIGINT. A Go stand-in for the pause image, which cannot be pulled
// here; packed by hack/image from pause/Dockerfile.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

const ready = "pause: running"

func main() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	// One line once the signals are caught, so a caller (its test) knows
	// when a SIGTERM ends it cleanly instead of killing it.
	fmt.Fprintln(os.Stderr, ready)
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			return
		}
		reap()
	}
}

// reap collects every exited child, so orphans that PID 1 inherits in a
// shared PID namespace do not stay zombies. Several exits can arrive as one
// SIGCHLD, hence the loop.
func reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
