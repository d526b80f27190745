package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/demo-operator/uuid-controller/test/cluster"
	"github.com/demo-operator/uuid-controller/test/framework"
)

// articleCRD is the kopf article's CRD (../shared/seed/crd.yaml, verbatim):
// no status subresource.
const articleCRD = "testdata/article-crd.yaml"

// crdFix is what the controller must tell a user on the wrong CRD.
const crdFix = "kubectl apply -f crd.yaml"

// useArticleCRD replaces crd.yaml with the article's CRD until the test
// ends (the tests after it need crd.yaml).
func useArticleCRD(ctx context.Context, t *testing.T) {
	t.Helper()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := env.cluster.InstallCRD(ctx); err != nil {
			t.Errorf("reinstalling crd.yaml: %v", err)
		}
	})
	if err := env.cluster.InstallCRDFile(ctx, articleCRD); err != nil {
		t.Fatal(err)
	}
}

// auditedObjectWrites counts, from the audit log, the writes (update,
// patch) to Uuid objects themselves, not their status, in ns, by user
// ("" for anyone), per object name and response code. Server-side dry runs
// (the kopf migration's policy probe) write nothing and are left out.
func auditedObjectWrites(t *testing.T, ns, user string) map[string][]int {
	t.Helper()
	return auditedCodes(t, ns, func(ev cluster.AuditEvent) bool {
		return (ev.Verb == "patch" || ev.Verb == "update") && ev.ObjectRef.Subresource == "" &&
			(user == "" || ev.User.Username == user) && !ev.DryRun()
	})
}

// waitNotReady waits up to timeout for /readyz to answer 503 while the
// controller's log gives reason (the body withholds it, as kube
// components' do), and returns the body.
func waitNotReady(ctx context.Context, t *testing.T, p *cluster.ControllerProcess, timeout time.Duration, reason string) string {
	t.Helper()
	var code int
	var body string
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		var err error
		code, body, err = p.Readyz(ctx)
		if err != nil {
			return false, err // an unreachable health port ends the wait at once
		}
		return code == http.StatusServiceUnavailable && strings.Contains(p.Output(), reason), nil
	})
	if err != nil {
		t.Fatalf("/readyz still %d %q after %s, want 503 with the log saying %q: %v", code, body, timeout, reason, err)
	}
	if strings.Contains(body, reason) || !strings.Contains(body, "failed: reason withheld") {
		t.Errorf("/readyz body %q gives the reason %q, want it withheld", body, reason)
	}
	return body
}

// checkSaysCRDIsWrong checks that the controller says, in each of its
// ways, that the CRD lacks the status subresource, with the fix.
func checkSaysCRDIsWrong(ctx context.Context, t *testing.T, p *cluster.ControllerProcess, readyBody string) {
	t.Helper()
	if !strings.Contains(readyBody, "[-]crd failed: reason withheld") {
		t.Errorf("/readyz body %q does not name the failed crd check", readyBody)
	}
	if v := metricReaches(ctx, t, p, "uuid_controller_crd_ready", nil, 0); v != 0 {
		t.Errorf("uuid_controller_crd_ready = %v on the article's CRD, want 0", v)
	}
	out := p.Output()
	if !strings.Contains(out, "no status subresource") || !strings.Contains(out, crdFix) {
		t.Errorf("the log does not name the missing status subresource and the fix:\n%s", out)
	}
	mustStayRunning(t, p)
}

// TestCRDWithoutStatusSubresource: started on the article's CRD (the user
// skipped `kubectl apply -f crd.yaml`), the controller stays not ready,
// logs the problem and its fix, exports it, and assigns nothing; applying
// crd.yaml heals every object, those created before the start and those
// created since, with no restart and no update of the objects.
func TestCRDWithoutStatusSubresource(t *testing.T) {
	ctx := testCtx(t)
	ns := env.fw.NewNamespace(ctx, t)
	useArticleCRD(ctx, t)
	names := env.fw.CreateUuids(ctx, t, ns, "early", 3)

	p := framework.LaunchController(ctx, t, controllerAs(env.kubeconfig), ns, "--max-retry-delay", "2s")
	if err := p.WaitReady(ctx, 5*time.Second); err == nil {
		t.Fatal("the controller reports ready on a CRD without the status subresource")
	}
	names = append(names, env.fw.CreateUuids(ctx, t, ns, "late", 2)...)
	// Every object held back and retried twice (backoff up to 2 s): the
	// queue's retry count is the signal.
	retriedAtLeast(ctx, t, p, 2*len(names))
	checkSaysCRDIsWrong(ctx, t, p, waitNotReady(ctx, t, p, time.Second, "no status subresource"))
	for _, n := range names {
		if state, id := env.fw.Status(ctx, t, ns, n); state != "" || id != "" {
			t.Errorf("%s: status state %q uuid %q on a CRD the controller cannot write", n, state, id)
		}
	}
	if d := controllerMetric(ctx, t, p, "uuid_controller_dropped_total", nil); d != 0 {
		t.Errorf("dropped_total = %v: objects were given up on", d)
	}

	start := time.Now()
	if err := env.cluster.InstallCRD(ctx); err != nil {
		t.Fatal(err)
	}
	env.fw.WaitUUIDs(ctx, t, ns, names, time.Minute)
	t.Logf("every object had its UUID %s after crd.yaml was applied", time.Since(start).Round(100*time.Millisecond))
	if err := p.WaitReady(ctx, 30*time.Second); err != nil {
		t.Errorf("not ready once crd.yaml is applied: %v", err)
	}
	if v := metricReaches(ctx, t, p, "uuid_controller_crd_ready", nil, 1); v != 1 {
		t.Errorf("uuid_controller_crd_ready = %v after the fix, want 1", v)
	}
	if w := auditedObjectWrites(t, ns, ""); len(w) != 0 {
		t.Errorf("objects were updated to heal them: %v", w)
	}
	if got := auditedReaches(t, ns, 200, len(names)); got != len(names) {
		t.Errorf("%d successful status writes for %d objects, want one each", got, len(names))
	}
	mustStayRunning(t, p)
}

