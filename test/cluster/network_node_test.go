//go:build node

package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// TestNodeNetworkTornDown: the node's network goes up in the order the
// safety rules need (bridge with the node's address, the Service CIDR
// unreachable, the forwarding guard first in mangle FORWARD), a connect to
// a ClusterIP fails on the machine, and teardown leaves links, routes,
// iptables and sysctls exactly as they were, ip_forward included after it
// is turned on as the CNI bridge's isGateway does. Needs root.
func TestNodeNetworkTornDown(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	first, err := takeHostState(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	base, err := takeHostState(ctx, first)
	if err != nil {
		t.Fatal(err)
	}
	if err := setUpNetwork(ctx); err != nil {
		_ = tearDownNetwork(ctx, base)
		t.Fatal(err)
	}
	torn := false
	defer func() {
		if !torn {
			_ = tearDownNetwork(ctx, base)
		}
	}()

	if _, err := os.Stat(filepath.Join("/sys/class/net", NodeBridge)); err != nil {
		t.Errorf("bridge: %v", err)
	}
	if out, err := run(ctx, "ip", "route", "get", KubernetesServiceIP); err == nil || !strings.Contains(err.Error(), "No route to host") {
		t.Errorf("ip route get %s = %q, %v; want No route to host (unreachable)", KubernetesServiceIP, out, err)
	}
	for _, ipt := range iptablesTools {
		rules, err := cmdLines(ctx, ipt, "-w", "-t", "mangle", "-S", "FORWARD")
		if err != nil {
			t.Fatal(err)
		}
		if len(rules) < 2 || rules[1] != "-A FORWARD -j "+guardChain {
			t.Errorf("%s mangle FORWARD = %q, want the guard first", ipt, rules)
		}
	}
	// As the CNI bridge plugin's isGateway does.
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	torn = true
	if err := tearDownNetwork(ctx, base); err != nil {
		t.Fatal(err)
	}
	after, err := takeHostState(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if d := base.diff(after); len(d) > 0 {
		t.Errorf("machine changed:\n%s", strings.Join(d, "\n"))
	}
}

// TestNodeKilledCleanUp: a node whose test process died without Stop (its
// processes SIGKILLed, as Pdeathsig does, with a pod running) leaves
// shims, containers, cgroups, mounts, the bridge, routes and rules;
// CleanUpNodes removes all of it, and with ip_forward set back (which it
// cannot know) the machine is as before. Needs root, `make node-tools
// pause-image`.
func TestNodeKilledCleanUp(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	c, err := Start(ctx, Options{Node: true, PauseImage: filepath.Join(root, "bin", "pause.tar")})
	if err != nil {
		t.Fatal(err)
	}
	base := c.node.base
	cleaned := false
	defer func() {
		if !cleaned {
			_ = c.Stop()
		}
	}()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "pause", Namespace: metav1.NamespaceDefault},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "pause", Image: "registry.local/pause:3.10", ImagePullPolicy: corev1.PullNever,
		}}},
	}
	cs, err := kubernetes.NewForConfig(c.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.poll(ctx, nil, 2*time.Minute, func(ctx context.Context) error {
		p, err := cs.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Status.Phase != corev1.PodRunning {
			return fmt.Errorf("pod %s", p.Status.Phase)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	// The test process "dies": every process of the node gets SIGKILL.
	c.mu.Lock()
	c.stopped = true
	procs := []*process{c.etcd, c.apiserver}
	for _, p := range c.node.procs {
		procs = append(procs, p)
	}
	c.mu.Unlock()
	for _, p := range procs {
		_ = syscall.Kill(p.pid(), syscall.SIGKILL)
		<-p.done
	}
	if pids := c.nodePIDs(); len(pids) == 0 {
		t.Fatal("nothing left running after the kill: the test proves nothing")
	}

	cleaned = true
	if err := CleanUpNodes(ctx, slog.Default()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(c.dir); !os.IsNotExist(err) {
		t.Errorf("node dir %s: %v, want it removed", c.dir, err)
	}
	if err := restoreSysctl(base, "net/ipv4/ip_forward"); err != nil {
		t.Fatal(err)
	}
	after, err := takeHostState(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	// CleanUpNodes leaves the nf_tables tables kube-proxy created: it
	// cannot tell them from the machine's own.
	var d []string
	for _, line := range base.diff(after) {
		if !strings.HasPrefix(line, "iptables-save rule added: ") && !strings.HasPrefix(line, "ip6tables-save rule added: ") && !strings.HasPrefix(line, "nft rule added: ") {
			d = append(d, line)
		}
	}
	if len(d) > 0 {
		t.Errorf("machine changed:\n%s", strings.Join(d, "\n"))
	}
	for _, ipt := range iptablesTools {
		if rules, _ := run(ctx, ipt+"-save"); strings.Contains(rules, "KUBE-") || strings.Contains(rules, guardChain) {
			t.Errorf("%s still has node rules:\n%s", ipt, rules)
		}
	}
	// The empty tables go the way Stop removes them.
	if err := restoreIptables(ctx, "iptables", base); err != nil {
		t.Error(err)
	}
	if err := restoreIptables(ctx, "ip6tables", base); err != nil {
		t.Error(err)
	}
}

// TestNodeRefusesSecondNode: with the node's bridge already there (another
// node, or a killed one), Start refuses with a message that says what to do,
// and its cleanup leaves that bridge alone.
func TestNodeRefusesSecondNode(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := run(ctx, "ip", "link", "add", NodeBridge, "type", "bridge"); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if _, err := run(ctx, "ip", "link", "delete", NodeBridge); err != nil {
			t.Error(err)
		}
	}()
	c, err := Start(ctx, Options{Node: true, PauseImage: filepath.Join(root, "bin", "pause.tar")})
	if err == nil {
		_ = c.Stop()
		t.Fatal("Start succeeded beside an existing node bridge")
	}
	if !strings.Contains(err.Error(), "already exists") || !strings.Contains(err.Error(), "-node-cleanup") {
		t.Errorf("Start: %v; want it to name the existing bridge and the cleanup", err)
	}
	if _, err := os.Stat(filepath.Join("/sys/class/net", NodeBridge)); err != nil {
		t.Errorf("the existing bridge was removed: %v", err)
	}
}
