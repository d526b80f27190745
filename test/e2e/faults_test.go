package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/demo-operator/uuid-controller/test/cluster"
	"github.com/demo-operator/uuid-controller/test/framework"
)

// TestAPIServerRestart: the apiserver goes away and comes back on the same
// etcd while the controller runs; the controller keeps running, its watch
// resumes, and objects from before and after all have their UUIDs.
func TestAPIServerRestart(t *testing.T) {
	ctx := testCtx(t)
	ns := env.fw.NewNamespace(ctx, t)
	p := framework.StartController(ctx, t, controllerAs(env.kubeconfig), ns)
	before := env.fw.CreateUuids(ctx, t, ns, "before", 10)
	want := env.fw.WaitUUIDs(ctx, t, ns, before, 30*time.Second)

	if err := env.cluster.RestartAPIServer(ctx); err != nil {
		t.Fatalf("restart apiserver: %v", err)
	}
	mustStayRunning(t, p)

	after := env.fw.CreateUuids(ctx, t, ns, "after", 10)
	// The reflector backs off while the apiserver is down, so the first
	// events after it returns can take a few seconds.
	env.fw.WaitUUIDs(ctx, t, ns, after, 60*time.Second)
	checkKept(ctx, t, ns, want, "the apiserver restart")
	if n := metricReaches(ctx, t, p, "uuid_controller_uuids_assigned_total", nil, 20); n != 20 {
		t.Errorf("uuids_assigned_total = %v, want 20", n)
	}
	mustStayRunning(t, p)
}

// TestSIGTERMMidBurst: a controller stopped while it works through a
// backlog exits 0 promptly; the next one finishes the backlog, and no object
// is written twice.
func TestSIGTERMMidBurst(t *testing.T) {
	ctx := testCtx(t)
	ns := env.fw.NewNamespace(ctx, t)
	names := env.fw.CreateUuids(ctx, t, ns, "backlog", 300)
	p := framework.StartController(ctx, t, controllerAs(env.kubeconfig), ns)
	waitFirstAssignment(ctx, t, p)
	// The default --shutdown-timeout is 10 s; the exit must come within it.
	if code := sigterm(t, p, 15*time.Second); code != 0 {
		t.Errorf("exit code after SIGTERM = %d, want 0", code)
	}
	first := auditedStatusPatches(t, ns, 200)
	if first == 0 || first == len(names) {
		t.Fatalf("the first controller wrote %d of %d: SIGTERM did not land mid-backlog", first, len(names))
	}
	t.Logf("first controller wrote %d of %d before it stopped", first, len(names))

	framework.StartController(ctx, t, controllerAs(env.kubeconfig), ns)
	env.fw.WaitUUIDs(ctx, t, ns, names, time.Minute)
	if got := auditedReaches(t, ns, 0, len(names)); got != len(names) {
		t.Errorf("the audit log has %d status writes for %d objects, want exactly one each", got, len(names))
	}
}

// TestSIGKILLMidBurst: a controller killed while it works through a backlog
// (a crash, a node lost) leaves no object half-done: the next one finishes
// the backlog, and no UUID is ever replaced, even when a PATCH of the killed
// process commits after the new one has listed (its stale precondition then
// gets 409). The audit log cannot count writes here: a PATCH whose client
// died is logged 504 even when it committed.
func TestSIGKILLMidBurst(t *testing.T) {
	ctx := testCtx(t)
	ns := env.fw.NewNamespace(ctx, t)
	names := env.fw.CreateUuids(ctx, t, ns, "backlog", 300)
	history := env.fw.WatchUUIDs(ctx, t, ns)
	p := framework.StartController(ctx, t, controllerAs(env.kubeconfig), ns)
	waitFirstAssignment(ctx, t, p)
	p.Kill()
	if done := len(env.fw.AssignedUUIDs(ctx, t, ns)); done == len(names) {
		t.Fatalf("all %d objects were done before the kill: it did not land mid-backlog", done)
	}

	framework.StartController(ctx, t, controllerAs(env.kubeconfig), ns)
	want := env.fw.WaitUUIDs(ctx, t, ns, names, time.Minute)
	history.CheckOnce(ctx, t, want)
	if codes := auditedCodesNotOne200(t, ns); len(codes) > 0 {
		t.Logf("status PATCH codes, for objects not written with exactly one 200: %v", codes)
	}
	for name, codes := range auditedCodesNotOne200(t, ns) {
		if n := count(codes, 200); n > 1 {
			t.Errorf("%s: %d successful status writes, want at most one", name, n)
		}
	}
}

