package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"

	"github.com/google/uuid"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/demo-operator/uuid-controller/internal/kopf"
)

// MessageAssigned is the status message of a successful assignment, as the
// kopf operator this ports wrote it.
const MessageAssigned = "resource created successfully"

// maxMessageLen keeps an error text well inside the CRD's maxLength for
// message (4096), so the Error status itself is never rejected by validation.
const maxMessageLen = 1024

// Status is the controller-owned part of a Uuid object.
type Status struct {
	State   string `json:"state,omitempty"`
	Message string `json:"message,omitempty"`
	UUID    string `json:"uuid,omitempty"`
	// Conditions are written whole with every status write (a merge patch
	// replaces a list), so conditions of an earlier write that no longer
	// hold, such as Reconciling after a success, are dropped: absent is
	// False for kstatus.
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// assignedStatus is the status written when a UUID is assigned: Ready=True
// and nothing abnormal. prev are the object's current conditions and now
// the time of a transition.
func assignedStatus(id uuid.UUID, prev []metav1.Condition, now metav1.Time) Status {
	return Status{State: StateOk, Message: MessageAssigned, UUID: id.String(),
		Conditions: conditions(prev, now, metav1.Condition{
			Type: ConditionReady, Status: metav1.ConditionTrue, Reason: ReasonAssigned, Message: MessageAssigned,
		})}
}

// errorStatus is the status written when assignment failed: Ready=False
// with the apiserver's reason, and Reconciling=True while the failure is
// retried or Stalled=True when the request was rejected for good, so that
// kstatus reports InProgress or Failed rather than Current. It has no
// uuid: the CRD accepts only real UUIDs there (the kopf operator wrote
// "NA"), and an absent uuid lets a later update or resync try again.
func errorStatus(err error, retrying bool, prev []metav1.Condition, now metav1.Time) Status {
	msg := truncateMessage(err.Error(), maxMessageLen)
	condReason, _ := failureReasons(err)
	abnormal := metav1.Condition{Type: ConditionStalled, Status: metav1.ConditionTrue, Reason: ReasonRejected, Message: msg}
	if retrying {
		abnormal = metav1.Condition{Type: ConditionReconciling, Status: metav1.ConditionTrue, Reason: ReasonRetrying, Message: msg}
	}
	return Status{State: StateError, Message: msg, Conditions: conditions(prev, now,
		metav1.Condition{Type: ConditionReady, Status: metav1.ConditionFalse, Reason: condReason, Message: msg},
		abnormal)}
}

// conditions returns want, each with the lastTransitionTime of the
// condition of its type in prev when that has the same status, else now:
// a transition time only moves when the status does.
func conditions(prev []metav1.Condition, now metav1.Time, want ...metav1.Condition) []metav1.Condition {
	for i := range want {
		want[i].LastTransitionTime = now
		if p := meta.FindStatusCondition(prev, want[i].Type); p != nil && p.Status == want[i].Status {
			want[i].LastTransitionTime = p.LastTransitionTime
		}
	}
	return want
}

// sameStatus tells whether cur already says what st says, transition
// times aside, so writing st would change nothing a reader sees.
func sameStatus(cur, st Status) bool {
	if cur.State != st.State || cur.Message != st.Message || cur.UUID != st.UUID || len(cur.Conditions) != len(st.Conditions) {
		return false
	}
	for _, c := range st.Conditions {
		p := meta.FindStatusCondition(cur.Conditions, c.Type)
		if p == nil || p.Status != c.Status || p.Reason != c.Reason || p.Message != c.Message {
			return false
		}
	}
	return true
}

// truncateMessage cuts msg to at most n bytes on a character boundary, with
// each invalid UTF-8 byte replaced by U+FFFD as encoding/json would: the
// message must read back from the API exactly as written, or the
// controller cannot tell its own Error write when it returns.
func truncateMessage(msg string, n int) string {
	msg = string([]rune(msg))
	if len(msg) <= n {
		return msg
	}
	for n > 0 && !utf8.RuneStart(msg[n]) {
		n--
	}
	return msg[:n]
}

// statusPatch builds a JSON merge patch that sets status and carries the
// cached object's resourceVersion as a precondition. The apiserver answers
// 409 Conflict when the object changed since it was read, so two writers (two
// replicas, an old and a new pod in a rollout) can never both assign a UUID:
// the loser requeues and then sees the winner's UUID.
func statusPatch(resourceVersion string, st Status) ([]byte, error) {
	if resourceVersion == "" {
		return nil, fmt.Errorf("object has no resourceVersion to use as a precondition")
	}
	p := map[string]any{
		"metadata": map[string]any{"resourceVersion": resourceVersion},
		"status":   st,
	}
	b, err := json.Marshal(p)
	if err != nil {
		return nil, fmt.Errorf("encoding status patch: %w", err)
	}
	return b, nil
}

// patchStatus sends st to the status subresource of obj with send.
func patchStatus(ctx context.Context, send statusPatcher, obj metav1.Object, st Status) error {
	patch, err := statusPatch(obj.GetResourceVersion(), st)
	if err != nil {
		return fmt.Errorf("status patch for %s/%s: %w", obj.GetNamespace(), obj.GetName(), err)
	}
	if err := send(ctx, obj.GetNamespace(), obj.GetName(), patch); err != nil {
		return fmt.Errorf("patching status of %s/%s: %w", obj.GetNamespace(), obj.GetName(), err)
	}
	return nil
}

// statusPatcher sends a merge patch to the status subresource of the
// object namespace/name.
type statusPatcher func(ctx context.Context, namespace, name string, patch []byte) error

// dynamicPatcher sends it with the dynamic client, which decodes the
// object the apiserver returns; unit tests use it on a fake client.
func dynamicPatcher(client dynamic.NamespaceableResourceInterface) statusPatcher {
	return func(ctx context.Context, namespace, name string, patch []byte) error {
		_, err := client.Namespace(namespace).Patch(ctx, name, types.MergePatchType, patch,
			metav1.PatchOptions{FieldManager: FieldManager}, "status")
		return err
	}
}

// restPatcher sends it with rc (newStatusClient), through objectPatcher.
func restPatcher(rc rest.Interface) statusPatcher {
	patch := objectPatcher(rc)
	return func(ctx context.Context, namespace, name string, data []byte) error {
		return patch(ctx, namespace, name, types.MergePatchType, data, metav1.PatchOptions{FieldManager: FieldManager}, "status")
	}
}

// objectPatcher sends patches to Uuid objects (or a subresource) with rc
// (newStatusClient) and reads nothing of a successful answer, the whole
// object: it is drained through a small buffer, neither held nor decoded
// (the informer brings the written object anyway, and the kopf release
// and probe need only to know they succeeded). An error answer is still
// decoded into the apiserver's Status, so apierrors tells a conflict from
// the rest.
func objectPatcher(rc rest.Interface) func(ctx context.Context, namespace, name string, pt types.PatchType, data []byte,
	opts metav1.PatchOptions, subresources ...string) error {
	return func(ctx context.Context, namespace, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) error {
		body, err := rc.Patch(pt).Namespace(namespace).Resource(uuidGVR.Resource).Name(name).SubResource(subresources...).
			SpecificallyVersionedParams(&opts, paramCodec, schema.GroupVersion{Version: "v1"}).Body(data).Stream(ctx)
		if err != nil {
			return err
		}
		defer body.Close()
		// The write is done once the apiserver answered 2xx; reading the
		// rest only lets the connection serve the next request.
		_, _ = io.Copy(io.Discard, body)
		return nil
	}
}

// kopfPatcher is objectPatcher as the kopf migration takes it.
func kopfPatcher(rc rest.Interface) kopf.Patcher {
	patch := objectPatcher(rc)
	return func(ctx context.Context, namespace, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions) error {
		return patch(ctx, namespace, name, pt, data, opts)
	}
}

// newStatusClient is a REST client for uuidGVR's group and version, with
// the dynamic client's serializers (JSON, decoding into unstructured).
func newStatusClient(cfg *rest.Config) (rest.Interface, error) {
	c := dynamic.ConfigFor(cfg)
	c.GroupVersion = &schema.GroupVersion{Group: uuidGVR.Group, Version: uuidGVR.Version}
	c.APIPath = "/apis"
	rc, err := rest.RESTClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("building the status client: %w", err)
	}
	return rc, nil
}

// statusSamples are values the controller writes, per status field: the
// CRD check makes sure the schema accepts each of them.
var statusSamples = map[string][]string{
	"state":   {StateOk, StateError},
	"message": {MessageAssigned, strings.Repeat("x", maxMessageLen)},
	"uuid":    {"0b6f2a8e-5d4c-4f3b-9a1e-7c2d8e6f4a10"},
}
