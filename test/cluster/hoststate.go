package cluster

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// hostState is what a node may change on the machine and must leave as it
// found it: kernel settings, links, routes, firewall rules, mounts, cgroups
// and a few well-known directories. Stop compares the state after teardown
// with the one taken before anything started.
type hostState struct {
	sysctls  map[string]string // /proc/sys path relative to /proc/sys -> value
	links    []string
	routes   []string
	rules    map[string][]string // tool (iptables, ip6tables, nft) -> rule lines, counters removed
	mounts   []string            // "mount point fstype"
	cgroups  []string            // top-level cgroup dirs, "controller/dir"
	dirs     map[string][]string // well-known dir -> its entries
	volatile map[string]bool     // sysctls that changed on their own while the baseline was taken
}

// volatileSysctls are counters and random values that change without
// anyone setting them.
var volatileSysctls = []string{
	"kernel/random/", "kernel/ns_last_pid", "kernel/pty/nr", "fs/dentry-state", "fs/file-nr",
	"fs/inode-nr", "fs/inode-state", "fs/quota/", "net/netfilter/nf_conntrack_count",
	"kernel/sched_domain/", "fs/binfmt_misc/", "kernel/tainted",
}

// watchedDirs are where a kubelet, containerd or the CNI plugins write
// state by default; the node keeps its own state under its work dir, so
// these must look the same afterwards.
var watchedDirs = []string{"/var/lib", "/var/log", "/run", "/etc", "/opt", "/var/lib/cni", "/etc/cni", "/opt/cni"}

// takeHostState reads the state. volatileFrom, when set, is an earlier
// reading: sysctls that differ from it are marked volatile and ignored.
func takeHostState(ctx context.Context, volatileFrom *hostState) (*hostState, error) {
	s := &hostState{rules: map[string][]string{}, dirs: map[string][]string{}, volatile: map[string]bool{}}
	var err error
	if s.sysctls, err = readSysctls(); err != nil {
		return nil, err
	}
	if volatileFrom != nil {
		maps.Copy(s.volatile, volatileFrom.volatile)
		for k, v := range volatileFrom.sysctls {
			if now, ok := s.sysctls[k]; ok && now != v {
				s.volatile[k] = true
			}
		}
	}
	if s.links, err = cmdLines(ctx, "ip", "-o", "link", "show"); err != nil {
		return nil, err
	}
	for i, l := range s.links { // "2: eth0: <...> ..." -> "eth0"
		if f := strings.Fields(l); len(f) > 1 {
			s.links[i] = strings.TrimSuffix(strings.SplitN(f[1], "@", 2)[0], ":")
		}
	}
	for _, fam := range []string{"-4", "-6"} {
		r, err := cmdLines(ctx, "ip", fam, "route", "show", "table", "all")
		if err != nil {
			return nil, err
		}
		s.routes = append(s.routes, r...)
	}
	for _, tool := range [][]string{{"iptables-save"}, {"ip6tables-save"}, {"nft", "list", "ruleset"}} {
		if _, err := exec.LookPath(tool[0]); err != nil {
			continue
		}
		lines, err := cmdLines(ctx, tool[0], tool[1:]...)
		if err != nil {
			return nil, err
		}
		s.rules[tool[0]] = normaliseRules(lines)
	}
	if s.mounts, err = mountPoints(); err != nil {
		return nil, err
	}
	if s.cgroups, err = topCgroups(); err != nil {
		return nil, err
	}
	for _, d := range watchedDirs {
		entries, err := os.ReadDir(d)
		if err != nil && !os.IsNotExist(err) {
			return nil, err
		}
		names := []string{}
		for _, e := range entries {
			names = append(names, e.Name())
		}
		s.dirs[d] = names
	}
	return s, nil
}

// readSysctls reads every readable file under /proc/sys.
func readSysctls() (map[string]string, error) {
	out := map[string]string{}
	err := filepath.WalkDir("/proc/sys", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // a per-interface dir that vanished while walking
		}
		if d.IsDir() {
			return nil
		}
		info, err := d.Info()
		if err != nil || info.Mode().Perm()&0o444 == 0 {
			return nil // write-only, e.g. vm/drop_caches
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil // some files refuse reads (EPERM, EINVAL)
		}
		out[strings.TrimPrefix(path, "/proc/sys/")] = strings.TrimSpace(string(b))
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("cluster: reading /proc/sys: %w", err)
	}
	return out, nil
}

