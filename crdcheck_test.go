package main

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2/ktesting"
)

// facts reads a capture from testdata (see testdata/README.md).
func facts(t *testing.T, which string) crdFacts {
	t.Helper()
	var rl metav1.APIResourceList
	b, err := os.ReadFile("testdata/discovery-" + which + ".json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &rl); err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile("testdata/openapi-" + which + ".json")
	if err != nil {
		t.Fatal(err)
	}
	return crdFacts{resources: &rl, openAPI: doc}
}

// editSchema decodes doc, lets edit change the Uuid schema's status
// properties, and encodes it again.
func editSchema(t *testing.T, doc []byte, edit func(status map[string]any)) []byte {
	t.Helper()
	var d map[string]any
	if err := json.Unmarshal(doc, &d); err != nil {
		t.Fatal(err)
	}
	s := d["components"].(map[string]any)["schemas"].(map[string]any)["operator.demo.v1.Uuid"].(map[string]any)
	edit(s["properties"].(map[string]any)["status"].(map[string]any))
	b, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestCRDProblems(t *testing.T) {
	good, article := facts(t, "crd"), facts(t, "article-crd")
	props := func(st map[string]any) map[string]any { return st["properties"].(map[string]any) }
	withSchema := func(edit func(map[string]any)) crdFacts {
		f := good
		f.openAPI = editSchema(t, good.openAPI, edit)
		return f
	}
	noPatch := good
	noPatch.resources = good.resources.DeepCopy()
	for i, r := range noPatch.resources.APIResources {
		if r.Name == "uuid/status" {
			noPatch.resources.APIResources[i].Verbs = []string{"get"}
		}
	}
	tests := []struct {
		name  string
		facts crdFacts
		want  []string // one substring per problem; none for a fitting CRD
	}{
		{name: "crd.yaml", facts: good},
		{name: "the article's CRD", facts: article, want: []string{"no status subresource", "no status.conditions"}},
		{name: "not installed", facts: crdFacts{}, want: []string{"is not served"}},
		{name: "another resource in the group", facts: crdFacts{resources: &metav1.APIResourceList{APIResources: []metav1.APIResource{{Name: "other"}}}},
			want: []string{"resource uuid is not served"}},
		{name: "status without patch", facts: noPatch, want: []string{"does not accept patch"}},
		{name: "state enum without Error", facts: withSchema(func(st map[string]any) {
			props(st)["state"].(map[string]any)["enum"] = []any{"Ok"}
		}), want: []string{`status.state does not allow "Error"`}},
		{name: "no uuid field", facts: withSchema(func(st map[string]any) { delete(props(st), "uuid") }),
			want: []string{"no status.uuid"}},
		{name: "no fields, unknown ones kept", facts: withSchema(func(st map[string]any) {
			delete(st, "properties")
			st["x-kubernetes-preserve-unknown-fields"] = true
		})},
		{name: "uuid an integer", facts: withSchema(func(st map[string]any) {
			props(st)["uuid"] = map[string]any{"type": "integer"}
		}), want: []string{"status.uuid has type integer"}},
		{name: "uuid pattern rejecting UUIDs", facts: withSchema(func(st map[string]any) {
			props(st)["uuid"].(map[string]any)["pattern"] = "^[0-9]+$"
		}), want: []string{"status.uuid pattern"}},
		{name: "short message", facts: withSchema(func(st map[string]any) {
			props(st)["message"].(map[string]any)["maxLength"] = 100
		}), want: []string{"status.message maxLength 100"}},
		{name: "status a string", facts: withSchema(func(st map[string]any) { st["type"] = "string" }),
			want: []string{"status has type string"}},
		{name: "unreadable document", facts: crdFacts{resources: good.resources, openAPI: []byte("<html>")},
			want: []string{"not readable"}},
		{name: "no Uuid schema", facts: crdFacts{resources: good.resources, openAPI: []byte(`{"components":{"schemas":{}}}`)},
			want: []string{"no schema for kind Uuid"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := crdProblems(tt.facts)
			if len(got) != len(tt.want) {
				t.Fatalf("problems = %q, want %d matching %q", got, len(tt.want), tt.want)
			}
			for i, w := range tt.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("problem %d = %q, want it to contain %q", i, got[i], w)
				}
			}
		})
	}
}

