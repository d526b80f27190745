package e2e

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"

	"github.com/demo-operator/uuid-controller/test/cluster"
)

// testCtx is bounded so a hung apiserver fails the test instead of CI.
func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

var nonDNS = regexp.MustCompile(`[^a-z0-9-]+`)

// newNamespace creates a namespace named after the test, so each test's
// objects and events are apart from the others'.
func newNamespace(ctx context.Context, t *testing.T) string {
	t.Helper()
	name := nonDNS.ReplaceAllString(strings.ToLower(t.Name()), "-")
	if len(name) > 40 {
		name = name[:40]
	}
	name = strings.Trim(name, "-") + "-" + uuid.NewString()[:6]
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := env.kube.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace %s: %v", name, err)
	}
	return name
}

// startController runs the controller as the ServiceAccount, watching only
// namespace ns, waits for its cache to sync and stops it when the test ends.
// Its output is logged if the test fails.
func startController(ctx context.Context, t *testing.T, ns string, args ...string) *cluster.ControllerProcess {
	t.Helper()
	return startControllerAs(ctx, t, env.kubeconfig, ns, args...)
}

func startControllerAs(ctx context.Context, t *testing.T, kubeconfig, ns string, args ...string) *cluster.ControllerProcess {
	t.Helper()
	return startControllerWith(ctx, t, cluster.ControllerOptions{Kubeconfig: kubeconfig}, ns, args...)
}

// startControllerWith is startControllerAs with more of StartController's
// options (the binary and the namespace and log flags are added).
func startControllerWith(ctx context.Context, t *testing.T, opts cluster.ControllerOptions, ns string, args ...string) *cluster.ControllerProcess {
	t.Helper()
	p := launchControllerWith(ctx, t, opts, ns, args...)
	if err := p.WaitReady(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	return p
}

// launchController is startControllerAs without waiting for readiness;
// ns "" watches every namespace, as deployed.
func launchController(ctx context.Context, t *testing.T, kubeconfig, ns string, args ...string) *cluster.ControllerProcess {
	t.Helper()
	return launchControllerWith(ctx, t, cluster.ControllerOptions{Kubeconfig: kubeconfig}, ns, args...)
}

func launchControllerWith(ctx context.Context, t *testing.T, opts cluster.ControllerOptions, ns string, args ...string) *cluster.ControllerProcess {
	t.Helper()
	if ns != "" {
		args = append([]string{"--namespace", ns}, args...)
	}
	opts.Binary = env.binary
	opts.Args = append(append([]string{"-v", "2"}, opts.Args...), args...)
	p, err := cluster.StartController(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Stop()
		if t.Failed() {
			t.Logf("controller pid %d output:\n%s", p.PID(), p.Output())
		}
	})
	return p
}

func uuids(ns string) dynamic.ResourceInterface {
	return env.dyn.Resource(cluster.UuidGVR).Namespace(ns)
}

func newUuid(name string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "demo.operator/v1",
		"kind":       "Uuid",
		"metadata":   map[string]any{"name": name},
		"spec":       map[string]any{},
	}}
}

// createUuids creates n objects named prefix-0 .. prefix-(n-1) and returns
// their names.
func createUuids(ctx context.Context, t *testing.T, ns, prefix string, n int) []string {
	t.Helper()
	names := make([]string, n)
	for i := range n {
		names[i] = fmt.Sprintf("%s-%d", prefix, i)
		if _, err := uuids(ns).Create(ctx, newUuid(names[i]), metav1.CreateOptions{}); err != nil {
			t.Fatalf("create %s/%s: %v", ns, names[i], err)
		}
	}
	return names
}

// status reads an object's status.state and status.uuid from the API.
func status(ctx context.Context, t *testing.T, ns, name string) (state, id string) {
	t.Helper()
	u, err := uuids(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get %s/%s: %v", ns, name, err)
	}
	state, _, _ = unstructured.NestedString(u.Object, "status", "state")
	id, _, _ = unstructured.NestedString(u.Object, "status", "uuid")
	return state, id
}

