package cluster

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// ControllerNamespace and ControllerServiceAccount are the identity
// deploy/rbac.yaml grants the controller's permissions to.
const (
	ControllerNamespace      = "uuid-system"
	ControllerServiceAccount = "uuid-controller"
)

// BuildController compiles the uuid-controller (the repo root's main
// package) into dir and returns the binary's path.
func BuildController(ctx context.Context, dir string) (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, "uuid-controller")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, ".")
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("cluster: go build uuid-controller: %w: %s", err, b)
	}
	return out, nil
}

// ControllerKubeconfig applies deploy/namespace.yaml and deploy/rbac.yaml
// and returns a kubeconfig for the controller's ServiceAccount, so a
// controller run with it has the permissions the manifests grant, and get
// on namespaces for --namespace (GrantNamespaceReads).
func (c *Cluster) ControllerKubeconfig(ctx context.Context) (string, error) {
	if err := c.Apply(ctx, filepath.Join(c.repoRoot, "deploy", "namespace.yaml"),
		filepath.Join(c.repoRoot, "deploy", "rbac.yaml")); err != nil {
		return "", err
	}
	if _, err := c.GrantNamespaceReads(ctx, ControllerNamespace, ControllerServiceAccount); err != nil {
		return "", err
	}
	return c.ServiceAccountKubeconfig(ctx, ControllerNamespace, ControllerServiceAccount)
}

// ControllerOptions configures StartController.
type ControllerOptions struct {
	// Binary is the path from BuildController.
	Binary string
	// Kubeconfig is passed as --kubeconfig.
	Kubeconfig string
	// Args are appended to the flags StartController sets itself
	// (--kubeconfig, --health-addr, --metrics-addr, and --metrics-secure=false
	// without MetricsAuth).
	Args []string
	// MetricsAuth, when set, leaves /metrics as deployed (HTTPS, readable
	// only with a token the apiserver authorizes) and Metrics reads it with
	// these credentials. Without it the controller serves plain HTTP
	// (--metrics-secure=false), so a test need not set up a reader.
	MetricsAuth *MetricsAuth
	// Log receives the controller's stderr and stdout. Default: kept in
	// memory only, readable with Output.
	Log io.Writer
	// Env ("NAME=value") is added to this process's environment, as a
	// pod's env is to the container's.
	Env []string
}

// MetricsAuth is how Metrics reads a secure /metrics.
type MetricsAuth struct {
	// Token is sent as the bearer token.
	Token string
	// CA (PEM) verifies the controller's serving certificate; nil skips
	// the check, for the certificate it makes itself in memory.
	CA []byte
}

// ControllerProcess is a running uuid-controller.
type ControllerProcess struct {
	cmd           *exec.Cmd
	done          chan struct{}
	err           error
	healthURL     string
	metricsURL    string
	metricsToken  string
	metricsClient *http.Client
	out           *syncBuffer
	startedAt     time.Time
	stopTimeout   time.Duration
}

// StartController starts the controller on free loopback ports for its
// health and metrics servers and waits until /healthz answers (not until
// its cache has synced: see WaitReady).
func StartController(ctx context.Context, opts ControllerOptions) (*ControllerProcess, error) {
	ports, err := freePorts(2)
	if err != nil {
		return nil, fmt.Errorf("cluster: free ports: %w", err)
	}
	health := "127.0.0.1:" + strconv.Itoa(ports[0])
	metrics := "127.0.0.1:" + strconv.Itoa(ports[1])
	args := []string{"--kubeconfig", opts.Kubeconfig, "--health-addr", health, "--metrics-addr", metrics}
	p := &ControllerProcess{
		done:          make(chan struct{}),
		healthURL:     "http://" + health,
		metricsURL:    "http://" + metrics + "/metrics",
		metricsClient: &http.Client{Timeout: 5 * time.Second},
		out:           &syncBuffer{},
		stopTimeout:   30 * time.Second,
	}
	if a := opts.MetricsAuth; a != nil {
		tlsConfig, err := clientTLS(a.CA)
		if err != nil {
			return nil, err
		}
		p.metricsURL = "https://" + metrics + "/metrics"
		p.metricsToken = a.Token
		p.metricsClient.Transport = &http.Transport{TLSClientConfig: tlsConfig}
	} else {
		args = append(args, "--metrics-secure=false")
	}
	args = append(args, opts.Args...)
	var w io.Writer = p.out
	if opts.Log != nil {
		w = io.MultiWriter(p.out, opts.Log)
	}
	p.cmd = exec.Command(opts.Binary, args...)
	if len(opts.Env) > 0 {
		p.cmd.Env = append(os.Environ(), opts.Env...)
	}
	p.cmd.Stdout, p.cmd.Stderr = w, w
	p.cmd.SysProcAttr = procAttr()
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("cluster: start uuid-controller: %w", err)
	}
	p.startedAt = time.Now()
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	if err := p.waitHTTP(ctx, "/healthz", 30*time.Second); err != nil {
		_, _ = p.Stop()
		return nil, err
	}
	return p, nil
}

