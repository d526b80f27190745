package main

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"unique"

	"github.com/google/uuid"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/demo-operator/uuid-controller/internal/kopf"
)

// cachedUUID is what the informer keeps of a Uuid object: its identity (for
// the cache key, the PATCH precondition and Event references) and its
// status. It is read-only once built. Memory per object is what bounds the
// controller's size (BENCHMARKS.md), so the common object, one with a UUID
// or with no status yet, is 80 bytes: UID and UUID as 16 bytes each, the
// resourceVersion as a number, the namespace shared, state and message as
// codes; anything rarer (a failure report, a deletion, a malformed status)
// goes in rare.
type cachedUUID struct {
	readOnlyMeta
	name string
	// namespace is shared by every object of the namespace.
	namespace unique.Handle[string]
	// rv is metadata.resourceVersion when it is a decimal number without
	// leading zeros (always, from an etcd-backed apiserver); else
	// rare.resourceVersion holds it.
	rv uint64
	// uid is metadata.uid when it is a canonical UUID (always, from an
	// apiserver); else rare.uid holds it.
	uid uuid.UUID
	// id is status.uuid, valid only when flags has hasUUID.
	id    uuid.UUID
	flags cacheFlags
	// created is metadata.creationTimestamp in Unix seconds (the
	// apiserver's resolution), 0 when unset or outside uint32; as a
	// uint32 it fills padding after flags, so the struct stays 80 bytes.
	created uint32
	rare    *cachedRare
}

// cacheFlags codes the usual status.state and status.message, and whether
// kopf's finalizer is on the object.
type cacheFlags uint8

const (
	hasUUID cacheFlags = 1 << iota
	uidInRare
	rvInRare
	stateOk
	stateError
	messageAssigned
	kopfFinalizer
)

// cachedRare holds what few objects have.
type cachedRare struct {
	uid             types.UID
	resourceVersion string
	state, message  string // when not coded in flags
	// uuidText is a status.uuid that is valid but not canonical (upper
	// case), kept as written.
	uuidText string
	// problem says why status could not be trusted (not an object, a
	// uuid that is not a UUID); "" when it is fine or absent.
	problem string
	// conditions are kept only for an object with state Error and no UUID
	// (see currentConditions): the few the controller may write again.
	conditions        []metav1.Condition
	deletionTimestamp *metav1.Time
	// finalizers are kept only while the object is being deleted.
	finalizers []string
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
	f := cachedFields{name: u.GetName(), namespace: u.GetNamespace(), created: u.GetCreationTimestamp(),
		resourceVersion: u.GetResourceVersion(), uid: u.GetUID(), deletionTimestamp: u.GetDeletionTimestamp()}
	f.uuidText, f.problem = existingUUID(u)
	st := currentStatus(u)
	f.state, f.message = st.State, st.Message
	st.UUID = f.uuidText
	f.conditions = currentConditions(u, st)
	f.finalizers = terminatingFinalizers(u)
	f.kopfFinalizer = slices.Contains(u.GetFinalizers(), kopf.Finalizer)
	return f.pack()
}

// cachedFields is what the cache keeps of an object, as read (by toCached,
// or by decodeCached from the JSON), before pack codes it.
type cachedFields struct {
	name, namespace, resourceVersion string
	uid                              types.UID
	created                          metav1.Time
	// uuidText is a valid status.uuid, or ""; problem is existingUUID's.
	uuidText, problem string
	state, message    string
	conditions        []metav1.Condition
	deletionTimestamp *metav1.Time
	finalizers        []string
	// kopfFinalizer: kopf's finalizer is among metadata.finalizers.
	kopfFinalizer bool
}

