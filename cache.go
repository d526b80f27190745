package main

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
)

// cachedUuid is what the informer keeps of a Uuid object: its identity (for
// the cache key, the PATCH precondition and Event references) and its
// status. It is about 600 bytes, against some 1,500 for even a trimmed
// unstructured object and several KiB for a whole one, so the controller's
// memory stays small and linear in the number of objects.
type cachedUuid struct {
	metav1.TypeMeta
	// ObjectMeta holds only name, namespace, UID, resourceVersion,
	// deletionTimestamp and, while that is set, finalizers.
	metav1.ObjectMeta
	// Status is status.state, status.message and a valid status.uuid; an
	// invalid uuid is left out here and described by UUIDProblem.
	Status Status
	// UUIDProblem says why status could not be trusted (not an object, a
	// uuid that is not a UUID); "" when it is fine or absent.
	UUIDProblem string
}

// DeepCopyObject implements runtime.Object.
func (o *cachedUuid) DeepCopyObject() runtime.Object {
	out := *o
	o.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	return &out
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

// toCached keeps what the controller reads of u.
func toCached(u *unstructured.Unstructured) *cachedUuid {
	id, problem := existingUUID(u)
	st := currentStatus(u)
	return &cachedUuid{
		TypeMeta: metav1.TypeMeta{APIVersion: shared(u.GetAPIVersion()), Kind: shared(u.GetKind())},
		ObjectMeta: metav1.ObjectMeta{
			Namespace:         u.GetNamespace(),
			Name:              u.GetName(),
			UID:               u.GetUID(),
			ResourceVersion:   u.GetResourceVersion(),
			DeletionTimestamp: u.GetDeletionTimestamp(),
			Finalizers:        terminatingFinalizers(u),
		},
		Status:      Status{State: shared(st.State), Message: shared(st.Message), UUID: id},
		UUIDProblem: problem,
	}
}

// trimForCache is the informer's transform: every object is stored, and
// handed to the event handlers, as a *cachedUuid.
func trimForCache(obj any) (any, error) {
	if u, ok := obj.(*unstructured.Unstructured); ok {
		return toCached(u), nil
	}
	// Tombstones and anything else pass through unchanged.
	return obj, nil
}
