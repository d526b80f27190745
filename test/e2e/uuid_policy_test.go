package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/demo-operator/uuid-controller/test/cluster"
	"github.com/demo-operator/uuid-controller/test/framework"
)

// uuidPolicy is deploy/uuid-policy.yaml's policy and binding name; denials
// name it.
const uuidPolicy = "uuid-controller-sets-uuids"

// uuidPolicyRule is the policy's message, which a denial carries.
const uuidPolicyRule = "status.uuid is set only by uuid-controller"

// useUUIDPolicy applies the policy and binding among objs (as shipped),
// the binding narrowed to namespaces so that no other test's writes meet
// it, removes both when the test ends, and waits until the apiserver
// enforces it in the first namespace. Both are renamed with the first
// namespace as a suffix: the apiserver reads policies and bindings apart,
// so a policy of the same name that an earlier test just deleted could
// still be dropped after this one's first denial.
func useUUIDPolicy(ctx context.Context, t *testing.T, objs []*unstructured.Unstructured, namespaces ...string) {
	t.Helper()
	var policy []*unstructured.Unstructured
	name := uuidPolicy + "-" + namespaces[0]
	for _, o := range objs {
		if o.GetName() != uuidPolicy {
			continue
		}
		o = o.DeepCopy()
		o.SetName(name)
		if o.GetKind() == "ValidatingAdmissionPolicyBinding" {
			if err := unstructured.SetNestedField(o.Object, name, "spec", "policyName"); err != nil {
				t.Fatal(err)
			}
			values := make([]any, len(namespaces))
			for i, ns := range namespaces {
				values[i] = ns
			}
			sel := map[string]any{"matchExpressions": []any{map[string]any{
				"key": "kubernetes.io/metadata.name", "operator": "In", "values": values}}}
			if err := unstructured.SetNestedField(o.Object, sel, "spec", "matchResources", "namespaceSelector"); err != nil {
				t.Fatal(err)
			}
		}
		policy = append(policy, o)
	}
	if len(policy) != 2 {
		t.Fatalf("%d objects named %s, want the policy and its binding", len(policy), uuidPolicy)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		vap := env.kube.AdmissionregistrationV1()
		_ = vap.ValidatingAdmissionPolicyBindings().Delete(ctx, name, metav1.DeleteOptions{})
		_ = vap.ValidatingAdmissionPolicies().Delete(ctx, name, metav1.DeleteOptions{})
	})
	applyObjects(ctx, t, policy)
	// A dry run of a user's first UUID on an object of its own: denied
	// once the apiserver has loaded the policy.
	const probe = "policy-probe"
	ns := namespaces[0]
	createBare(ctx, t, ns, probe)
	err := framework.Poll(ctx, 30*time.Second, "the policy enforced", func(ctx context.Context) error {
		_, err := env.fw.Uuids(ns).Patch(ctx, probe, types.MergePatchType, []byte(`{"status":{"uuid":"`+uuid.NewString()+`"}}`),
			metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}}, "status")
		if !isPolicyDenial(err) {
			return fmt.Errorf("a user's first UUID (dry run): %v, want 403 from %s", err, name)
		}
		return nil
	})
	if err != nil {
		// Either not loaded yet or not refusing: the checks that follow
		// tell which writes got through.
		t.Errorf("the policy never refused a user's first UUID: %v", err)
	}
}

// isPolicyDenial tells whether err is the policy's refusal: 403, naming
// the policy and its rule.
func isPolicyDenial(err error) bool {
	return apierrors.IsForbidden(err) && strings.Contains(err.Error(), uuidPolicy) && strings.Contains(err.Error(), uuidPolicyRule)
}

// dynamicFor is a dynamic client from kubeconfig, acting as user when set
// (impersonation, as kubectl --as).
func dynamicFor(t *testing.T, kubeconfig, user string) dynamic.Interface {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return dyn
}

