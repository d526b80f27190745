// Package cluster runs a real, throwaway Kubernetes control plane (etcd and
// kube-apiserver on loopback, no containers) for end-to-end tests and
// benchmarks of the uuid-controller.
//
// The binaries come from `make tools` (bin/etcd, bin/kube-apiserver,
// bin/kubectl). A cluster has RBAC on, an admin bearer token in
// system:masters, ServiceAccount tokens signed by a key generated at start,
// and the repo's crd.yaml installed.
package cluster

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// ModulePath is the module whose go.mod marks the repo root.
const ModulePath = "github.com/demo-operator/uuid-controller"

// Binaries that Start needs in Options.BinDir.
const (
	EtcdBinary      = "etcd"
	APIServerBinary = "kube-apiserver"
	KubectlBinary   = "kubectl"
)

// Options configures Start. The zero value is usable.
type Options struct {
	// BinDir holds etcd, kube-apiserver and kubectl. Default:
	// $KUBE_TEST_BIN_DIR, else <repo root>/bin.
	BinDir string
	// Dir is the work dir (data, certs, kubeconfigs, logs). Default: a
	// fresh temporary dir, removed by Stop. A given Dir is kept.
	Dir string
	// Log receives etcd's and kube-apiserver's output. Default: the files
	// etcd.log and kube-apiserver.log in Dir. If $ARTIFACTS is set, Stop
	// copies those files into it.
	Log io.Writer
	// ExtraAPIServerArgs are appended to kube-apiserver's flags.
	ExtraAPIServerArgs []string
	// Audit writes an audit log of every request on Uuid objects, read
	// with AuditEvents.
	Audit bool
	// ExtraEtcdArgs are appended to etcd's flags.
	ExtraEtcdArgs []string
	// Logger receives the package's own structured log. Default:
	// slog.Default().
	Logger *slog.Logger

	// Node adds a whole single node (node.go): kube-controller-manager,
	// kube-scheduler, containerd, a kubelet and kube-proxy, with the
	// apiserver on the node's bridge (NodeIP) instead of loopback. It
	// needs root, `make node-tools` and `make node-deps`.
	Node bool
	// PauseImage is the pod sandbox image archive (`make pause-image`; its
	// tag is pinned as containerd's sandbox image). Required with Node.
	PauseImage string
	// NodeImages are image archives loaded into the node's containerd, so
	// pods run them without a registry. Images can also be pushed to the
	// node's registry (Cluster.Registry), from which the kubelet pulls.
	NodeImages []string
}

// Cluster is a running etcd + kube-apiserver pair.
type Cluster struct {
	opts     Options
	log      *slog.Logger
	repoRoot string
	binDir   string
	dir      string
	tempDir  bool // dir was created by Start and is removed by Stop

	etcdURL    string
	apiPort    int
	url        string
	caPEM      []byte
	adminToken string
	adminKC    string
	apiArgs    []string
	etcdArgs   []string
	logMu      sync.Mutex

	mu        sync.Mutex // guards the processes, node and stopped
	etcd      *process
	apiserver *process
	node      *nodeState // nil without Options.Node
	stopped   bool
}

