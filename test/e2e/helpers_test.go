package e2e

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/demo-operator/uuid-controller/test/cluster"
	"github.com/demo-operator/uuid-controller/test/framework"
)

// The helpers below bind test/framework to this package's cluster.

// testCtx is bounded so a hung apiserver fails the test instead of CI.
func testCtx(t *testing.T) context.Context {
	t.Helper()
	return framework.Context(t, 5*time.Minute)
}

// controllerAs is the options that run this checkout's controller binary
// authenticated by kubeconfig (env.kubeconfig: as its ServiceAccount).
func controllerAs(kubeconfig string) cluster.ControllerOptions {
	return cluster.ControllerOptions{Binary: env.binary, Kubeconfig: kubeconfig}
}

// checkKept fails the test unless every object in want still has the UUID
// it had before what happened (named by across).
func checkKept(ctx context.Context, t *testing.T, ns string, want map[string]string, across string) {
	t.Helper()
	got := env.fw.AssignedUUIDs(ctx, t, ns)
	for n, id := range want {
		if got[n] != id {
			t.Errorf("%s: UUID changed across %s: %s -> %s", n, across, id, got[n])
		}
	}
}

// controllerMetric sums a counter or gauge of the controller's /metrics.
// The metric must be exported, so a renamed metric fails the test instead
// of reading as 0.
func controllerMetric(ctx context.Context, t *testing.T, p *cluster.ControllerProcess, name string, match func(map[string]string) bool) float64 {
	t.Helper()
	text, err := p.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text, "\n# TYPE "+name+" ") {
		t.Fatalf("the controller exports no metric %s", name)
	}
	v, err := cluster.MetricSum(text, name, match)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// metricReaches is controllerMetric, waiting up to 5 s for want.
func metricReaches(ctx context.Context, t *testing.T, p *cluster.ControllerProcess, name string, match func(map[string]string) bool, want float64) float64 {
	t.Helper()
	return framework.Reaches(want, func() float64 { return controllerMetric(ctx, t, p, name, match) })
}

// settled calls read until it returns the same value twice in a row, and
// returns that value.
func settled(t *testing.T, read func() (float64, error)) float64 {
	t.Helper()
	v, err := framework.Settled(t.Context(), 15*time.Second, read)
	if err != nil {
		t.Fatalf("metric: %v", err)
	}
	return v
}

// patchStatus is a user's (admin's) merge patch of the status subresource.
func patchStatus(ctx context.Context, ns, name, patch string) error {
	_, err := env.fw.Uuids(ns).Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}, "status")
	return err
}

// events lists the Events on object ns/name.
func events(ctx context.Context, t *testing.T, ns, name string) []corev1.Event {
	t.Helper()
	list, err := env.kube.CoreV1().Events(ns).List(ctx, metav1.ListOptions{
		FieldSelector: "involvedObject.name=" + name,
	})
	if err != nil {
		t.Fatalf("list events: %v", err)
	}
	return list.Items
}

// waitWarning waits up to 30 s for a Warning Event with reason on the named
// object (the controller's broadcaster posts Events asynchronously).
func waitWarning(ctx context.Context, t *testing.T, ns, name, reason string) corev1.Event {
	t.Helper()
	var found corev1.Event
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		for _, e := range events(ctx, t, ns, name) {
			if e.Type == corev1.EventTypeWarning && e.Reason == reason {
				found = e
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no Warning event %s on %s/%s within 30 s", reason, ns, name)
	}
	return found
}

// sigterm sends p SIGTERM and returns its exit code, failing the test if
// it is still running after timeout.
func sigterm(t *testing.T, p *cluster.ControllerProcess, timeout time.Duration) int {
	t.Helper()
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	code, err := p.Wait(timeout)
	if err != nil {
		t.Fatalf("after SIGTERM: %v", err)
	}
	return code
}

// mustStayRunning fails the test if the controller has exited.
func mustStayRunning(t *testing.T, p *cluster.ControllerProcess) {
	t.Helper()
	if p.Exited() {
		t.Fatalf("controller exited unexpectedly; output:\n%s", p.Output())
	}
}

// auditedReaches is auditedStatusPatches, waiting up to 5 s for want.
func auditedReaches(t *testing.T, ns string, code, want int) int {
	t.Helper()
	return framework.Reaches(want, func() int { return auditedStatusPatches(t, ns, code) })
}

// auditedStatusPatches counts, from the apiserver's audit log, the PATCH
// requests to the status of Uuid objects in ns answered with code (0: any).
func auditedStatusPatches(t *testing.T, ns string, code int) int {
	t.Helper()
	n := 0
	for _, codes := range auditedStatusPatchCodes(t, ns) {
		for _, c := range codes {
			if code == 0 || c == code {
				n++
			}
		}
	}
	return n
}

// auditedStatusPatchCodes returns, from the apiserver's audit log, the
// response codes of the PATCH requests to the status of each Uuid object
// in ns, in order.
func auditedStatusPatchCodes(t *testing.T, ns string) map[string][]int {
	t.Helper()
	return auditedCodes(t, ns, isStatusPatchEvent)
}

func isStatusPatchEvent(ev cluster.AuditEvent) bool {
	return ev.Verb == "patch" && ev.ObjectRef.Subresource == "status"
}

// auditedCodes returns, from the apiserver's audit log, the response codes
// of the requests match picks on each Uuid object in ns, in order.
func auditedCodes(t *testing.T, ns string, match func(cluster.AuditEvent) bool) map[string][]int {
	t.Helper()
	codes := map[string][]int{}
	for _, ev := range auditedEvents(t, ns, match) {
		codes[ev.ObjectRef.Name] = append(codes[ev.ObjectRef.Name], ev.ResponseStatus.Code)
	}
	return codes
}

// auditedStatusPatchEvents returns, from the apiserver's audit log, the
// PATCH requests to the status of Uuid objects in ns, in order.
func auditedStatusPatchEvents(t *testing.T, ns string) []cluster.AuditEvent {
	t.Helper()
	return auditedEvents(t, ns, isStatusPatchEvent)
}

// auditedEvents returns, from the apiserver's audit log, the requests
// match picks on Uuid objects in ns, in order.
func auditedEvents(t *testing.T, ns string, match func(cluster.AuditEvent) bool) []cluster.AuditEvent {
	t.Helper()
	evs, err := env.cluster.AuditEvents()
	if err != nil {
		t.Fatal(err)
	}
	var out []cluster.AuditEvent
	for _, ev := range evs {
		if r := ev.ObjectRef; r.Resource == cluster.UuidGVR.Resource && r.Namespace == ns && match(ev) {
			out = append(out, ev)
		}
	}
	return out
}