// fakeFetch answers the checker's reads from a list of results, the last
// repeated.
func fakeFetch(results ...func() (crdFacts, error)) func(context.Context) (crdFacts, error) {
	i := 0
	return func(context.Context) (crdFacts, error) {
		r := results[min(i, len(results)-1)]
		i++
		return r()
	}
}

func TestCRDCheckerReportsAndHeals(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	good, article := facts(t, "crd"), facts(t, "article-crd")
	m := NewMetrics()
	k := newCRDChecker(nil, m.CRDReady)
	k.fetch = fakeFetch(
		func() (crdFacts, error) { return crdFacts{}, errors.New("connection refused") },
		func() (crdFacts, error) { return article, nil },
		func() (crdFacts, error) { return good, nil },
	)
	heals := 0
	k.onHeal = func(context.Context) { heals++ }

	k.check(ctx) // the apiserver cannot be reached
	if err := k.Ready(); err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("Ready before any check = %v, want the reason", err)
	}
	if err := k.Blocked(); err != nil {
		t.Errorf("Blocked with nothing known = %v, want nil: writes go on and a 404 asks again", err)
	}

	k.check(ctx) // the article's CRD
	blocked := k.Blocked()
	if !errors.Is(blocked, errCRDNotReady) || !strings.Contains(blocked.Error(), "kubectl apply -f crd.yaml") {
		t.Errorf("Blocked on the article's CRD = %v, want errCRDNotReady naming the fix", blocked)
	}
	if err := k.Ready(); err == nil || err.Error() != blocked.Error() {
		t.Errorf("Ready = %v, want %v", err, blocked)
	}
	if v := testutil.ToFloat64(m.CRDReady); v != 0 {
		t.Errorf("crd_ready = %v, want 0", v)
	}

	k.check(ctx) // crd.yaml applied
	if k.Ready() != nil || k.Blocked() != nil || heals != 1 {
		t.Errorf("after the fix: Ready %v, Blocked %v, heals %d; want nil, nil, 1", k.Ready(), k.Blocked(), heals)
	}
	if v := testutil.ToFloat64(m.CRDReady); v != 1 {
		t.Errorf("crd_ready = %v, want 1", v)
	}
	k.check(ctx)
	if heals != 1 {
		t.Errorf("heals = %d after a second good check, want still 1", heals)
	}
}

// While the CRD is known to be wrong nothing is written and nothing is
// reported on the objects (no Error status that would 404 too, no Event
// per object), however many attempts; the key stays queued with backoff,
// and the fix queues it again at once.
func TestWritesWaitForTheCRD(t *testing.T) {
	f := newFixture(t, Options{ErrorAfter: 1}, newUUIDObject("default", "example", "5"))
	k := newCRDChecker(nil, f.metrics.CRDReady)
	k.fetch = fakeFetch(func() (crdFacts, error) { return facts(t, "article-crd"), nil })
	f.ctrl.useCRDChecker(k)
	k.check(f.ctx)

	f.ctrl.queue.Add(key("default", "example"))
	f.drive(3)
	if ps := f.patches(); len(ps) != 0 {
		t.Errorf("%d patches sent while the CRD is wrong, want 0", len(ps))
	}
	if ev := f.events(); len(ev) != 0 {
		t.Errorf("events = %q, want none: the CRD problem is reported once, by the checker", ev)
	}
	if n := f.ctrl.queue.NumRequeues(key("default", "example")); n != 3 {
		t.Errorf("requeues = %d, want 3", n)
	}
	if d := testutil.ToFloat64(f.metrics.Dropped); d != 0 {
		t.Errorf("dropped = %v", d)
	}

	k.fetch = fakeFetch(func() (crdFacts, error) { return facts(t, "crd"), nil })
	k.check(f.ctx)
	if n := f.ctrl.queue.Len(); n != 1 {
		t.Fatalf("queue length after the fix = %d, want the object queued at once", n)
	}
	f.drive(1)
	if ps := f.patches(); len(ps) != 1 {
		t.Errorf("%d patches after the fix, want 1", len(ps))
	}
}

