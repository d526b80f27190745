// Package kopf holds what the controller knows of the kopf operator it
// replaces: the finalizer kopf puts on every object it handles, and the
// JSON patch that removes it from an object being deleted. Whether to
// remove it is the controller's decision.
package kopf

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
)

// Finalizer is the finalizer kopf 1.36 puts on every object it handles.
const Finalizer = "kopf.zalando.org/KopfFinalizerMarker"

// FinalizerIndex is the position of kopf's finalizer on obj while obj is
// being deleted, else -1: a live object keeps it, so a kopf still running
// finds it in place.
func FinalizerIndex(obj metav1.Object) int {
	if obj.GetDeletionTimestamp() == nil {
		return -1
	}
	return slices.Index(obj.GetFinalizers(), Finalizer)
}

// HeldIndex names the cache index HeldIndexFunc computes: under HeldValue
// it files the objects whose deletion kopf's finalizer holds, and no other,
// so it costs nothing per object that is not held.
const (
	HeldIndex = "kopf-held"
	HeldValue = "held"
)

// HeldIndexFunc is the cache.IndexFunc of HeldIndex.
func HeldIndexFunc(obj any) ([]string, error) {
	if o, ok := obj.(metav1.Object); ok && FinalizerIndex(o) >= 0 {
		return []string{HeldValue}, nil
	}
	return nil, nil
}

// RemoveFinalizerPatch is a JSON patch removing the finalizer at index i,
// provided it is still kopf's: where a bare remove would drop whatever
// entry had moved to i, a failed test changes nothing.
func RemoveFinalizerPatch(i int) ([]byte, error) {
	path := fmt.Sprintf("/metadata/finalizers/%d", i)
	b, err := json.Marshal([]map[string]any{
		{"op": "test", "path": path, "value": Finalizer},
		{"op": "remove", "path": path},
	})
	if err != nil {
		return nil, fmt.Errorf("encoding the finalizer patch: %w", err)
	}
	return b, nil
}

// IsFailedPatchTest tells the apiserver's answer to a JSON patch it could
// not apply (the test failed, the index is gone): 422 naming no object and
// no cause, unlike a rejection by validation or an admission policy.
func IsFailedPatchTest(err error) bool {
	var status apierrors.APIStatus
	if !apierrors.IsInvalid(err) || !errors.As(err, &status) {
		return false
	}
	d := status.Status().Details
	return d == nil || (d.Name == "" && d.Kind == "" && len(d.Causes) == 0)
}

// DynamicPatcher is a Patcher over a dynamic client, which decodes the
// object a successful patch answers with: for tests, over a fake client.
func DynamicPatcher(client dynamic.NamespaceableResourceInterface) Patcher {
	return func(ctx context.Context, namespace, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions) error {
		_, err := client.Namespace(namespace).Patch(ctx, name, pt, data, opts)
		return err
	}
}