// pack codes f as a cachedUUID.
func (f *cachedFields) pack() *cachedUUID {
	c := &cachedUUID{name: f.name, namespace: unique.Make(f.namespace)}
	if sec := f.created.Unix(); sec > 0 && sec <= math.MaxUint32 {
		c.created = uint32(sec)
	}
	var rare cachedRare
	if rv, ok := decimalRV(f.resourceVersion); ok {
		c.rv = rv
	} else {
		c.flags |= rvInRare
		rare.resourceVersion = f.resourceVersion
	}
	if id, ok := canonicalUUID(string(f.uid)); ok {
		c.uid = id
	} else {
		c.flags |= uidInRare
		rare.uid = f.uid
	}
	if id, ok := canonicalUUID(f.uuidText); ok {
		c.id = id
		c.flags |= hasUUID
	} else if f.uuidText != "" {
		c.flags |= hasUUID
		rare.uuidText = f.uuidText
	}
	rare.problem = f.problem
	switch f.state {
	case "":
	case StateOk:
		c.flags |= stateOk
	case StateError:
		c.flags |= stateError
	default:
		rare.state = f.state
	}
	switch f.message {
	case "":
	case MessageAssigned:
		c.flags |= messageAssigned
	default:
		rare.message = f.message
	}
	if f.kopfFinalizer {
		c.flags |= kopfFinalizer
	}
	rare.conditions = f.conditions
	if f.deletionTimestamp != nil {
		rare.deletionTimestamp = f.deletionTimestamp
		rare.finalizers = f.finalizers
	}
	if rare.uid != "" || rare.resourceVersion != "" || rare.state != "" || rare.message != "" || rare.uuidText != "" || rare.problem != "" ||
		rare.conditions != nil || rare.deletionTimestamp != nil {
		c.rare = &rare
	}
	return c
}

var noRare cachedRare

// more is c.rare, or an empty one.
func (c *cachedUUID) more() *cachedRare {
	if c.rare == nil {
		return &noRare
	}
	return c.rare
}

// hasUUID tells whether the object has a valid status.uuid.
func (c *cachedUUID) hasUUID() bool { return c.flags&hasUUID != 0 }

// carriesKopfFinalizer tells whether kopf's finalizer is on the object,
// being deleted or not.
func (c *cachedUUID) carriesKopfFinalizer() bool { return c.flags&kopfFinalizer != 0 }

// uuidProblem says why status could not be trusted, or "".
func (c *cachedUUID) uuidProblem() string { return c.more().problem }

// status is the object's status as toCached read it: state, message, a
// valid uuid and (see currentConditions) its conditions.
func (c *cachedUUID) status() Status {
	r := c.more()
	st := Status{State: r.state, Message: r.message, Conditions: r.conditions}
	switch {
	case c.flags&stateOk != 0:
		st.State = StateOk
	case c.flags&stateError != 0:
		st.State = StateError
	}
	if c.flags&messageAssigned != 0 {
		st.Message = MessageAssigned
	}
	if c.hasUUID() {
		st.UUID = r.uuidText
		if st.UUID == "" {
			st.UUID = c.id.String()
		}
	}
	return st
}

// The metav1.Object methods the controller, the informer's key function
// and the event recorder read.

func (c *cachedUUID) GetName() string { return c.name }
func (c *cachedUUID) GetCreationTimestamp() metav1.Time {
	if c.created == 0 {
		return metav1.Time{}
	}
	return metav1.Unix(int64(c.created), 0)
}
func (c *cachedUUID) GetNamespace() string { return c.namespace.Value() }
func (c *cachedUUID) GetResourceVersion() string {
	if c.flags&rvInRare != 0 {
		return c.more().resourceVersion
	}
	return strconv.FormatUint(c.rv, 10)
}
func (c *cachedUUID) GetUID() types.UID {
	if c.flags&uidInRare != 0 {
		return c.more().uid
	}
	return types.UID(c.uid.String())
}
func (c *cachedUUID) GetDeletionTimestamp() *metav1.Time { return c.more().deletionTimestamp }
func (c *cachedUUID) GetFinalizers() []string            { return c.more().finalizers }

// GetObjectKind implements runtime.Object: the kind is always Uuid.
func (c *cachedUUID) GetObjectKind() schema.ObjectKind { return fixedKind{} }

// fixedKind is a schema.ObjectKind fixed to uuidGVK.
type fixedKind struct{}

func (fixedKind) GroupVersionKind() schema.GroupVersionKind { return uuidGVK }

// SetGroupVersionKind is ignored: a cached object is always a Uuid.
func (fixedKind) SetGroupVersionKind(schema.GroupVersionKind) {}

// DeepCopyObject implements runtime.Object.
func (c *cachedUUID) DeepCopyObject() runtime.Object {
	out := *c
	if c.rare != nil {
		r := *c.rare
		r.conditions = append([]metav1.Condition(nil), r.conditions...)
		r.finalizers = append([]string(nil), r.finalizers...)
		r.deletionTimestamp = r.deletionTimestamp.DeepCopy()
		out.rare = &r
	}
	return &out
}

// decimalRV parses rv when formatting the number gives rv back.
func decimalRV(rv string) (uint64, bool) {
	if rv == "" || len(rv) > 1 && rv[0] == '0' {
		return 0, false
	}
	n, err := strconv.ParseUint(rv, 10, 64)
	return n, err == nil
}