// statusEditor is a ServiceAccount in ns holding edit there (what the
// built-in ClusterRole aggregates, as namespaceAdmin binds admin's) and a
// Role of its own that grants every write of uuid/status.
func statusEditor(ctx context.Context, t *testing.T, ns string) dynamic.Interface {
	t.Helper()
	const name = "status-editor"
	kc, err := env.cluster.ServiceAccountKubeconfig(ctx, ns, name)
	if err != nil {
		t.Fatal(err)
	}
	rbac := env.kube.RbacV1()
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "uuid-status-writer", Namespace: ns},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"demo.operator"}, Resources: []string{"uuid/status"}, Verbs: []string{"get", "patch", "update"}}}}
	if _, err := rbac.Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	refs := []rbacv1.RoleRef{{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name}}
	for _, r := range []string{"system:aggregate-to-edit", "system:aggregate-to-view", "uuid-controller-aggregate-to-edit", "uuid-controller-aggregate-to-view"} {
		refs = append(refs, rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: r})
	}
	for _, ref := range refs {
		b := &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: strings.ReplaceAll(name+"-"+ref.Name, ":", "-"), Namespace: ns},
			RoleRef:    ref,
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: name}},
		}
		if _, err := rbac.RoleBindings(ns).Create(ctx, b, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return dynamicFor(t, kc, "")
}

// statusWrites are the ways a client writes status.uuid of ns/name to id:
// merge patch, JSON patch, PUT of /status and server-side apply.
func statusWrites(ctx context.Context, dyn dynamic.Interface, ns, name, id string) map[string]func() error {
	uuids := dyn.Resource(cluster.UuidGVR).Namespace(ns)
	return map[string]func() error{
		"merge patch": func() error {
			_, err := uuids.Patch(ctx, name, types.MergePatchType, []byte(`{"status":{"uuid":"`+id+`"}}`), metav1.PatchOptions{}, "status")
			return err
		},
		"JSON patch": func() error {
			_, err := uuids.Patch(ctx, name, types.JSONPatchType, []byte(`[{"op":"add","path":"/status/uuid","value":"`+id+`"}]`), metav1.PatchOptions{}, "status")
			return err
		},
		"PUT of /status": func() error {
			u, err := uuids.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if err := unstructured.SetNestedField(u.Object, id, "status", "uuid"); err != nil {
				return err
			}
			_, err = uuids.UpdateStatus(ctx, u, metav1.UpdateOptions{})
			return err
		},
		"server-side apply": func() error {
			apply := `{"apiVersion":"demo.operator/v1","kind":"Uuid","metadata":{"name":"` + name + `"},"status":{"uuid":"` + id + `"}}`
			force := true
			_, err := uuids.Patch(ctx, name, types.ApplyPatchType, []byte(apply), metav1.PatchOptions{FieldManager: "setter", Force: &force}, "status")
			return err
		},
	}
}

// refusedSet checks that user's every way of giving ns/name, which has no
// UUID, a first one is refused by the policy (or, for a verb the user's
// role lacks, by RBAC: admin may patch uuid/status, not update it), and
// that none landed. It returns how many the policy refused.
func refusedSet(ctx context.Context, t *testing.T, user string, dyn dynamic.Interface, ns, name string) int {
	t.Helper()
	denied := 0
	for what, write := range statusWrites(ctx, dyn, ns, name, uuid.NewString()) {
		switch err := write(); {
		case isPolicyDenial(err):
			denied++
		case apierrors.IsForbidden(err) && strings.Contains(err.Error(), `cannot update resource "uuid/status"`):
			t.Logf("%s may not %s (RBAC): %v", user, what, err)
		default:
			t.Errorf("%s setting %s's UUID by %s: err = %v, want 403 from %s: %q", user, name, what, err, uuidPolicy, uuidPolicyRule)
		}
	}
	if denied == 0 {
		t.Errorf("%s: no write of %s's UUID reached the policy", user, name)
	}
	if _, id := env.fw.Status(ctx, t, ns, name); id != "" {
		t.Errorf("%s set %s's UUID to %s", user, name, id)
	}
	return denied
}

