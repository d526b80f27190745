package cluster

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// stopTimeout bounds how long a child gets between SIGTERM and SIGKILL.
// An apiserver whose etcd is gone was seen to ignore SIGTERM for minutes.
const stopTimeout = 20 * time.Second

// process is one running child (etcd or kube-apiserver) in its own
// process group.
type process struct {
	name string
	cmd  *exec.Cmd
	done chan struct{} // closed when Wait returned
	err  error         // Wait's result, valid after done is closed
	logf *os.File      // log file owned by this process, if any
	log  *slog.Logger
}

func startProcess(log *slog.Logger, name, path string, args, env []string, out io.Writer, logf *os.File) (*process, error) {
	cmd := exec.Command(path, args...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.Stdout = out
	cmd.Stderr = out
	cmd.SysProcAttr = procAttr()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, done: make(chan struct{}), logf: logf, log: log}
	log.Info("started", "process", name, "pid", cmd.Process.Pid)
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

func (p *process) pid() int { return p.cmd.Process.Pid }

// exited reports whether the process is gone, and its Wait error.
func (p *process) exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// stop sends SIGTERM to the process group, waits up to stopTimeout, then
// SIGKILLs the group and waits for the process to be reaped.
func (p *process) stop() error {
	if done, _ := p.exited(); !done {
		pgid := p.pid() // Setpgid: the group id is the child's pid
		start := time.Now()
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		select {
		case <-p.done:
			p.log.Info("stopped", "process", p.name, "pid", pgid, "signal", "SIGTERM", "took", time.Since(start).Round(time.Millisecond))
		case <-time.After(stopTimeout):
			p.log.Warn("did not stop on SIGTERM, killing", "process", p.name, "pid", pgid, "waited", stopTimeout)
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			<-p.done
		}
		// Anything else left in the group (there should be nothing).
		if err := syscall.Kill(-pgid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			p.log.Warn("kill process group", "process", p.name, "pgid", pgid, "err", err)
		}
	}
	if p.logf != nil {
		err := p.logf.Close()
		p.logf = nil
		return err
	}
	return nil
}

// lockedWriter serialises writes from several children into one caller
// supplied io.Writer.
type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}