// canonicalUUID parses s when it is a UUID as uuid.UUID.String writes it
// (36 characters, lower case), so that keeping 16 bytes loses nothing.
func canonicalUUID(s string) (uuid.UUID, bool) {
	if len(s) != 36 {
		return uuid.UUID{}, false
	}
	for i := 0; i < len(s); i++ {
		if 'A' <= s[i] && s[i] <= 'F' {
			return uuid.UUID{}, false
		}
	}
	id, err := uuid.Parse(s)
	return id, err == nil
}

// existingUUID returns the object's valid status.uuid, or "" when there is
// none. A reason is returned when status holds something that is not a UUID
// (or status is not an object), so the caller can tell the user why it is
// being replaced; the CRD schema rejects such values, so they only appear
// when the schema was changed or bypassed.
func existingUUID(obj *unstructured.Unstructured) (id string, problem string) {
	if st, ok := obj.Object["status"]; ok && st != nil {
		if _, ok := st.(map[string]any); !ok {
			// Its type, not its value, which may be large.
			return "", fmt.Sprintf("status is a %T, not an object", st)
		}
	}
	raw, found, _ := unstructured.NestedFieldNoCopy(obj.Object, "status", "uuid")
	if !found {
		return "", ""
	}
	s, ok := raw.(string)
	if !ok {
		return "", fmt.Sprintf("status.uuid is a %T, not a string", raw)
	}
	return checkUUID(s)
}

// checkUUID is existingUUID for a status.uuid that is a string.
func checkUUID(s string) (id string, problem string) {
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

// readOnlyMeta completes metav1.Object for cachedUUID with what the cache
// does not keep: the getters return zero values, and the setters panic,
// since a cached object is shared by every reader and must not change.
type readOnlyMeta struct{}

func readOnly(field string) { panic("cachedUUID is read-only: Set" + field) }

func (readOnlyMeta) SetNamespace(string)                           { readOnly("Namespace") }
func (readOnlyMeta) SetName(string)                                { readOnly("Name") }
func (readOnlyMeta) GetGenerateName() string                       { return "" }
func (readOnlyMeta) SetGenerateName(string)                        { readOnly("GenerateName") }
func (readOnlyMeta) SetUID(types.UID)                              { readOnly("UID") }
func (readOnlyMeta) SetResourceVersion(string)                     { readOnly("ResourceVersion") }
func (readOnlyMeta) GetGeneration() int64                          { return 0 }
func (readOnlyMeta) SetGeneration(int64)                           { readOnly("Generation") }
func (readOnlyMeta) GetSelfLink() string                           { return "" }
func (readOnlyMeta) SetSelfLink(string)                            { readOnly("SelfLink") }
func (readOnlyMeta) SetCreationTimestamp(metav1.Time)              { readOnly("CreationTimestamp") }
func (readOnlyMeta) SetDeletionTimestamp(*metav1.Time)             { readOnly("DeletionTimestamp") }
func (readOnlyMeta) GetDeletionGracePeriodSeconds() *int64         { return nil }
func (readOnlyMeta) SetDeletionGracePeriodSeconds(*int64)          { readOnly("DeletionGracePeriodSeconds") }
func (readOnlyMeta) GetLabels() map[string]string                  { return nil }
func (readOnlyMeta) SetLabels(map[string]string)                   { readOnly("Labels") }
func (readOnlyMeta) GetAnnotations() map[string]string             { return nil }
func (readOnlyMeta) SetAnnotations(map[string]string)              { readOnly("Annotations") }
func (readOnlyMeta) SetFinalizers([]string)                        { readOnly("Finalizers") }
func (readOnlyMeta) GetOwnerReferences() []metav1.OwnerReference   { return nil }
func (readOnlyMeta) SetOwnerReferences([]metav1.OwnerReference)    { readOnly("OwnerReferences") }
func (readOnlyMeta) GetManagedFields() []metav1.ManagedFieldsEntry { return nil }
func (readOnlyMeta) SetManagedFields([]metav1.ManagedFieldsEntry)  { readOnly("ManagedFields") }

var _ metav1.Object = (*cachedUUID)(nil)

// terminatingFinalizers is what the cache keeps of u's finalizers: all of
// them while u is being deleted, none before, since only then can one be
// acted on (and most objects carry kopf's for life).
func terminatingFinalizers(u *unstructured.Unstructured) []string {
	if u.GetDeletionTimestamp() == nil {
		return nil
	}
	return u.GetFinalizers()
}
