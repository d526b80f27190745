//go:build node

package node

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/demo-operator/uuid-controller/test/framework"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
)

// TestLeaderPodDeleted: the leader pod deleted (a normal graceful delete,
// as a drain or `kubectl delete pod` does) exits 0 and releases the Lease;
// another replica (the standby, or the replacement pod if it asks first)
// takes over within the lease duration; objects created
// meanwhile get their UUIDs, one write each; a watch sees no UUID change.
func TestLeaderPodDeleted(t *testing.T) {
	ctx := testCtx(t)
	d := rolledOutReplicas(ctx, t)
	leader, leaderName, standby, lease := d.leader, d.leader.Name, d.standby.Name, d.lease
	t.Logf("leader %s, standby %s", leaderName, standby)
	leaseDuration := time.Duration(*lease.Spec.LeaseDurationSeconds) * time.Second

	objNS := env.NewNamespace(ctx, t)
	before := env.CreateUuids(ctx, t, objNS, "before", 20)
	env.WaitUUIDs(ctx, t, objNS, before, time.Minute)
	ids := env.WatchUUIDs(ctx, t, objNS)
	leases := watchLease(ctx, t)
	exit := watchExitCode(t, leader)

	deleted := time.Now()
	if err := env.Kube.CoreV1().Pods(ns).Delete(ctx, leader.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	during := env.CreateUuids(ctx, t, objNS, "during", 20)

	// The next leader is the standby, or the Deployment's replacement pod
	// when it starts and asks first: after a release, whichever replica
	// tries first wins, and the standby tries every retry period (2 s).
	var next leaseObservation
	if err := framework.Poll(ctx, 2*leaseDuration, "another replica to take the lease", func(context.Context) error {
		for _, o := range leases.observations() {
			if o.holder != "" && holderPod(o.lease) != leaderName {
				next = o
				return nil
			}
		}
		return fmt.Errorf("lease holders seen: %v", holders(leases.observations()))
	}); err != nil {
		t.Fatal(err)
	}
	who := "the standby"
	if pod := holderPod(next.lease); pod != standby {
		who = "the replacement pod " + pod
	}
	if took := next.at.Sub(deleted); took > leaseDuration {
		t.Errorf("%s took over %s after the delete, more than the lease duration %s", who, took, leaseDuration)
	} else {
		t.Logf("%s took over %s after the delete (lease duration %s)", who, took.Round(time.Millisecond), leaseDuration)
	}
	released := false
	for _, o := range leases.observations() {
		if o.at.After(deleted) && o.holder == "" {
			released = true
		}
		if o.holder == next.holder {
			break
		}
	}
	if !released {
		t.Errorf("the deleted leader did not release the Lease before %s took it: holders %v", who, holders(leases.observations()))
	}

	leases.check(t)
	names := append(before, during...)
	env.WaitUUIDs(ctx, t, objNS, names, time.Minute)
	// Sized, so that an audit filter that matched nothing fails.
	writes := statusWrites(t, objNS)
	if len(writes) != len(names) {
		t.Errorf("the audit log shows status writes to %d objects in %s, want %d", len(writes), objNS, len(names))
	}
	for name, n := range writes {
		if n != 1 {
			t.Errorf("%s/%s: %d status writes, want 1", objNS, name, n)
		}
	}
	ids.CheckUnchanged(t)
	code, err := exit.wait(time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if code != 0 {
		t.Errorf("the deleted leader's container exited %d, want 0", code)
	}
	if err := waitRolledOut(ctx); err != nil {
		t.Fatal(err)
	}
}

func holders(obs []leaseObservation) []string {
	var out []string
	for _, o := range obs {
		if len(out) == 0 || out[len(out)-1] != o.holder {
			out = append(out, o.holder)
		}
	}
	return out
}

// exitWatch catches a pod's container exit code, which the kubelet
// reports in the pod's status before the pod is gone.
type exitWatch struct {
	mu   sync.Mutex
	code *int32
	done chan struct{}
}

func watchExitCode(t *testing.T, p *corev1.Pod) *exitWatch {
	t.Helper()
	w, err := env.Kube.CoreV1().Pods(p.Namespace).Watch(t.Context(), metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("metadata.name", p.Name).String(), ResourceVersion: p.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	ew := &exitWatch{done: make(chan struct{})}
	t.Cleanup(w.Stop)
	go func() {
		defer close(ew.done)
		for ev := range w.ResultChan() {
			pod, ok := ev.Object.(*corev1.Pod)
			if !ok || pod.UID != p.UID {
				continue
			}
			for _, cs := range pod.Status.ContainerStatuses {
				if term := cs.State.Terminated; term != nil {
					ew.mu.Lock()
					ew.code = &term.ExitCode
					ew.mu.Unlock()
					return
				}
			}
			if ev.Type == watch.Deleted {
				return
			}
		}
	}()
	return ew
}

// wait returns the exit code, or an error if the pod went away (or the
// timeout passed) without the kubelet reporting one.
func (ew *exitWatch) wait(timeout time.Duration) (int32, error) {
	select {
	case <-ew.done:
	case <-time.After(timeout):
	}
	ew.mu.Lock()
	defer ew.mu.Unlock()
	if ew.code == nil {
		return 0, fmt.Errorf("no exit code reported for the deleted pod within %s", timeout)
	}
	return *ew.code, nil
}