// WaitReady waits until /readyz answers ok: the informer's cache has synced.
func (p *ControllerProcess) WaitReady(ctx context.Context, timeout time.Duration) error {
	return p.waitHTTP(ctx, "/readyz", timeout)
}

func (p *ControllerProcess) waitHTTP(ctx context.Context, path string, timeout time.Duration) error {
	hc := &http.Client{Timeout: 2 * time.Second}
	var last error
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		if p.Exited() {
			return false, fmt.Errorf("cluster: uuid-controller exited (%v) before %s answered; output:\n%s", p.err, path, p.Output())
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.healthURL+path, nil)
		if err != nil {
			return false, err
		}
		resp, err := hc.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return true, nil
			}
			err = fmt.Errorf("%s: %s", path, resp.Status)
		}
		last = err
		return false, nil
	})
	if wait.Interrupted(err) {
		return fmt.Errorf("cluster: waiting for uuid-controller %s: %w (last: %v)", path, err, last)
	}
	return err
}

// clientTLS trusts caPEM, or any certificate when caPEM is nil.
func clientTLS(caPEM []byte) (*tls.Config, error) {
	if caPEM == nil {
		return &tls.Config{InsecureSkipVerify: true}, nil // the controller's own in-memory certificate
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("cluster: MetricsAuth.CA holds no PEM certificate")
	}
	return &tls.Config{RootCAs: pool}, nil
}

// MetricsURL is the controller's /metrics: https:// when started with
// MetricsAuth, else http://.
func (p *ControllerProcess) MetricsURL() string { return p.metricsURL }

// HealthURL is the controller's health server, http://host:port.
func (p *ControllerProcess) HealthURL() string { return p.healthURL }

// Readyz returns the controller's /readyz response code and body.
func (p *ControllerProcess) Readyz(ctx context.Context) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.healthURL+"/readyz", nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		return 0, "", fmt.Errorf("cluster: GET controller /readyz: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// Metrics returns the controller's /metrics in Prometheus text format.
func (p *ControllerProcess) Metrics(ctx context.Context) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.metricsURL, nil)
	if err != nil {
		return "", err
	}
	if p.metricsToken != "" {
		req.Header.Set("Authorization", "Bearer "+p.metricsToken)
	}
	resp, err := p.metricsClient.Do(req)
	if err != nil {
		return "", fmt.Errorf("cluster: GET controller metrics: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("cluster: GET controller metrics: %s", resp.Status)
	}
	return string(b), nil
}

// PID is the controller's process id.
func (p *ControllerProcess) PID() int { return p.cmd.Process.Pid }

// Output is everything the controller has printed so far.
func (p *ControllerProcess) Output() string { return p.out.String() }

// Exited reports whether the process has ended.
func (p *ControllerProcess) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Signal sends sig to the controller.
func (p *ControllerProcess) Signal(sig syscall.Signal) error {
	return p.cmd.Process.Signal(sig)
}

// Wait waits up to timeout for the process to exit and returns its exit
// code (-1 when killed by a signal).
func (p *ControllerProcess) Wait(timeout time.Duration) (int, error) {
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode(), nil
	case <-time.After(timeout):
		return 0, fmt.Errorf("cluster: uuid-controller still running after %s", timeout)
	}
}

// Stop sends SIGTERM, waits up to 30 s, then SIGKILLs. It returns the exit
// code and how long the exit took. Safe to call after the process exited.
func (p *ControllerProcess) Stop() (int, time.Duration) {
	start := time.Now()
	if !p.Exited() {
		_ = p.Signal(syscall.SIGTERM)
		if _, err := p.Wait(p.stopTimeout); err != nil {
			_ = p.Signal(syscall.SIGKILL)
			<-p.done
		}
	}
	return p.cmd.ProcessState.ExitCode(), time.Since(start)
}

// Kill SIGKILLs the controller, as a crash or a node loss would: no lease
// release, no graceful shutdown.
func (p *ControllerProcess) Kill() {
	_ = p.Signal(syscall.SIGKILL)
	<-p.done
}

// PeakRSS reads the process's peak resident set size (VmHWM) from /proc.
func (p *ControllerProcess) PeakRSS() (int64, error) { return p.memory("VmHWM") }

// RSS reads the process's resident set size now (VmRSS) from /proc.
func (p *ControllerProcess) RSS() (int64, error) { return p.memory("VmRSS") }

// memory reads field of the controller's /proc/PID/status, in bytes.
func (p *ControllerProcess) memory(field string) (int64, error) { return ProcMemory(p.PID(), field) }

// ProcMemory reads a memory field (in kB: VmRSS, VmHWM) of /proc/PID/status,
// in bytes.
func ProcMemory(pid int, field string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("cluster: read memory of pid %d: %w", pid, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			f := strings.Fields(v)
			if len(f) != 2 || f[1] != "kB" {
				return 0, fmt.Errorf("cluster: unexpected %s line %q", field, line)
			}
			kb, err := strconv.ParseInt(f[0], 10, 64)
			return kb * 1024, err
		}
	}
	return 0, fmt.Errorf("cluster: no %s in /proc/%d/status", field, pid)
}

// syncBuffer is a bytes.Buffer safe for the concurrent writes of a child's
// stdout and stderr and reads from tests.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