// Start brings up etcd and kube-apiserver on free loopback ports, waits for
// /readyz and the "default" namespace, and installs crd.yaml from the repo
// root, waiting until it is Established and NamesAccepted. The context
// bounds only start-up; the cluster runs until Stop. On any error, Start
// stops whatever it started.
//
// A fresh apiserver stays busy for its first 20-30 s after /readyz;
// Start does not wait for that.
func Start(ctx context.Context, opts Options) (_ *Cluster, err error) {
	c := &Cluster{opts: opts, log: opts.Logger}
	if c.log == nil {
		c.log = slog.Default()
	}
	c.log = c.log.With("component", "test-cluster")

	c.repoRoot, err = RepoRoot()
	if err != nil {
		return nil, err
	}
	c.binDir = opts.BinDir
	if c.binDir == "" {
		c.binDir = os.Getenv("KUBE_TEST_BIN_DIR")
	}
	if c.binDir == "" {
		c.binDir = filepath.Join(c.repoRoot, "bin")
	}
	if c.binDir, err = filepath.Abs(c.binDir); err != nil {
		return nil, err
	}
	for _, b := range []string{EtcdBinary, APIServerBinary, KubectlBinary} {
		if err := checkBinary(filepath.Join(c.binDir, b)); err != nil {
			return nil, err
		}
	}
	tmp, prefix := "", "uuid-test-cluster-"
	if opts.Node {
		if err := checkNodeHost(c.binDir, opts); err != nil {
			return nil, err
		}
		// Short: unix socket paths under it must fit in 108 bytes.
		tmp, prefix = "/tmp", "uuid-node-"
	}

	if opts.Dir == "" {
		c.dir, err = os.MkdirTemp(tmp, prefix)
		if err != nil {
			return nil, err
		}
		c.tempDir = true
	} else {
		c.dir, err = filepath.Abs(opts.Dir)
		if err != nil {
			return nil, err
		}
		if err := os.MkdirAll(c.dir, 0o755); err != nil {
			return nil, err
		}
	}
	defer func() {
		if err != nil {
			if stopErr := c.Stop(); stopErr != nil {
				c.log.Error("stop after failed start", "err", stopErr)
			}
		}
	}()

	if opts.Node {
		if err := c.beginNode(ctx); err != nil {
			return nil, err
		}
	}
	if err := c.prepare(); err != nil {
		return nil, err
	}
	if err := c.startEtcd(ctx); err != nil {
		return nil, err
	}
	if err := c.startAPIServer(ctx); err != nil {
		return nil, err
	}
	if err := c.waitDefaultNamespace(ctx); err != nil {
		return nil, err
	}
	if err := c.InstallCRD(ctx); err != nil {
		return nil, err
	}
	if opts.Node {
		if err := c.startNode(ctx); err != nil {
			return nil, err
		}
	}
	c.log.Info("cluster ready", "url", c.url, "dir", c.dir, "kubeconfig", c.adminKC)
	return c, nil
}

// RepoRoot walks up from the working directory to the go.mod of ModulePath.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && modulePath(b) == ModulePath {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("cluster: no go.mod for module %s in the working directory or above it", ModulePath)
		}
		dir = parent
	}
}

func modulePath(gomod []byte) string {
	sc := bufio.NewScanner(bytes.NewReader(gomod))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 2 && f[0] == "module" {
			return strings.Trim(f[1], `"`)
		}
	}
	return ""
}

func checkBinary(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("cluster: %s binary not found at %s (run `make tools` to build it, or set KUBE_TEST_BIN_DIR): %w", filepath.Base(path), path, err)
	}
	if st.IsDir() || st.Mode()&0o111 == 0 {
		return fmt.Errorf("cluster: %s at %s is not an executable file (run `make tools`)", filepath.Base(path), path)
	}
	return nil
}

