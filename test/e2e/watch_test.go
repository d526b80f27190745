package e2e

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/demo-operator/uuid-controller/test/cluster"
	"github.com/demo-operator/uuid-controller/test/framework"
)

// crdSwitchWithin bounds how long a running controller takes to follow a
// CRD change: the CRD check runs every 30 s while the CRD fits
// (internal/crdcheck), and at once when a narrowed list fails.
const crdSwitchWithin = 45 * time.Second

// pendingSelector is the narrowed watch's field selector.
const pendingSelector = "status.uuid="

// metricWithin polls a controller metric until it equals want or timeout
// passes, and returns the last value read.
func metricWithin(ctx context.Context, t *testing.T, p *cluster.ControllerProcess, name string, want float64, timeout time.Duration) float64 {
	t.Helper()
	var v float64
	_ = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		v = controllerMetric(ctx, t, p, name, nil)
		return v == want, nil
	})
	return v
}

// controllerListsAndWatches returns, from the audit log, the queries of
// the controller's lists and watches of Uuid objects in ns. A watch is
// logged when it ends.
func controllerListsAndWatches(t *testing.T, ns string) (lists, watches []url.Values) {
	t.Helper()
	for _, ev := range auditedEvents(t, ns, func(ev cluster.AuditEvent) bool {
		return ev.User.Username == controllerUser && (ev.Verb == "list" || ev.Verb == "watch")
	}) {
		u, err := url.Parse(ev.RequestURI)
		if err != nil {
			t.Fatal(err)
		}
		if ev.Verb == "list" {
			lists = append(lists, u.Query())
		} else {
			watches = append(watches, u.Query())
		}
	}
	return lists, watches
}

// TestWatchMode: with crd.yaml the controller lists and watches only the
// objects waiting for a UUID (fieldSelector status.uuid=, seen in the
// audit log), and says so on watch_narrowed and in its log; with the CRD
// an apiserver before 1.31 serves ($UUID_WATCH=full: no selectable
// field) it lists and watches every object and says that. Either way,
// objects get one UUID and one write each.
func TestWatchMode(t *testing.T) {
	ctx := testCtx(t)
	ns := env.fw.NewNamespace(ctx, t)
	before := env.fw.CreateUuids(ctx, t, ns, "before", 5)
	p := framework.StartController(ctx, t, controllerAs(env.kubeconfig), ns)
	env.fw.WaitUUIDs(ctx, t, ns, before, 30*time.Second)
	env.fw.WaitUUIDs(ctx, t, ns, env.fw.CreateUuids(ctx, t, ns, "after", 5), 30*time.Second)

	narrowed := !cluster.FullWatch()
	want, wantSel, wantLog := 1.0, pendingSelector, "Watching only the Uuid objects still waiting for a UUID"
	if !narrowed {
		want, wantSel, wantLog = 0, "", "Watching and caching every Uuid object"
	}
	if v := metricReaches(ctx, t, p, "uuid_controller_watch_narrowed", nil, want); v != want {
		t.Errorf("uuid_controller_watch_narrowed = %v, want %v", v, want)
	}
	if !strings.Contains(p.Output(), wantLog) {
		t.Errorf("the log does not say %q:\n%s", wantLog, p.Output())
	}
	for name, codes := range auditedStatusPatchCodes(t, ns) {
		if len(codes) != 1 || codes[0] != 200 {
			t.Errorf("%s: status writes %v, want exactly one 200", name, codes)
		}
	}
	mustStayRunning(t, p)
	// The informer's requests are in the audit log once they end. It
	// reads its initial state with a watch (client-go's watch-list); the
	// narrowed leader's only lists are its sweep's, 500 objects a page.
	if code := sigterm(t, p, 30*time.Second); code != 0 {
		t.Errorf("exit code %d on SIGTERM", code)
	}
	lists, watches := controllerListsAndWatches(t, ns)
	if len(watches)+len(lists) == 0 {
		t.Fatal("the audit log has no list or watch of Uuid objects by the controller")
	}
	// Besides, the kopf report's watch on metadata (internal/kopf) starts
	// from the present: one list of one object for the resourceVersion,
	// then a watch from it, with no initial state to send.
	fromPresent := func(q url.Values) bool {
		rv := q.Get("resourceVersion")
		return q.Get("fieldSelector") == "" && q.Get("sendInitialEvents") == "" && rv != "" && rv != "0"
	}
	for _, q := range watches {
		if got := q.Get("fieldSelector"); got != wantSel && !fromPresent(q) {
			t.Errorf("the controller watched with %v, want fieldSelector %q, or from the present (watches %v)", q, wantSel, watches)
			break
		}
	}
	sweeps := 0
	for _, q := range lists {
		switch {
		case q.Get("fieldSelector") == wantSel:
		case q.Get("fieldSelector") == "" && q.Get("limit") == "1":
		case narrowed && q.Get("fieldSelector") == "" && q.Get("limit") == "500":
			sweeps++
		default:
			t.Errorf("the controller listed with %v, want fieldSelector %q, the sweep's limit=500 or the kopf report's limit=1", q, wantSel)
		}
	}
	if narrowed && sweeps == 0 {
		t.Errorf("no sweep in the audit log: lists %v", lists)
	}
}

