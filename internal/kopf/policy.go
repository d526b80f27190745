package kopf

import (
	"context"
	"errors"
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// PolicyName is the ValidatingAdmissionPolicy (deploy/kopf-migration/
// policy.yaml) that narrows the migration's patch grant on the objects to
// removing kopf's finalizer from an object being deleted.
const PolicyName = "uuid-controller-kopf-migration"

// ErrPolicyMissing: a change the policy must deny was allowed, so the
// patch grant is not bounded (the policy is not installed, does not match
// this ServiceAccount, or the cluster does not enforce it).
var ErrPolicyMissing = errors.New("the ValidatingAdmissionPolicy " + PolicyName +
	" does not bind this controller: a dry-run patch it must deny was allowed; apply deploy/kopf-migration/policy.yaml, matching this controller's ServiceAccount")

// ProbeLabel is the label the probe would add. A dry run: it is never
// written.
const ProbeLabel = "uuid-controller.demo.operator/admission-probe"

// Probe proves that the policy binds the caller: it asks, in a server-side
// dry run, to add a label to the object name, which the policy denies
// whatever the object's state. It returns nil when the apiserver denied it
// naming PolicyName, ErrPolicyMissing when it was allowed, and any other
// answer (no RBAC grant, the object gone, no apiserver) wrapped, proving
// nothing either way.
func Probe(ctx context.Context, patch Patcher, namespace, name, fieldManager string) error {
	err := patch(ctx, namespace, name, types.MergePatchType, []byte(`{"metadata":{"labels":{"`+ProbeLabel+`":"dry-run"}}}`),
		metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}, FieldManager: fieldManager})
	switch {
	case err == nil:
		return ErrPolicyMissing
	case deniedByPolicy(err):
		return nil
	}
	return fmt.Errorf("probing the admission policy %s with a dry-run patch of %s: %w", PolicyName, name, err)
}

// deniedByPolicy tells the apiserver's denial by PolicyName: 422 (the
// policy sets no reason) or 403, naming it as "ValidatingAdmissionPolicy
// 'NAME' with binding ... denied request".
func deniedByPolicy(err error) bool {
	return (apierrors.IsInvalid(err) || apierrors.IsForbidden(err)) &&
		strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+PolicyName+"'")
}