// freePorts returns n distinct free TCP ports on 127.0.0.1. The listeners
// are held until all are chosen so the ports differ.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// prepare writes certificates, keys, the token file and the admin
// kubeconfig, and fixes the ports and flags.
func (c *Cluster) prepare() error {
	for _, d := range []string{"certs", "etcd-data", "kubeconfigs"} {
		if err := os.MkdirAll(filepath.Join(c.dir, d), 0o700); err != nil {
			return err
		}
	}
	certs := filepath.Join(c.dir, "certs")
	servingCert := filepath.Join(certs, "apiserver.crt")
	servingKey := filepath.Join(certs, "apiserver.key")
	// On a node the apiserver listens on the bridge, for pods, and its
	// certificate names the kubernetes Service's ClusterIP, which
	// rest.InClusterConfig connects to.
	host, serviceCIDR, certIPs := "127.0.0.1", "10.0.0.0/24", []string{"127.0.0.1", "10.0.0.1"}
	if c.opts.Node {
		host, serviceCIDR, certIPs = NodeIP, ServiceCIDR, []string{"127.0.0.1", NodeIP, KubernetesServiceIP}
	}
	var err error
	if c.caPEM, err = WriteServingCert(servingCert, servingKey, certIPs...); err != nil {
		return fmt.Errorf("cluster: serving certificate: %w", err)
	}
	if err := os.WriteFile(filepath.Join(certs, "ca.crt"), c.caPEM, 0o600); err != nil {
		return err
	}
	saKey := filepath.Join(certs, "sa.key")
	if err := writeServiceAccountKey(saKey); err != nil {
		return err
	}
	if c.adminToken, err = randomToken(); err != nil {
		return err
	}
	tokens := filepath.Join(c.dir, "tokens.csv")
	line := fmt.Sprintf("%s,admin,admin-uid,\"system:masters\"\n", c.adminToken)
	if err := os.WriteFile(tokens, []byte(line), 0o600); err != nil {
		return err
	}

	ports, err := freePorts(3)
	if err != nil {
		return fmt.Errorf("cluster: free ports: %w", err)
	}
	c.etcdURL = "http://127.0.0.1:" + strconv.Itoa(ports[0])
	peerURL := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	c.apiPort = ports[2]
	c.url = "https://" + host + ":" + strconv.Itoa(c.apiPort)
	c.etcdArgs = []string{
		"--name", "default",
		"--data-dir", filepath.Join(c.dir, "etcd-data"),
		"--listen-client-urls", c.etcdURL,
		"--advertise-client-urls", c.etcdURL,
		"--listen-peer-urls", peerURL,
		"--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "default=" + peerURL,
		"--log-level", "warn",
	}
	c.etcdArgs = append(c.etcdArgs, c.opts.ExtraEtcdArgs...)
	c.apiArgs = []string{
		"--etcd-servers", c.etcdURL,
		"--cert-dir", certs,
		"--tls-cert-file", servingCert,
		"--tls-private-key-file", servingKey,
		"--secure-port", strconv.Itoa(c.apiPort),
		"--bind-address", host,
		"--advertise-address", host,
		"--service-account-key-file", saKey,
		"--service-account-signing-key-file", saKey,
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--token-auth-file", tokens,
		"--authorization-mode", "RBAC",
		"--service-cluster-ip-range", serviceCIDR,
	}
	if !c.opts.Node {
		// Loopback is not a valid advertise address for the endpoint
		// reconciler, and nothing without a node needs the kubernetes
		// Service's endpoints.
		c.apiArgs = append(c.apiArgs, "--endpoint-reconciler-type", "none")
	}
	if c.opts.Audit {
		audit, err := c.auditArgs()
		if err != nil {
			return err
		}
		c.apiArgs = append(c.apiArgs, audit...)
	}
	c.apiArgs = append(c.apiArgs, c.opts.ExtraAPIServerArgs...)

	c.adminKC = filepath.Join(c.dir, "kubeconfigs", "admin.kubeconfig")
	return writeKubeconfig(c.adminKC, c.url, c.caPEM, "admin", c.adminToken)
}

// output returns where a child's output goes: the caller's Log, or a log
// file in Dir opened for appending (so a restarted apiserver keeps its
// earlier log).
func (c *Cluster) output(name string) (io.Writer, *os.File, error) {
	if c.opts.Log != nil {
		return lockedWriter{mu: &c.logMu, w: c.opts.Log}, nil, nil
	}
	f, err := os.OpenFile(filepath.Join(c.dir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, nil, err
	}
	return f, f, nil
}

func (c *Cluster) spawn(name string, args []string) (*process, error) {
	return c.spawnPath(name, filepath.Join(c.binDir, name), args, nil)
}

// spawnEnv is spawn with env added to the environment.
func (c *Cluster) spawnEnv(name string, args, env []string) (*process, error) {
	return c.spawnPath(name, filepath.Join(c.binDir, name), args, env)
}

// spawnPath starts the program at path, logging as name.
func (c *Cluster) spawnPath(name, path string, args, env []string) (*process, error) {
	out, f, err := c.output(name)
	if err != nil {
		return nil, err
	}
	p, err := startProcess(c.log, name, path, args, env, out, f)
	if err != nil && f != nil {
		f.Close()
	}
	return p, err
}

func (c *Cluster) startEtcd(ctx context.Context) error {
	p, err := c.spawn(EtcdBinary, c.etcdArgs)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.etcd = p
	c.mu.Unlock()
	hc := &http.Client{Timeout: 2 * time.Second}
	return c.poll(ctx, p, time.Minute, func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.etcdURL+"/health", nil)
		if err != nil {
			return err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK || !bytes.Contains(body, []byte(`"health":"true"`)) {
			return fmt.Errorf("etcd /health: %s: %s", resp.Status, bytes.TrimSpace(body))
		}
		return nil
	})
}

