package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
)

// The node's network. Everything here stays on the machine: the Pod CIDR is
// a bridge of the node's own, the Service CIDR is unreachable except
// through kube-proxy's DNAT to the bridge, and nothing is forwarded or
// masqueraded between the bridge and any other interface.
const (
	// NodeBridge is the bridge the CNI plugin puts pods on. The node
	// creates it before the apiserver starts, because the apiserver
	// listens on its address.
	NodeBridge = "uuid-node0"
	// PodCIDR is the bridge's subnet, which pods get their addresses from.
	PodCIDR = "10.88.0.0/24"
	// NodeIP is the bridge's own address: the node's address, where the
	// apiserver listens and which the kubernetes Service's endpoint is.
	// Pods cannot reach the host's 127.0.0.1.
	NodeIP = "10.88.0.1"
	// ServiceCIDR is the cluster's Service range. It is routed
	// "unreachable" so that a packet to a ClusterIP that kube-proxy has
	// not translated fails on the machine instead of leaving it.
	ServiceCIDR = "10.96.0.0/24"
	// KubernetesServiceIP is the kubernetes Service's ClusterIP (the
	// range's first address), which rest.InClusterConfig connects to.
	KubernetesServiceIP = "10.96.0.1"
	// guardChain drops traffic between the bridge and any other interface.
	// It is in the mangle table, which the FORWARD path passes before the
	// filter table: kube-proxy prepends its own jumps to filter's FORWARD,
	// and some of those ACCEPT.
	guardChain = "UUID-NODE-GUARD"
	// cniNetwork names the CNI network, and so the result files libcni
	// caches under /var/lib/cni/results.
	cniNetwork  = "uuid-node"
	cniCacheDir = "/var/lib/cni"
)

var iptablesTools = []string{"iptables", "ip6tables"}

// setUpNetwork creates the bridge with the node's address, the unreachable
// route for the Service CIDR and the forwarding guard, in that order,
// before anything that could send to a ClusterIP runs.
func setUpNetwork(ctx context.Context) error {
	steps := [][]string{
		{"ip", "link", "add", NodeBridge, "type", "bridge"},
		{"ip", "addr", "add", NodeIP + "/24", "dev", NodeBridge},
		{"ip", "link", "set", NodeBridge, "up"},
		{"ip", "route", "add", "unreachable", ServiceCIDR},
	}
	for _, ipt := range iptablesTools {
		steps = append(steps,
			[]string{ipt, "-w", "-t", "mangle", "-N", guardChain},
			[]string{ipt, "-w", "-t", "mangle", "-A", guardChain, "-i", NodeBridge, "!", "-o", NodeBridge, "-j", "DROP"},
			[]string{ipt, "-w", "-t", "mangle", "-A", guardChain, "!", "-i", NodeBridge, "-o", NodeBridge, "-j", "DROP"},
			[]string{ipt, "-w", "-t", "mangle", "-I", "FORWARD", "1", "-j", guardChain},
		)
	}
	for _, s := range steps {
		if _, err := run(ctx, s[0], s[1:]...); err != nil {
			return fmt.Errorf("cluster: node network: %w", err)
		}
	}
	return nil
}

// tearDownNetwork removes what setUpNetwork, the CNI plugins and kube-proxy
// added: links left on the bridge, the bridge (and with it the Pod CIDR's
// route), the unreachable route, every iptables rule and chain that is not
// in the baseline (the guard last), ip_forward as it was, and libcni's
// cached results for this network. It goes on after an error and returns
// them all.
func tearDownNetwork(ctx context.Context, base *hostState) error {
	errs := []error{removeBridge(ctx), removeServiceRoute(ctx)}
	// The bridge's isGateway turned forwarding on machine-wide.
	for _, key := range []string{"net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding"} {
		if err := restoreSysctl(base, key); err != nil {
			errs = append(errs, err)
		}
	}
	for _, ipt := range iptablesTools {
		if err := restoreIptables(ctx, ipt, base); err != nil {
			errs = append(errs, err)
		}
	}
	errs = append(errs, removeCNIResults(!slices.Contains(base.dirs["/var/lib"], "cni")))
	return errors.Join(errs...)
}

