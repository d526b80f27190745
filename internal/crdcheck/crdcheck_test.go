package crdcheck

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/demo-operator/uuid-controller/internal/testlog"
)

// testStatus has the fields and json names of the controller's Status.
type testStatus struct {
	State      string             `json:"state,omitempty"`
	Message    string             `json:"message,omitempty"`
	UUID       string             `json:"uuid,omitempty"`
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// newTestChecker checks the Uuid resource the captures in testdata serve,
// as the controller does; d may be nil when fetch is replaced.
func newTestChecker(d discovery.DiscoveryInterfaceWithContext) *Checker {
	k, err := New(Config{
		Discovery: d,
		Resource:  schema.GroupVersionResource{Group: "demo.operator", Version: "v1", Resource: "uuid"},
		Kind:      "Uuid",
		Status:    reflect.TypeFor[testStatus](),
		Samples: map[string][]string{
			"state":   {"Ok", "Error"},
			"message": {"resource created successfully", strings.Repeat("x", 1024)},
			"uuid":    {"0b6f2a8e-5d4c-4f3b-9a1e-7c2d8e6f4a10"},
		},
		Fix:     "apply the controller's CRD: kubectl apply -f crd.yaml",
		Metrics: prometheus.NewRegistry(),
	})
	if err != nil {
		panic(err) // a new registry cannot hold the gauge already
	}
	return k
}

// facts reads a capture from testdata (see testdata/README.md).
func readFacts(t *testing.T, which string) facts {
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
	return facts{resources: &rl, openAPI: doc}
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
	good, article := readFacts(t, "crd"), readFacts(t, "article-crd")
	props := func(st map[string]any) map[string]any { return st["properties"].(map[string]any) }
	withSchema := func(edit func(map[string]any)) facts {
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
		facts facts
		want  []string // one substring per problem; none for a fitting CRD
	}{
		{name: "crd.yaml", facts: good},
		{name: "the article's CRD", facts: article, want: []string{"no status subresource", "no status.conditions"}},
		{name: "not installed", facts: facts{}, want: []string{"is not served"}},
		{name: "another resource in the group", facts: facts{resources: &metav1.APIResourceList{APIResources: []metav1.APIResource{{Name: "other"}}}},
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
		{name: "unreadable document", facts: facts{resources: good.resources, openAPI: []byte("<html>")},
			want: []string{"not readable"}},
		{name: "no Uuid schema", facts: facts{resources: good.resources, openAPI: []byte(`{"components":{"schemas":{}}}`)},
			want: []string{"no schema for kind Uuid"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := newTestChecker(nil).problemsOf(tt.facts)
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
func fakeFetch(results ...func() (facts, error)) func(context.Context) (facts, error) {
	i := 0
	return func(context.Context) (facts, error) {
		r := results[min(i, len(results)-1)]
		i++
		return r()
	}
}

func TestCRDCheckerReportsAndHeals(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	good, article := readFacts(t, "crd"), readFacts(t, "article-crd")
	k := newTestChecker(nil)
	k.fetch = fakeFetch(
		func() (facts, error) { return facts{}, errors.New("connection refused") },
		func() (facts, error) { return article, nil },
		func() (facts, error) { return good, nil },
	)
	heals := 0
	onHeal := func(context.Context) { heals++ }

	k.check(ctx, onHeal) // the apiserver cannot be reached
	if err := k.Ready(); err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("Ready before any check = %v, want the reason", err)
	}
	if err := k.Blocked(); err != nil {
		t.Errorf("Blocked with nothing known = %v, want nil: writes go on and a 404 asks again", err)
	}

	k.check(ctx, onHeal) // the article's CRD
	blocked := k.Blocked()
	if !errors.Is(blocked, ErrNotReady) || !strings.Contains(blocked.Error(), "kubectl apply -f crd.yaml") {
		t.Errorf("Blocked on the article's CRD = %v, want ErrNotReady naming the fix", blocked)
	}
	if err := k.Ready(); err == nil || err.Error() != blocked.Error() {
		t.Errorf("Ready = %v, want %v", err, blocked)
	}
	if v := testutil.ToFloat64(k.ready); v != 0 {
		t.Errorf("crd_ready = %v, want 0", v)
	}

	k.check(ctx, onHeal) // crd.yaml applied
	if k.Ready() != nil || k.Blocked() != nil || heals != 1 {
		t.Errorf("after the fix: Ready %v, Blocked %v, heals %d; want nil, nil, 1", k.Ready(), k.Blocked(), heals)
	}
	if v := testutil.ToFloat64(k.ready); v != 1 {
		t.Errorf("crd_ready = %v, want 1", v)
	}
	k.check(ctx, onHeal)
	if heals != 1 {
		t.Errorf("heals = %d after a second good check, want still 1", heals)
	}
}

// fetchFacts against an httptest apiserver serving the captures, or
// failing one of the two reads.
func TestFetchFacts(t *testing.T) {
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
			got, err := newTestChecker(dc).fetchFacts(t.Context())
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
			if p := newTestChecker(dc).problemsOf(got); tt.wantFacts && len(p) != 0 {
				t.Errorf("problems = %q on the served crd.yaml", p)
			}
		})
	}
}

// Run checks at once, again soon after Suspect (the periodic check of a
// fitting CRD is 30 s away), and returns when its context ends.
func TestCRDCheckerRunChecksOnSuspect(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	k := newTestChecker(nil)
	checks := make(chan struct{}, 10)
	good := readFacts(t, "crd")
	k.fetch = func(context.Context) (facts, error) { checks <- struct{}{}; return good, nil }
	done := make(chan struct{})
	go func() { defer close(done); k.Run(ctx, func(context.Context) {}) }()
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

// withoutKindSchema is doc with the Uuid schema taken out, as the document
// of a group version reads just before a new CRD's schema is published.
func withoutKindSchema(t *testing.T, doc []byte) []byte {
	t.Helper()
	var d map[string]any
	if err := json.Unmarshal(doc, &d); err != nil {
		t.Fatal(err)
	}
	delete(d["components"].(map[string]any)["schemas"].(map[string]any), "operator.demo.v1.Uuid")
	b, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// notPublished is the document read's 404, as fetchFacts returns it.
func notPublished() (facts, error) {
	return facts{}, fmt.Errorf("reading /openapi/v3/apis/demo.operator/v1: %w",
		apierrors.NewNotFound(schema.GroupResource{}, ""))
}

// errorLines are the error lines in logs.
func errorLines(logs *testlog.Capture) []string {
	var out []string
	for _, e := range logs.Entries() {
		if e.Type == ktesting.LogError {
			out = append(out, e.Message)
		}
	}
	return out
}

// Quiet start: a CRD just created is served before its OpenAPI document
// holds it (404, then a document without the kind). The check reads again
// for a few seconds and reports only what it then finds: no error line.
func TestCRDCheckQuietWhileUnpublished(t *testing.T) {
	logger, logs := testlog.New(t, 0)
	ctx := klog.NewContext(t.Context(), logger)
	good := readFacts(t, "crd")
	early := facts{resources: good.resources, openAPI: withoutKindSchema(t, good.openAPI)}
	k := newTestChecker(nil)
	k.fetch = fakeFetch(notPublished, notPublished,
		func() (facts, error) { return early, nil },
		func() (facts, error) { return good, nil })
	k.check(ctx, func(context.Context) {})
	if err := k.Ready(); err != nil {
		t.Errorf("Ready = %v once the document is published, want nil", err)
	}
	if lines := errorLines(logs); len(lines) > 0 {
		t.Errorf("logged %q for a CRD whose document was published within the grace", lines)
	}
}

// Past the grace, a document still not published is reported exactly as
// before: an unreadable document as a failed check, a document without the
// kind as a CRD that does not fit.
func TestCRDCheckReportsUnpublishedAfterGrace(t *testing.T) {
	good := readFacts(t, "crd")
	early := facts{resources: good.resources, openAPI: withoutKindSchema(t, good.openAPI)}
	for _, tc := range []struct {
		name      string
		fetch     func() (facts, error)
		wantLog   string
		wantReady string
	}{
		{"404", notPublished, "Could not check the Uuid CRD, will retry", "has not been checked yet"},
		{"no schema for the kind", func() (facts, error) { return early, nil }, "The installed Uuid CRD does not fit this controller", "has no schema for kind Uuid"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logger, logs := testlog.New(t, 0)
			ctx := klog.NewContext(t.Context(), logger)
			k := newTestChecker(nil)
			k.publishGrace = 300 * time.Millisecond
			reads := 0
			k.fetch = func(context.Context) (facts, error) { reads++; return tc.fetch() }
			start := time.Now()
			k.check(ctx, func(context.Context) {})
			if took := time.Since(start); took < k.publishGrace || reads < 2 {
				t.Errorf("check returned after %s and %d reads, want it to read again for %s", took, reads, k.publishGrace)
			}
			if lines := errorLines(logs); len(lines) != 1 || !strings.Contains(lines[0], tc.wantLog) {
				t.Errorf("error lines %q, want one: %q", lines, tc.wantLog)
			}
			if err := k.Ready(); err == nil || !strings.Contains(err.Error(), tc.wantReady) {
				t.Errorf("Ready = %v, want it to say %q", err, tc.wantReady)
			}
		})
	}
}

// Selectable follows the selectable fields the served CRD declares:
// unknown before a check completes, true for crd.yaml (captured from the
// apiserver), false for the article's CRD and for an unreadable document,
// and what was known stands through a failed check.
func TestSelectable(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	good, article := readFacts(t, "crd"), readFacts(t, "article-crd")
	k := newTestChecker(nil)
	k.cfg.SelectableField = "status.uuid"
	k.fetch = fakeFetch(
		func() (facts, error) { return facts{}, errors.New("connection refused") },
		func() (facts, error) { return good, nil },
		func() (facts, error) { return facts{}, errors.New("connection refused") },
		func() (facts, error) { return article, nil },
		func() (facts, error) { return facts{resources: good.resources, openAPI: []byte("<html>")}, nil },
	)
	want := []struct{ selectable, known bool }{{false, false}, {true, true}, {true, true}, {false, true}, {false, true}}
	for i, w := range want {
		k.check(ctx, func(context.Context) {})
		if s, known := k.Selectable(); s != w.selectable || known != w.known {
			t.Errorf("check %d: Selectable() = %v, %v; want %v, %v", i, s, known, w.selectable, w.known)
		}
	}
	other := newTestChecker(nil)
	other.cfg.SelectableField = "status.state"
	other.fetch = fakeFetch(func() (facts, error) { return good, nil })
	other.check(ctx, func(context.Context) {})
	if s, _ := other.Selectable(); s {
		t.Error("Selectable for status.state = true on crd.yaml, which declares only status.uuid")
	}
}