func (c *Cluster) startAPIServer(ctx context.Context) error {
	p, err := c.spawn(APIServerBinary, c.apiArgs)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.apiserver = p
	c.mu.Unlock()
	cs, err := kubernetes.NewForConfig(c.shortTimeoutConfig())
	if err != nil {
		return err
	}
	start := time.Now()
	err = c.poll(ctx, p, 2*time.Minute, func(ctx context.Context) error {
		body, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err != nil {
			return fmt.Errorf("/readyz: %w: %s", err, bytes.TrimSpace(body))
		}
		return nil
	})
	if err == nil {
		c.log.Info("kube-apiserver ready", "url", c.url, "took", time.Since(start).Round(time.Millisecond))
	}
	return err
}

// shortTimeoutConfig is the admin config with a per-request timeout, for
// polling.
func (c *Cluster) shortTimeoutConfig() *rest.Config {
	cfg := c.AdminConfig()
	cfg.Timeout = 5 * time.Second
	return cfg
}

// poll calls check until it succeeds, p exits, ctx ends or timeout passes.
func (c *Cluster) poll(ctx context.Context, p *process, timeout time.Duration, check func(context.Context) error) error {
	name := "cluster"
	if p != nil {
		name = p.name
	}
	var last error
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		if p != nil {
			if done, werr := p.exited(); done {
				return false, fmt.Errorf("cluster: %s exited during start-up (%v); %s", p.name, werr, c.logHint(p.name))
			}
		}
		last = check(ctx)
		return last == nil, nil
	})
	if wait.Interrupted(err) {
		return fmt.Errorf("cluster: waiting for %s: %w (last error: %v); %s", name, err, last, c.logHint(name))
	}
	return err
}

// logHint points at a child's log, with its last lines when it is a file.
func (c *Cluster) logHint(name string) string {
	if c.opts.Log != nil {
		return "see the configured Log writer"
	}
	path := filepath.Join(c.dir, name+".log")
	b, err := os.ReadFile(path)
	if err != nil {
		return "log " + path
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 15 {
		lines = lines[len(lines)-15:]
	}
	return fmt.Sprintf("last lines of %s:\n%s", path, strings.Join(lines, "\n"))
}

// AdminConfig returns a fresh copy of a system:masters client config with
// client-side throttling off.
func (c *Cluster) AdminConfig() *rest.Config {
	return &rest.Config{
		Host:            c.url,
		BearerToken:     c.adminToken,
		TLSClientConfig: rest.TLSClientConfig{CAData: append([]byte(nil), c.caPEM...)},
		QPS:             -1, // negative: no client-side rate limiter
		Burst:           1000,
		UserAgent:       "uuid-test-cluster",
	}
}

// AdminKubeconfig is the path of a kubeconfig file for the admin user.
func (c *Cluster) AdminKubeconfig() string { return c.adminKC }

// URL is the apiserver's https://127.0.0.1:port.
func (c *Cluster) URL() string { return c.url }

// Dir is the cluster's work dir.
func (c *Cluster) Dir() string { return c.dir }

// BinDir is the directory the binaries came from.
func (c *Cluster) BinDir() string { return c.binDir }

// RestartAPIServer stops kube-apiserver (SIGTERM, up to 20 s, then SIGKILL)
// and starts it again with the same flags, port and etcd, waiting for
// /readyz. Data in etcd survives.
func (c *Cluster) RestartAPIServer(ctx context.Context) error {
	if err := c.stopOne(&c.apiserver, "RestartAPIServer"); err != nil {
		return err
	}
	c.log.Info("restarting kube-apiserver")
	return c.startAPIServer(ctx)
}

// stopOne takes the process in slot (c.etcd or c.apiserver) out of the
// cluster and stops it (SIGTERM, up to 20 s, then SIGKILL); op names the
// caller in the error when the cluster is already stopped.
func (c *Cluster) stopOne(slot **process, op string) error {
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return fmt.Errorf("cluster: %s after Stop", op)
	}
	old := *slot
	*slot = nil
	c.mu.Unlock()
	if old == nil {
		return nil
	}
	return old.stop()
}