// waitFirstAssignment waits until p has assigned its first UUID.
func waitFirstAssignment(ctx context.Context, t *testing.T, p *cluster.ControllerProcess) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return controllerMetric(ctx, t, p, "uuid_controller_uuids_assigned_total", nil) > 0, nil
	})
	if err != nil {
		t.Fatal("no UUID assigned within 30 s")
	}
}

func count(codes []int, code int) int {
	n := 0
	for _, c := range codes {
		if c == code {
			n++
		}
	}
	return n
}

// auditedCodesNotOne200 lists, for each object in ns whose status was not
// written successfully exactly once, the response codes of its status PATCHes.
func auditedCodesNotOne200(t *testing.T, ns string) map[string][]int {
	t.Helper()
	codes := auditedStatusPatchCodes(t, ns)
	for name, cs := range codes {
		if slices.Equal(cs, []int{200}) {
			delete(codes, name)
		}
	}
	return codes
}

// TestEtcdOutage: etcd goes away for 20 s under a running apiserver and
// controller (every list, watch and write fails meanwhile). The controller
// keeps running and, once etcd is back, serves new objects; old UUIDs stay.
func TestEtcdOutage(t *testing.T) {
	ctx := testCtx(t)
	ns := env.fw.NewNamespace(ctx, t)
	p := framework.StartController(ctx, t, controllerAs(env.kubeconfig), ns)
	before := env.fw.CreateUuids(ctx, t, ns, "before", 10)
	want := env.fw.WaitUUIDs(ctx, t, ns, before, 30*time.Second)

	startEtcd := stopEtcd(t)
	time.Sleep(20 * time.Second) // the outage's length is what is tested: no signal ends it sooner
	mustStayRunning(t, p)
	startEtcd(ctx)
	after := createAfterOutage(ctx, t, ns, "after", 10)
	env.fw.WaitUUIDs(ctx, t, ns, after, time.Minute)
	checkKept(ctx, t, ns, want, "the etcd outage")
	mustStayRunning(t, p)
}