// removeBridge deletes the pods' links left on the bridge, then the bridge
// (and with it the Pod CIDR's route).
func removeBridge(ctx context.Context) error {
	var errs []error
	ports, _ := os.ReadDir(filepath.Join("/sys/class/net", NodeBridge, "brif"))
	for _, p := range ports {
		if _, err := run(ctx, "ip", "link", "delete", p.Name()); err != nil {
			errs = append(errs, err)
		}
	}
	if _, err := os.Stat(filepath.Join("/sys/class/net", NodeBridge)); err == nil {
		if _, err := run(ctx, "ip", "link", "delete", NodeBridge); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func removeServiceRoute(ctx context.Context) error {
	if out, _ := run(ctx, "ip", "route", "show", "type", "unreachable", ServiceCIDR); strings.TrimSpace(out) != "" {
		if _, err := run(ctx, "ip", "route", "delete", "unreachable", ServiceCIDR); err != nil {
			return err
		}
	}
	return nil
}

func restoreSysctl(base *hostState, key string) error {
	want, ok := base.sysctls[key]
	if !ok {
		return nil
	}
	path := filepath.Join("/proc/sys", key)
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	if strings.TrimSpace(string(b)) == want {
		return nil
	}
	if err := os.WriteFile(path, []byte(want+"\n"), 0o644); err != nil {
		return fmt.Errorf("cluster: restoring %s to %s: %w", key, want, err)
	}
	return nil
}

// restoreIptables deletes every rule and then every chain that the
// baseline's `ipt -S` of each table does not have: kube-proxy's and the
// kubelet's KUBE-* chains (kube-proxy --cleanup leaves KUBE-FIREWALL), and
// the guard; and, with the nf_tables backend (where using a table creates
// it), each table the baseline did not have once it holds nothing.
func restoreIptables(ctx context.Context, ipt string, base *hostState) error {
	// "table rule" for each rule and ":chain" line of the saved baseline.
	baseline := map[string]bool{}
	saved := ""
	for _, l := range base.rules[ipt+"-save"] {
		if t, ok := strings.CutPrefix(l, "*"); ok {
			saved = t
			baseline["*"+t] = true
			continue
		}
		baseline[saved+" "+l] = true
	}
	return deleteIptables(ctx, ipt, iptablesKeep{
		rule:  func(table, rule string) bool { return baseline[table+" "+rule] },
		chain: func(table, chain string) bool { return baseline[table+" :"+chain+" -"] },
		table: func(table string) bool { return baseline["*"+table] },
	})
}

// iptablesKeep says which rules, chains and tables deleteIptables leaves.
type iptablesKeep struct {
	rule  func(table, rule string) bool // rule as `ipt -S` prints it
	chain func(table, chain string) bool
	table func(table string) bool
}

func deleteIptables(ctx context.Context, ipt string, keep iptablesKeep) error {
	version, _ := run(ctx, ipt, "-V")
	family := map[string]string{"iptables": "ip", "ip6tables": "ip6"}[ipt]
	var errs []error
	for _, table := range []string{"raw", "mangle", "nat", "filter", "security"} {
		lines, err := cmdLines(ctx, ipt, "-w", "-t", table, "-S")
		if err != nil {
			continue // table not available
		}
		var chains []string
		for _, l := range slices.Backward(lines) {
			switch {
			case strings.HasPrefix(l, "-A ") && !keep.rule(table, l):
				args, err := splitRule(l)
				if err != nil {
					errs = append(errs, err)
					continue
				}
				args[0] = "-D"
				if _, err := run(ctx, ipt, append([]string{"-w", "-t", table}, args...)...); err != nil {
					errs = append(errs, err)
				}
			case strings.HasPrefix(l, "-N ") && !keep.chain(table, strings.TrimPrefix(l, "-N ")):
				chains = append(chains, strings.TrimPrefix(l, "-N "))
			}
		}
		for _, ch := range chains {
			if _, err := run(ctx, ipt, "-w", "-t", table, "-F", ch); err != nil {
				errs = append(errs, err)
			}
			if _, err := run(ctx, ipt, "-w", "-t", table, "-X", ch); err != nil {
				errs = append(errs, err)
			}
		}
		if !keep.table(table) && strings.Contains(version, "nf_tables") && nftTableExists(ctx, family, table) {
			if rest, err := cmdLines(ctx, ipt, "-w", "-t", table, "-S"); err == nil && onlyAcceptPolicies(rest) {
				if _, err := run(ctx, "nft", "delete", "table", family, table); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	return errors.Join(errs...)
}

func nftTableExists(ctx context.Context, family, table string) bool {
	tables, err := cmdLines(ctx, "nft", "list", "tables")
	return err == nil && slices.Contains(tables, "table "+family+" "+table)
}

func onlyAcceptPolicies(rules []string) bool {
	for _, r := range rules {
		if !strings.HasPrefix(r, "-P ") || !strings.HasSuffix(r, " ACCEPT") {
			return false
		}
	}
	return true
}

// splitRule splits an `iptables -S` line into arguments, honouring the
// double quotes iptables puts around comments.
func splitRule(line string) ([]string, error) {
	var args []string
	var cur strings.Builder
	inQuote, have := false, false
	for i := 0; i < len(line); i++ {
		ch := line[i]
		switch {
		case ch == '\\' && inQuote && i+1 < len(line):
			i++
			cur.WriteByte(line[i])
		case ch == '"':
			inQuote, have = !inQuote, true
		case ch == ' ' && !inQuote:
			if have {
				args = append(args, cur.String())
				cur.Reset()
				have = false
			}
		default:
			cur.WriteByte(ch)
			have = true
		}
	}
	if inQuote {
		return nil, fmt.Errorf("cluster: unbalanced quotes in iptables rule %q", line)
	}
	if have {
		args = append(args, cur.String())
	}
	return args, nil
}

// removeCNIResults deletes the results libcni cached for this network (it
// writes them to /var/lib/cni whatever the node's own dirs), and, with
// emptyDirs, the dirs that held them if nothing else is left there.
func removeCNIResults(emptyDirs bool) error {
	results := filepath.Join(cniCacheDir, "results")
	entries, err := os.ReadDir(results)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	// "<network>-<sandbox id>-<interface>": the node's network's, and the
	// loopback containerd sets up in the same sandboxes.
	var errs []error
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), cniNetwork+"-")
		if !ok {
			continue
		}
		errs = append(errs, os.Remove(filepath.Join(results, e.Name())))
		if id, _, ok := strings.Cut(rest, "-"); ok {
			lo := filepath.Join(results, "cni-loopback-"+id+"-lo")
			if err := os.Remove(lo); err != nil && !os.IsNotExist(err) {
				errs = append(errs, err)
			}
		}
	}
	if emptyDirs {
		for _, d := range []string{results, cniCacheDir} {
			if err := os.Remove(d); err != nil && !os.IsNotExist(err) && !errors.Is(err, syscall.ENOTEMPTY) {
				errs = append(errs, fmt.Errorf("cluster: %w", err))
			}
		}
	}
	return errors.Join(errs...)
}