// TestWatchFollowsTheCRD: a running controller follows the CRD both ways
// without a restart: from the fallback (a CRD with no selectable field) to
// the narrowed watch once crd.yaml is applied, and back when the field is
// taken away again; objects created in each phase get one UUID and one
// write each.
func TestWatchFollowsTheCRD(t *testing.T) {
	ctx := testCtx(t)
	ns := env.fw.NewNamespace(ctx, t)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := env.cluster.InstallCRD(ctx); err != nil {
			t.Errorf("reinstalling crd.yaml: %v", err)
		}
	})
	if err := env.cluster.InstallCRDWithoutSelectableFields(ctx); err != nil {
		t.Fatal(err)
	}
	p := framework.StartController(ctx, t, controllerAs(env.kubeconfig), ns)
	if v := metricWithin(ctx, t, p, "uuid_controller_watch_narrowed", 0, 10*time.Second); v != 0 {
		t.Fatalf("uuid_controller_watch_narrowed = %v on a CRD without the selectable field, want 0", v)
	}
	env.fw.WaitUUIDs(ctx, t, ns, env.fw.CreateUuids(ctx, t, ns, "full", 3), 30*time.Second)

	if err := env.cluster.InstallCRDWithSelectableFields(ctx); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if v := metricWithin(ctx, t, p, "uuid_controller_watch_narrowed", 1, crdSwitchWithin); v != 1 {
		t.Fatalf("uuid_controller_watch_narrowed = %v %s after crd.yaml was applied, want 1", v, crdSwitchWithin)
	}
	t.Logf("narrowed %s after crd.yaml was applied", time.Since(start).Round(100*time.Millisecond))
	env.fw.WaitUUIDs(ctx, t, ns, env.fw.CreateUuids(ctx, t, ns, "narrowed", 3), 30*time.Second)

	if err := env.cluster.InstallCRDWithoutSelectableFields(ctx); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	if v := metricWithin(ctx, t, p, "uuid_controller_watch_narrowed", 0, crdSwitchWithin); v != 0 {
		t.Fatalf("uuid_controller_watch_narrowed = %v %s after the selectable field was removed, want 0", v, crdSwitchWithin)
	}
	t.Logf("back to the full watch %s after the field was removed", time.Since(start).Round(100*time.Millisecond))
	env.fw.WaitUUIDs(ctx, t, ns, env.fw.CreateUuids(ctx, t, ns, "full-again", 3), 30*time.Second)

	if n := strings.Count(p.Output(), "switched=true"); n != 2 {
		t.Errorf("the log says %d switches, want 2:\n%s", n, p.Output())
	}
	codes := auditedStatusPatchCodes(t, ns)
	if len(codes) != 9 {
		t.Errorf("status writes to %d objects, want 9: %v", len(codes), codes)
	}
	for name, c := range codes {
		if len(c) != 1 || c[0] != 200 {
			t.Errorf("%s: status writes %v, want exactly one 200", name, c)
		}
	}
	mustStayRunning(t, p)
}