// TestCRDReplacedByArticles: a controller running on crd.yaml when the
// article's CRD is applied over it: the first status write that gets 404
// for an object still in the cache makes it check the CRD; it then says
// what is wrong, keeps the new objects queued, and assigns their UUIDs once
// crd.yaml is back; the UUIDs from before are kept.
func TestCRDReplacedByArticles(t *testing.T) {
	ctx := testCtx(t)
	ns := env.fw.NewNamespace(ctx, t)
	p := framework.StartController(ctx, t, controllerAs(env.kubeconfig), ns, "--max-retry-delay", "2s")
	before := env.fw.WaitUUIDs(ctx, t, ns, env.fw.CreateUuids(ctx, t, ns, "before", 2), 30*time.Second)

	useArticleCRD(ctx, t)
	during := env.fw.CreateUuids(ctx, t, ns, "during", 2)
	// The periodic check comes every 30 s; the 404 asks for one at once,
	// so without that the wait below would mostly time out.
	checkSaysCRDIsWrong(ctx, t, p, waitNotReady(ctx, t, p, 15*time.Second, "no status subresource"))
	for _, n := range during {
		if _, id := env.fw.Status(ctx, t, ns, n); id != "" {
			t.Errorf("%s got UUID %s on a CRD without the status subresource", n, id)
		}
	}
	// A periodic check landing between the CRD swap and the creates would
	// hold the writes back before any 404 (about 1 run in 30).
	notFound := controllerMetric(ctx, t, p, "uuid_controller_status_writes_total", func(l map[string]string) bool { return l["result"] == "not_found" })
	t.Logf("%v status writes answered 404 before the check caught up", notFound)

	if err := env.cluster.InstallCRD(ctx); err != nil {
		t.Fatal(err)
	}
	env.fw.WaitUUIDs(ctx, t, ns, during, time.Minute)
	checkKept(ctx, t, ns, before, "the CRD replaced and restored")
	if err := p.WaitReady(ctx, 30*time.Second); err != nil {
		t.Errorf("not ready once crd.yaml is back: %v", err)
	}
	if w := auditedObjectWrites(t, ns, ""); len(w) != 0 {
		t.Errorf("objects were updated to heal them: %v", w)
	}
}

// TestCRDSchemaPrunesUUID: a CRD with the status subresource whose schema
// has no status.uuid would silently drop every UUID written. Started on
// it, the controller reads that from the OpenAPI document (as its
// ServiceAccount), stays not ready naming the field and the fix, and
// writes nothing; crd.yaml heals it.
func TestCRDSchemaPrunesUUID(t *testing.T) {
	ctx := testCtx(t)
	ns := env.fw.NewNamespace(ctx, t)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := env.cluster.InstallCRD(ctx); err != nil {
			t.Errorf("reinstalling crd.yaml: %v", err)
		}
	})
	if err := env.cluster.InstallCRDFile(ctx, "testdata/crd-without-uuid.yaml"); err != nil {
		t.Fatal(err)
	}
	// The OpenAPI document follows the CRD a moment after discovery does.
	waitFor(t, 30*time.Second, "the OpenAPI document drops status.uuid", func() bool {
		doc, err := env.kube.Discovery().RESTClient().Get().AbsPath("/openapi/v3/apis/demo.operator/v1").DoRaw(ctx)
		return err == nil && !strings.Contains(string(doc), `"format":"uuid"`)
	})
	p := framework.LaunchController(ctx, t, controllerAs(env.kubeconfig), ns)
	body := waitNotReady(ctx, t, p, 30*time.Second, "no status.uuid")
	names := env.fw.CreateUuids(ctx, t, ns, "pruned", 2)
	retriedAtLeast(ctx, t, p, 2*len(names))
	if !strings.Contains(body, "[-]crd failed") {
		t.Errorf("/readyz body %q does not name the failed crd check", body)
	}
	if out := p.Output(); !strings.Contains(out, crdFix) {
		t.Errorf("the log does not name the fix:\n%s", out)
	}
	if out := p.Output(); !strings.Contains(out, "no status.uuid") {
		t.Errorf("the log does not name status.uuid:\n%s", out)
	}
	if n := auditedStatusPatches(t, ns, 0); n != 0 {
		t.Errorf("%d status writes on a schema that drops the UUID, want none", n)
	}
	if err := env.cluster.InstallCRD(ctx); err != nil {
		t.Fatal(err)
	}
	env.fw.WaitUUIDs(ctx, t, ns, names, time.Minute)
	if err := p.WaitReady(ctx, 30*time.Second); err != nil {
		t.Errorf("not ready once crd.yaml is applied: %v", err)
	}
}

// retriedAtLeast waits until p's queue has put keys back with backoff n
// times (workqueue_retries_total of the uuid queue): writes held back and
// tried again, the positive signal that the controller had its chances to
// write and did not.
func retriedAtLeast(ctx context.Context, t *testing.T, p *cluster.ControllerProcess, n int) {
	t.Helper()
	isUUIDQueue := func(l map[string]string) bool { return l["name"] == "uuid" }
	waitFor(t, 30*time.Second, fmt.Sprintf("%d retries of held-back writes", n), func() bool {
		return controllerMetric(ctx, t, p, "workqueue_retries_total", isUUIDQueue) >= float64(n)
	})
}
