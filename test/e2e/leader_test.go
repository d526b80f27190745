package e2e

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/demo-operator/uuid-controller/test/cluster"
	"github.com/demo-operator/uuid-controller/test/framework"
)

// leaderArgs turns on leader election with a Lease of the test's own and
// short timings, so a takeover happens within seconds. deploy/rbac.yaml
// grants get and update on the Lease named uuid-controller only, so the
// test grants the same on its own Lease (grantLease).
func leaderArgs(ctx context.Context, t *testing.T, lease string, leaseDuration time.Duration) []string {
	t.Helper()
	grantLease(ctx, t, lease)
	return []string{"--leader-elect", "--leader-elect-name", lease,
		"--leader-elect-namespace", cluster.ControllerNamespace,
		"--leader-elect-lease-duration", leaseDuration.String(),
		"--leader-elect-renew-deadline", (leaseDuration * 3 / 4).String(),
		"--leader-elect-retry-period", "250ms"}
}

// grantLease gives the controller's ServiceAccount deploy/rbac.yaml's
// rule for its Lease (get and update, by name) on the Lease named lease,
// until the test ends.
func grantLease(ctx context.Context, t *testing.T, lease string) {
	t.Helper()
	name := "test-lease-" + lease
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: cluster.ControllerNamespace},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"},
			ResourceNames: []string{lease}, Verbs: []string{"get", "update"}}},
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: cluster.ControllerNamespace},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: cluster.ControllerNamespace, Name: cluster.ControllerServiceAccount}},
	}
	rbac := env.kube.RbacV1()
	if _, err := rbac.Roles(cluster.ControllerNamespace).Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := rbac.RoleBindings(cluster.ControllerNamespace).Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = rbac.RoleBindings(cluster.ControllerNamespace).Delete(ctx, name, metav1.DeleteOptions{})
		_ = rbac.Roles(cluster.ControllerNamespace).Delete(ctx, name, metav1.DeleteOptions{})
	})
}

func isLeader(ctx context.Context, t *testing.T, p *cluster.ControllerProcess) bool {
	t.Helper()
	return controllerMetric(ctx, t, p, "uuid_controller_leader", nil) == 1
}

// waitLeader waits until exactly one of ps reports leading and returns it.
func waitLeader(ctx context.Context, t *testing.T, timeout time.Duration, ps ...*cluster.ControllerProcess) *cluster.ControllerProcess {
	t.Helper()
	var leaders []*cluster.ControllerProcess
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		leaders = nil
		for _, p := range ps {
			if isLeader(ctx, t, p) {
				leaders = append(leaders, p)
			}
		}
		if len(leaders) > 1 {
			t.Fatalf("%d replicas report leading at once", len(leaders))
		}
		return len(leaders) == 1, nil
	})
	if err != nil {
		t.Fatalf("no replica became leader within %s", timeout)
	}
	return leaders[0]
}

// startPair starts two replicas electing with the Lease named ns and
// returns them as leader and standby once one leads.
func startPair(ctx context.Context, t *testing.T, ns string, leaseDuration time.Duration) (leader, standby *cluster.ControllerProcess) {
	t.Helper()
	args := leaderArgs(ctx, t, ns, leaseDuration)
	a := framework.StartController(ctx, t, controllerAs(env.kubeconfig), ns, args...)
	b := framework.StartController(ctx, t, controllerAs(env.kubeconfig), ns, args...)
	if leader = waitLeader(ctx, t, 20*time.Second, a, b); leader == a {
		return a, b
	}
	return b, a
}

// writesOf reads p's status writes, waiting up to 5 s for them to reach want.
func writesOf(ctx context.Context, t *testing.T, p *cluster.ControllerProcess, want int) float64 {
	t.Helper()
	return metricReaches(ctx, t, p, "uuid_controller_status_writes_total", nil, float64(want))
}

