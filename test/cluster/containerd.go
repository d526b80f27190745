package cluster

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// Binaries the node needs besides the control plane's: in BinDir (from
// `make node-tools`), or from Debian's packages (`make node-deps`).
const (
	ContainerdBinary = "containerd"
	ShimBinary       = "containerd-shim-runc-v2"
	CtrBinary        = "ctr"
	runcPath         = "/usr/sbin/runc"
	cniBinDir        = "/usr/lib/cni"
	// criNamespace is the containerd namespace the CRI plugin keeps the
	// kubelet's images and containers in.
	criNamespace = "k8s.io"
)

// containerdConfig is containerd v2's configuration for the node: every
// path under the node's dir, the CRI plugin on runc (Debian's) and the
// node's CNI network. restrict_oom_score_adj: the sandbox cannot lower
// oom_score_adj without CAP_SYS_RESOURCE, which these VMs lack.
const containerdConfig = `version = 3
root = '{{D}}/root'
state = '{{D}}/state'
[grpc]
  address = '{{D}}/containerd.sock'
[ttrpc]
  address = '{{D}}/containerd.sock.ttrpc'
[debug]
  address = ''
[metrics]
  address = ''
[plugins]
  [plugins.'io.containerd.internal.v1.opt']
    path = '{{D}}/opt'
  [plugins.'io.containerd.shim.v1.manager']
    socket_dir = '{{D}}/s'
  [plugins.'io.containerd.nri.v1.nri']
    disable = true
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = '{{PAUSE}}'
    [plugins.'io.containerd.cri.v1.images'.registry]
      config_path = '{{D}}/certs.d'
  [plugins.'io.containerd.cri.v1.runtime']
    netns_mounts_under_state_dir = true
    enable_unprivileged_ports = true
    enable_unprivileged_icmp = true
    restrict_oom_score_adj = true
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = '{{RUNC}}'
          Root = '{{D}}/runc'
          SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ['{{CNIBIN}}']
      conf_dir = '{{D}}/net.d'
      max_conf_num = 1
  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = '127.0.0.1'
    stream_server_port = '0'
`

// cniConfig puts pods on the node's bridge. No ipMasq and no portmap:
// pod traffic is never translated to leave the machine. containerd adds
// the loopback interface itself.
const cniConfig = `{"cniVersion":"1.0.0","name":"{{NET}}","plugins":[{"type":"bridge","bridge":"{{BRIDGE}}","isGateway":true,"ipMasq":false,"hairpinMode":true,
 "ipam":{"type":"host-local","dataDir":"{{D}}/ipam","ranges":[[{"subnet":"{{CIDR}}","gateway":"{{GW}}"}]],"routes":[{"dst":"0.0.0.0/0"}]}}]}
`

// containerdDir is the runtime's own dir under the node's dir, with a short
// name: the shims' sockets (dir/s/<64 hex digits>) must stay under the
// 108-byte limit of a unix socket address.
func (c *Cluster) containerdDir() string { return filepath.Join(c.dir, "c") }

// ContainerdSocket is the absolute path of the node's containerd socket
// (ctr refuses a relative one).
func (c *Cluster) ContainerdSocket() string {
	return filepath.Join(c.containerdDir(), "containerd.sock")
}

