//go:build node

package node

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestReplicasRunningOneLeader: deploy/ as applied runs two replicas,
// Running and Ready with no restarts, the image built here and pulled from
// the node's registry by digest; exactly one of them holds the Lease and
// says so in its log, the other waits for it.
func TestReplicasRunningOneLeader(t *testing.T) {
	ctx := testCtx(t)
	d := rolledOutReplicas(ctx, t)
	pods, holder := d.pods, d.leader.Name
	leaders := 0
	for i := range pods {
		p := &pods[i]
		if p.Status.Phase != corev1.PodRunning || !podReady(p) {
			t.Errorf("pod %s: phase %s, ready %v", p.Name, p.Status.Phase, podReady(p))
		}
		if len(p.Status.ContainerStatuses) != 1 {
			t.Fatalf("pod %s: %d container statuses", p.Name, len(p.Status.ContainerStatuses))
		}
		cs := p.Status.ContainerStatuses[0]
		if cs.RestartCount != 0 {
			t.Errorf("pod %s: %d restarts", p.Name, cs.RestartCount)
		}
		// The kubelet reports the pulled index as the image ID,
		// REGISTRY/REPO@sha256:...; cs.Image is containerd's local image ID
		// (sha256:..., the config), as a digest-only reference has no tag.
		if spec := p.Spec.Containers[0].Image; spec != env.image || cs.ImageID != env.image {
			t.Errorf("pod %s: image %s, runs %s (ID %s), want %s (pushed by make image-push)", p.Name, spec, cs.Image, cs.ImageID, env.image)
		}
		log := podLog(t, p)
		acquired := strings.Contains(log, `"Successfully acquired lease" lock="`+ns+"/"+leaseName+`"`)
		if acquired {
			leaders++
		}
		if acquired != (p.Name == holder) {
			t.Errorf("pod %s: acquired the lease per its log: %v; the Lease's holder is %q", p.Name, acquired, holder)
		}
		if !strings.Contains(log, "Waiting for the leader lease") {
			t.Errorf("pod %s: no leader election in its log:\n%s", p.Name, log)
		}
	}
	if leaders != 1 {
		t.Errorf("%d pods logged acquiring the lease, want exactly 1", leaders)
	}
}

// TestNamespaceEnforcesRestricted: deploy/namespace.yaml labels the
// controller's namespace with Pod Security "restricted", the apiserver
// enforces it (a pod without a security context is refused), and the Deployment's pods
// were admitted under it.
func TestNamespaceEnforcesRestricted(t *testing.T) {
	ctx := testCtx(t)
	n, err := env.Kube.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := n.Labels["pod-security.kubernetes.io/enforce"]; got != "restricted" {
		t.Fatalf("namespace %s: pod-security.kubernetes.io/enforce = %q, want restricted", ns, got)
	}
	// A pod with no security context: it may run as root, escalate and
	// keep its capabilities, which "baseline" allows and "restricted" not.
	plain := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "plain", Namespace: ns},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: env.image}}},
	}
	_, err = env.Kube.CoreV1().Pods(ns).Create(ctx, plain, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), `violates PodSecurity "restricted`) {
		t.Fatalf("pod without a security context in %s: err = %v, want Forbidden by PodSecurity restricted", ns, err)
	}
	if err := waitRolledOut(ctx); err != nil {
		t.Fatal(err)
	}
}
