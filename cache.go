package main

import (
	"fmt"

	"github.com/google/uuid"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
)

// cachedUUID is what the informer keeps of a Uuid object: its identity (for
// the cache key, the PATCH precondition and Event references) and its
// status. It is about 600 bytes, against some 1,500 for even a trimmed
// unstructured object and several KiB for a whole one, so the controller's
// memory stays small and linear in the number of objects.
type cachedUUID struct {
	metav1.TypeMeta
	// ObjectMeta holds only name, namespace, UID, resourceVersion,
	// deletionTimestamp and, while that is set, finalizers.
	metav1.ObjectMeta
	// Status is status.state, status.message and a valid status.uuid; an
	// invalid uuid is left out here and described by UUIDProblem. Its
	// conditions are kept only for an object with state Error and no
	// UUID (see currentConditions): the few the controller may write again.
	Status Status
	// UUIDProblem says why status could not be trusted (not an object, a
	// uuid that is not a UUID); "" when it is fine or absent.
	UUIDProblem string
}

// DeepCopyObject implements runtime.Object.
func (o *cachedUUID) DeepCopyObject() runtime.Object {
	out := *o
	o.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	return &out
}

// trimForCache is the informer's transform: every object is stored, and
// handed to the event handlers, as a *cachedUUID.
func trimForCache(obj any) (any, error) {
	if u, ok := obj.(*unstructured.Unstructured); ok {
		return toCached(u), nil
	}
	// Tombstones and anything else pass through unchanged.
	return obj, nil
}

// toCached keeps what the controller reads of u.
func toCached(u *unstructured.Unstructured) *cachedUUID {
	id, problem := existingUUID(u)
	st := currentStatus(u)
	st = Status{State: shared(st.State), Message: shared(st.Message), UUID: id}
	st.Conditions = currentConditions(u, st)
	return &cachedUUID{
		TypeMeta: metav1.TypeMeta{APIVersion: shared(u.GetAPIVersion()), Kind: shared(u.GetKind())},
		ObjectMeta: metav1.ObjectMeta{
			Namespace:         u.GetNamespace(),
			Name:              u.GetName(),
			UID:               u.GetUID(),
			ResourceVersion:   u.GetResourceVersion(),
			DeletionTimestamp: u.GetDeletionTimestamp(),
			Finalizers:        terminatingFinalizers(u),
		},
		Status:      st,
		UUIDProblem: problem,
	}
}

// existingUUID returns the object's valid status.uuid, or "" when there is
// none. A reason is returned when status holds something that is not a UUID
// (or status is not an object), so the caller can tell the user why it is
// being replaced; the CRD schema rejects such values, so they only appear
// when the schema was changed or bypassed.
func existingUUID(obj *unstructured.Unstructured) (id string, problem string) {
	raw, found, err := unstructured.NestedFieldNoCopy(obj.Object, "status", "uuid")
	if err != nil {
		return "", fmt.Sprintf("status is not an object: %v", err)
	}
	if !found {
		return "", ""
	}
	s, ok := raw.(string)
	if !ok {
		return "", fmt.Sprintf("status.uuid is a %T, not a string", raw)
	}
	if s == "" {
		return "", ""
	}
	if _, err := uuid.Parse(s); err != nil || len(s) != 36 {
		return "", fmt.Sprintf("status.uuid %q is not a UUID", s)
	}
	return s, ""
}

// currentStatus reads status.state and status.message, tolerating any shape.
func currentStatus(obj *unstructured.Unstructured) Status {
	state, _, _ := unstructured.NestedString(obj.Object, "status", "state")
	msg, _, _ := unstructured.NestedString(obj.Object, "status", "message")
	return Status{State: state, Message: msg}
}

// currentConditions reads status.conditions of an object whose status the
// controller may write again: one without a UUID whose state is Error (its
// own earlier failure report), so that a condition that keeps its status
// keeps its lastTransitionTime. Other objects need none of it: one with a
// UUID is never written again, and one with no state has at most the
// CRD's default conditions, whose fixed time is not a transition to keep.
// Malformed entries are left out (the CRD's schema rejects them anyway);
// the next write replaces them.
func currentConditions(obj *unstructured.Unstructured, st Status) []metav1.Condition {
	if st.UUID != "" || st.State != StateError {
		return nil
	}
	field, _, _ := unstructured.NestedFieldNoCopy(obj.Object, "status", "conditions")
	raw, _ := field.([]any)
	var out []metav1.Condition
	for _, r := range raw {
		m, ok := r.(map[string]any)
		if !ok {
			continue
		}
		var c metav1.Condition
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(m, &c); err == nil {
			out = append(out, c)
		}
	}
	return out
}

// Constants replace the decoded copies of these strings, which every object
// repeats, so 10,000 objects share one of each.
var sharedStrings = map[string]string{
	uuidAPIVersion: uuidAPIVersion, uuidKind: uuidKind,
	StateOk: StateOk, StateError: StateError, MessageAssigned: MessageAssigned,
}

const (
	uuidAPIVersion = "demo.operator/v1"
	uuidKind       = "Uuid"
)

func shared(s string) string {
	if c, ok := sharedStrings[s]; ok {
		return c
	}
	return s
}
