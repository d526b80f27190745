package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
)

// A node (Options.Node) is the control plane plus kube-controller-manager,
// kube-scheduler, containerd, a kubelet and kube-proxy on this machine, so
// that Deployments run as real Pods. It needs root. It changes the machine
// only in ways Stop undoes and then checks: a bridge with the node's
// address, routes, iptables rules, ip_forward, mounts under the node's
// dir, cgroups. The kubelet runs in a mount namespace of its own, where the
// kernel settings it insists on are files bind-mounted over /proc/sys, so
// the machine's stay as they are.

// nodeState is what Start did for a node, for Stop to undo.
type nodeState struct {
	// base is the machine before the node, which Stop restores and checks.
	base *hostState
	// procs are the node's processes by binary name, in start order.
	procs map[string]*process
	order []string
	// mounts are the mounts Start made itself.
	mounts         []string
	kubeletHealthz string
	// registry is the node's image registry, HOST:PORT.
	registry string
}

// stopOrder is the order Stop stops the node's processes in: no new pods
// first, then the agents, then the runtime.
var stopOrder = []string{ControllerManagerBinary, SchedulerBinary, ProxyBinary, KubeletBinary, ContainerdBinary, RegistryBinary}

// checkNodeHost refuses to start a node without root or without the
// binaries and packages it needs.
func checkNodeHost(binDir string, opts Options) error {
	if os.Geteuid() != 0 {
		return errors.New("cluster: a node needs root (bridges, iptables, mounts, cgroups)")
	}
	for _, b := range []string{ControllerManagerBinary, SchedulerBinary, KubeletBinary, ProxyBinary, ContainerdBinary, ShimBinary, CtrBinary, RegistryBinary} {
		if err := checkBinary(filepath.Join(binDir, b)); err != nil {
			return fmt.Errorf("%w (the node's binaries come from `make node-tools`)", err)
		}
	}
	for _, p := range []string{runcPath, filepath.Join(cniBinDir, "bridge"), filepath.Join(cniBinDir, "host-local"), filepath.Join(cniBinDir, "loopback")} {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("cluster: %s missing (run `make node-deps`): %w", p, err)
		}
	}
	for _, tool := range []string{"ip", "iptables", "ip6tables", "iptables-save", "ip6tables-save", "unshare", "findmnt", "mount"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("cluster: %s not on PATH (run `make node-deps`): %w", tool, err)
		}
	}
	if opts.PauseImage == "" {
		return errors.New("cluster: a node needs Options.PauseImage, the pod sandbox image archive (`make image` writes bin/pause.tar)")
	}
	for _, img := range append([]string{opts.PauseImage}, opts.NodeImages...) {
		if _, err := os.Stat(img); err != nil {
			return fmt.Errorf("cluster: image archive: %w (run `make image`)", err)
		}
	}
	return nil
}

// beginNode records the machine's state and sets up the network. Start
// calls it before the apiserver, which listens on the bridge.
func (c *Cluster) beginNode(ctx context.Context) error {
	// One node at a time: names and addresses are fixed. Checked before
	// anything is recorded, so the failed Start's Stop leaves the other
	// node alone.
	if _, err := os.Stat(filepath.Join("/sys/class/net", NodeBridge)); err == nil {
		return fmt.Errorf("cluster: network interface %s already exists: another node is running, or one was killed (`go run ./hack/cluster -node-cleanup` removes what it left)", NodeBridge)
	}
	first, err := takeHostState(ctx, nil)
	if err != nil {
		return err
	}
	time.Sleep(200 * time.Millisecond)
	// A second reading marks the settings that change on their own.
	base, err := takeHostState(ctx, first)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.node = &nodeState{base: base, procs: map[string]*process{}}
	c.mu.Unlock()
	return setUpNetwork(ctx)
}

