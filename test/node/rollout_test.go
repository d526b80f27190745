//go:build node

package node

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/demo-operator/uuid-controller/test/framework"
)

// rolloutObjects is how many objects with UUIDs a rolling update runs over.
const rolloutObjects = 1000

// TestRolloutRestart: `kubectl rollout restart` replaces both pods one at
// a time over 1,000 objects that already have UUIDs. No status is
// written, no UUID changes, and the Lease passes from one holder to the
// next only when released or expired: never two leaders at once.
func TestRolloutRestart(t *testing.T) {
	ctx := testCtx(t)
	if err := waitRolledOut(ctx); err != nil {
		t.Fatal(err)
	}
	objNS := env.NewNamespace(ctx, t)
	start := time.Now()
	before := env.WaitUUIDs(ctx, t, objNS, env.CreateUuids(ctx, t, objNS, "obj", rolloutObjects), 3*time.Minute)
	t.Logf("%d objects created and given UUIDs in %s", rolloutObjects, time.Since(start).Round(time.Millisecond))
	// The audit log holds each object's one write, or the filter below
	// matches nothing and "no write during the rollout" proves nothing.
	writesBefore := statusWrites(t, objNS)
	if len(writesBefore) != rolloutObjects {
		t.Fatalf("the audit log shows status writes to %d objects in %s, want %d", len(writesBefore), objNS, rolloutObjects)
	}
	ids := env.WatchUUIDs(ctx, t, objNS)
	leases := watchLease(ctx, t)
	oldPods, err := controllerPods(ctx)
	if err != nil {
		t.Fatal(err)
	}

	start = time.Now()
	if out, err := env.cluster.Kubectl(ctx, "-n", ns, "rollout", "restart", "deployment/"+deployName); err != nil {
		t.Fatalf("kubectl rollout restart: %v\n%s", err, out)
	}
	if out, err := env.cluster.Kubectl(ctx, "-n", ns, "rollout", "status", "deployment/"+deployName, "--timeout=5m"); err != nil {
		t.Fatalf("kubectl rollout status: %v\n%s", err, out)
	}
	if err := waitRolledOut(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("rollout restart took %s", time.Since(start).Round(time.Millisecond))
	newPods, err := controllerPods(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, np := range newPods {
		for _, op := range oldPods {
			if np.UID == op.UID {
				t.Fatalf("pod %s was not replaced", np.Name)
			}
		}
	}
	// The new leader has synced and gone through every object once a
	// sentinel created now has its UUID: the queue is first in, first
	// out, and all 1,000 were queued when its informer synced.
	if err := framework.Poll(ctx, time.Minute, "a new pod to hold the lease", func(ctx context.Context) error {
		lease, _, err := env.LeaseHolder(ctx, ns, leaseName)
		if err != nil {
			return err
		}
		holder := holderPod(lease)
		for _, p := range newPods {
			if p.Name == holder {
				return nil
			}
		}
		return fmt.Errorf("holder %q is not a new pod", holder)
	}); err != nil {
		t.Fatal(err)
	}
	sentinelNS := env.NewNamespace(ctx, t)
	env.WaitUUIDs(ctx, t, sentinelNS, env.CreateUuids(ctx, t, sentinelNS, "sentinel", 1), time.Minute)

	after := statusWrites(t, objNS)
	if len(after) != rolloutObjects {
		t.Errorf("the audit log shows status writes to %d objects in %s after the rollout, want %d", len(after), objNS, rolloutObjects)
	}
	for name, n := range after {
		if n != writesBefore[name] {
			t.Errorf("%s/%s: %d status writes during the rollout", objNS, name, n-writesBefore[name])
		}
	}
	l, err := env.Uuids(objNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	changed := 0
	for _, o := range l.Items {
		if id := framework.UUIDOf(o.Object); id != before[o.GetName()] {
			changed++
		}
	}
	if changed > 0 || len(l.Items) != rolloutObjects {
		t.Errorf("%d of %d objects have a different UUID after the rollout", changed, len(l.Items))
	}
	ids.CheckUnchanged(t)

	leases.check(t)
	obs := leases.observations()
	// "Never two leaders" holds of a watch that saw nothing: it must have
	// seen the Lease pass from a replaced pod to a new one.
	isPod := func(pods []corev1.Pod) func(string) bool {
		return func(name string) bool {
			return slices.ContainsFunc(pods, func(p corev1.Pod) bool { return p.Name == name })
		}
	}
	if !handedOver(obs, isPod(oldPods), isPod(newPods)) {
		t.Errorf("the Lease watch saw no handover from an old pod to a new one: holders %v", holders(obs))
	}
	if bad := overlappingLeaders(obs); len(bad) > 0 {
		t.Errorf("two leaders at once: %s", strings.Join(bad, "; "))
	}
	// And no second Lease that a replica could lead by.
	all, err := env.Kube.CoordinationV1().Leases("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range all.Items {
		if strings.HasPrefix(holderPod(&l), deployName+"-") && (l.Namespace != ns || l.Name != leaseName) {
			t.Errorf("Lease %s/%s is held by %s", l.Namespace, l.Name, *l.Spec.HolderIdentity)
		}
	}
	t.Logf("lease holders during the rollout: %v", holders(obs))
}
