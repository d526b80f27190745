//go:build node

package cluster

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
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
