//go:build node

package node

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/demo-operator/uuid-controller/test/framework"
)

// The namespace admin the test installs as: Helm impersonates this user
// of this group, which holds only the built-in admin role, in one
// namespace.
const (
	teamAdmin  = "team-admin"
	teamAdmins = "team-admins"
)

// TestNamespaceAdminHelmInstall: docs/install.md#installing-into-one-namespace
// on the real node, as written. A cluster admin applies
// deploy/aggregate-roles once (the CRD is there) and binds the built-in
// admin role in one namespace to a group; a user of that group, holding
// nothing else, installs the chart there with --skip-crds and the
// documented values. RBAC refuses any cluster-scoped object, and any Role
// granting a verb the user lacks, so the install succeeding is the proof
// that none is needed. Both pods get Ready, one leads, and an object in
// that namespace gets its UUID written by the release's ServiceAccount
// (the cluster-wide install scaled to zero meanwhile); helm uninstall, as
// the same user, leaves the object and its UUID. The namespace goes at the
// end, with the release's Lease.
func TestNamespaceAdminHelmInstall(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	team := env.NewNamespace(ctx, t)
	t.Cleanup(func() { _ = env.Kube.CoreV1().Namespaces().Delete(context.Background(), team, metav1.DeleteOptions{}) })
	if out, err := env.cluster.Kubectl(ctx, "apply", "-f", "deploy/aggregate-roles/roles.yaml"); err != nil {
		t.Fatalf("kubectl apply -f deploy/aggregate-roles/roles.yaml: %v\n%s", err, out)
	}
	if out, err := env.cluster.Kubectl(ctx, "create", "rolebinding", "team-admins", "--clusterrole=admin",
		"--group="+teamAdmins, "-n", team); err != nil {
		t.Fatalf("kubectl create rolebinding: %v\n%s", err, out)
	}
	// The aggregation controller adds the Uuid rules to admin a moment
	// after the ClusterRoles exist.
	teamMay(ctx, t, team, authorizationv1.ResourceAttributes{Verb: "patch", Group: "demo.operator", Resource: "uuid", Subresource: "status"})
	if ok, err := env.Allowed(ctx, teamReview(team, authorizationv1.ResourceAttributes{Verb: "create", Group: "rbac.authorization.k8s.io", Resource: "clusterroles"})); err != nil || ok {
		t.Fatalf("%s may create ClusterRoles (%v): the test would prove nothing", teamAdmin, err)
	}

	// No controller but the release's in the namespace.
	scaleClusterWide(ctx, t, 0)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		scaleClusterWide(ctx, t, 2)
		if err := waitRolledOut(ctx); err != nil {
			t.Errorf("the cluster-wide install again: %v", err)
		}
	})

	asTeam := []string{"-n", team, "--kube-as-user", teamAdmin, "--kube-as-group", teamAdmins}
	install := append([]string{"install", release, chart, "--skip-crds", "--wait", "--timeout=5m",
		"--set", "namespace.create=false", "--set", "namespace.name=", "--set", "metrics.reader.create=false",
		"--set", "watchNamespaces={" + team + "}"}, imageValues()...)
	start := time.Now()
	if out, err := helm(ctx, append(install, asTeam...)...); err != nil {
		t.Fatalf("helm install as a namespace admin: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		_, _ = helm(context.Background(), append([]string{"uninstall", release, "--wait", "--ignore-not-found"}, asTeam...)...)
	})
	t.Logf("helm install as a namespace admin: Ready in %s", time.Since(start).Round(time.Millisecond))

	if err := framework.Poll(ctx, time.Minute, "the release's Lease to have a holder", func(ctx context.Context) error {
		lease, _, err := env.LeaseHolder(ctx, team, leaseName)
		if err != nil {
			return err
		}
		if h := holderPod(lease); !strings.HasPrefix(h, release+"-") {
			return fmt.Errorf("held by %q", h)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	names := env.CreateUuids(ctx, t, team, "obj", 3)
	ids := env.WaitUUIDs(ctx, t, team, names, time.Minute)
	writer := "system:serviceaccount:" + team + ":" + release
	evs, err := env.cluster.AuditEvents()
	if err != nil {
		t.Fatal(err)
	}
	writes := map[string][]string{}
	for _, ev := range evs {
		if ev.ObjectRef.Namespace == team && ev.ObjectRef.Subresource == "status" && ev.Verb == "patch" {
			writes[ev.ObjectRef.Name] = append(writes[ev.ObjectRef.Name], ev.User.Username)
		}
	}
	for _, name := range names {
		if w := writes[name]; len(w) != 1 || w[0] != writer {
			t.Errorf("%s: status patches by %v, want one by %s", name, w, writer)
		}
	}

	if out, err := helm(ctx, append([]string{"uninstall", release, "--wait"}, asTeam...)...); err != nil {
		t.Fatalf("helm uninstall as a namespace admin: %v\n%s", err, out)
	}
	for name, id := range env.WaitUUIDs(ctx, t, team, names, 10*time.Second) {
		if id != ids[name] {
			t.Errorf("%s: status.uuid %q after helm uninstall, was %q", name, id, ids[name])
		}
	}
	// The release's Lease outlives it (the chart does not own it); the
	// tests that follow look for Leases held by the controller's pods.
	if err := env.Kube.CoreV1().Namespaces().Delete(ctx, team, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitNamespaceGone(ctx, t, team)
}

// teamMay waits until the team's admin may do attrs in namespace.
func teamMay(ctx context.Context, t *testing.T, namespace string, attrs authorizationv1.ResourceAttributes) {
	t.Helper()
	if err := env.WaitAllowed(ctx, time.Minute, teamAdmin+" to be allowed "+attrs.Verb+" "+attrs.Resource+"/"+attrs.Subresource,
		teamReview(namespace, attrs)); err != nil {
		t.Fatal(err)
	}
}

// teamReview is the review of whether the team's admin may do attrs in
// namespace.
func teamReview(namespace string, attrs authorizationv1.ResourceAttributes) authorizationv1.SubjectAccessReviewSpec {
	attrs.Namespace = namespace
	return authorizationv1.SubjectAccessReviewSpec{User: teamAdmin, Groups: []string{teamAdmins, "system:authenticated"},
		ResourceAttributes: &attrs}
}

// scaleClusterWide scales deploy/'s Deployment to replicas and, for 0,
// waits until its pods are gone.
func scaleClusterWide(ctx context.Context, t *testing.T, replicas int) {
	t.Helper()
	if out, err := env.cluster.Kubectl(ctx, "scale", "deployment", deployName, "-n", ns, fmt.Sprintf("--replicas=%d", replicas)); err != nil {
		t.Fatalf("kubectl scale: %v\n%s", err, out)
	}
	if replicas != 0 {
		return
	}
	if err := framework.Poll(ctx, 2*time.Minute, "deploy/'s pods to be gone", func(ctx context.Context) error {
		pods, err := controllerPods(ctx)
		if err != nil {
			return err
		}
		if len(pods) != 0 {
			return fmt.Errorf("%d pods", len(pods))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
