package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// KubeletBinary is the node agent, run in a mount namespace of its own.
const KubeletBinary = "kubelet"

// NodeName is the node's name in the API.
const NodeName = "uuid-node"

// kubeletConfig is the KubeletConfiguration: cgroupfs on the machines'
// cgroup v1 hybrid layout (failCgroupV1: false, or 1.35+ refuses it), no
// cluster DNS (no image to run it), no image GC, eviction only when the
// machine is nearly full, the kubelet's own ports on loopback.
const kubeletConfig = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://{{SOCK}}
imageServiceEndpoint: unix://{{SOCK}}
address: 127.0.0.1
port: {{PORT}}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {{HEALTHZ}}
podLogsDir: {{D}}/logs
staticPodPath: ""
authentication: {anonymous: {enabled: false}, webhook: {enabled: true}, x509: {}}
authorization: {mode: Webhook}
registerNode: true
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", nodefs.inodesFree: "1%", imagefs.available: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
resolvConf: ""
clusterDomain: cluster.local
clusterDNS: []
protectKernelDefaults: false
makeIPTablesUtilChains: false
`

// kubeletSysctls are the machine-wide settings the kubelet sets at start
// (pkg/kubelet/cm setupKernelTunables), with the values it wants. In its
// mount namespace files holding these values are bind-mounted over them,
// so it reads what it wants and the machine keeps its own.
var kubeletSysctls = map[string]string{
	"vm/overcommit_memory":      "1",
	"vm/panic_on_oom":           "0",
	"kernel/panic":              "10",
	"kernel/panic_on_oops":      "1",
	"kernel/keys/root_maxkeys":  "1000000",
	"kernel/keys/root_maxbytes": "25000000",
}

// kubeletNamespaceScript runs in the kubelet's new mount namespace (unshare
// -m, propagation unchanged so the shared root dir stays shared with the
// machine's namespace) and execs the kubelet. Mounts made here stay here:
// their parent mounts are made slaves first, in case the machine's are
// shared. /var/lib and /var/log get a tmpfs because the kubelet writes to
// /var/lib/kubelet/device-plugins and /var/log/containers whatever its
// flags say. mount -n: libmount would otherwise create /run/mount on the
// machine.
func kubeletNamespaceScript(sysctlDir string) string {
	var b strings.Builder
	b.WriteString("set -eu\n")
	for _, t := range []string{"/", "/proc", "/var/lib", "/var/log"} {
		fmt.Fprintf(&b, "mount -n --make-slave \"$(findmnt -n -o TARGET -T %s)\"\n", t)
	}
	for key := range kubeletSysctls {
		fmt.Fprintf(&b, "mount -n --bind %s /proc/sys/%s\n", filepath.Join(sysctlDir, strings.ReplaceAll(key, "/", ".")), key)
	}
	b.WriteString("mount -n -t tmpfs -o mode=0755,size=64m uuid-node-var-lib /var/lib\n")
	b.WriteString("mount -n -t tmpfs -o mode=0755,size=64m uuid-node-var-log /var/log\n")
	b.WriteString("exec \"$@\"\n")
	return b.String()
}

func (c *Cluster) kubeletDir() string { return filepath.Join(c.dir, "kubelet") }

func (c *Cluster) startKubelet(ctx context.Context) error {
	d := c.kubeletDir()
	root := filepath.Join(d, "root")
	sysctlDir := filepath.Join(d, "sysctl")
	for _, sub := range []string{root, sysctlDir, filepath.Join(d, "pki"), filepath.Join(d, "logs")} {
		if err := os.MkdirAll(sub, 0o700); err != nil {
			return err
		}
	}
	for key, v := range kubeletSysctls {
		if err := os.WriteFile(filepath.Join(sysctlDir, strings.ReplaceAll(key, "/", ".")), []byte(v+"\n"), 0o644); err != nil {
			return err
		}
	}
	// The kubelet mounts pods' volumes under its root dir in its own
	// namespace; containerd, in the machine's, must see them: a shared
	// bind mount carries them across.
	if err := syscall.Mount(root, root, "", syscall.MS_BIND, ""); err != nil {
		return fmt.Errorf("cluster: bind-mounting the kubelet root dir: %w", err)
	}
	c.setNodeMount(root)
	if err := syscall.Mount("", root, "", syscall.MS_SHARED, ""); err != nil {
		return fmt.Errorf("cluster: making the kubelet root dir shared: %w", err)
	}
	ports, err := freePorts(2)
	if err != nil {
		return err
	}
	c.node.kubeletHealthz = "http://127.0.0.1:" + strconv.Itoa(ports[1]) + "/healthz"
	cfg := filepath.Join(d, "config.yaml")
	r := strings.NewReplacer("{{SOCK}}", c.ContainerdSocket(), "{{D}}", d, "{{PORT}}", strconv.Itoa(ports[0]), "{{HEALTHZ}}", strconv.Itoa(ports[1]))
	if err := os.WriteFile(cfg, []byte(r.Replace(kubeletConfig)), 0o600); err != nil {
		return err
	}
	script := filepath.Join(d, "namespace.sh")
	if err := os.WriteFile(script, []byte(kubeletNamespaceScript(sysctlDir)), 0o700); err != nil {
		return err
	}
	args := []string{"--mount", "--propagation", "unchanged", "--", "/bin/sh", script,
		filepath.Join(c.binDir, KubeletBinary),
		"--config", cfg, "--kubeconfig", c.adminKC, "--root-dir", root, "--cert-dir", filepath.Join(d, "pki"),
		"--hostname-override", NodeName, "--node-ip", NodeIP,
	}
	// The kubelet mounts volumes with mount(8), whose libmount records
	// them in /run/mount/utab: kept in the node's dir instead.
	env := []string{"LIBMOUNT_UTAB=" + filepath.Join(d, "utab")}
	p, err := c.spawnPath(KubeletBinary, "unshare", args, env)
	if err != nil {
		return err
	}
	c.setNodeProcess(KubeletBinary, p)
	return c.waitNodeReady(ctx, p)
}

// waitNodeReady waits until the node is registered and Ready (the runtime
// and its CNI network are up) and kube-controller-manager has lifted the
// not-ready taint.
func (c *Cluster) waitNodeReady(ctx context.Context, p *process) error {
	cs, err := kubernetes.NewForConfig(c.shortTimeoutConfig())
	if err != nil {
		return err
	}
	start := time.Now()
	err = c.poll(ctx, p, 3*time.Minute, func(ctx context.Context) error {
		n, err := cs.CoreV1().Nodes().Get(ctx, NodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		ready := false
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				if cond.Status != corev1.ConditionTrue {
					return fmt.Errorf("node %s not Ready: %s", NodeName, cond.Message)
				}
				ready = true
			}
		}
		if !ready {
			return fmt.Errorf("node %s has no Ready condition yet", NodeName)
		}
		for _, t := range n.Spec.Taints {
			if t.Key == corev1.TaintNodeNotReady {
				return fmt.Errorf("node %s still tainted %s", NodeName, t.Key)
			}
		}
		return nil
	})
	if err == nil {
		c.log.Info("node ready", "node", NodeName, "took", time.Since(start).Round(time.Millisecond))
	}
	return err
}