// StopEtcd stops etcd (SIGTERM, up to 20 s, then SIGKILL) and leaves the
// apiserver running without its storage, as in an etcd outage; StartEtcd
// brings it back on the same port and data dir.
func (c *Cluster) StopEtcd() error {
	c.log.Info("stopping etcd")
	return c.stopOne(&c.etcd, "StopEtcd")
}

// StartEtcd starts etcd again after StopEtcd and waits for its /health.
func (c *Cluster) StartEtcd(ctx context.Context) error {
	c.mu.Lock()
	running, stopped := c.etcd != nil, c.stopped
	c.mu.Unlock()
	if stopped || running {
		return errors.New("cluster: StartEtcd while etcd runs or after Stop")
	}
	c.log.Info("starting etcd")
	return c.startEtcd(ctx)
}

// Metrics returns the apiserver's /metrics as the admin, in Prometheus
// text format.
func (c *Cluster) Metrics(ctx context.Context) (string, error) {
	cs, err := kubernetes.NewForConfig(c.AdminConfig())
	if err != nil {
		return "", err
	}
	b, err := cs.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return "", fmt.Errorf("cluster: GET /metrics: %w", err)
	}
	return string(b), nil
}

// PIDs returns the pids of the running etcd and kube-apiserver (0 when not
// running).
func (c *Cluster) PIDs() (etcd, apiserver int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.etcd != nil {
		etcd = c.etcd.pid()
	}
	if c.apiserver != nil {
		apiserver = c.apiserver.pid()
	}
	return etcd, apiserver
}

// Stop stops kube-apiserver, then etcd (each SIGTERM to its process group,
// up to 20 s, then SIGKILL), copies logs to $ARTIFACTS if set, and removes
// Dir if Start created it. It is safe to call more than once.
func (c *Cluster) Stop() error {
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return nil
	}
	c.stopped = true
	api, etcd := c.apiserver, c.etcd
	c.mu.Unlock()

	var errs []error
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if c.node != nil {
		errs = append(errs, c.stopNodeWorkloads(ctx, api != nil && etcd != nil))
	}
	if api != nil {
		errs = append(errs, api.stop())
	}
	if etcd != nil {
		errs = append(errs, etcd.stop())
	}
	if c.node != nil {
		errs = append(errs, c.removeNodeLeftovers(), c.finishNode(ctx))
	}
	if dst := os.Getenv("ARTIFACTS"); dst != "" && c.opts.Log == nil && c.dir != "" {
		errs = append(errs, c.copyLogs(dst))
	}
	if c.tempDir {
		// Never remove through a mount that is still there.
		if err := unmountUnder(c.dir); err != nil {
			errs = append(errs, fmt.Errorf("cluster: %s kept: %w", c.dir, err))
		} else {
			errs = append(errs, os.RemoveAll(c.dir))
		}
	}
	c.log.Info("cluster stopped", "dir", c.dir, "removed", c.tempDir)
	return errors.Join(errs...)
}

func (c *Cluster) copyLogs(dst string) error {
	dst = filepath.Join(dst, "cluster-"+filepath.Base(c.dir))
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	for _, name := range []string{EtcdBinary, APIServerBinary, ControllerManagerBinary, SchedulerBinary, ContainerdBinary, KubeletBinary, ProxyBinary} {
		b, err := os.ReadFile(filepath.Join(c.dir, name+".log"))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dst, name+".log"), b, 0o644); err != nil {
			return err
		}
	}
	c.log.Info("copied logs", "to", dst)
	return nil
}