// refusedSwapThenClear checks that user may not swap ns/name's UUID
// (crd.yaml's rule) nor, once it removed it, give it another (the
// policy's), and that the removal itself, the documented reset, goes
// through.
func refusedSwapThenClear(ctx context.Context, t *testing.T, user string, dyn dynamic.Interface, ns, name string) {
	t.Helper()
	_, first := env.fw.Status(ctx, t, ns, name)
	if first == "" {
		t.Fatalf("%s has no UUID to swap", name)
	}
	other := uuid.NewString()
	if err := statusWrites(ctx, dyn, ns, name, other)["merge patch"](); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "cannot be changed to another UUID") {
		t.Errorf("%s swapping %s's UUID: err = %v, want 422 naming crd.yaml's rule", user, name, err)
	}
	uuids := dyn.Resource(cluster.UuidGVR).Namespace(ns)
	if _, err := uuids.Patch(ctx, name, types.MergePatchType, []byte(`{"status":{"uuid":null}}`), metav1.PatchOptions{}, "status"); err != nil {
		t.Fatalf("%s removing %s's UUID (the documented reset): %v", user, name, err)
	}
	for _, id := range []string{other, first} {
		if err := statusWrites(ctx, dyn, ns, name, id)["merge patch"](); !isPolicyDenial(err) {
			t.Errorf("%s setting %s's UUID to %s after removing it: err = %v, want 403 from %s", user, name, id, err, uuidPolicy)
		}
	}
	if _, id := env.fw.Status(ctx, t, ns, name); id != "" {
		t.Errorf("%s gave %s the UUID %s after removing it", user, name, id)
	}
}

// refusedThroughObject checks that status written through the object
// itself (create and update, which the status subresource makes drop
// status) gives it no UUID.
func refusedThroughObject(ctx context.Context, t *testing.T, user string, dyn dynamic.Interface, ns, name string) {
	t.Helper()
	uuids := dyn.Resource(cluster.UuidGVR).Namespace(ns)
	u := framework.NewUuid(name)
	u.Object["status"] = map[string]any{"uuid": uuid.NewString()}
	if _, err := uuids.Create(ctx, u, metav1.CreateOptions{}); err != nil && !isPolicyDenial(err) {
		t.Fatalf("%s creating %s: %v", user, name, err)
	}
	if _, err := uuids.Patch(ctx, name, types.MergePatchType, []byte(`{"status":{"uuid":"`+uuid.NewString()+`"}}`), metav1.PatchOptions{}); err != nil && !isPolicyDenial(err) {
		t.Fatalf("%s patching %s: %v", user, name, err)
	}
	if _, id := env.fw.Status(ctx, t, ns, name); id != "" {
		t.Errorf("%s gave %s the UUID %s through the object itself", user, name, id)
	}
}

// TestOnlyControllerSetsUUID: with the cluster-wide install's admission
// policy (as make build-installer renders it), the cluster admin, a user
// holding admin in the namespace and one holding edit and a Role for every
// write of uuid/status may neither give an object its first UUID, by any
// write, nor swap one, nor give another after removing it: each is refused
// naming the rule. Removing one goes through, and the controller (its
// ServiceAccount) assigns the first UUIDs and new ones after a removal.
func TestOnlyControllerSetsUUID(t *testing.T) {
	ctx := testCtx(t)
	root := framework.RepoRoot(t)
	ns := env.fw.NewNamespace(ctx, t)
	_, objs := installer(t, root, "uuid-controller:dev")
	useUUIDPolicy(ctx, t, objs, ns)
	users := []struct {
		who, object string
		dyn         dynamic.Interface
	}{
		{"the cluster admin", "by-cluster-admin", env.dyn},
		{"admin", "by-admin", dynamicFor(t, namespaceAdmin(ctx, t, root, ns), "")},
		{"edit and a status role", "by-status-editor", statusEditor(ctx, t, ns)},
	}
	var names []string
	denied := 0
	for _, u := range users {
		createBare(ctx, t, ns, u.object)
		denied += refusedSet(ctx, t, u.who, u.dyn, ns, u.object)
		refusedThroughObject(ctx, t, u.who, u.dyn, ns, u.object+"-object")
		names = append(names, u.object, u.object+"-object")
	}

	p := framework.StartController(ctx, t, controllerAs(env.kubeconfig), ns)
	first := env.fw.WaitUUIDs(ctx, t, ns, names, 30*time.Second)
	// Stopped, so that no assignment races the users' writes after a removal.
	if code, _ := p.Stop(); code != 0 {
		t.Fatalf("controller exit code %d", code)
	}
	for _, u := range users {
		refusedSwapThenClear(ctx, t, u.who, u.dyn, ns, u.object)
	}
	framework.StartController(ctx, t, controllerAs(env.kubeconfig), ns)
	again := env.fw.WaitUUIDs(ctx, t, ns, names, 30*time.Second)
	for _, u := range users {
		if again[u.object] == first[u.object] {
			t.Errorf("%s kept its UUID %s across its removal", u.object, first[u.object])
		}
	}
	t.Logf("%d first UUIDs refused by the policy; the audit log holds %d status patches in %s refused with 403", denied, auditedStatusPatches(t, ns, 403), ns)
}

