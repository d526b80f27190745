package e2e

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/demo-operator/uuid-controller/test/cluster"
	"github.com/demo-operator/uuid-controller/test/framework"
)

// kopfProofTTL is the bound the controller states (policyProofTTL in
// internal/kopf/gate.go): no finalizer removal starts more than this long after
// the apiserver stops enforcing the migration's admission policy.
const kopfProofTTL = 3 * time.Second

// TestKopfPolicyChangedAfterStart: with the policy proven at start and a
// removal done, the policy is then deleted, its binding deleted, or its
// validationActions set to Warn. Once the apiserver no longer denies the
// ServiceAccount's label patch and the stated bound has passed, an object
// deleted with kopf's finalizer keeps it: the controller's dry-run probe
// of that object is allowed (audit log), it writes nothing to it, and
// /readyz and uuid_controller_kopf_policy_bound say the policy is gone.
func TestKopfPolicyChangedAfterStart(t *testing.T) {
	vap := func() (policies, bindings interface {
		Delete(context.Context, string, metav1.DeleteOptions) error
	}) {
		a := env.kube.AdmissionregistrationV1()
		return a.ValidatingAdmissionPolicies(), a.ValidatingAdmissionPolicyBindings()
	}
	const policyName = "uuid-controller-kopf-migration"
	for _, tc := range []struct {
		name   string
		change func(ctx context.Context) error
	}{
		{"policy deleted", func(ctx context.Context) error {
			p, _ := vap()
			return p.Delete(ctx, policyName, metav1.DeleteOptions{})
		}},
		{"binding deleted", func(ctx context.Context) error {
			_, b := vap()
			return b.Delete(ctx, policyName, metav1.DeleteOptions{})
		}},
		{"validationActions Warn", func(ctx context.Context) error {
			_, err := env.kube.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Patch(ctx, policyName,
				types.MergePatchType, []byte(`{"spec":{"validationActions":["Warn"]}}`), metav1.PatchOptions{})
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			ns := env.fw.NewNamespace(ctx, t)
			useKopfMigration(ctx, t, ns, true)
			for _, n := range []string{"before", "after"} {
				createBare(ctx, t, ns, n, kopfFinalizer)
				t.Cleanup(func() { dropFinalizers(ns, n) })
				if err := patchStatus(ctx, ns, n, `{"status":{"state":"Ok","uuid":"`+uuid.NewString()+`"}}`); err != nil {
					t.Fatal(err)
				}
			}
			p := framework.LaunchController(ctx, t, controllerAs(env.kubeconfig), ns, "--remove-kopf-finalizer", "--max-retry-delay=2s")
			if err := p.WaitReady(ctx, time.Minute); err != nil {
				t.Fatal(err)
			}
			deleteUuid(ctx, t, ns, "before")
			waitFor(t, 30*time.Second, "the first object to go while the policy binds", func() bool { return object(ctx, t, ns, "before") == nil })

			if err := tc.change(ctx); err != nil {
				t.Fatal(err)
			}
			waitKopfPolicy(ctx, t, ns, nil, []string{labelPatch})
			// The bound the controller states, from when the apiserver
			// stopped enforcing the policy.
			time.Sleep(kopfProofTTL)
			deleteUuid(ctx, t, ns, "after")
			dryRuns := func() int {
				return len(auditedEvents(t, ns, func(ev cluster.AuditEvent) bool {
					return ev.DryRun() && ev.User.Username == controllerUser && ev.ObjectRef.Name == "after"
				}))
			}
			waitFor(t, 30*time.Second, "a dry-run probe of the object deleted after the change", func() bool { return dryRuns() >= 1 })
			waitNotReady(ctx, t, p, 30*time.Second, policyName)
			if u := object(ctx, t, ns, "after"); u == nil || !slices.Contains(u.GetFinalizers(), kopfFinalizer) {
				t.Errorf("%s: %v, want the object still held by kopf's finalizer", tc.name, u)
			}
			if w := auditedObjectWrites(t, ns, controllerUser)["after"]; len(w) != 0 {
				t.Errorf("%s: the controller wrote to the object deleted after the change: %v", tc.name, w)
			}
			if v := controllerMetric(ctx, t, p, "uuid_controller_kopf_policy_bound", nil); v != 0 {
				t.Errorf("uuid_controller_kopf_policy_bound = %v after the change, want 0", v)
			}
		})
	}
}