// startNode starts the node's parts once the apiserver is up, and waits
// until the node is Ready and the kubernetes Service's ClusterIP works.
func (c *Cluster) startNode(ctx context.Context) error {
	start := time.Now()
	if err := c.startControllerManager(ctx); err != nil {
		return err
	}
	if err := c.startScheduler(); err != nil {
		return err
	}
	pause, err := imageTag(c.opts.PauseImage)
	if err != nil {
		return err
	}
	if err := c.startRegistry(ctx); err != nil {
		return err
	}
	if err := c.startContainerd(ctx, pause); err != nil {
		return err
	}
	for _, img := range append([]string{c.opts.PauseImage}, c.opts.NodeImages...) {
		if err := c.ImportImage(ctx, img); err != nil {
			return err
		}
	}
	if err := c.startKubelet(ctx); err != nil {
		return err
	}
	if err := c.startProxy(ctx); err != nil {
		return err
	}
	c.log.Info("node ready", "node", NodeName, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

func (c *Cluster) setNodeProcess(name string, p *process) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.node.procs[name] = p
	c.node.order = append(c.node.order, name)
}

func (c *Cluster) setNodeMount(path string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.node.mounts = append(c.node.mounts, path)
}

// stopNodeWorkloads stops the pods and the node's processes: the
// controllers and the scheduler first, so nothing replaces the pods; then
// every pod is deleted through the API, so the kubelet stops them and the
// CNI plugin releases their network; then kube-proxy, the kubelet and
// containerd. apiUp says whether the API can be used.
func (c *Cluster) stopNodeWorkloads(ctx context.Context, apiUp bool) error {
	var errs []error
	stop := func(name string) {
		c.mu.Lock()
		p := c.node.procs[name]
		delete(c.node.procs, name)
		c.mu.Unlock()
		if p != nil {
			errs = append(errs, p.stop())
		}
	}
	stop(ControllerManagerBinary)
	stop(SchedulerBinary)
	if apiUp && c.node.procs[KubeletBinary] != nil && c.node.procs[ContainerdBinary] != nil {
		if err := c.deleteAllPods(ctx); err != nil {
			c.log.Warn("pods not stopped through the API; removing them by force", "err", err)
		}
	}
	for _, name := range stopOrder {
		stop(name)
	}
	return errors.Join(errs...)
}

// deleteAllPods deletes every pod at once and waits (up to a minute) until
// containerd runs no container and the bridge has no pod on it.
func (c *Cluster) deleteAllPods(ctx context.Context) error {
	cs, err := kubernetes.NewForConfig(c.shortTimeoutConfig())
	if err != nil {
		return err
	}
	nss, err := cs.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	zero := int64(0)
	for _, ns := range nss.Items {
		if err := cs.CoreV1().Pods(ns.Name).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{}); err != nil {
			return fmt.Errorf("deleting pods in %s: %w", ns.Name, err)
		}
	}
	return c.poll(ctx, nil, time.Minute, func(ctx context.Context) error {
		n, err := c.runningTasks(ctx)
		if err != nil {
			return err
		}
		ports, _ := os.ReadDir(filepath.Join("/sys/class/net", NodeBridge, "brif"))
		if n > 0 || len(ports) > 0 {
			return fmt.Errorf("%d containers running, %d pods on the bridge", n, len(ports))
		}
		return nil
	})
}

// removeNodeLeftovers kills what the node's processes left running (the
// shims, which containerd starts in groups of their own, and any process in
// a cgroup the node created), removes those cgroups, and unmounts
// everything under the node's dir. Stop calls it after etcd and the
// apiserver are stopped: their command lines name the dir too.
func (c *Cluster) removeNodeLeftovers() error {
	errs := []error{killUntilGone(c.nodePIDs, func([]int) {})}
	errs = append(errs, removeCgroupTrees(c.newCgroups()))
	errs = append(errs, unmountUnder(c.dir))
	return errors.Join(errs...)
}

// nodePIDs are the processes the node left: any whose command line names
// the node's dir (the shims), and any in a cgroup the node created (pods).
func (c *Cluster) nodePIDs() []int {
	return appendCgroupPIDs(pidsWithArg(c.dir+"/"), c.newCgroups())
}

// pidsWithArg lists the processes (but this one) whose command line
// contains s.
func pidsWithArg(s string) []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	self := os.Getpid()
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(cmdline), s) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// appendCgroupPIDs adds the processes in the cgroup trees to pids.
func appendCgroupPIDs(pids []int, trees []string) []int {
	for _, cg := range trees {
		_ = filepath.WalkDir(cg, func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
				return nil
			}
			b, _ := os.ReadFile(path)
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil && !slices.Contains(pids, pid) {
					pids = append(pids, pid)
				}
			}
			return nil
		})
	}
	return pids
}

