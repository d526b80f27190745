package main

import (
	"context"
	"encoding/json"
	"fmt"
	"unicode/utf8"

	"github.com/google/uuid"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
)

// The values the controller writes into status.state. crd.yaml allows only these.
const (
	StateOk    = "Ok"
	StateError = "Error"
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
}

// assignedStatus is the status written when a UUID is assigned.
func assignedStatus(id uuid.UUID) Status {
	return Status{State: StateOk, Message: MessageAssigned, UUID: id.String()}
}

// errorStatus is the status written when assignment failed for good. It has
// no uuid: the CRD accepts only real UUIDs there (the kopf operator wrote
// "NA"), and an absent uuid lets a later update or resync try again.
func errorStatus(err error) Status {
	return Status{State: StateError, Message: truncateMessage(err.Error(), maxMessageLen)}
}

// truncateMessage cuts msg to at most n bytes on a character boundary, with
// each invalid UTF-8 byte replaced by U+FFFD as encoding/json would: the
// message must read back from the API exactly as written, or the
// controller cannot see that the status already reports a failure, and
// writes it again at each report.
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

// patchStatus sends st to the status subresource of obj.
func patchStatus(ctx context.Context, client dynamic.NamespaceableResourceInterface, obj metav1.Object, st Status) error {
	patch, err := statusPatch(obj.GetResourceVersion(), st)
	if err != nil {
		return fmt.Errorf("status patch for %s/%s: %w", obj.GetNamespace(), obj.GetName(), err)
	}
	_, err = client.Namespace(obj.GetNamespace()).Patch(ctx, obj.GetName(), types.MergePatchType, patch,
		metav1.PatchOptions{FieldManager: FieldManager}, "status")
	if err != nil {
		return fmt.Errorf("patching status of %s/%s: %w", obj.GetNamespace(), obj.GetName(), err)
	}
	return nil
}