// TestLeaderElection: of two replicas only the Lease holder writes; when it
// dies without releasing the Lease, the other takes over and new objects
// still get a UUID.
func TestLeaderElection(t *testing.T) {
	ctx := testCtx(t)
	ns := env.fw.NewNamespace(ctx, t)
	leader, standby := startPair(ctx, t, ns, 5*time.Second)
	_, holder, err := env.fw.LeaseHolder(ctx, cluster.ControllerNamespace, ns)
	if err != nil {
		t.Fatal(err)
	}
	if holder == "" {
		t.Fatal("a replica reports leading but the Lease has no holder")
	}

	first := env.fw.CreateUuids(ctx, t, ns, "first", 10)
	env.fw.WaitUUIDs(ctx, t, ns, first, 30*time.Second)
	if got := writesOf(ctx, t, leader, len(first)); got != float64(len(first)) {
		t.Errorf("leader sent %v status writes, want %d", got, len(first))
	}
	if got := writesOf(ctx, t, standby, 0); got != 0 {
		t.Errorf("standby sent %v status writes, want 0", got)
	}

	// SIGKILL: no release; the standby must wait out the lease.
	leader.Kill()
	if got := waitLeader(ctx, t, 30*time.Second, standby); got != standby {
		t.Fatal("standby did not take over")
	}
	if _, h, err := env.fw.LeaseHolder(ctx, cluster.ControllerNamespace, ns); err != nil {
		t.Fatal(err)
	} else if h == holder || h == "" {
		t.Errorf("Lease holder after takeover = %q, was %q", h, holder)
	}
	second := env.fw.CreateUuids(ctx, t, ns, "second", 10)
	env.fw.WaitUUIDs(ctx, t, ns, second, 30*time.Second)
	if got := writesOf(ctx, t, standby, len(second)); got != float64(len(second)) {
		t.Errorf("new leader sent %v status writes, want %d", got, len(second))
	}
	mustStayRunning(t, standby)
}

// TestSIGTERMReleasesLease: SIGTERM makes the leader exit 0 within a few
// seconds and release the Lease, so the next replica leads at once instead
// of after the lease duration.
func TestSIGTERMReleasesLease(t *testing.T) {
	ctx := testCtx(t)
	ns := env.fw.NewNamespace(ctx, t)
	// A long lease: a takeover within it proves the Lease was released.
	const leaseDuration = 60 * time.Second
	p := framework.StartController(ctx, t, controllerAs(env.kubeconfig), ns, leaderArgs(ctx, t, ns, leaseDuration)...)
	waitLeader(ctx, t, 20*time.Second, p)
	names := env.fw.CreateUuids(ctx, t, ns, "before-term", 3)
	env.fw.WaitUUIDs(ctx, t, ns, names, 30*time.Second)

	start := time.Now()
	if code := sigterm(t, p, 5*time.Second); code != 0 {
		t.Errorf("exit code after SIGTERM = %d, want 0", code)
	}
	t.Logf("exited %s after SIGTERM", time.Since(start).Round(time.Millisecond))
	if _, h, err := env.fw.LeaseHolder(ctx, cluster.ControllerNamespace, ns); err != nil {
		t.Fatal(err)
	} else if h != "" {
		t.Errorf("Lease still held by %q after SIGTERM", h)
	}

	next := framework.StartController(ctx, t, controllerAs(env.kubeconfig), ns, leaderArgs(ctx, t, ns, leaseDuration)...)
	waitLeader(ctx, t, 10*time.Second, next)
	more := env.fw.CreateUuids(ctx, t, ns, "after-term", 3)
	env.fw.WaitUUIDs(ctx, t, ns, more, 30*time.Second)
}

// TestLeaseLostExits: a leader that cannot renew its Lease (etcd down for
// longer than the renew deadline) stops and exits non-zero, saying why,
// instead of running on as a replica that never campaigns again; the
// standby, which never led, stays up and takes over once etcd is back.
func TestLeaseLostExits(t *testing.T) {
	ctx := testCtx(t)
	ns := env.fw.NewNamespace(ctx, t)
	leader, standby := startPair(ctx, t, ns, 4*time.Second)
	env.fw.WaitUUIDs(ctx, t, ns, env.fw.CreateUuids(ctx, t, ns, "before", 3), 30*time.Second)

	startEtcd := stopEtcd(t)
	code, err := leader.Wait(30 * time.Second)
	if err != nil {
		t.Fatalf("leader still running 30 s after etcd stopped (renew deadline 3 s): %v", err)
	}
	if code == 0 {
		t.Errorf("leader exited 0 after losing its lease, want non-zero")
	}
	if out := leader.Output(); !strings.Contains(out, "leader lease lost") {
		t.Errorf("leader's log does not say the lease was lost:\n%s", out)
	}
	mustStayRunning(t, standby)
	startEtcd(ctx)

	if got := waitLeader(ctx, t, time.Minute, standby); got != standby {
		t.Fatal("standby did not take over")
	}
	env.fw.WaitUUIDs(ctx, t, ns, createAfterOutage(ctx, t, ns, "after", 5), time.Minute)
	mustStayRunning(t, standby)
}

