package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/demo-operator/uuid-controller/test/cluster"
	"github.com/demo-operator/uuid-controller/test/framework"
)

// TestAPFPushBackCutsTheLimit: API Priority and Fairness gives the
// controller's status writes a priority level of one share that rejects
// what it cannot seat, so a backlog met by the default flags draws 429s.
// The controller cuts its in-flight limit for them (cause throttled, seen
// on the status client's transport), and still assigns every object.
func TestAPFPushBackCutsTheLimit(t *testing.T) {
	ctx := testCtx(t)
	fc := env.kube.FlowcontrolV1()
	pl := &flowcontrolv1.PriorityLevelConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "uuid-e2e-tiny"},
		Spec: flowcontrolv1.PriorityLevelConfigurationSpec{
			Type: flowcontrolv1.PriorityLevelEnablementLimited,
			Limited: &flowcontrolv1.LimitedPriorityLevelConfiguration{
				NominalConcurrencyShares: ptr[int32](1),
				LendablePercent:          ptr[int32](0),
				LimitResponse:            flowcontrolv1.LimitResponse{Type: flowcontrolv1.LimitResponseTypeReject},
			},
		},
	}
	fs := &flowcontrolv1.FlowSchema{
		ObjectMeta: metav1.ObjectMeta{Name: "uuid-e2e-controller-writes"},
		Spec: flowcontrolv1.FlowSchemaSpec{
			PriorityLevelConfiguration: flowcontrolv1.PriorityLevelConfigurationReference{Name: pl.Name},
			MatchingPrecedence:         100,
			DistinguisherMethod:        &flowcontrolv1.FlowDistinguisherMethod{Type: flowcontrolv1.FlowDistinguisherMethodByUserType},
			Rules: []flowcontrolv1.PolicyRulesWithSubjects{{
				Subjects: []flowcontrolv1.Subject{{Kind: flowcontrolv1.SubjectKindServiceAccount,
					ServiceAccount: &flowcontrolv1.ServiceAccountSubject{Namespace: cluster.ControllerNamespace, Name: cluster.ControllerServiceAccount}}},
				ResourceRules: []flowcontrolv1.ResourcePolicyRule{{
					Verbs: []string{"patch"}, APIGroups: []string{"demo.operator"}, Resources: []string{"uuid/status"},
					Namespaces: []string{flowcontrolv1.NamespaceEvery},
				}},
			}},
		},
	}
	if _, err := fc.PriorityLevelConfigurations().Create(ctx, pl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.WithoutCancel(ctx)
		_ = fc.FlowSchemas().Delete(ctx, fs.Name, metav1.DeleteOptions{})
		_ = fc.PriorityLevelConfigurations().Delete(ctx, pl.Name, metav1.DeleteOptions{})
	})
	if _, err := fc.FlowSchemas().Create(ctx, fs, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The apiserver's APF configuration controller has taken the schema
	// in once it reports whether the schema's level exists (Dangling).
	if err := framework.Poll(ctx, 30*time.Second, "FlowSchema "+fs.Name+" taken in", func(ctx context.Context) error {
		got, err := fc.FlowSchemas().Get(ctx, fs.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, c := range got.Status.Conditions {
			if c.Type == flowcontrolv1.FlowSchemaConditionDangling && c.Status == flowcontrolv1.ConditionFalse {
				return nil
			}
		}
		return fmt.Errorf("conditions %v", got.Status.Conditions)
	}); err != nil {
		t.Fatal(err)
	}
	// Objects made while no controller runs are a backlog the moment it
	// starts.
	ns := env.fw.NewNamespace(ctx, t)
	names := env.fw.CreateUuids(ctx, t, ns, "backlog", 400)
	p := framework.StartController(ctx, t, controllerAs(env.kubeconfig), ns)
	env.fw.WaitUUIDs(ctx, t, ns, names, 3*time.Minute)

	throttled := controllerMetric(ctx, t, p, "uuid_controller_syncs_in_flight_cuts_total", func(l map[string]string) bool { return l["cause"] == "throttled" })
	slow := controllerMetric(ctx, t, p, "uuid_controller_syncs_in_flight_cuts_total", func(l map[string]string) bool { return l["cause"] == "slow" })
	limit := controllerMetric(ctx, t, p, "uuid_controller_syncs_in_flight_limit", nil)
	rejected := apiserverMetric(ctx, t, "apiserver_flowcontrol_rejected_requests_total", func(l map[string]string) bool { return l["priority_level"] == pl.Name })
	t.Logf("%d objects assigned through a one-share priority level: the apiserver rejected %.0f writes; the controller cut its limit %.0f times for 429s and %.0f for slow answers; limit now %.0f",
		len(names), rejected, throttled, slow, limit)
	if rejected == 0 {
		t.Fatalf("the priority level rejected nothing: the test did not push back (its setup, not the controller)")
	}
	if throttled == 0 {
		t.Errorf("the apiserver answered %.0f writes 429, but the controller never cut its limit for them", rejected)
	}
	if got := auditedStatusPatches(t, ns, 200); got != len(names) {
		t.Errorf("%d status writes succeeded for %d objects, want one each", got, len(names))
	}
}

// apiserverMetric sums a metric of the apiserver's own /metrics, read as
// admin.
func apiserverMetric(ctx context.Context, t *testing.T, name string, match func(map[string]string) bool) float64 {
	t.Helper()
	body, err := env.kube.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	v, err := cluster.MetricSum(string(body), name, match)
	if err != nil {
		t.Fatal(err)
	}
	return v
}