// TestInvalidUUIDsReplaced: objects whose status.uuid is not a UUID (kopf's
// "NA", or anything written under the article's CRD), which a narrowed
// watch cannot select, are found by the leader's sweep and given one UUID
// each with one write; the sweep says what it found on its metrics.
func TestInvalidUUIDsReplaced(t *testing.T) {
	ctx := testCtx(t)
	ns := env.fw.NewNamespace(ctx, t)
	useArticleCRD(ctx, t)
	bad := map[string]string{"na": "NA", "word": "not-a-uuid"}
	for name, id := range bad {
		createBare(ctx, t, ns, name)
		patch := `{"status":{"state":"Erreur","message":"boom","uuid":"` + id + `"}}`
		if _, err := env.fw.Uuids(ns).Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := env.cluster.InstallCRD(ctx); err != nil {
		t.Fatal(err)
	}
	p := framework.StartController(ctx, t, controllerAs(env.kubeconfig), ns)
	got := env.fw.WaitUUIDs(ctx, t, ns, []string{"na", "word"}, 30*time.Second)
	for name, id := range got {
		if _, err := uuid.Parse(id); err != nil || len(id) != 36 {
			t.Errorf("%s: status.uuid %q, want a UUID", name, id)
		}
	}
	for name, codes := range auditedStatusPatchCodes(t, ns) {
		if len(codes) != 1 || codes[0] != 200 {
			t.Errorf("%s: status writes %v, want exactly one 200", name, codes)
		}
	}
	if !cluster.FullWatch() {
		if v := metricReaches(ctx, t, p, "uuid_controller_sweep_invalid_objects", nil, 2); v != 2 {
			t.Errorf("uuid_controller_sweep_invalid_objects = %v, want 2", v)
		}
		if v := controllerMetric(ctx, t, p, "uuid_controller_sweeps_total", func(l map[string]string) bool { return l["result"] == "ok" }); v < 1 {
			t.Errorf("uuid_controller_sweeps_total{result=ok} = %v, want at least 1", v)
		}
		if v := controllerMetric(ctx, t, p, "uuid_controller_watch_narrowed", nil); v != 1 {
			t.Errorf("uuid_controller_watch_narrowed = %v, want 1: no object carries kopf's finalizer", v)
		}
	}
	mustStayRunning(t, p)
}

// TestUUIDCannotBeSwapped: crd.yaml's transition rule stops any client
// with status rights from replacing one UUID with another, by merge patch,
// JSON patch, PUT of /status or server-side apply; the UUID stays. Removing
// it stays allowed (the documented reset), and so does giving one to an
// object that has none.
func TestUUIDCannotBeSwapped(t *testing.T) {
	ctx := testCtx(t)
	ns := env.fw.NewNamespace(ctx, t)
	name := env.fw.CreateUuids(ctx, t, ns, "swap", 1)[0]
	first, other := uuid.NewString(), uuid.NewString()
	if err := patchStatus(ctx, ns, name, `{"status":{"uuid":"`+first+`"}}`); err != nil {
		t.Fatalf("setting a first UUID: %v", err)
	}
	writes := map[string]func() error{
		"merge patch": func() error { return patchStatus(ctx, ns, name, `{"status":{"uuid":"`+other+`"}}`) },
		"JSON patch": func() error {
			_, err := env.fw.Uuids(ns).Patch(ctx, name, types.JSONPatchType,
				[]byte(`[{"op":"replace","path":"/status/uuid","value":"`+other+`"}]`), metav1.PatchOptions{}, "status")
			return err
		},
		"PUT of /status": func() error {
			u, err := env.fw.Uuids(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if err := unstructured.SetNestedField(u.Object, other, "status", "uuid"); err != nil {
				return err
			}
			_, err = env.fw.Uuids(ns).UpdateStatus(ctx, u, metav1.UpdateOptions{})
			return err
		},
		"server-side apply": func() error {
			apply := `{"apiVersion":"demo.operator/v1","kind":"Uuid","metadata":{"name":"` + name + `"},"status":{"uuid":"` + other + `"}}`
			force := true
			_, err := env.fw.Uuids(ns).Patch(ctx, name, types.ApplyPatchType, []byte(apply),
				metav1.PatchOptions{FieldManager: "swapper", Force: &force}, "status")
			return err
		},
		"upper case": func() error {
			return patchStatus(ctx, ns, name, `{"status":{"uuid":"`+strings.ToUpper(other)+`"}}`)
		},
	}
	for what, write := range writes {
		err := write()
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "cannot be changed to another UUID") {
			t.Errorf("%s replacing the UUID: err = %v, want 422 naming the rule", what, err)
		}
		if _, id := env.fw.Status(ctx, t, ns, name); id != first {
			t.Fatalf("after the %s: status.uuid = %q, want %q kept", what, id, first)
		}
	}
	if err := patchStatus(ctx, ns, name, `{"status":{"uuid":null}}`); err != nil {
		t.Fatalf("removing the UUID (the documented reset): %v", err)
	}
	if err := patchStatus(ctx, ns, name, `{"status":{"uuid":"`+other+`"}}`); err != nil {
		t.Errorf("giving a UUID to an object that has none: %v", err)
	}
}

// TestExpiredContinueGoesOn: what the controller's sweep relies on to
// finish over a million objects. Once etcd is compacted past a paginated
// list's revision (every 5 minutes, which such a sweep outlasts), the next
// page is refused with 410 Expired, and the refusal carries a token that
// goes on from the same key, at the latest revision. (The sweep's own
// handling of it: TestSweepGoesOnAfterExpiredToken.)
func TestExpiredContinueGoesOn(t *testing.T) {
	ctx := testCtx(t)
	ns := env.fw.NewNamespace(ctx, t)
	for _, name := range []string{"a", "b", "c"} {
		createBare(ctx, t, ns, name)
	}
	first, err := env.fw.Uuids(ns).List(ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(first.Items) != 1 || first.Items[0].GetName() != "a" || first.GetContinue() == "" {
		t.Fatalf("first page: %d items, continue %q; want a, and a token", len(first.Items), first.GetContinue())
	}
	createBare(ctx, t, ns, "d") // a revision after the page's
	if _, err := env.cluster.CompactEtcd(ctx); err != nil {
		t.Fatal(err)
	}
	// The watch cache answers a token whose revision it still holds a
	// snapshot of; a restarted one holds none, so etcd answers, as it does
	// for a page whose snapshot left the cache's history.
	if err := env.cluster.RestartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = env.fw.Uuids(ns).List(ctx, metav1.ListOptions{Limit: 1, Continue: first.GetContinue()})
	var status apierrors.APIStatus
	if !apierrors.IsResourceExpired(err) || !errors.As(err, &status) || status.Status().Continue == "" {
		t.Fatalf("next page after compaction: %v; want 410 Expired carrying a continue token", err)
	}
	var names []string
	for opts := (metav1.ListOptions{Limit: 1, Continue: status.Status().Continue}); ; {
		page, err := env.fw.Uuids(ns).List(ctx, opts)
		if err != nil {
			t.Fatalf("going on from the 410's token: %v", err)
		}
		for _, u := range page.Items {
			names = append(names, u.GetName())
		}
		if opts.Continue = page.GetContinue(); opts.Continue == "" {
			break
		}
	}
	if got := strings.Join(names, ","); got != "b,c,d" {
		t.Errorf("pages from the 410's token hold %s, want b,c,d (after a, at the latest revision)", got)
	}
}
