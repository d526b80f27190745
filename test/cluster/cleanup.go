package cluster

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
)

// nodeDirPattern matches the dirs nodes keep their state in.
const nodeDirPattern = "/tmp/uuid-node-*"

// CleanUpNodes removes what nodes whose process was killed before Stop
// (SIGKILL, a `go test -timeout`) left on the machine: the shims and
// containers, which outlive containerd, their cgroups, the mounts under
// their dirs, the bridge and its pods' links, the Service CIDR's route, the
// KUBE-* and guard iptables rules and chains, libcni's cached results, and
// the dirs. Without the reading Start took, it removes only what is
// recognisably a node's, and it cannot know what ip_forward was: it says
// when it is on. Nothing it finds is an error; what it fails to remove is.
func CleanUpNodes(ctx context.Context, log *slog.Logger) error {
	dirs, err := filepath.Glob(nodeDirPattern)
	if err != nil {
		return err
	}
	var errs []error
	errs = append(errs, killUntilGone(leftoverPIDs, func(pids []int) { log.Info("killing node leftovers", "pids", pids) }))
	kubepods, err := kubepodsCgroups()
	if err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, removeCgroupTrees(kubepods))
	for _, d := range dirs {
		if err := unmountUnder(d); err != nil {
			errs = append(errs, err)
			continue
		}
		log.Info("removing node dir", "dir", d)
		errs = append(errs, os.RemoveAll(d))
	}
	errs = append(errs, removeBridge(ctx), removeServiceRoute(ctx))
	nodeRule := func(_, r string) bool { return !strings.Contains(r, "KUBE-") && !strings.Contains(r, guardChain) }
	nodeChain := func(_, ch string) bool { return !strings.HasPrefix(ch, "KUBE-") && ch != guardChain }
	for _, ipt := range iptablesTools {
		// Tables stay: whether they were there before is not known.
		errs = append(errs, deleteIptables(ctx, ipt, iptablesKeep{rule: nodeRule, chain: nodeChain, table: func(string) bool { return true }}))
	}
	errs = append(errs, removeCNIResults(true))
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward"); err == nil && strings.TrimSpace(string(b)) == "1" {
		log.Warn("net.ipv4.ip_forward is 1: a node's bridge turns it on; set it back (sysctl -w net.ipv4.ip_forward=0) if it was off before")
	}
	return errors.Join(errs...)
}

// leftoverPIDs are the processes whose command line names a node's dir (the
// shims) or that are in a kubepods cgroup (the pods).
func leftoverPIDs() []int {
	pids := pidsWithArg(filepath.Dir(nodeDirPattern) + "/uuid-node-")
	cgs, _ := kubepodsCgroups()
	return appendCgroupPIDs(pids, cgs)
}

// kubepodsCgroups are the kubelet's top-level cgroups, in every hierarchy.
func kubepodsCgroups() ([]string, error) {
	all, err := topCgroups()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, cg := range all {
		if strings.HasPrefix(filepath.Base(cg), "kubepods") {
			out = append(out, cg)
		}
	}
	return out, nil
}