// A 404 on the status write for an object the cache still holds is a
// missing status subresource or a deletion not yet delivered: the key is
// retried and a CRD check asked for; once the cache has lost the object
// too, it is forgotten, never counted as a failure.
func TestNotFoundOnPatchAsksForACheck(t *testing.T) {
	obj := newUUIDObject("default", "example", "5")
	f := newFixtureWithClient(t, newClient(t), Options{}, obj) // cached, but gone from the API
	k := newCRDChecker(nil, f.metrics.CRDReady)
	f.ctrl.useCRDChecker(k)
	f.ctrl.queue.Add(key("default", "example"))
	f.drive(1)
	if n := f.ctrl.queue.NumRequeues(key("default", "example")); n != 1 {
		t.Errorf("requeues = %d, want 1: a 404 the cache cannot explain is retried", n)
	}
	select {
	case <-k.trigger:
	default:
		t.Error("no CRD check asked for")
	}
	if err := f.indexer.Delete(toCached(obj)); err != nil {
		t.Fatal(err)
	}
	f.drive(1)
	if n := f.ctrl.queue.NumRequeues(key("default", "example")); n != 0 || f.ctrl.queue.Len() != 0 {
		t.Errorf("requeues = %d, queue length %d once the object left the cache, want it forgotten", n, f.ctrl.queue.Len())
	}
	if got := testutil.ToFloat64(f.metrics.StatusWrites.WithLabelValues("not_found")); got != 1 {
		t.Errorf("not_found writes = %v, want 1", got)
	}
	if d := testutil.ToFloat64(f.metrics.Dropped); d != 0 {
		t.Errorf("dropped = %v", d)
	}
}

// fetchCRDFacts against an httptest apiserver serving the captures, or
// failing one of the two reads.
func TestFetchCRDFacts(t *testing.T) {
	disc, err := os.ReadFile("testdata/discovery-crd.json")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile("testdata/openapi-crd.json")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		discovery int // response code; 200 serves the capture
		openAPI   int
		wantErr   string
		wantFacts bool
	}{
		{name: "served", discovery: 200, openAPI: 200, wantFacts: true},
		{name: "group version not served", discovery: 404, openAPI: 404},
		{name: "discovery fails", discovery: 503, openAPI: 200, wantErr: "discovery of demo.operator/v1"},
		{name: "document not published yet", discovery: 200, openAPI: 404, wantErr: "reading /openapi/v3/apis/demo.operator/v1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				code, body := tt.openAPI, doc
				if r.URL.Path == "/apis/demo.operator/v1" {
					code, body = tt.discovery, disc
				}
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(code)
				if code == http.StatusOK {
					_, _ = w.Write(body)
				}
			}))
			defer srv.Close()
			dc, err := discovery.NewDiscoveryClientForConfig(&rest.Config{Host: srv.URL})
			if err != nil {
				t.Fatal(err)
			}
			got, err := fetchCRDFacts(t.Context(), dc)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if (got.resources != nil) != tt.wantFacts || (len(got.openAPI) > 0) != tt.wantFacts {
				t.Errorf("facts = %v, %d bytes; want them read: %v", got.resources, len(got.openAPI), tt.wantFacts)
			}
			if tt.wantFacts && len(crdProblems(got)) != 0 {
				t.Errorf("problems = %q on the served crd.yaml", crdProblems(got))
			}
		})
	}
}

// Run checks at once, again soon after Suspect (the periodic check of a
// fitting CRD is 30 s away), and returns when its context ends.
func TestCRDCheckerRunChecksOnSuspect(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	k := newCRDChecker(nil, NewMetrics().CRDReady)
	checks := make(chan struct{}, 10)
	good := facts(t, "crd")
	k.fetch = func(context.Context) (crdFacts, error) { checks <- struct{}{}; return good, nil }
	done := make(chan struct{})
	go func() { defer close(done); k.Run(ctx) }()
	waitCheck := func(what string) {
		t.Helper()
		select {
		case <-checks:
		case <-time.After(10 * time.Second):
			t.Fatalf("no check %s", what)
		}
	}
	waitCheck("at start")
	k.Suspect()
	k.Suspect() // coalesced with the first
	waitCheck("after Suspect")
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	if n := len(checks); n != 0 {
		t.Errorf("%d more checks, want the two Suspect calls to make one", n)
	}
}
