package e2e

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/demo-operator/uuid-controller/test/cluster"
	"github.com/demo-operator/uuid-controller/test/framework"
)

// withoutRule returns a ServiceAccount kubeconfig whose ClusterRole is
// deploy/rbac.yaml's, as installed, less the rule for resource.
func withoutRule(t *testing.T, name, resource string) string {
	t.Helper()
	ctx := testCtx(t)
	rbac := env.kube.RbacV1()
	full, err := rbac.ClusterRoles().Get(ctx, "uuid-controller", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}}
	for _, r := range full.Rules {
		if !slices.Contains(r.Resources, resource) {
			role.Rules = append(role.Rules, r)
		}
	}
	if len(role.Rules) != len(full.Rules)-1 {
		t.Fatalf("expected exactly one %s rule in ClusterRole uuid-controller, rules: %v", resource, full.Rules)
	}
	if _, err := rbac.ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Cluster-wide objects outlive the test's namespace: remove them, and
	// any "-granted" binding the test adds, so the test can run again.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = rbac.ClusterRoles().Delete(ctx, name, metav1.DeleteOptions{})
		_ = rbac.ClusterRoleBindings().Delete(ctx, name, metav1.DeleteOptions{})
		_ = rbac.ClusterRoleBindings().Delete(ctx, name+"-granted", metav1.DeleteOptions{})
	})
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: cluster.ControllerNamespace, Name: name}},
	}
	if _, err := rbac.ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	kc, err := env.cluster.ServiceAccountKubeconfig(ctx, cluster.ControllerNamespace, name)
	if err != nil {
		t.Fatal(err)
	}
	// The tests' --namespace reads the namespace, as for env.kubeconfig.
	reads, err := env.cluster.GrantNamespaceReads(ctx, cluster.ControllerNamespace, name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = rbac.ClusterRoleBindings().Delete(ctx, reads, metav1.DeleteOptions{})
	})
	return kc
}

// grantFull binds withoutRule's ServiceAccount name to the shipped
// ClusterRole as well (the binding name-granted, which withoutRule's
// cleanup removes).
func grantFull(ctx context.Context, t *testing.T, name string) {
	t.Helper()
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-granted"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "uuid-controller"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: cluster.ControllerNamespace, Name: name}},
	}
	if _, err := env.kube.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestForbiddenStatusPatch: without permission to patch uuid/status the