func (c *Cluster) startContainerd(ctx context.Context, pauseTag string) error {
	d := c.containerdDir()
	for _, sub := range []string{"net.d", "ipam", "s"} {
		if err := os.MkdirAll(filepath.Join(d, sub), 0o700); err != nil {
			return err
		}
	}
	r := strings.NewReplacer("{{D}}", d, "{{PAUSE}}", pauseTag, "{{RUNC}}", runcPath, "{{CNIBIN}}", cniBinDir,
		"{{NET}}", cniNetwork, "{{BRIDGE}}", NodeBridge, "{{CIDR}}", PodCIDR, "{{GW}}", NodeIP)
	cfg := filepath.Join(d, "config.toml")
	if err := os.WriteFile(cfg, []byte(r.Replace(containerdConfig)), 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(d, "net.d", "10-"+cniNetwork+".conflist"), []byte(r.Replace(cniConfig)), 0o600); err != nil {
		return err
	}
	if err := c.writeRegistryHosts(filepath.Join(d, "certs.d")); err != nil {
		return err
	}
	// The shim is found on PATH: the one built with this containerd.
	p, err := c.spawnEnv(ContainerdBinary, []string{"--config", cfg, "--log-level", "warn"},
		[]string{"PATH=" + c.binDir + ":" + os.Getenv("PATH")})
	if err != nil {
		return err
	}
	c.setNodeProcess(ContainerdBinary, p)
	return c.poll(ctx, p, time.Minute, func(ctx context.Context) error {
		conn, err := (&net.Dialer{}).DialContext(ctx, "unix", c.ContainerdSocket())
		if err != nil {
			return err
		}
		conn.Close()
		_, err = c.ctr(ctx, "version")
		return err
	})
}

// ctr runs the node's ctr in the CRI namespace and returns its output.
func (c *Cluster) ctr(ctx context.Context, args ...string) (string, error) {
	full := append([]string{"-a", c.ContainerdSocket(), "-n", criNamespace}, args...)
	out, err := run(ctx, filepath.Join(c.binDir, CtrBinary), full...)
	if err != nil {
		return "", fmt.Errorf("cluster: %w", err)
	}
	return out, nil
}

// ImportImage loads an image archive (`make image` writes an OCI layout
// that is also a docker save archive) into the node's containerd, this
// machine's platform only, as `ctr -n k8s.io images import` does, so pods
// can use it without pulling.
func (c *Cluster) ImportImage(ctx context.Context, archive string) error {
	_, err := c.ctr(ctx, "images", "import", "--platform", "linux/"+runtime.GOARCH, archive)
	return err
}

// imageTag reads the first tag of an image archive's docker save
// manifest (manifest.json), which `make image` and `make pause-image` write.
func imageTag(archive string) (string, error) {
	f, err := os.Open(archive)
	if err != nil {
		return "", fmt.Errorf("cluster: image archive: %w", err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return "", fmt.Errorf("cluster: %s has no manifest.json (not a docker save / tarball image archive)", archive)
		}
		if err != nil {
			return "", fmt.Errorf("cluster: reading %s: %w", archive, err)
		}
		if h.Name != "manifest.json" {
			continue
		}
		var m []struct{ RepoTags []string }
		if err := json.NewDecoder(tr).Decode(&m); err != nil {
			return "", fmt.Errorf("cluster: %s manifest.json: %w", archive, err)
		}
		if len(m) == 0 || len(m[0].RepoTags) == 0 {
			return "", fmt.Errorf("cluster: %s has no tag", archive)
		}
		return m[0].RepoTags[0], nil
	}
}

// ContainerPID returns the host pid of a running container's main process,
// given the container ID from a pod's status ("containerd://ID" or ID).
func (c *Cluster) ContainerPID(ctx context.Context, containerID string) (int, error) {
	id := strings.TrimPrefix(containerID, "containerd://")
	out, err := c.ctr(ctx, "tasks", "ls")
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l) // TASK PID STATUS
		if len(f) == 3 && f[0] == id {
			if f[2] != "RUNNING" {
				return 0, fmt.Errorf("cluster: container %s is %s", id, f[2])
			}
			return strconv.Atoi(f[1])
		}
	}
	return 0, fmt.Errorf("cluster: no task for container %s", id)
}

// runningTasks counts the containers (sandboxes included) with a task in
// the node's containerd.
func (c *Cluster) runningTasks(ctx context.Context) (int, error) {
	out, err := c.ctr(ctx, "tasks", "ls", "-q")
	if err != nil {
		return 0, err
	}
	return len(strings.Fields(out)), nil
}
