package kopf

import (
	"errors"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	k8stesting "k8s.io/client-go/testing"
)

// denial is the apiserver's answer when a policy without a reason denies a
// request, built as k8s.io/apiserver's validating dispatcher builds it.
func denial(policy string) error {
	err := apierrors.NewForbidden(schema.GroupResource{Group: "demo.operator", Resource: "uuid"}, "x",
		errors.New("ValidatingAdmissionPolicy '"+policy+"' with binding '"+policy+"' denied request: the uuid-controller ServiceAccount may only change Uuid objects being deleted"))
	err.ErrStatus.Reason = metav1.StatusReasonInvalid
	err.ErrStatus.Code = 422
	return err
}

func TestProbe(t *testing.T) {
	gvr := schema.GroupVersionResource{Group: "demo.operator", Version: "v1", Resource: "uuid"}
	for _, tc := range []struct {
		name    string
		apiErr  error
		wantErr func(error) bool
	}{
		{"denied by the policy: proven", denial(PolicyName), func(err error) bool { return err == nil }},
		{"allowed: missing", nil, func(err error) bool { return errors.Is(err, ErrPolicyMissing) }},
		{"denied by another policy: unproven", denial("someone-elses"), func(err error) bool {
			return err != nil && !errors.Is(err, ErrPolicyMissing) && strings.Contains(err.Error(), "probing the admission policy")
		}},
		{"no RBAC grant: unproven", apierrors.NewForbidden(gvr.GroupResource(), "x", errors.New("cannot patch")), func(err error) bool {
			return apierrors.IsForbidden(err) && !errors.Is(err, ErrPolicyMissing)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			obj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "demo.operator/v1", "kind": "Uuid",
				"metadata": map[string]any{"name": "x", "namespace": "ns"}}}
			client := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
				map[schema.GroupVersionResource]string{gvr: "UuidList"}, obj)
			var sent k8stesting.PatchActionImpl
			client.PrependReactor("patch", "uuid", func(a k8stesting.Action) (bool, runtime.Object, error) {
				sent = a.(k8stesting.PatchActionImpl)
				return true, obj, tc.apiErr
			})
			err := Probe(t.Context(), DynamicPatcher(client.Resource(gvr)), "ns", "x", "test")
			if !tc.wantErr(err) {
				t.Errorf("Probe = %v", err)
			}
			if !strings.Contains(string(sent.Patch), ProbeLabel) || len(sent.PatchOptions.DryRun) != 1 || sent.PatchOptions.DryRun[0] != metav1.DryRunAll {
				t.Errorf("sent patch %s with options %+v, want a dry run adding %s", sent.Patch, sent.PatchOptions, ProbeLabel)
			}
		})
	}
}