// controller says so clearly (a Warning Event on the object, an error log,
// a metric), keeps retrying with capped backoff instead of hot-looping or
// giving up, and stays up; once the permission is granted, the object gets
// its UUID on the next retry, with no restart and no update of the object.
func TestForbiddenStatusPatch(t *testing.T) {
	ctx := testCtx(t)
	ns := env.fw.NewNamespace(ctx, t)
	const sa = "uuid-controller-no-status"
	kc := withoutRule(t, sa, "uuid/status")
	const maxDelay = time.Second
	p := framework.StartController(ctx, t, controllerAs(kc), ns, "--error-after", "3", "--max-retry-delay", maxDelay.String())
	env.fw.CreateUuids(ctx, t, ns, "denied", 1)

	warning := waitWarning(ctx, t, ns, "denied-0", "UUIDFailed")
	if !strings.Contains(warning.Message, "forbidden") || !strings.Contains(warning.Message, "uuid/status") {
		t.Errorf("Warning event message %q does not say that patching uuid/status is forbidden", warning.Message)
	}
	t.Logf("event: %s %s: %s", warning.Type, warning.Reason, warning.Message)

	// Still retrying, at the capped pace: once the backoff has reached
	// --max-retry-delay (after about 1.3 s), one PATCH per delay, the
	// failure having been reported already. A hot loop would show as far
	// more; the default 1 min cap as at most one (attempts 12 and 13 come
	// 10 s and 20 s in). Counted on the apiserver's clock, from the audit
	// log: the forbidden PATCHes received in the window from 8 s to 14 s
	// after the first, read once one has come after it (the controller
	// sends them one at a time, so all before it are logged by then).
	const skip, window = 8 * time.Second, 6 * time.Second
	var first, last time.Time
	tries := 0
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		var received []time.Time
		for _, ev := range auditedStatusPatchEvents(t, ns) {
			if ev.ResponseStatus.Code == 403 {
				received = append(received, ev.RequestReceived)
			}
		}
		if len(received) == 0 {
			return false, nil
		}
		first, last = received[0], received[len(received)-1]
		from, to := first.Add(skip), first.Add(skip+window)
		if !last.After(to) {
			return false, nil
		}
		tries = 0
		for _, r := range received {
			if !r.Before(from) && r.Before(to) {
				tries++
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("no forbidden status write came %s after the first (%s); the last came %s after it",
			skip+window, first.Format(time.RFC3339Nano), last.Sub(first))
	}
	if perDelay := int(window / maxDelay); tries < perDelay/2 || tries > perDelay+2 {
		t.Errorf("%d forbidden status writes in %s with --max-retry-delay %s, want %d to %d",
			tries, window, maxDelay, perDelay/2, perDelay+2)
	}
	t.Logf("%d forbidden status writes in %s", tries, window)
	if out := p.Output(); !strings.Contains(out, "forbidden") {
		t.Errorf("controller log does not mention forbidden:\n%s", out)
	}
	if d := controllerMetric(ctx, t, p, "uuid_controller_dropped_total", nil); d != 0 {
		t.Errorf("dropped_total = %v, want 0: a missing grant is retried, not given up", d)
	}
	if _, id := env.fw.Status(ctx, t, ns, "denied-0"); id != "" {
		t.Errorf("status.uuid = %q without permission to write it", id)
	}
	mustStayRunning(t, p)

	// Grant the full role; a retry within --max-retry-delay of the grant
	// reaching the authorizer assigns the UUID.
	grantFull(ctx, t, sa)
	env.fw.WaitUUIDs(ctx, t, ns, []string{"denied-0"}, 30*time.Second)
	if d := metricReaches(ctx, t, p, "uuid_controller_uuids_assigned_total", nil, 1); d != 1 {
		t.Errorf("uuids_assigned_total = %v, want 1", d)
	}
	// Retrying has stopped, so the metric can be held against the audit log.
	failures := controllerMetric(ctx, t, p, "uuid_controller_patch_failures_total",
		func(l map[string]string) bool { return l["reason"] == "Forbidden" })
	if denied := auditedStatusPatches(t, ns, 403); failures != float64(denied) {
		t.Errorf("patch_failures_total{reason=Forbidden} = %v, the apiserver answered %d with 403", failures, denied)
	}
}

// TestNoEventPermission: Events are a courtesy; without permission to post
// them (a stricter ClusterRole) UUIDs are still assigned and failures still
// retried, and the controller says in its log why its Events are missing.
func TestNoEventPermission(t *testing.T) {
	ctx := testCtx(t)
	ns := env.fw.NewNamespace(ctx, t)
	kc := withoutRule(t, "uuid-controller-no-events", "events")
	// --event-level Normal: every assignment tries to post an Event.
	p := framework.StartController(ctx, t, controllerAs(kc), ns, "--event-level", "Normal")
	env.fw.WaitUUIDs(ctx, t, ns, env.fw.CreateUuids(ctx, t, ns, "quiet", 5), 30*time.Second)
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		out := p.Output()
		// klog quotes the error, so its own quotes come escaped.
		return strings.Contains(out, "Server rejected event") && strings.Contains(out, `cannot create resource \"events\"`), nil
	})
	if err != nil {
		t.Fatalf("the log does not say that posting Events is forbidden:\n%s", p.Output())
	}
	mustStayRunning(t, p)
}

// TestClusterWideReadsNoNamespace: the cluster-wide install's grant,
// deploy/rbac.yaml's ClusterRole and nothing else, reads no namespace
// (only --namespace reads them, which that install never passes), and a
// controller run with it as deployed, watching every namespace, gets ready
// and assigns UUIDs.
func TestClusterWideReadsNoNamespace(t *testing.T) {
	ctx := testCtx(t)
	ns := env.fw.NewNamespace(ctx, t)
	const sa = "uuid-controller-as-shipped"
	rbac := env.kube.RbacV1()
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: sa},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "uuid-controller"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: cluster.ControllerNamespace, Name: sa}},
	}
	if _, err := rbac.ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = rbac.ClusterRoleBindings().Delete(ctx, sa, metav1.DeleteOptions{})
	})
	kc, err := env.cluster.ServiceAccountKubeconfig(ctx, cluster.ControllerNamespace, sa)
	if err != nil {
		t.Fatal(err)
	}
	user := "system:serviceaccount:" + cluster.ControllerNamespace + ":" + sa
	for _, target := range []string{ns, cluster.ControllerNamespace, "kube-system"} {
		allowed, err := env.fw.Allowed(ctx, authorizationv1.SubjectAccessReviewSpec{User: user,
			ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "get", Resource: "namespaces", Name: target, Namespace: target}})
		if err != nil {
			t.Fatal(err)
		}
		if allowed {
			t.Errorf("the cluster-wide install's ServiceAccount may get namespace %s, want no namespace read", target)
		}
	}
	p := framework.StartController(ctx, t, controllerAs(kc), "")
	env.fw.WaitUUIDs(ctx, t, ns, env.fw.CreateUuids(ctx, t, ns, "shipped", 3), 30*time.Second)
	mustStayRunning(t, p)
}
