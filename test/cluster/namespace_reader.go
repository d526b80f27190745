package cluster

import (
	"context"
	"fmt"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// NamespaceReaderRole is a test-only ClusterRole: get on namespaces. The
// tests run the cluster-wide install's identity with --namespace, to keep
// each test's objects apart, and --namespace reads each namespace it
// watches; deploy/rbac.yaml's ClusterRole no longer grants that, since
// the cluster-wide install never passes --namespace (the Roles-only
// install's Role grants it in its own namespace).
const NamespaceReaderRole = "uuid-controller-test-namespace-reader"

// GrantNamespaceReads binds NamespaceReaderRole to ServiceAccount
// namespace/name by a ClusterRoleBinding, which it returns the name of.
func (c *Cluster) GrantNamespaceReads(ctx context.Context, namespace, name string) (string, error) {
	cs, err := kubernetes.NewForConfig(c.AdminConfig())
	if err != nil {
		return "", err
	}
	rbac := cs.RbacV1()
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: NamespaceReaderRole},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"get"}}}}
	if _, err := rbac.ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", fmt.Errorf("cluster: create ClusterRole %s: %w", role.Name, err)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: NamespaceReaderRole + "-" + namespace + "-" + name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: namespace, Name: name}},
	}
	if _, err := rbac.ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", fmt.Errorf("cluster: create ClusterRoleBinding %s: %w", binding.Name, err)
	}
	return binding.Name, nil
}
