package e2e

import (
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/demo-operator/uuid-controller/test/cluster"
)

// withoutStatusPatch returns a ServiceAccount kubeconfig whose ClusterRole
// is deploy/rbac.yaml's, as installed, less the uuid/status rule.
func withoutStatusPatch(t *testing.T, name string) string {
	t.Helper()
	ctx := testCtx(t)
	rbac := env.kube.RbacV1()
	full, err := rbac.ClusterRoles().Get(ctx, "uuid-controller", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}}
	for _, r := range full.Rules {
		if !slices.Contains(r.Resources, "uuid/status") {
			role.Rules = append(role.Rules, r)
		}
	}
	if len(role.Rules) != len(full.Rules)-1 {
		t.Fatalf("expected exactly one uuid/status rule in ClusterRole uuid-controller, rules: %v", full.Rules)
	}
	if _, err := rbac.ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
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
	return kc
}

// TestForbiddenStatusPatch: without permission to patch uuid/status the
// controller says so clearly (a Warning Event on the object, an error log,
// a metric), retries a bounded number of times with backoff and stays up;
// once the permission is granted, the next update of the object gets its
// UUID.
func TestForbiddenStatusPatch(t *testing.T) {
	ctx := testCtx(t)
	ns := newNamespace(ctx, t)
	const sa = "uuid-controller-no-status"
	kc := withoutStatusPatch(t, sa)
	const maxRetries = 3
	p := startControllerAs(ctx, t, kc, ns, "--max-retries", "3")
	createUuids(ctx, t, ns, "denied", 1)

	var warning *corev1.Event
	for deadline := time.Now().Add(30 * time.Second); warning == nil; {
		for _, e := range events(ctx, t, ns, "denied-0") {
			if e.Type == corev1.EventTypeWarning && e.Reason == "UUIDFailed" {
				warning = &e
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("no Warning event UUIDFailed on the object within 30 s")
		}
		time.Sleep(200 * time.Millisecond)
	}
	if !strings.Contains(warning.Message, "forbidden") || !strings.Contains(warning.Message, "uuid/status") {
		t.Errorf("Warning event message %q does not say that patching uuid/status is forbidden", warning.Message)
	}
	t.Logf("event: %s %s: %s", warning.Type, warning.Reason, warning.Message)

	// Bounded: each try is one PATCH, plus one to record the error.
	attempts := auditedStatusPatches(t, ns, 403)
	if attempts < 1 || attempts > maxRetries+2 {
		t.Errorf("%v forbidden status writes, want between 1 and %d", attempts, maxRetries+2)
	}
	time.Sleep(quiet)
	if again := auditedStatusPatches(t, ns, 403); again != attempts {
		t.Errorf("still retrying after giving up: %v forbidden writes, then %v", attempts, again)
	}
	failures := controllerMetric(ctx, t, p, "uuid_controller_patch_failures_total",
		func(l map[string]string) bool { return l["reason"] == "Forbidden" })
	if failures != float64(attempts) {
		t.Errorf("patch_failures_total{reason=Forbidden} = %v, the apiserver saw %v", failures, attempts)
	}
	if d := controllerMetric(ctx, t, p, "uuid_controller_dropped_total", nil); d != 1 {
		t.Errorf("dropped_total = %v, want 1", d)
	}
	if out := p.Output(); !strings.Contains(out, "forbidden") {
		t.Errorf("controller log does not mention forbidden:\n%s", out)
	}
	if _, id := status(ctx, t, ns, "denied-0"); id != "" {
		t.Errorf("status.uuid = %q without permission to write it", id)
	}
	mustStayRunning(t, p)

	// Grant the full role; an update of the object retries it.
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: sa + "-granted"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "uuid-controller"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: cluster.ControllerNamespace, Name: sa}},
	}
	if _, err := env.kube.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// RBAC changes reach the authorizer through its own informer.
	deadline := time.Now().Add(30 * time.Second)
	for i := 0; ; i++ {
		patch := `{"metadata":{"labels":{"retry":"` + string(rune('a'+i%26)) + `"}}}`
		if _, err := uuids(ns).Patch(ctx, "denied-0", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		if _, id := status(ctx, t, ns, "denied-0"); id != "" || time.Now().After(deadline) {
			break
		}
	}
	waitUUIDs(ctx, t, ns, []string{"denied-0"}, time.Second)
}