// waitUUIDs polls until every named object has state Ok and a valid UUID,
// and returns name -> UUID.
func waitUUIDs(ctx context.Context, t *testing.T, ns string, names []string, timeout time.Duration) map[string]string {
	t.Helper()
	var got map[string]string
	missing := names
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		got = assignedUUIDs(ctx, t, ns)
		missing = nil
		for _, n := range names {
			if _, ok := got[n]; !ok {
				missing = append(missing, n)
			}
		}
		return len(missing) == 0, nil
	})
	if err != nil {
		t.Fatalf("after %s, %d of %d objects in %s have no UUID, e.g. %v", timeout, len(missing), len(names), ns, missing[:min(5, len(missing))])
	}
	for _, n := range names {
		if _, err := uuid.Parse(got[n]); err != nil {
			t.Errorf("%s/%s: status.uuid %q is not a UUID: %v", ns, n, got[n], err)
		}
	}
	return got
}

// assignedUUIDs lists ns and returns name -> UUID for the objects with
// state Ok and a UUID.
func assignedUUIDs(ctx context.Context, t *testing.T, ns string) map[string]string {
	t.Helper()
	list, err := uuids(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("list %s: %v", ns, err)
	}
	got := map[string]string{}
	for _, u := range list.Items {
		state, _, _ := unstructured.NestedString(u.Object, "status", "state")
		id, _, _ := unstructured.NestedString(u.Object, "status", "uuid")
		if state == "Ok" && id != "" {
			got[u.GetName()] = id
		}
	}
	return got
}

// checkKept fails the test unless every object in want still has the UUID
// it had before what happened (named by across).
func checkKept(ctx context.Context, t *testing.T, ns string, want map[string]string, across string) {
	t.Helper()
	got := assignedUUIDs(ctx, t, ns)
	for n, id := range want {
		if got[n] != id {
			t.Errorf("%s: UUID changed across %s: %s -> %s", n, across, id, got[n])
		}
	}
}

// apiStatusWrites is the apiserver's count of status writes to Uuid objects
// (any response code), read once it has stopped moving: the apiserver
// counts a request as its handler returns, which can trail the response.
func apiStatusWrites(ctx context.Context, t *testing.T) float64 {
	t.Helper()
	return settled(t, func() (float64, error) {
		text, err := env.cluster.Metrics(ctx)
		if err != nil {
			return 0, err
		}
		return cluster.StatusWrites(text)
	})
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

// reaches calls read every 50 ms for up to 5 s until it returns want, and
// returns its last value: a count read right after a client saw a status
// can trail it (the controller counts a write when the response arrives,
// the apiserver may answer before its audit event is written).
func reaches[T comparable](want T, read func() T) T {
	var v T
	// Only the timeout ends the wait, and then the last value is the answer.
	_ = wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		v = read()
		return v == want, nil
	})
	return v
}

// metricReaches is controllerMetric, waiting up to 5 s for want.
func metricReaches(ctx context.Context, t *testing.T, p *cluster.ControllerProcess, name string, match func(map[string]string) bool, want float64) float64 {
	t.Helper()
	return reaches(want, func() float64 { return controllerMetric(ctx, t, p, name, match) })
}

// settled calls read every 300 ms until it returns the same value twice
// in a row, and returns that value.
func settled(t *testing.T, read func() (float64, error)) float64 {
	t.Helper()
	prev := -1.0
	err := wait.PollUntilContextTimeout(t.Context(), 300*time.Millisecond, 15*time.Second, true, func(context.Context) (bool, error) {
		v, err := read()
		if err != nil || v == prev {
			return err == nil, err
		}
		prev = v
		return false, nil
	})
	if wait.Interrupted(err) {
		t.Fatalf("metric still changing after 15 s (last %v)", prev)
	}
	if err != nil {
		t.Fatal(err)
	}
	return prev
}

// patchStatus is a user's (admin's) merge patch of the status subresource.
func patchStatus(ctx context.Context, ns, name, patch string) error {
	_, err := uuids(ns).Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}, "status")
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
	return reaches(want, func() int { return auditedStatusPatches(t, ns, code) })
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
