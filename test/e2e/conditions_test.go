package e2e

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/demo-operator/uuid-controller/test/cluster"
	"github.com/demo-operator/uuid-controller/test/framework"
)

// TestReadyCondition: `kubectl wait --for=condition=Ready`, as a script
// would run it, waits while no UUID is assigned (the CRD's default status
// says Ready=Unknown) and returns 0 once the controller has assigned one;
// the conditions come in the one status write per object.
func TestReadyCondition(t *testing.T) {
	ctx := testCtx(t)
	ns := env.fw.NewNamespace(ctx, t)
	env.fw.CreateUuids(ctx, t, ns, "early", 1)
	// No controller runs yet: nothing can have been assigned.
	conds := conditionsOf(ctx, t, ns, "early-0")
	if !meta.IsStatusConditionPresentAndEqual(conds, "Ready", metav1.ConditionUnknown) ||
		!meta.IsStatusConditionTrue(conds, "Reconciling") {
		t.Errorf("conditions of an object not yet written = %+v, want the CRD's default: Ready=Unknown, Reconciling=True", conds)
	}
	mustNotBeReady(t, ns, "early-0", 2*time.Second)

	framework.StartController(ctx, t, controllerAs(env.kubeconfig), ns)
	names := append([]string{"early-0"}, env.fw.CreateUuids(ctx, t, ns, "new", 1)...)
	for _, name := range names {
		if out, err := kubectlWaitReady(ns, name, 10*time.Second); err != nil {
			t.Fatalf("kubectl wait for %s: %v\n%s", name, err, out)
		}
		u := get(ctx, t, ns, name)
		conds := conditionsOf(ctx, t, ns, name)
		ready := meta.FindStatusCondition(conds, "Ready")
		if len(conds) != 1 || ready == nil || ready.Status != metav1.ConditionTrue || ready.Reason != "UUIDAssigned" {
			t.Errorf("%s: conditions = %+v, want only Ready=True, reason UUIDAssigned", name, conds)
		} else if ready.LastTransitionTime.Before(ptr(u.GetCreationTimestamp())) {
			t.Errorf("%s: Ready's lastTransitionTime %s is before the object's creation %s", name, ready.LastTransitionTime, u.GetCreationTimestamp())
		}
	}
	if n := auditedReaches(t, ns, 0, len(names)); n != len(names) {
		t.Errorf("%d status writes for %d objects, want one each, conditions included", n, len(names))
	}
}

// TestConditionsOnFailure: while the apiserver denies the UUID write, the
// object says so in its conditions (Ready=False with the apiserver's
// reason, and Reconciling=True while retried or Stalled=True once given
// up), so `kubectl wait` times out on it; once the write goes through it
// is Ready with nothing abnormal left.
func TestConditionsOnFailure(t *testing.T) {
	for _, d := range cluster.UUIDDenials {
		abnormal, abnormalReason := "Stalled", "Rejected"
		if d.Retried {
			abnormal, abnormalReason = "Reconciling", "Retrying"
		}
		t.Run(d.Name, func(t *testing.T) {
			ctx := testCtx(t)
			ns := env.fw.NewNamespace(ctx, t)
			remove, err := env.cluster.RejectUUIDWrites(ctx, ns, ns, d.Reason)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = remove(context.WithoutCancel(ctx)) })
			name := env.fw.CreateUuids(ctx, t, ns, "failing", 1)[0]
			p := framework.StartController(ctx, t, controllerAs(env.kubeconfig), ns, "--error-after", "3", "--max-retry-delay", "1s")

			conds := waitCondition(ctx, t, ns, name, "Ready", metav1.ConditionFalse)
			ready := meta.FindStatusCondition(conds, "Ready")
			abnormalCond := meta.FindStatusCondition(conds, abnormal)
			if ready.Reason != string(d.Reason) || !strings.Contains(ready.Message, cluster.DeniedMessage) {
				t.Errorf("Ready = %+v, want reason %s and the apiserver's message", ready, d.Reason)
			}
			if len(conds) != 2 || abnormalCond == nil || abnormalCond.Status != metav1.ConditionTrue || abnormalCond.Reason != abnormalReason {
				t.Errorf("conditions = %+v, want Ready=False and %s=True, reason %s", conds, abnormal, abnormalReason)
			}
			if state, id := env.fw.Status(ctx, t, ns, name); state != "Error" || id != "" {
				t.Errorf("state %q, uuid %q; want Error and none", state, id)
			}
			mustNotBeReady(t, ns, name, 10*time.Second)

			if err := remove(ctx); err != nil {
				t.Fatal(err)
			}
			if err := env.cluster.RetryAfterDenial(ctx, d, ns, name); err != nil {
				t.Fatal(err)
			}
			// The denial ends when the apiserver's admission plugin sees
			// the policy go, a moment after the delete.
			if out, err := kubectlWaitReady(ns, name, 30*time.Second); err != nil {
				t.Fatalf("kubectl wait once the write is allowed: %v\n%s", err, out)
			}
			after := conditionsOf(ctx, t, ns, name)
			if r := meta.FindStatusCondition(after, "Ready"); len(after) != 1 || r == nil || r.Status != metav1.ConditionTrue ||
				r.LastTransitionTime.Before(&ready.LastTransitionTime) {
				t.Errorf("conditions after recovery = %+v, want only Ready=True, its transition after %s", after, ready.LastTransitionTime)
			}
			mustStayRunning(t, p)
		})
	}
}