// TestLeaseLossStopsWritesFirst: the leader's Lease renewals fail (through
// a proxy) in the middle of a burst whose status writes the proxy holds
// for 3 s each, so some are always in flight. The old leader must cancel
// them when it stops leading: the audit log shows no write of the old
// leader (told apart by the User-Agent the proxy sets) after the new
// leader's first. Letting them finish, as a shutdown does, would land them
// while the new leader writes.
func TestLeaseLossStopsWritesFirst(t *testing.T) {
	ctx := testCtx(t)
	ns := env.fw.NewNamespace(ctx, t)
	const oldLeaderAgent = "uuid-controller-old-leader"
	var failRenewals atomic.Bool
	kubeconfig := apiProxy(t, func(w http.ResponseWriter, r *http.Request) bool {
		r.Header.Set("User-Agent", oldLeaderAgent)
		switch {
		case failRenewals.Load() && r.Method == http.MethodPut && strings.HasSuffix(r.URL.Path, "/leases/"+ns):
			http.Error(w, "renewals fail in this test", http.StatusInternalServerError)
			return true
		case isStatusPatch(r):
			// Read the body first: net/http notices a client that went away
			// (and cancels r's context) only once the body is read.
			body, err := io.ReadAll(r.Body)
			if err != nil {
				return true
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			select {
			case <-time.After(3 * time.Second):
				return false // forwarded
			case <-r.Context().Done():
				return true // cancelled by the controller: never sent on
			}
		}
		return false
	})
	history := env.fw.WatchUUIDs(ctx, t, ns)
	args := leaderArgs(ctx, t, ns, 4*time.Second)
	old := framework.StartController(ctx, t, controllerAs(kubeconfig), ns, args...)
	waitLeader(ctx, t, 20*time.Second, old)
	next := framework.StartController(ctx, t, controllerAs(env.kubeconfig), ns, args...)
	names := env.fw.CreateUuids(ctx, t, ns, "burst", 300)
	waitFirstAssignment(ctx, t, old)
	failRenewals.Store(true)

	if code, err := old.Wait(30 * time.Second); err != nil || code == 0 {
		t.Fatalf("old leader: exit code %d, %v; want non-zero within 30 s of failing renewals", code, err)
	}
	if got := waitLeader(ctx, t, 30*time.Second, next); got != next {
		t.Fatal("the standby did not take over")
	}
	ids := env.fw.WaitUUIDs(ctx, t, ns, names, 2*time.Minute)

	// Every status PATCH of the old leader's that reached the apiserver
	// counts, whatever its code: one cut off by its client is logged 504
	// even when it committed.
	var oldWrites, newWrites []time.Time
	for _, ev := range auditedStatusPatchEvents(t, ns) {
		switch {
		case ev.UserAgent == oldLeaderAgent:
			oldWrites = append(oldWrites, ev.RequestReceived)
		case ev.ResponseStatus.Code == http.StatusOK:
			newWrites = append(newWrites, ev.RequestReceived)
		}
	}
	if len(oldWrites) == 0 || len(newWrites) == 0 {
		t.Fatalf("%d writes by the old leader, %d by the new one: want both to have written", len(oldWrites), len(newWrites))
	}
	firstNew := slices.MinFunc(newWrites, time.Time.Compare)
	lastOld := slices.MaxFunc(oldWrites, time.Time.Compare)
	t.Logf("old leader: %d writes, the last at %s; new leader: %d writes, the first at %s",
		len(oldWrites), lastOld.Format(time.StampMicro), len(newWrites), firstNew.Format(time.StampMicro))
	if !lastOld.Before(firstNew) {
		late := 0
		for _, w := range oldWrites {
			if !w.Before(firstNew) {
				late++
			}
		}
		t.Errorf("the old leader wrote %d times after the new leader's first write (last %s after it)", late, lastOld.Sub(firstNew))
	}
	// The precondition still keeps each object to one UUID ever.
	history.CheckOnce(ctx, t, ids)
}
