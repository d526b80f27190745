package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
)

// DeniedMessage is what a RejectUUIDWrites policy says when it denies a write.
const DeniedMessage = "uuid writes are denied by the test"

// UUIDDenial is one way RejectUUIDWrites fails the controller's UUID write.
type UUIDDenial struct {
	Name   string
	Reason metav1.StatusReason
	// Retried: the controller retries the write with backoff (403).
	// Otherwise (422) it gives the object up until its next update.
	Retried bool
}

// UUIDDenials are a failure the controller retries and one it gives up.
var UUIDDenials = []UUIDDenial{
	{Name: "retried", Reason: metav1.StatusReasonForbidden, Retried: true},
	{Name: "rejected", Reason: metav1.StatusReasonInvalid},
}

// RetryAfterDenial makes the controller try ns/name again once writes are
// allowed: backoff does it for a retried denial, an update of the object
// (a label) for one it gave up.
func (c *Cluster) RetryAfterDenial(ctx context.Context, d UUIDDenial, ns, name string) error {
	if d.Retried {
		return nil
	}
	dyn, err := dynamic.NewForConfig(c.AdminConfig())
	if err != nil {
		return err
	}
	_, err = dyn.Resource(UuidGVR).Namespace(ns).Patch(ctx, name, types.MergePatchType,
		[]byte(`{"metadata":{"labels":{"retry":"1"}}}`), metav1.PatchOptions{})
	return err
}

// RejectUUIDWrites makes the apiserver deny every write of status.uuid to
// Uuid objects in namespace ns, with reason: Forbidden (403), which the
// controller retries, or Invalid (422), which it gives up until the
// object's next update. Status writes without a uuid, such as the
// controller's failure report, go through. It is a ValidatingAdmissionPolicy
// and its binding, named name; RejectUUIDWrites returns once the apiserver
// enforces them (a dry-run write is denied), and returns the function that
// removes them and returns once a write is allowed again. Call it before a
// controller watches ns: its probe object is created and deleted in ns.
func (c *Cluster) RejectUUIDWrites(ctx context.Context, name, ns string, reason metav1.StatusReason) (remove func(context.Context) error, err error) {
	cs, err := kubernetes.NewForConfig(c.AdminConfig())
	if err != nil {
		return nil, err
	}
	api := cs.AdmissionregistrationV1()
	fail := admissionv1.Fail
	policy := &admissionv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: &fail,
			MatchConstraints: &admissionv1.MatchResources{ResourceRules: []admissionv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionv1.RuleWithOperations{
					Operations: []admissionv1.OperationType{admissionv1.Update},
					Rule: admissionv1.Rule{
						APIGroups: []string{UuidGVR.Group}, APIVersions: []string{UuidGVR.Version},
						Resources: []string{UuidGVR.Resource + "/status"},
					},
				},
			}}},
			Validations: []admissionv1.Validation{{
				Expression: "!has(object.status) || !has(object.status.uuid)",
				Message:    DeniedMessage,
				Reason:     &reason,
			}},
		},
	}
	binding := &admissionv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        name,
			ValidationActions: []admissionv1.ValidationAction{admissionv1.Deny},
			MatchResources: &admissionv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{
				MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns},
			}},
		},
	}
	dyn, err := dynamic.NewForConfig(c.AdminConfig())
	if err != nil {
		return nil, err
	}
	uuids := dyn.Resource(UuidGVR).Namespace(ns)
	deny := func(ctx context.Context) error {
		return errors.Join(
			ignoreNotFound(api.ValidatingAdmissionPolicyBindings().Delete(ctx, name, metav1.DeleteOptions{})),
			ignoreNotFound(api.ValidatingAdmissionPolicies().Delete(ctx, name, metav1.DeleteOptions{})),
		)
	}
	remove = func(ctx context.Context) error {
		if err := deny(ctx); err != nil {
			return err
		}
		return probe(ctx, uuids, name+"-probe", "allowed", func(err error) bool { return err == nil })
	}
	if _, err := api.ValidatingAdmissionPolicies().Create(ctx, policy, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("cluster: create ValidatingAdmissionPolicy %s: %w", name, err)
	}
	if _, err := api.ValidatingAdmissionPolicyBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		return nil, errors.Join(fmt.Errorf("cluster: create ValidatingAdmissionPolicyBinding %s: %w", name, err), deny(ctx))
	}
	denied := func(err error) bool { return apierrors.ReasonForError(err) == reason }
	if err := probe(ctx, uuids, name+"-probe", "denied with "+string(reason), denied); err != nil {
		return nil, errors.Join(fmt.Errorf("cluster: policy %s: %w", name, err), deny(ctx))
	}
	return remove, nil
}

// probe creates a probe object and dry-runs a uuid write on it until the
// answer is what want accepts (a policy reaches the admission plugin
// through an informer, a moment after it is created or deleted), then
// deletes the probe.
func probe(ctx context.Context, uuids dynamic.ResourceInterface, name, what string, want func(error) bool) error {
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": UuidGVR.GroupVersion().String(), "kind": "Uuid",
		"metadata": map[string]any{"name": name},
	}}
	if _, err := uuids.Create(ctx, obj, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create probe %s: %w", name, err)
	}
	defer func() { _ = uuids.Delete(context.WithoutCancel(ctx), name, metav1.DeleteOptions{}) }()
	patch := []byte(`{"status":{"uuid":"00000000-0000-4000-8000-000000000000"}}`)
	var last error
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		// A controller watching the namespace may give the probe its UUID
		// first. That write went through admission, so it answers the
		// question; a dry run of another UUID would meet the CRD's
		// transition rule instead.
		if got, err := uuids.Get(ctx, name, metav1.GetOptions{}); err == nil {
			if id, _, _ := unstructured.NestedString(got.Object, "status", "uuid"); id != "" {
				last = nil
				return want(nil), nil
			}
		}
		_, last = uuids.Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}}, "status")
		return want(last), nil
	})
	if err != nil {
		return fmt.Errorf("a dry-run uuid write was not %s within 30 s (last error: %v): %w", what, last, err)
	}
	return nil
}

func ignoreNotFound(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}
