package main

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/demo-operator/uuid-controller/internal/kopf"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"

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
			gvk := c.GetObjectKind().GroupVersionKind()
			if c.GetName() != "a" || c.GetNamespace() != "ns" || c.GetResourceVersion() != "7" || c.GetUID() != types.UID("uid-1") ||
				gvk.Kind != "Uuid" || gvk.GroupVersion().String() != "demo.operator/v1" {
				t.Errorf("identity lost: %+v", c)
			}
			if len(c.GetAnnotations()) != 0 || len(c.GetLabels()) != 0 || len(c.GetManagedFields()) != 0 {
				t.Error("metadata beyond identity kept in cache")
			}
			if !equality.Semantic.DeepEqual(c.status(), tt.want) {
				t.Errorf("status = %+v, want %+v", c.status(), tt.want)
			}
			if c.hasUUID() != (tt.want.UUID != "") {
				t.Errorf("hasUUID = %v with status %+v", c.hasUUID(), tt.want)
			}
			if (tt.wantProblem == "") != (c.uuidProblem() == "") || !strings.Contains(c.uuidProblem(), tt.wantProblem) {
				t.Errorf("problem = %q, want one containing %q", c.uuidProblem(), tt.wantProblem)
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
		{name: "status of wrong type", status: "done", wantProblem: "status is a string, not an object"},
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
	u := newUUIDObject("ns", "a", "7")
	u.SetUID("uid-1")
	c := toCached(u)
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
	cp.name = "b"
	cp.rare.uid = "uid-2"
	if c.GetName() != "a" || c.GetUID() != "uid-1" {
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

// The compact form gives back exactly what the object holds: a UID or
// UUID kept as 16 bytes reads back as the same text, and one that is not
// canonical is kept as written.
func TestCachedUUIDRoundTrip(t *testing.T) {
	const canonicalUID = "0c6f1a52-7d1e-4b8a-9f3e-2a5b7c9d1e0f"
	upper := strings.ToUpper(testUUID)
	deleted := metav1.Date(2026, 12, 5, 6, 0, 0, 0, time.UTC)
	tests := []struct {
		name       string
		uid        types.UID
		rv         string // default "7"
		status     map[string]any
		deleting   bool
		finalizers []string
		want       Status
		compact    bool // nothing in rare
	}{
		{name: "new object", uid: canonicalUID, compact: true},
		{name: "assigned", uid: canonicalUID, status: map[string]any{"state": "Ok", "message": MessageAssigned, "uuid": testUUID},
			want: Status{State: StateOk, Message: MessageAssigned, UUID: testUUID}, compact: true},
		{name: "UID not a UUID", uid: "uid-1", want: Status{}},
		{name: "resourceVersion not a plain number", uid: canonicalUID, rv: "0x7"},
		{name: "resourceVersion with a leading zero", uid: canonicalUID, rv: "07"},
		{name: "upper-case UUID kept as written", uid: canonicalUID, status: map[string]any{"state": "Ok", "uuid": upper},
			want: Status{State: StateOk, UUID: upper}},
		{name: "other state and message", uid: canonicalUID, status: map[string]any{"state": "Erreur", "message": "kopf said so"},
			want: Status{State: "Erreur", Message: "kopf said so"}},
		{name: "being deleted", uid: canonicalUID, deleting: true, finalizers: []string{kopf.Finalizer},
			status: map[string]any{"state": "Ok", "message": MessageAssigned, "uuid": testUUID},
			want:   Status{State: StateOk, Message: MessageAssigned, UUID: testUUID}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rv := cmp.Or(tt.rv, "7")
			u := newUUIDObject("ns", "a", rv)
			u.SetUID(tt.uid)
			if tt.status != nil {
				u.Object["status"] = tt.status
			}
			if tt.deleting {
				u.SetDeletionTimestamp(&deleted)
				u.SetFinalizers(tt.finalizers)
			}
			c := toCached(u)
			if c.GetUID() != tt.uid || c.GetResourceVersion() != rv {
				t.Errorf("UID, resourceVersion = %q, %q; want %q, %q", c.GetUID(), c.GetResourceVersion(), tt.uid, rv)
			}
			if got := c.status(); !equality.Semantic.DeepEqual(got, tt.want) {
				t.Errorf("status = %+v, want %+v", got, tt.want)
			}
			if (c.rare == nil) != tt.compact {
				t.Errorf("rare = %+v, want it nil: %v", c.rare, tt.compact)
			}
			if tt.deleting && (!c.GetDeletionTimestamp().Equal(&deleted) || !slices.Equal(c.GetFinalizers(), tt.finalizers)) {
				t.Errorf("deletion lost: %v %v", c.GetDeletionTimestamp(), c.GetFinalizers())
			}
		})
	}
}

// creationTimestamp, for the assignment latency, is kept in whole seconds
// (the apiserver's resolution) inside the 80 bytes; one unset, or outside
// what a uint32 of Unix seconds holds, reads back as zero (no observation).
func TestCachedCreationTimestamp(t *testing.T) {
	if size := unsafe.Sizeof(cachedUUID{}); size > 80 {
		t.Errorf("cachedUUID is %d bytes, over the 80 docs/design.md and BENCHMARKS.md count on", size)
	}
	for _, tt := range []struct {
		name string
		set  metav1.Time
		want metav1.Time
	}{
		{name: "set", set: metav1.Date(2026, 12, 5, 7, 30, 1, 0, time.UTC), want: metav1.Date(2026, 12, 5, 7, 30, 1, 0, time.UTC)},
		{name: "unset", set: metav1.Time{}, want: metav1.Time{}},
		{name: "before 1970", set: metav1.Date(1969, 1, 1, 0, 0, 0, 0, time.UTC), want: metav1.Time{}},
		{name: "after 2106", set: metav1.Date(2107, 1, 1, 0, 0, 0, 0, time.UTC), want: metav1.Time{}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			u := newUUIDObject("ns", "a", "1")
			u.SetCreationTimestamp(tt.set)
			if got := toCached(u).GetCreationTimestamp(); !got.Equal(&tt.want) {
				t.Errorf("creationTimestamp = %v, want %v", got, tt.want)
			}
		})
	}
}

// Objects of one namespace share one copy of its name.
func TestCachedNamespaceIsShared(t *testing.T) {
	a, b := toCached(newUUIDObject("team-a", "x", "1")), toCached(newUUIDObject(strings.Clone("team-a"), "y", "1"))
	if a.namespace != b.namespace || unsafe.StringData(a.GetNamespace()) != unsafe.StringData(b.GetNamespace()) {
		t.Error("two objects of a namespace hold two copies of its name")
	}
}

func TestCachedUUIDIsReadOnly(t *testing.T) {
	c := toCached(newUUIDObject("ns", "a", "7"))
	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "read-only: SetLabels") {
			t.Errorf("SetLabels on a cached object: recovered %v, want a read-only panic", r)
		}
	}()
	c.SetLabels(map[string]string{"a": "b"})
}

// cachedWithStatus is the cached form of an object with status st.
func cachedWithStatus(t *testing.T, ns, name string, uid types.UID, rv string, st Status) *cachedUUID {
	t.Helper()
	u := newUUIDObject(ns, name, rv)
	u.SetUID(uid)
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&st)
	if err != nil {
		t.Fatal(err)
	}
	if len(m) > 0 {
		u.Object["status"] = m
	}
	return toCached(u)
}
