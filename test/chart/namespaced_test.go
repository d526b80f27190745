package chart

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestChartWatchNamespaces: watchNamespaces renders, instead of the
// ClusterRole and its binding, the namespaced component's Role and a
// RoleBinding to the controller's ServiceAccount in each namespace listed,
// and --namespace with the list.
func TestChartWatchNamespaces(t *testing.T) {
	objs := byKey(t, render(t, "--set", "watchNamespaces={team-a,team-b}", "--set", "namespace.name=ops"))
	for k := range objs {
		if strings.HasSuffix(k, " /uuid-controller") {
			t.Errorf("%s rendered: watchNamespaces grants by Roles only", k)
		}
	}
	component := readObjects(t, "deploy/components/namespaced/role.yaml")
	var wantRules any
	for _, o := range component {
		if o.GetKind() == "Role" {
			wantRules = o.Object["rules"]
		}
	}
	for _, ns := range []string{"team-a", "team-b"} {
		role, ok := objs["rbac.authorization.k8s.io/v1 Role "+ns+"/uuid-controller"]
		if !ok {
			t.Fatalf("no Role %s/uuid-controller", ns)
		}
		if !reflect.DeepEqual(role.Object["rules"], wantRules) {
			t.Errorf("Role %s/uuid-controller rules %v, want deploy/components/namespaced's %v", ns, role.Object["rules"], wantRules)
		}
		b, ok := objs["rbac.authorization.k8s.io/v1 RoleBinding "+ns+"/uuid-controller"]
		if !ok {
			t.Fatalf("no RoleBinding %s/uuid-controller", ns)
		}
		subjects, _, _ := unstructured.NestedSlice(b.Object, "subjects")
		if len(subjects) != 1 || subjects[0].(map[string]any)["namespace"] != "ops" || subjects[0].(map[string]any)["name"] != "uuid-controller" {
			t.Errorf("RoleBinding %s/uuid-controller subjects %v, want the ServiceAccount ops/uuid-controller", ns, subjects)
		}
	}
	if got := args(t, deployment(t, objs)); !slices.Contains(got, "--namespace=team-a,team-b") {
		t.Errorf("args %q, want --namespace=team-a,team-b", got)
	}
}

// TestChartAggregateRoles: aggregateRoles.create renders
// deploy/aggregate-roles/roles.yaml, and the default renders none of it.
func TestChartAggregateRoles(t *testing.T) {
	for _, o := range render(t) {
		if strings.Contains(o.GetName(), "aggregate") {
			t.Errorf("%s rendered by default", key(o))
		}
	}
	for _, p := range compare(only(render(t, "--set", "aggregateRoles.create=true"), "aggregate"),
		readObjects(t, "deploy/aggregate-roles/roles.yaml"), "deploy/aggregate-roles/roles.yaml") {
		t.Error(p)
	}
}

// only keeps the objects whose name contains s.
func only(objs []*unstructured.Unstructured, s string) []*unstructured.Unstructured {
	return slices.DeleteFunc(objs, func(o *unstructured.Unstructured) bool { return !strings.Contains(o.GetName(), s) })
}

// TestChartNotesExampleInAWatchedNamespace: the notes' example object goes
// where the controller looks, the first namespace of watchNamespaces, and
// into default only when every namespace is watched.
func TestChartNotesExampleInAWatchedNamespace(t *testing.T) {
	for _, c := range []struct {
		set  []string
		want string
	}{
		{nil, "default"},
		{[]string{"--set", "watchNamespaces={team-a,team-b}"}, "team-a"},
	} {
		out, errOut, err := run(t, "helm", append([]string{"install", "uuid-controller", chartDir, "--dry-run=client", "-n", "ops", "--set", "namespace.name=ops"}, c.set...)...)
		if err != nil {
			t.Fatalf("helm install --dry-run %v: %v\n%s", c.set, err, errOut)
		}
		i := strings.Index(out, "NOTES:")
		if i < 0 {
			t.Fatalf("helm install --dry-run %v printed no notes:\n%s", c.set, out)
		}
		notes := out[i:]
		for _, w := range []string{"metadata: {name: example, namespace: " + c.want + "}", "kubectl -n " + c.want + " wait uuid/example"} {
			if !strings.Contains(notes, w) {
				t.Errorf("helm install %v: the notes do not say %q:\n%s", c.set, w, notes)
			}
		}
	}
}

// TestChartUUIDPolicy: the admission policy that keeps status.uuid to the
// controller is deploy/uuid-policy.yaml, rendered by default (every
// namespace watched, a cluster admin's install) and not with
// watchNamespaces (a namespace admin's, who may not create it), unless
// uuidPolicy.create says otherwise.
func TestChartUUIDPolicy(t *testing.T) {
	want := readObjects(t, "deploy/uuid-policy.yaml")
	for _, c := range []struct {
		set      []string
		rendered bool
	}{
		{nil, true},
		{[]string{"--set", "watchNamespaces={team-a}", "--set", "namespace.name=team-a"}, false},
		{[]string{"--set", "watchNamespaces={team-a}", "--set", "namespace.name=team-a", "--set", "uuidPolicy.create=true"}, true},
		{[]string{"--set", "uuidPolicy.create=false"}, false},
	} {
		got := only(render(t, c.set...), "uuid-controller-sets-uuids")
		if !c.rendered {
			for _, o := range got {
				t.Errorf("%v: %s rendered", c.set, key(o))
			}
			continue
		}
		for _, p := range compare(got, want, "deploy/uuid-policy.yaml") {
			t.Errorf("%v: %s", c.set, p)
		}
	}
}