// stopEtcd stops etcd and returns the function that starts it again; if
// the test ends first, cleanup starts it, since later tests need it.
func stopEtcd(t *testing.T) (start func(context.Context)) {
	t.Helper()
	if err := env.cluster.StopEtcd(); err != nil {
		t.Fatal(err)
	}
	started := false
	t.Cleanup(func() {
		if !started {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := env.cluster.StartEtcd(ctx); err != nil {
				t.Errorf("restarting etcd: %v", err)
			}
		}
	})
	return func(ctx context.Context) {
		t.Helper()
		started = true
		if err := env.cluster.StartEtcd(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// createAfterOutage creates n objects, retrying each create for up to a
// minute: the apiserver's etcd client backs off while etcd is away, so the
// first requests after it returns can still fail.
func createAfterOutage(ctx context.Context, t *testing.T, ns, prefix string, n int) []string {
	t.Helper()
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	created := 0
	var lastErr error
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		for ; created < n; created++ {
			if _, lastErr = env.fw.Uuids(ns).Create(ctx, framework.NewUuid(names[created]), metav1.CreateOptions{}); lastErr != nil {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("create %s/%s a minute after etcd came back: %v", ns, names[created], lastErr)
	}
	return names
}

// TestTransientWriteErrors: the apiserver answers the first status PATCHes
// with 500 (an overloaded or failing apiserver). The controller retries
// with backoff, reports the failure on the object exactly once, at the
// --error-after-th failed attempt (one Warning Event, and one Error status
// write, which fails too), and assigns the UUID as soon as a write goes
// through, with state Ok. Nothing is dropped, and every failure is counted.
func TestTransientWriteErrors(t *testing.T) {
	ctx := testCtx(t)
	ns := env.fw.NewNamespace(ctx, t)
	const (
		failFirst  = 6
		errorAfter = 3
		// baseRetryDelay is controller.go's: an object's first retry
		// delay, doubling from there.
		baseRetryDelay = 5 * time.Millisecond
	)
	type patch struct {
		at    time.Time
		state string // the status.state the PATCH writes
	}
	var (
		mu      sync.Mutex
		patches []patch
	)
	viaProxy := apiProxy(t, func(w http.ResponseWriter, r *http.Request) bool {
		if !isStatusPatch(r) {
			return false
		}
		body, err := io.ReadAll(r.Body)
		if err != nil {
			t.Errorf("read a status PATCH: %v", err)
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		var sent struct {
			Status struct{ State string } `json:"status"`
		}
		if err := json.Unmarshal(body, &sent); err != nil {
			t.Errorf("status PATCH %s: %v", body, err)
		}
		mu.Lock()
		patches = append(patches, patch{at: time.Now(), state: sent.Status.State})
		n := len(patches)
		mu.Unlock()
		if n > failFirst {
			return false
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","message":"injected by the test","reason":"InternalError","code":500}`))
		return true
	})
	p := framework.StartController(ctx, t, controllerAs(viaProxy), ns, "--error-after", strconv.Itoa(errorAfter), "--max-retry-delay", "1s")
	env.fw.CreateUuids(ctx, t, ns, "flaky", 1)

	env.fw.WaitUUIDs(ctx, t, ns, []string{"flaky-0"}, 30*time.Second)
	if state, _ := env.fw.Status(ctx, t, ns, "flaky-0"); state != "Ok" {
		t.Errorf("state = %q after recovery, want Ok", state)
	}
	if w := waitWarning(ctx, t, ns, "flaky-0", "UUIDFailed"); !strings.Contains(w.Message, "injected by the test") {
		t.Errorf("Warning event %q does not carry the apiserver's error", w.Message)
	}
	warnings := 0
	for _, e := range events(ctx, t, ns, "flaky-0") {
		if e.Type == corev1.EventTypeWarning {
			warnings += int(max(e.Count, 1))
		}
	}
	if warnings != 1 {
		t.Errorf("%d Warning events on flaky-0, want exactly 1", warnings)
	}

	// The PATCHes, in order: errorAfter assignments, the Error status,
	// then assignments until one lands (failFirst failed in all).
	mu.Lock()
	got := slices.Clone(patches)
	mu.Unlock()
	var states, want []string
	for _, pt := range got {
		states = append(states, pt.state)
	}
	for i := range failFirst + 1 {
		if i == errorAfter {
			want = append(want, "Error")
		} else {
			want = append(want, "Ok")
		}
	}
	if !slices.Equal(states, want) {
		t.Errorf("status PATCHes wrote states %v, want %v: the Error status once, right after the --error-after-th (%d) failed attempt", states, want, errorAfter)
	}
	// Each retry waits at least its backoff after the attempt before it.
	var attempts []time.Time
	for _, pt := range got {
		if pt.state == "Ok" {
			attempts = append(attempts, pt.at)
		}
	}
	for i := 1; i < len(attempts); i++ {
		backoff := baseRetryDelay << (i - 1)
		if gap := attempts[i].Sub(attempts[i-1]); gap < backoff {
			t.Errorf("attempt %d came %s after attempt %d, less than its backoff %s", i+1, gap, i, backoff)
		}
	}
	failures := controllerMetric(ctx, t, p, "uuid_controller_patch_failures_total",
		func(l map[string]string) bool { return l["reason"] == "InternalError" })
	if failures != failFirst {
		t.Errorf("patch_failures_total{reason=InternalError} = %v, want %d", failures, failFirst)
	}
	if d := controllerMetric(ctx, t, p, "uuid_controller_dropped_total", nil); d != 0 {
		t.Errorf("dropped_total = %v, want 0", d)
	}
}
