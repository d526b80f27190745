//go:build node

package node

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/demo-operator/uuid-controller/test/framework"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
)

// TestReadinessFollowsInformer: with read access to uuid (list and watch)
// taken from the ServiceAccount's ClusterRole, a replica that starts cannot
// sync its informer: it runs, stays up, logs the forbidden request, and
// `kubectl get pods` shows it 0/1 Ready while its readiness probe keeps
// failing, which holds back a rollout. Given access back, it turns Ready
// without a restart.
//
// Taking `list` alone is not enough since client-go 1.35: its informers
// sync through a watch that streams the initial objects (WatchListClient,
// on by default), which needs only `watch`. Such a replica syncs and is
// rightly Ready.
func TestReadinessFollowsInformer(t *testing.T) {
	ctx := testCtx(t)
	d := rolledOutReplicas(ctx, t)
	holder, standby := d.leader.Name, d.standby.Name

	cr, err := env.Kube.RbacV1().ClusterRoles().Get(ctx, "uuid-controller", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	removed := 0
	for i, r := range cr.Rules {
		if slices.Contains(r.Resources, "uuid") {
			cr.Rules[i].Verbs = slices.DeleteFunc(slices.Clone(r.Verbs), func(v string) bool { return v == "list" || v == "watch" })
			removed += len(r.Verbs) - len(cr.Rules[i].Verbs)
		}
	}
	cr.Rules = slices.DeleteFunc(cr.Rules, func(r rbacv1.PolicyRule) bool { return len(r.Verbs) == 0 })
	if removed != 2 {
		t.Fatalf("the ClusterRole grants list and watch on uuid %d times, want 2: %+v", removed, cr.Rules)
	}
	if _, err := env.Kube.RbacV1().ClusterRoles().Update(ctx, cr, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	restored := false
	restore := func() {
		if !restored {
			restored = true
			if out, err := env.cluster.Kubectl(context.WithoutCancel(ctx), "apply", "-f", filepath.Join("deploy", "rbac.yaml")); err != nil {
				t.Errorf("restoring deploy/rbac.yaml: %v\n%s", err, out)
			}
		}
	}
	t.Cleanup(restore)

	// The standby's replacement starts without list.
	if err := env.Kube.CoreV1().Pods(ns).Delete(ctx, standby, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	var fresh *corev1.Pod
	if err := framework.Poll(ctx, 2*time.Minute, "a replacement pod whose readiness probe has failed 3 times", func(ctx context.Context) error {
		pods, err := controllerPods(ctx)
		if err != nil {
			return err
		}
		for i := range pods {
			p := &pods[i]
			if p.Name == holder || p.Name == standby {
				continue
			}
			fresh = p
			if p.Status.Phase != corev1.PodRunning {
				return fmt.Errorf("pod %s is %s", p.Name, p.Status.Phase)
			}
			// The kubelet's event is the proof the probe ran and kept
			// failing, not just that it has not run yet or failed once
			// before the cache synced (which is normal at start).
			evs, err := env.Kube.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: fields.Set{
				"involvedObject.name": p.Name, "reason": "Unhealthy"}.String()})
			if err != nil {
				return err
			}
			for _, ev := range evs.Items {
				if strings.Contains(ev.Message, "Readiness probe failed") && ev.Count >= 3 {
					return nil
				}
			}
			var seen []string
			for _, ev := range evs.Items {
				seen = append(seen, fmt.Sprintf("%s x%d: %s", ev.Reason, ev.Count, ev.Message))
			}
			return fmt.Errorf("pod %s (ready %v): no failed readiness probe yet; its Unhealthy events: %q", p.Name, podReady(p), seen)
		}
		return fmt.Errorf("no replacement pod yet")
	}); err != nil {
		t.Fatal(err)
	}
	p, err := env.Kube.CoreV1().Pods(ns).Get(ctx, fresh.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if podReady(p) || p.Status.ContainerStatuses[0].RestartCount != 0 || p.Status.ContainerStatuses[0].State.Running == nil {
		t.Fatalf("pod %s: ready %v, status %+v; want running, not ready, no restarts", p.Name, podReady(p), p.Status.ContainerStatuses[0])
	}
	out, err := env.cluster.Kubectl(ctx, "-n", ns, "get", "pods", "--no-headers")
	if err != nil {
		t.Fatalf("kubectl get pods: %v\n%s", err, out)
	}
	if !kubectlShows(out, p.Name, "0/1", "Running") {
		t.Errorf("kubectl get pods does not show %s 0/1 Running:\n%s", p.Name, out)
	}
	var log string
	if err := framework.Poll(ctx, time.Minute, "the forbidden list in the pod's log", func(context.Context) error {
		if log = podLog(t, p); !strings.Contains(log, "forbidden") || !strings.Contains(log, `resource \"uuid\"`) {
			return fmt.Errorf("not logged yet")
		}
		return nil
	}); err != nil {
		t.Errorf("pod %s: %v; its log:\n%s", p.Name, err, log)
	}

	restore()
	if err := framework.Poll(ctx, 2*time.Minute, "the replica to turn Ready", func(ctx context.Context) error {
		p, err := env.Kube.CoreV1().Pods(ns).Get(ctx, fresh.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !podReady(p) {
			return fmt.Errorf("pod %s not Ready", p.Name)
		}
		if n := p.Status.ContainerStatuses[0].RestartCount; n != 0 {
			return fmt.Errorf("pod %s restarted %d times", p.Name, n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := waitRolledOut(ctx); err != nil {
		t.Fatal(err)
	}
}

// kubectlShows reports whether `kubectl get pods --no-headers` has a line
// for pod with the given READY and STATUS columns.
func kubectlShows(out, pod, ready, status string) bool {
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) >= 3 && f[0] == pod && f[1] == ready && f[2] == status {
			return true
		}
	}
	return false
}
