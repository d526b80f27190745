package main

import (
	"context"
	"fmt"
	"strconv"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
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

// leaseRecord keeps the record as an annotation of the leader's Lease,
// which the controller may get and update already, and reads the CRD's
// metadata (a get on the one CRD, deploy/rbac.yaml).
type leaseRecord struct {
	kube            kubernetes.Interface
	meta            metadata.Interface
	namespace, name string
}

func (l leaseRecord) CRD(ctx context.Context) (string, error) {
	m, err := l.meta.Resource(crdGVR).Get(ctx, crdName, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("reading CustomResourceDefinition %s: %w", crdName, err)
	}
	return string(m.UID) + "/" + strconv.FormatInt(m.Generation, 10), nil
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
