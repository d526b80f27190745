//go:build node

package node

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/demo-operator/uuid-controller/test/cluster"
)

// TestExampleFromInClusterLeader: `kubectl apply -f examples/uuid.yaml`
// gets state Ok and a UUID, written by the leader pod with nothing but
// what the kubelet gave it: the audit log shows the write came from the
// leader's pod address with the token projected for that pod; the node
// shows the process has no kubeconfig, only the kubernetes Service's
// variables, and that its connection went to the ClusterIP and was
// translated to the apiserver on the bridge.
func TestExampleFromInClusterLeader(t *testing.T) {
	ctx := testCtx(t)
	leader := rolledOutReplicas(ctx, t).leader

	// Writes from now on: another test (TestHelmChart) may have had an
	// example of its own assigned and deleted before.
	applied := time.Now()
	if out, err := env.cluster.Kubectl(ctx, "apply", "-f", "examples/uuid.yaml"); err != nil {
		t.Fatalf("kubectl apply -f examples/uuid.yaml: %v\n%s", err, out)
	}
	t.Cleanup(func() { _, _ = env.cluster.Kubectl(ctx, "delete", "-f", "examples/uuid.yaml", "--wait=false") })
	ids := env.WaitUUIDs(ctx, t, "default", []string{"example"}, time.Minute)
	if _, ok := ids["example"]; !ok {
		t.Fatalf("UUIDs in default: %v, want one for example", ids)
	}

	// Who wrote it: the audit log.
	evs, err := env.cluster.AuditEvents()
	if err != nil {
		t.Fatal(err)
	}
	var writes []cluster.AuditEvent
	for _, ev := range evs {
		if ev.ObjectRef.Namespace == "default" && ev.ObjectRef.Name == "example" && ev.ObjectRef.Subresource == "status" && ev.Verb == "patch" &&
			!ev.RequestReceived.Before(applied) {
			writes = append(writes, ev)
		}
	}
	if len(writes) != 1 {
		t.Fatalf("%d status patches on default/example, want 1: %+v", len(writes), writes)
	}
	w := writes[0]
	if w.User.Username != controllerUser || w.ResponseStatus.Code != 200 {
		t.Errorf("status patch by %q, code %d; want %q, 200", w.User.Username, w.ResponseStatus.Code, controllerUser)
	}
	if got := w.User.Extra["authentication.kubernetes.io/pod-name"]; !slices.Equal(got, []string{leader.Name}) {
		t.Errorf("status patch's token was issued to pod %v, want the leader %s (a projected token)", got, leader.Name)
	}
	if !slices.Contains(w.SourceIPs, leader.Status.PodIP) {
		t.Errorf("status patch came from %v, want the leader's pod IP %s", w.SourceIPs, leader.Status.PodIP)
	}

	// How it connected: the process on the node.
	pid := containerPID(t, leader)
	environ := procStrings(t, pid, "environ")
	for _, want := range []string{"KUBERNETES_SERVICE_HOST=" + cluster.KubernetesServiceIP, "KUBERNETES_SERVICE_PORT=443"} {
		if !slices.Contains(environ, want) {
			t.Errorf("leader's environment lacks %s: %v", want, environ)
		}
	}
	for _, e := range environ {
		if strings.HasPrefix(e, "KUBECONFIG=") {
			t.Errorf("leader has %s", e)
		}
	}
	for _, a := range procStrings(t, pid, "cmdline") {
		if strings.Contains(a, "kubeconfig") || strings.Contains(a, "master") {
			t.Errorf("leader's command line has %q", a)
		}
	}
	// conntrack in the node's network namespace: the leader's connection
	// to the ClusterIP, answered by the apiserver on the bridge.
	out, err := runCmd("conntrack", "-L", "-p", "tcp", "--orig-src", leader.Status.PodIP, "--orig-dst", cluster.KubernetesServiceIP)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "dport=443") || !strings.Contains(out, "src="+cluster.NodeIP) || !strings.Contains(out, "ESTABLISHED") {
		t.Errorf("no established connection from the leader %s to %s:443 translated to %s:\n%s",
			leader.Status.PodIP, cluster.KubernetesServiceIP, cluster.NodeIP, out)
	}
}

// containerPID is the host pid of a pod's controller container.
func containerPID(t *testing.T, p *corev1.Pod) int {
	t.Helper()
	if len(p.Status.ContainerStatuses) != 1 || p.Status.ContainerStatuses[0].ContainerID == "" {
		t.Fatalf("pod %s: no container ID in %+v", p.Name, p.Status.ContainerStatuses)
	}
	pid, err := env.cluster.ContainerPID(t.Context(), p.Status.ContainerStatuses[0].ContainerID)
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// procStrings reads a NUL-separated /proc/PID file (environ, cmdline).
func procStrings(t *testing.T, pid int, file string) []string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/%s", pid, file))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
}
