package kopf

import (
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

func TestFinalizerIndex(t *testing.T) {
	deleting := &metav1.Time{Time: time.Now()}
	for _, tc := range []struct {
		name       string
		deletion   *metav1.Time
		finalizers []string
		want       int
	}{
		{"live, kopf's", nil, []string{Finalizer}, -1},
		{"deleting, kopf's second", deleting, []string{"example.com/other", Finalizer}, 1},
		{"deleting, another only", deleting, []string{"example.com/other"}, -1},
		{"deleting, none", deleting, nil, -1},
	} {
		obj := &metav1.ObjectMeta{DeletionTimestamp: tc.deletion, Finalizers: tc.finalizers}
		if got := FinalizerIndex(obj); got != tc.want {
			t.Errorf("%s: FinalizerIndex = %d, want %d", tc.name, got, tc.want)
		}
	}
}

func TestRemoveFinalizerPatch(t *testing.T) {
	b, err := RemoveFinalizerPatch(1)
	if err != nil {
		t.Fatal(err)
	}
	var ops []map[string]any
	if err := json.Unmarshal(b, &ops); err != nil {
		t.Fatal(err)
	}
	want := []map[string]any{
		{"op": "test", "path": "/metadata/finalizers/1", "value": Finalizer},
		{"op": "remove", "path": "/metadata/finalizers/1"},
	}
	if len(ops) != 2 || ops[0]["op"] != want[0]["op"] || ops[0]["path"] != want[0]["path"] || ops[0]["value"] != want[0]["value"] ||
		ops[1]["op"] != want[1]["op"] || ops[1]["path"] != want[1]["path"] || len(ops[1]) != 2 {
		t.Errorf("patch = %s, want test then remove of index 1", b)
	}
}

func TestIsFailedPatchTest(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		// As k8s.io/apiserver's patch handler answers a failed test.
		{"failed test", apierrors.NewGenericServerResponse(http.StatusUnprocessableEntity, "", schema.GroupResource{}, "",
			"testing value /metadata/finalizers/1 failed: test failed", 0, false), true},
		{"rejected by validation", apierrors.NewInvalid(schema.GroupKind{Group: "demo.operator", Kind: "Uuid"}, "x", nil), false},
		{"conflict", apierrors.NewConflict(schema.GroupResource{}, "x", errors.New("changed")), false},
		{"not an API error", errors.New("boom"), false},
	} {
		if got := IsFailedPatchTest(tc.err); got != tc.want {
			t.Errorf("%s: IsFailedPatchTest = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestWaitingGaugeReadsTheIndex: kopf_finalizer_waiting_objects counts what
// Config.Held returns, never lists the whole cache (a scrape every few
// seconds over a million objects), and is NaN, not 0, when the index
// cannot be read.
func TestWaitingGaugeReadsTheIndex(t *testing.T) {
	held := []any{&metav1.ObjectMeta{Name: "a"}, &metav1.ObjectMeta{Name: "b"}}
	var heldErr error
	reg := prometheus.NewRegistry()
	_, err := New(Config{
		Any:     func() Object { t.Error("the gauge read the cache"); return nil },
		Held:    func() ([]any, error) { return held, heldErr },
		Metrics: reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	gauge := func() float64 {
		t.Helper()
		families, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range families {
			if mf.GetName() == "kopf_finalizer_waiting_objects" {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatal("no kopf_finalizer_waiting_objects")
		return 0
	}
	if got := gauge(); got != 2 {
		t.Errorf("kopf_finalizer_waiting_objects = %v, want 2", got)
	}
	heldErr = errors.New("index kopf-held does not exist")
	if got := gauge(); !math.IsNaN(got) {
		t.Errorf("kopf_finalizer_waiting_objects with the index unreadable = %v, want NaN", got)
	}
}

// TestHeldIndexFunc files only the objects whose deletion kopf's finalizer
// holds.
func TestHeldIndexFunc(t *testing.T) {
	deleting := &metav1.Time{Time: time.Now()}
	for _, tc := range []struct {
		name string
		obj  any
		want []string
	}{
		{"deleting, kopf's", &metav1.ObjectMeta{DeletionTimestamp: deleting, Finalizers: []string{"example.com/other", Finalizer}}, []string{HeldValue}},
		{"live, kopf's", &metav1.ObjectMeta{Finalizers: []string{Finalizer}}, nil},
		{"deleting, another only", &metav1.ObjectMeta{DeletionTimestamp: deleting, Finalizers: []string{"example.com/other"}}, nil},
		{"not an object", "a tombstone", nil},
	} {
		got, err := HeldIndexFunc(tc.obj)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("%s: HeldIndexFunc = %v, %v; want %v", tc.name, got, err, tc.want)
		}
	}
}