// TestOnlyControllerSetsUUIDRolesOnly: the Roles-only install
// (docs/install.md), applied by the namespace admin once a cluster admin
// applied deploy/uuid-policy.yaml. The namespace admin, even after binding
// the controller's Role to themselves, may not set or swap a UUID; the
// controller assigns them. What the namespace admin can do is act as the
// controller's ServiceAccount (admin and edit may impersonate the
// ServiceAccounts of their namespace): in that namespace this sets a UUID
// (docs/security.md says so), and in another namespace RBAC refuses it.
func TestOnlyControllerSetsUUIDRolesOnly(t *testing.T) {
	ctx := testCtx(t)
	root := framework.RepoRoot(t)
	in := installNamespaced(ctx, t)
	other := env.fw.NewNamespace(ctx, t)
	policyObjs, err := cluster.ReadObjects(filepath.Join(root, "deploy", "uuid-policy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	useUUIDPolicy(ctx, t, policyObjs, in.ns, other)

	kc, err := env.cluster.ServiceAccountKubeconfig(ctx, in.ns, "namespace-admin")
	if err != nil {
		t.Fatal(err)
	}
	admin := dynamicFor(t, kc, "")
	// The namespace admin binds the controller's Role, which holds the
	// status verb, to themselves: RBAC allows it, as it must for the
	// install.
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "uuid-controller-for-me", Namespace: in.ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "uuid-controller"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: in.ns, Name: "namespace-admin"}},
	}
	if _, err := saClientset(ctx, t, in.ns, "namespace-admin").RbacV1().RoleBindings(in.ns).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
		t.Fatalf("the namespace admin binding the controller's Role to themselves: %v", err)
	}
	const user = "the namespace admin"
	createBare(ctx, t, in.ns, "mine")
	t.Logf("%d first UUIDs refused by the policy", refusedSet(ctx, t, user, admin, in.ns, "mine"))
	refusedThroughObject(ctx, t, user, admin, in.ns, "mine-object")

	p := in.start(ctx, t)
	env.fw.WaitUUIDs(ctx, t, in.ns, []string{"mine", "mine-object"}, time.Minute)
	if code, _ := p.Stop(); code != 0 {
		t.Fatalf("controller exit code %d", code)
	}
	refusedSwapThenClear(ctx, t, user, admin, in.ns, "mine")

	// Acting as the controller's ServiceAccount.
	asController := dynamicFor(t, kc, in.user)
	if err := statusWrites(ctx, asController, in.ns, "mine", uuid.NewString())["merge patch"](); err != nil {
		t.Errorf("the namespace admin as %s setting a UUID in its own namespace: %v, want it allowed (the documented limit)", in.user, err)
	}
	createBare(ctx, t, other, "theirs")
	if err := statusWrites(ctx, asController, other, "theirs", uuid.NewString())["merge patch"](); !apierrors.IsForbidden(err) || isPolicyDenial(err) {
		t.Errorf("the namespace admin as %s setting a UUID in namespace %s: %v, want 403 from RBAC", in.user, other, err)
	}
	if _, id := env.fw.Status(ctx, t, other, "theirs"); id != "" {
		t.Errorf("%s/theirs got the UUID %s from another namespace's controller ServiceAccount", other, id)
	}
}