// killUntilGone SIGKILLs what pids lists, every 200 ms, until it lists
// nothing; after 15 s it gives up and names what is still running. It tells
// onKill before each round.
func killUntilGone(pids func() []int, onKill func([]int)) error {
	var left []int
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 15*time.Second, true, func(context.Context) (bool, error) {
		if left = pids(); len(left) == 0 {
			return true, nil
		}
		onKill(left)
		killAll(left)
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("cluster: processes still running after SIGKILL: %v", left)
	}
	return nil
}

func killAll(pids []int) {
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// newCgroups are the top-level cgroups that were not there before the node
// (kubepods).
func (c *Cluster) newCgroups() []string {
	now, err := topCgroups()
	if err != nil {
		return nil
	}
	var out []string
	for _, cg := range now {
		if !slices.Contains(c.node.base.cgroups, cg) {
			out = append(out, cg)
		}
	}
	return out
}

// removeCgroupTrees removes cgroup trees, deepest first (a cgroup dir goes
// with rmdir once it has no children and no processes).
func removeCgroupTrees(trees []string) error {
	var errs []error
	for _, cg := range trees {
		var dirs []string
		_ = filepath.WalkDir(cg, func(path string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, path)
			}
			return nil
		})
		for _, d := range slices.Backward(dirs) {
			if err := syscall.Rmdir(d); err != nil && !errors.Is(err, syscall.ENOENT) {
				errs = append(errs, fmt.Errorf("cluster: removing cgroup %s: %w", d, err))
			}
		}
	}
	return errors.Join(errs...)
}

// unmountUnder unmounts every mount at or below dir, deepest first.
func unmountUnder(dir string) error {
	ms, err := mountPoints()
	if err != nil {
		return err
	}
	var under []string
	for _, m := range ms {
		mp, _, _ := strings.Cut(m, " ")
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			under = append(under, mp)
		}
	}
	// Longest first: children before parents. A mount point mounted twice
	// appears twice and is unmounted twice.
	slices.SortStableFunc(under, func(a, b string) int { return len(b) - len(a) })
	var errs []error
	for _, mp := range under {
		if err := syscall.Unmount(mp, 0); err != nil {
			if err2 := syscall.Unmount(mp, syscall.MNT_DETACH); err2 != nil && !errors.Is(err2, syscall.EINVAL) {
				errs = append(errs, fmt.Errorf("cluster: unmount %s: %w", mp, err2))
			}
		}
	}
	return errors.Join(errs...)
}

// finishNode tears the network down and checks the machine against the
// baseline: any difference is an error. A kernel setting found changed is
// also set back.
func (c *Cluster) finishNode(ctx context.Context) error {
	base := c.node.base
	errs := []error{tearDownNetwork(ctx, base)}
	if pids := c.nodePIDs(); len(pids) > 0 {
		errs = append(errs, fmt.Errorf("cluster: node processes left running: %v", pids))
	}
	after, err := takeHostState(ctx, nil)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	problems := base.diff(after)
	for k, v := range base.sysctls {
		if !base.volatile[k] && !isVolatileSysctl(k) && after.sysctls[k] != v && after.sysctls[k] != "" {
			if err := restoreSysctl(base, k); err != nil {
				problems = append(problems, err.Error())
			} else {
				problems = append(problems, fmt.Sprintf("(sysctl %s set back to %q)", k, v))
			}
		}
	}
	if len(problems) > 0 {
		errs = append(errs, fmt.Errorf("cluster: the machine is not as the node found it:\n  %s", strings.Join(problems, "\n  ")))
	} else {
		c.log.Info("node torn down; links, routes, iptables, mounts, cgroups, sysctls and state dirs as before")
	}
	return errors.Join(errs...)
}

// PodLogs reads a container's log from the kubelet's pod log dir (the
// apiserver has no kubelet client certificate, so `kubectl logs` cannot
// fetch it). All of the container's restarts are included, oldest first.
func (c *Cluster) PodLogs(namespace, pod, podUID, container string) (string, error) {
	if c.node == nil {
		return "", errors.New("cluster: PodLogs needs a node (Options.Node)")
	}
	dir := filepath.Join(c.kubeletDir(), "logs", namespace+"_"+pod+"_"+podUID, container)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", fmt.Errorf("cluster: pod log: %w", err)
	}
	var b strings.Builder
	for _, e := range entries { // 0.log, 1.log, ...: ReadDir sorts them
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return "", fmt.Errorf("cluster: pod log: %w", err)
		}
		b.Write(data)
	}
	return b.String(), nil
}