func isVolatileSysctl(key string) bool {
	for _, p := range volatileSysctls {
		if strings.HasPrefix(key, p) {
			return true
		}
	}
	return false
}

// normaliseRules drops comments and packet counters from iptables-save and
// nft output, which change on their own.
func normaliseRules(lines []string) []string {
	var out []string
	for _, l := range lines {
		if strings.HasPrefix(l, "#") || strings.TrimSpace(l) == "" {
			continue
		}
		if strings.HasPrefix(l, ":") { // ":INPUT ACCEPT [12:345]"
			if i := strings.LastIndex(l, " ["); i > 0 {
				l = l[:i]
			}
		}
		if i := strings.Index(l, " counter packets "); i > 0 { // nft
			l = l[:i]
		}
		out = append(out, l)
	}
	return out
}

func mountPoints() ([]string, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		sep := slices.Index(f, "-")
		if len(f) < 5 || sep < 0 || sep+1 >= len(f) {
			continue
		}
		out = append(out, unescapeMount(f[4])+" "+f[sep+1])
	}
	return out, sc.Err()
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	return strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`).Replace(s)
}

// topCgroups lists the directories directly under each mounted cgroup
// hierarchy, where the kubelet puts kubepods.
func topCgroups() ([]string, error) {
	roots, err := cgroupRoots()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, r := range roots {
		entries, err := os.ReadDir(r)
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			if e.IsDir() {
				out = append(out, filepath.Join(r, e.Name()))
			}
		}
	}
	return out, nil
}

// cgroupRoots are the mount points of every cgroup and cgroup2 hierarchy.
func cgroupRoots() ([]string, error) {
	ms, err := mountPoints()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, m := range ms {
		mp, typ, _ := strings.Cut(m, " ")
		if typ == "cgroup" || typ == "cgroup2" {
			out = append(out, mp)
		}
	}
	return out, nil
}

// diff lists every difference between s (the baseline) and after.
func (s *hostState) diff(after *hostState) []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(s.sysctls)) {
		if s.volatile[k] || isVolatileSysctl(k) {
			continue
		}
		v := s.sysctls[k]
		if now, ok := after.sysctls[k]; !ok {
			out = append(out, fmt.Sprintf("sysctl %s is gone (was %q)", k, v))
		} else if now != v {
			out = append(out, fmt.Sprintf("sysctl %s = %q, was %q", k, now, v))
		}
	}
	out = append(out, setDiff("link", s.links, after.links)...)
	out = append(out, setDiff("route", s.routes, after.routes)...)
	for _, tool := range slices.Sorted(maps.Keys(s.rules)) {
		out = append(out, setDiff(tool+" rule", s.rules[tool], after.rules[tool])...)
	}
	out = append(out, setDiff("mount", s.mounts, after.mounts)...)
	out = append(out, setDiff("cgroup", s.cgroups, after.cgroups)...)
	for _, d := range watchedDirs {
		out = append(out, setDiff("entry in "+d, s.dirs[d], after.dirs[d])...)
	}
	return out
}

// setDiff names what was added to or removed from a list of lines.
func setDiff(what string, before, after []string) []string {
	count := map[string]int{}
	for _, l := range before {
		count[l]++
	}
	for _, l := range after {
		count[l]--
	}
	var out []string
	for _, l := range slices.Sorted(maps.Keys(count)) {
		switch n := count[l]; {
		case n < 0:
			out = append(out, fmt.Sprintf("%s added: %s", what, l))
		case n > 0:
			out = append(out, fmt.Sprintf("%s removed: %s", what, l))
		}
	}
	return out
}

// cmdLines runs a command and returns its stdout's lines.
func cmdLines(ctx context.Context, name string, args ...string) ([]string, error) {
	out, err := run(ctx, name, args...)
	if err != nil {
		return nil, err
	}
	var lines []string
	for _, l := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
		if l != "" {
			lines = append(lines, l)
		}
	}
	return lines, nil
}

// run runs a host command with a bounded time and returns its stdout; the
// error carries the command line and its stderr.
func run(ctx context.Context, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}
