package main

import (
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/cache"
	ref "k8s.io/client-go/tools/reference"
)

func TestTrimForCache(t *testing.T) {
	readyFalse := map[string]any{"type": "Ready", "status": "False", "reason": "Forbidden", "message": "boom",
		"lastTransitionTime": "2026-12-04T12:00:00Z"}
	tests := []struct {
		name        string
		status      any
		want        Status
		wantProblem string
	}{
		{name: "no status"},
		{name: "assigned", status: map[string]any{"state": "Ok", "message": MessageAssigned, "uuid": testUUID},
			want: Status{State: StateOk, Message: MessageAssigned, UUID: testUUID}},
		{name: "error", status: map[string]any{"state": "Error", "message": "boom"},
			want: Status{State: StateError, Message: "boom"}},
		// Conditions are kept for the controller's own Error report only.
		{name: "error with conditions", status: map[string]any{"state": "Error", "message": "boom", "conditions": []any{readyFalse}},
			want: Status{State: StateError, Message: "boom", Conditions: []metav1.Condition{{
				Type: ConditionReady, Status: metav1.ConditionFalse, Reason: "Forbidden", Message: "boom",
				LastTransitionTime: metav1.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)}}}},
		{name: "assigned with conditions", status: map[string]any{"state": "Ok", "uuid": testUUID, "conditions": []any{readyFalse}},
			want: Status{State: StateOk, UUID: testUUID}},
		{name: "uuid not a UUID", status: map[string]any{"state": "Ok", "uuid": "NA"},
			want: Status{State: StateOk}, wantProblem: `"NA" is not a UUID`},
		{name: "status not an object", status: "broken", wantProblem: "not an object"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			obj := newUUIDObject("ns", "a", "7")
			obj.SetUID("uid-1")
			obj.SetAnnotations(map[string]string{"big": strings.Repeat("y", 1000)})
			obj.Object["spec"] = map[string]any{"anything": "here"}
			if tt.status != nil {
				obj.Object["status"] = tt.status
			}
			got, err := trimForCache(obj)
			if err != nil {
				t.Fatal(err)
			}
			c, ok := got.(*cachedUUID)
			if !ok {
				t.Fatalf("transform gave a %T, want *cachedUUID", got)
			}
			if c.Name != "a" || c.Namespace != "ns" || c.ResourceVersion != "7" || c.UID != types.UID("uid-1") ||
				c.Kind != "Uuid" || c.APIVersion != "demo.operator/v1" {
				t.Errorf("identity lost: %+v", c)
			}
			if len(c.Annotations) != 0 || len(c.Labels) != 0 || len(c.ManagedFields) != 0 {
				t.Error("metadata beyond identity kept in cache")
			}
			if !equality.Semantic.DeepEqual(c.Status, tt.want) {
				t.Errorf("status = %+v, want %+v", c.Status, tt.want)
			}
			if (tt.wantProblem == "") != (c.UUIDProblem == "") || !strings.Contains(c.UUIDProblem, tt.wantProblem) {
				t.Errorf("problem = %q, want one containing %q", c.UUIDProblem, tt.wantProblem)
			}
			if _, ok := obj.Object["spec"]; !ok {
				t.Error("trimForCache modified its input")
			}
		})
	}
	tomb := cache.DeletedFinalStateUnknown{Key: "ns/a"}
	if got, _ := trimForCache(tomb); got != tomb {
		t.Error("a tombstone was not passed through")
	}
}

func TestExistingUUID(t *testing.T) {
	valid := "6f1c2a4e-8a53-4c0c-9d8e-3f7c5a1b2d90"
	tests := []struct {
		name        string
		status      any // nil: no status at all
		wantID      string
		wantProblem string
	}{
		{name: "no status"},
		{name: "empty status", status: map[string]any{}},
		{name: "empty uuid", status: map[string]any{"uuid": ""}},
		{name: "valid", status: map[string]any{"uuid": valid, "state": "Ok"}, wantID: valid},
		{name: "valid with unknown fields", status: map[string]any{"uuid": valid, "extra": []any{1.0}}, wantID: valid},
		{name: "not a uuid", status: map[string]any{"uuid": "NA"}, wantProblem: `status.uuid "NA" is not a UUID`},
		{name: "urn form is not accepted", status: map[string]any{"uuid": "urn:uuid:" + valid}, wantProblem: "is not a UUID"},
		{name: "uuid of wrong type", status: map[string]any{"uuid": int64(7)}, wantProblem: "status.uuid is a int64, not a string"},
		{name: "status of wrong type", status: "done", wantProblem: "status is not an object"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			obj := newUUIDObject("ns", "a", "1")
			if tt.status != nil {
				obj.Object["status"] = tt.status
			}
			id, problem := existingUUID(obj)
			if id != tt.wantID {
				t.Errorf("id = %q, want %q", id, tt.wantID)
			}
			if (tt.wantProblem == "") != (problem == "") || !strings.Contains(problem, tt.wantProblem) {
				t.Errorf("problem = %q, want it to contain %q", problem, tt.wantProblem)
			}
		})
	}
}

// The cached object must still be keyable by the informer and referable by
// an Event.
func TestCachedUUIDIsAnObject(t *testing.T) {
	c := toCached(newUUIDObject("ns", "a", "7"))
	c.UID = "uid-1"
	if k, err := cache.MetaNamespaceKeyFunc(c); err != nil || k != "ns/a" {
		t.Errorf("cache key = %q, %v; want ns/a", k, err)
	}
	r, err := ref.GetReference(scheme.Scheme, c)
	if err != nil {
		t.Fatalf("event reference: %v", err)
	}
	if r.Kind != "Uuid" || r.APIVersion != "demo.operator/v1" || r.Namespace != "ns" || r.Name != "a" || r.UID != "uid-1" {
		t.Errorf("event reference = %+v", r)
	}
	cp := c.DeepCopyObject().(*cachedUUID)
	cp.Name = "b"
	if c.Name != "a" {
		t.Error("DeepCopyObject shares the object")
	}
}

func TestGetRejectsUntransformedObjects(t *testing.T) {
	f := newFixture(t, Options{})
	if err := f.indexer.Add(newUUIDObject("ns", "raw", "1")); err != nil {
		t.Fatal(err)
	}
	if _, err := f.ctrl.get(key("ns", "raw")); err == nil || !strings.Contains(err.Error(), "*unstructured.Unstructured") {
		t.Errorf("get of an untransformed object: err = %v, want one naming its type", err)
	}
	if _, err := f.ctrl.get(key("ns", "absent")); !apierrors.IsNotFound(err) {
		t.Errorf("get of an absent object: err = %v, want NotFound", err)
	}
}
