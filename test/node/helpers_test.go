//go:build node

package node

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/demo-operator/uuid-controller/test/cluster"
	"github.com/demo-operator/uuid-controller/test/framework"
)

// controllerUser is who the controller's writes come from.
const controllerUser = "system:serviceaccount:" + cluster.ControllerNamespace + ":" + cluster.ControllerServiceAccount

// testCtx is bounded so a stuck node fails the test instead of CI.
func testCtx(t *testing.T) context.Context {
	t.Helper()
	return framework.Context(t, 8*time.Minute)
}

// waitRolledOut waits until the Deployment has all its replicas updated,
// Ready and available, and no other pod of it is left.
func waitRolledOut(ctx context.Context) error {
	return framework.Poll(ctx, 5*time.Minute, "the Deployment to roll out", func(ctx context.Context) error {
		d, err := env.Kube.AppsV1().Deployments(ns).Get(ctx, deployName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if err := rolledOut(d); err != nil {
			return err
		}
		pods, err := controllerPods(ctx)
		if err != nil {
			return err
		}
		if int32(len(pods)) != *d.Spec.Replicas {
			return fmt.Errorf("%d pods, want %d", len(pods), *d.Spec.Replicas)
		}
		return nil
	})
}

func rolledOut(d *appsv1.Deployment) error {
	s, want := d.Status, *d.Spec.Replicas
	if s.ObservedGeneration < d.Generation || s.UpdatedReplicas != want || s.ReadyReplicas != want ||
		s.AvailableReplicas != want || s.Replicas != want {
		return fmt.Errorf("deployment status %+v, want %d replicas", s, want)
	}
	return nil
}

// deployed is the Deployment at rest: rolled out, its two pods, which of
// them holds the Lease, and the Lease.
type deployed struct {
	pods            []corev1.Pod
	leader, standby *corev1.Pod
	lease           *coordinationv1.Lease
}

// rolledOutReplicas waits until the Deployment is rolled out and returns its pods
// and leader.
func rolledOutReplicas(ctx context.Context, t *testing.T) deployed {
	t.Helper()
	if err := waitRolledOut(ctx); err != nil {
		t.Fatal(err)
	}
	// A test before may have replaced the pods: the new ones are rolled
	// out before one of them has taken the Lease.
	var d deployed
	err := framework.Poll(ctx, time.Minute, "the Deployment's 2 pods, one of them holding the Lease", func(ctx context.Context) error {
		pods, err := controllerPods(ctx)
		if err != nil {
			return err
		}
		lease, _, err := env.LeaseHolder(ctx, ns, leaseName)
		if err != nil {
			return err
		}
		holder := holderPod(lease)
		d = deployed{pods: pods, lease: lease}
		for i := range pods {
			if pods[i].Name == holder {
				d.leader = &pods[i]
			} else {
				d.standby = &pods[i]
			}
		}
		if len(pods) != 2 || d.leader == nil || d.standby == nil {
			return fmt.Errorf("%d pods, the Lease held by %q", len(pods), holder)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// controllerPods lists the Deployment's pods that are not being deleted.
func controllerPods(ctx context.Context) ([]corev1.Pod, error) {
	l, err := env.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: appLabel})
	if err != nil {
		return nil, err
	}
	var out []corev1.Pod
	for _, p := range l.Items {
		if p.DeletionTimestamp == nil {
			out = append(out, p)
		}
	}
	return out, nil
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// holderPod is the pod the Lease's holder identity names (identities are
// "<hostname>_<random>", the hostname being the pod's name), "" when no
// one holds it.
func holderPod(l *coordinationv1.Lease) string {
	if l.Spec.HolderIdentity == nil {
		return ""
	}
	pod, _, _ := strings.Cut(*l.Spec.HolderIdentity, "_")
	return pod
}

// podLog is a pod's controller container log from the node.
func podLog(t *testing.T, p *corev1.Pod) string {
	t.Helper()
	out, err := env.cluster.PodLogs(p.Namespace, p.Name, string(p.UID), container)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// statusWrites counts the controller's status writes in the audit log on
// objects in namespace, by object name.
func statusWrites(t *testing.T, namespace string) map[string]int {
	t.Helper()
	evs, err := env.cluster.AuditEvents()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, ev := range evs {
		if ev.ObjectRef.Subresource == "status" && ev.ObjectRef.Namespace == namespace &&
			ev.User.Username == controllerUser && ev.Verb != "get" && ev.Verb != "list" && ev.Verb != "watch" {
			out[ev.ObjectRef.Name]++
		}
	}
	return out
}

// leaseObservation is the Lease as one watch event showed it.
type leaseObservation struct {
	at     time.Time
	holder string // identity, "" when released
	lease  *coordinationv1.Lease
}

// leaseWatch records every state of the Lease from now on, and why it
// stopped if it stopped before the test ended: a watch that broke off saw
// nothing, and must not read as "no two leaders".
type leaseWatch struct {
	mu   sync.Mutex
	obs  []leaseObservation
	err  error
	done chan struct{}
}

func watchLease(ctx context.Context, t *testing.T) *leaseWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	w, err := env.Kube.CoordinationV1().Leases(ns).Watch(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("metadata.name", leaseName).String()})
	if err != nil {
		cancel()
		t.Fatalf("watch lease: %v", err)
	}
	lw := &leaseWatch{done: make(chan struct{})}
	t.Cleanup(func() { cancel(); w.Stop(); <-lw.done })
	go func() {
		defer close(lw.done)
		for ev := range w.ResultChan() {
			l, ok := ev.Object.(*coordinationv1.Lease)
			if !ok {
				lw.fail(fmt.Errorf("lease watch: %s event: %w", ev.Type, apierrors.FromObject(ev.Object)))
				return
			}
			holder := ""
			if l.Spec.HolderIdentity != nil {
				holder = *l.Spec.HolderIdentity
			}
			lw.mu.Lock()
			lw.obs = append(lw.obs, leaseObservation{at: time.Now(), holder: holder, lease: l})
			lw.mu.Unlock()
		}
		if ctx.Err() == nil {
			lw.fail(errors.New("lease watch: the server ended it before the test did"))
		}
	}()
	return lw
}

func (lw *leaseWatch) fail(err error) {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	lw.err = err
}

func (lw *leaseWatch) observations() []leaseObservation {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	return append([]leaseObservation(nil), lw.obs...)
}

// check fails the test if the watch broke off.
func (lw *leaseWatch) check(t *testing.T) {
	t.Helper()
	lw.mu.Lock()
	defer lw.mu.Unlock()
	if lw.err != nil {
		t.Error(lw.err)
	}
}

// handedOver reports whether obs show the Lease held by a pod that from
// names and later by a pod that to names.
func handedOver(obs []leaseObservation, from, to func(pod string) bool) bool {
	held := false
	for _, o := range obs {
		pod := holderPod(o.lease)
		if held && to(pod) {
			return true
		}
		held = held || from(pod)
	}
	return false
}

// overlappingLeaders lists every handover in which a new holder took the
// Lease while the previous one's term could still be running: neither
// released (holder "") nor expired (its last renewal plus the lease
// duration before the new holder's acquire time).
func overlappingLeaders(obs []leaseObservation) []string {
	var bad []string
	var prev *leaseObservation
	for i := range obs {
		o := &obs[i]
		if prev != nil && o.holder != "" && prev.holder != "" && o.holder != prev.holder {
			l := prev.lease
			expired := l.Spec.RenewTime != nil && l.Spec.LeaseDurationSeconds != nil &&
				o.lease.Spec.AcquireTime != nil &&
				o.lease.Spec.AcquireTime.Time.After(l.Spec.RenewTime.Add(time.Duration(*l.Spec.LeaseDurationSeconds)*time.Second))
			if !expired {
				bad = append(bad, fmt.Sprintf("%s took the lease from %s, which had neither released it nor let it expire", o.holder, prev.holder))
			}
		}
		prev = o
	}
	return bad
}

// runCmd runs a host command and returns its combined output.
func runCmd(name string, args ...string) (string, error) {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, out)
	}
	return string(out), nil
}