// kubectlWaitReady runs `kubectl wait --for=condition=Ready uuid/NAME`,
// as a user would, and returns its output and exit error.
func kubectlWaitReady(ns, name string, timeout time.Duration) (string, error) {
	return env.cluster.Kubectl(context.Background(), "wait", "--for=condition=Ready", "uuid/"+name, "-n", ns, "--timeout="+timeout.String())
}

// mustNotBeReady fails the test unless kubectl wait for Ready on ns/name
// times out (a non-zero exit, saying so).
func mustNotBeReady(t *testing.T, ns, name string, timeout time.Duration) {
	t.Helper()
	out, err := kubectlWaitReady(ns, name, timeout)
	var exit *exec.ExitError
	if !errors.As(err, &exit) || !strings.Contains(out, "timed out") {
		t.Errorf("kubectl wait --for=condition=Ready on %s/%s: %v, want a non-zero exit on timeout:\n%s", ns, name, err, out)
	}
}

func get(ctx context.Context, t *testing.T, ns, name string) *unstructured.Unstructured {
	t.Helper()
	u, err := env.fw.Uuids(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get %s/%s: %v", ns, name, err)
	}
	return u
}

// conditionsOf reads an object's status.conditions from the API.
func conditionsOf(ctx context.Context, t *testing.T, ns, name string) []metav1.Condition {
	t.Helper()
	raw, _, err := unstructured.NestedSlice(get(ctx, t, ns, name).Object, "status", "conditions")
	if err != nil {
		t.Fatalf("%s/%s: status.conditions: %v", ns, name, err)
	}
	conds := make([]metav1.Condition, len(raw))
	for i, r := range raw {
		m, ok := r.(map[string]any)
		if !ok {
			t.Fatalf("%s/%s: condition %d is a %T", ns, name, i, r)
		}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(m, &conds[i]); err != nil {
			t.Fatalf("%s/%s: condition %d: %v", ns, name, i, err)
		}
	}
	return conds
}

// waitCondition waits up to 30 s for ns/name's condition typ to have
// status, and returns the object's conditions then.
func waitCondition(ctx context.Context, t *testing.T, ns, name, typ string, status metav1.ConditionStatus) []metav1.Condition {
	t.Helper()
	var conds []metav1.Condition
	err := framework.Poll(ctx, 30*time.Second, fmt.Sprintf("%s/%s to have %s=%s", ns, name, typ, status), func(ctx context.Context) error {
		conds = conditionsOf(ctx, t, ns, name)
		if meta.IsStatusConditionPresentAndEqual(conds, typ, status) {
			return nil
		}
		return fmt.Errorf("conditions %s", fmt.Sprint(conds))
	})
	if err != nil {
		t.Fatal(err)
	}
	return conds
}

func ptr[T any](v T) *T { return &v }
