//go:build node

package node

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// TestRunsAsNonRootReadOnly: seen from the node, each replica's process is
// the controller binary running as uid and gid 65532, with no
// capabilities, no_new_privs and a seccomp filter, on a read-only root
// filesystem: what the image and the Deployment ask for, as the kernel
// applies it.
func TestRunsAsNonRootReadOnly(t *testing.T) {
	pods := rolledOutReplicas(testCtx(t), t).pods
	for i := range pods {
		p := &pods[i]
		pid := containerPID(t, p)
		if cmd := procStrings(t, pid, "cmdline"); cmd[0] != "/uuid-controller" {
			t.Errorf("pod %s: pid %d runs %v, want /uuid-controller", p.Name, pid, cmd)
		}
		status := procFields(t, pid)
		for key, want := range map[string]string{
			"Uid":        "65532 65532 65532 65532", // real, effective, saved, filesystem
			"Gid":        "65532 65532 65532 65532",
			"CapEff":     "0000000000000000",
			"CapPrm":     "0000000000000000",
			"NoNewPrivs": "1",
			"Seccomp":    "2", // filter mode: RuntimeDefault
		} {
			if got := status[key]; got != want {
				t.Errorf("pod %s: /proc/%d/status %s = %q, want %q", p.Name, pid, key, got, want)
			}
		}
		root, err := rootMount(pid)
		if err != nil {
			t.Fatalf("pod %s: %v", p.Name, err)
		}
		if !strings.Contains(","+root.options+",", ",ro,") {
			t.Errorf("pod %s: root filesystem mounted %q (%s), want ro", p.Name, root.options, root.line)
		}
	}
}

// procFields reads /proc/PID/status into key -> value, tabs made spaces.
func procFields(t *testing.T, pid int) map[string]string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(l, ":")
		if ok {
			out[k] = strings.Join(strings.Fields(v), " ")
		}
	}
	return out
}

type mountLine struct{ options, line string }

// rootMount is the mount a process sees at "/", from /proc/PID/mountinfo
// (the last one listed wins, as it is mounted on top).
func rootMount(pid int) (mountLine, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		return mountLine{}, err
	}
	var root mountLine
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l) // id parent major:minor root mountpoint options ...
		if len(f) > 5 && f[4] == "/" {
			root = mountLine{options: f[5], line: l}
		}
	}
	if root.line == "" {
		return root, fmt.Errorf("no / in /proc/%d/mountinfo", pid)
	}
	return root, nil
}
