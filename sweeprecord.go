package main

import (
	"context"
	"fmt"
	"strconv"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
)

// cleanSweepAnnotation, on the controller's Lease, names the CRD (uid and
// generation) under which a sweep last found no status.uuid that is not a
// UUID. The CRD's pattern refuses such a value on every write, so while
// the served CRD is that one, no new one can appear, and a new leader
// skips the sweep (O(all objects)).
const cleanSweepAnnotation = "demo.operator/clean-sweep-crd"

// crdName is the name of the Uuid CRD.
var crdName = uuidGVR.GroupResource().String()

// crdGVR is the resource of CustomResourceDefinitions.
var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// sweepRecord remembers the CRD of the last clean sweep.
type sweepRecord interface {
	// CRD is the served CRD's uid and generation, read before a sweep.
	CRD(ctx context.Context) (string, error)
	// Recorded is the CRD of the last clean sweep, "" for none.
	Recorded(ctx context.Context) (string, error)
	// Record keeps crd as that of a clean sweep.
	Record(ctx context.Context, crd string) error
}

// uuidPattern is crd.yaml's pattern on status.uuid: a CRD that declares
// it refuses any other value on every write.
const uuidPattern = `^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`

// leaseRecord keeps the record as an annotation of the leader's Lease,
// which the controller may get and update already, and reads the CRD (a
// get on the one CRD, deploy/rbac.yaml).
type leaseRecord struct {
	kube            kubernetes.Interface
	dyn             dynamic.Interface
	namespace, name string
}

// CRD is the served CRD's uid and generation; an error when it cannot be
// read, or does not refuse a status.uuid that is not a UUID (the article's
// CRD, a relaxed one): then no sweep may be skipped, since such a value
// may be written at any time.
func (l leaseRecord) CRD(ctx context.Context) (string, error) {
	crd, err := l.dyn.Resource(crdGVR).Get(ctx, crdName, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("reading CustomResourceDefinition %s: %w", crdName, err)
	}
	if p := servedUUIDPattern(crd); p != uuidPattern {
		return "", fmt.Errorf("CustomResourceDefinition %s does not refuse a status.uuid that is not a UUID (pattern %q, want crd.yaml's)", crdName, p)
	}
	return string(crd.GetUID()) + "/" + strconv.FormatInt(crd.GetGeneration(), 10), nil
}

// servedUUIDPattern is the pattern crd's served version puts on
// status.uuid, "" for none.
func servedUUIDPattern(crd *unstructured.Unstructured) string {
	versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
	for _, v := range versions {
		m, ok := v.(map[string]any)
		if !ok || m["name"] != uuidGVR.Version {
			continue
		}
		p, _, _ := unstructured.NestedString(m, "schema", "openAPIV3Schema", "properties", "status", "properties", "uuid", "pattern")
		return p
	}
	return ""
}

func (l leaseRecord) Recorded(ctx context.Context) (string, error) {
	lease, err := l.kube.CoordinationV1().Leases(l.namespace).Get(ctx, l.name, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("reading Lease %s/%s: %w", l.namespace, l.name, err)
	}
	return lease.Annotations[cleanSweepAnnotation], nil
}

// Record sets the annotation, retrying on a conflict with the elector's
// renewals (which keep annotations: they change the spec of the Lease
// they last read).
func (l leaseRecord) Record(ctx context.Context, crd string) error {
	leases := l.kube.CoordinationV1().Leases(l.namespace)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		lease, err := leases.Get(ctx, l.name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if lease.Annotations == nil {
			lease.Annotations = map[string]string{}
		}
		lease.Annotations[cleanSweepAnnotation] = crd
		_, err = leases.Update(ctx, lease, metav1.UpdateOptions{FieldManager: FieldManager})
		return err
	})
	if err != nil {
		return fmt.Errorf("recording the clean sweep on Lease %s/%s: %w", l.namespace, l.name, err)
	}
	return nil
}
