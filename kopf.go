package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
)

// Objects the article's kopf operator handled carry its finalizer, because
// that operator has an on.delete handler; once kopf is gone, deleting them
// hangs. With --remove-kopf-finalizer the controller removes that finalizer,
// and nothing else, from objects being deleted. Live objects keep it, so
// a kopf still running (or rolled back to) finds its finalizer in place and
// is never fought over it, and the apiserver itself refuses new finalizers
// on an object being deleted, so the removal cannot ping-pong with kopf.
// kopf's annotation kopf.zalando.org/last-handled-configuration is never
// touched: without it a rolled-back kopf would take every object for new
// and overwrite its UUID.

// kopfFinalizer is the finalizer kopf 1.36 puts on every object it handles.
const kopfFinalizer = "kopf.zalando.org/KopfFinalizerMarker"

// ReasonKopfFinalizerRemoved: kopf's finalizer was removed from an object
// being deleted (Normal).
const ReasonKopfFinalizerRemoved = "KopfFinalizerRemoved"

// ReasonKopfFinalizerFailed: removing kopf's finalizer failed; it is
// retried (Warning).
const ReasonKopfFinalizerFailed = "KopfFinalizerRemovalFailed"

// terminatingFinalizers is what the cache keeps of u's finalizers: all of
// them while u is being deleted, none before, since only then can one
// be acted on (and most objects carry kopf's for life).
func terminatingFinalizers(u *unstructured.Unstructured) []string {
	if u.GetDeletionTimestamp() == nil {
		return nil
	}
	return u.GetFinalizers()
}

// kopfFinalizerIndex is the position of kopf's finalizer on obj while obj is
// being deleted, else -1.
func kopfFinalizerIndex(obj *cachedUUID) int {
	if obj.DeletionTimestamp == nil {
		return -1
	}
	return slices.Index(obj.Finalizers, kopfFinalizer)
}

// releasesKopfFinalizer tells whether kopf's finalizer is to be removed
// from obj: the opt-in is on and obj is being deleted.
func (c *Controller) releasesKopfFinalizer(obj *cachedUUID) bool {
	return c.opts.RemoveKopfFinalizer && kopfFinalizerIndex(obj) >= 0
}

// needsWork tells whether obj has anything for a worker: no UUID yet, or,
// with --remove-kopf-finalizer, kopf's finalizer holding its deletion.
// Without the opt-in, an object so held is logged with the fix, at every
// resync while it lasts.
func (c *Controller) needsWork(logger klog.Logger, obj *cachedUUID) bool {
	if obj.Status.UUID == "" {
		return true
	}
	if kopfFinalizerIndex(obj) < 0 {
		return false
	}
	if !c.releasesKopfFinalizer(obj) {
		logger.Info("Object is being deleted but waits for kopf's finalizer; if the kopf operator is gone, run the controller with --remove-kopf-finalizer (README: Migrating from the kopf operator)",
			"object", klog.KObj(obj), "finalizer", kopfFinalizer)
		return false
	}
	return true
}

// kopfFinalizerPatch is a JSON patch removing the finalizer at index i,
// provided it is still kopf's: if the list changed since the cache saw it
// (kopf removed its own, another finalizer went), the test fails and the
// apiserver changes nothing, where a bare remove would drop whatever entry
// had moved to i.
func kopfFinalizerPatch(i int) ([]byte, error) {
	path := fmt.Sprintf("/metadata/finalizers/%d", i)
	b, err := json.Marshal([]map[string]any{
		{"op": "test", "path": path, "value": kopfFinalizer},
		{"op": "remove", "path": path},
	})
	if err != nil {
		return nil, fmt.Errorf("encoding the finalizer patch: %w", err)
	}
	return b, nil
}

// releaseKopfFinalizer removes kopf's finalizer from obj, which is being
// deleted. A failed test (the finalizers changed under the cache) comes
// back as a Conflict, so the object is retried from the cache's newer view.
func (c *Controller) releaseKopfFinalizer(ctx context.Context, obj *cachedUUID) error {
	logger := klog.FromContext(ctx)
	patch, err := kopfFinalizerPatch(kopfFinalizerIndex(obj))
	if err != nil {
		return err
	}
	_, err = c.client.Namespace(obj.Namespace).Patch(ctx, obj.Name, types.JSONPatchType, patch,
		metav1.PatchOptions{FieldManager: FieldManager})
	switch {
	case err == nil:
		c.metrics.KopfFinalizersRemoved.Inc()
		// Per object, so at -v=2 like an assignment: a migration deleting
		// many objects must not log each one at -v=0; the metric counts them.
		logger.V(2).Info("Removed kopf's finalizer from an object being deleted", "finalizer", kopfFinalizer)
		c.event(obj, corev1.EventTypeNormal, ReasonKopfFinalizerRemoved, "Removed finalizer "+kopfFinalizer+": the kopf operator is gone")
		return nil
	case apierrors.IsNotFound(err):
		return nil // deleted: its last finalizer went meanwhile
	case isFailedPatchTest(err):
		return apierrors.NewConflict(uuidGVR.GroupResource(), obj.Name,
			fmt.Errorf("kopf's finalizer is no longer at index %d: %w", kopfFinalizerIndex(obj), err))
	}
	// Said on the object too: kubectl describe is where a user looks when
	// a deletion hangs (a missing deploy/kopf-migration/ grant, say).
	err = fmt.Errorf("removing finalizer %s from %s/%s: %w", kopfFinalizer, obj.Namespace, obj.Name, err)
	c.event(obj, corev1.EventTypeWarning, ReasonKopfFinalizerFailed, "Failed to remove kopf's finalizer: "+err.Error())
	return err
}

// isFailedPatchTest tells the apiserver's answer to a JSON patch it could
// not apply (the test failed, the index is gone): 422 naming no object and
// no cause, as the apiserver builds it (NewGenericServerResponse drops the
// patch library's text), unlike a rejection by validation or an admission
// policy, which name the object and give causes.
func isFailedPatchTest(err error) bool {
	var status apierrors.APIStatus
	if !apierrors.IsInvalid(err) || !errors.As(err, &status) {
		return false
	}
	d := status.Status().Details
	return d == nil || (d.Name == "" && d.Kind == "" && len(d.Causes) == 0)
}
