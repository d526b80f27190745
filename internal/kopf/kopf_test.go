package kopf

import (
	"encoding/json"
	"errors"
	"net/http"
	"testing"
	"time"

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
