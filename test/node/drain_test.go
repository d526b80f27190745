//go:build node

package node

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/demo-operator/uuid-controller/test/framework"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestEvictionWhileNotReady: with the kopf article's CRD (no status
// subresource) both replicas are unready by design, which is when a
// migration drains nodes. The PodDisruptionBudget's
// unhealthyPodEvictionPolicy AlwaysAllow lets the Eviction API (what
// kubectl drain calls) evict one of them anyway; with the default
// (IfHealthyBudget) it answers 429 for as long as the CRD stays wrong, and
// the drain hangs.
func TestEvictionWhileNotReady(t *testing.T) {
	ctx := testCtx(t)
	d := rolledOutReplicas(ctx, t)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if err := env.cluster.InstallCRD(ctx); err != nil {
			t.Errorf("reinstalling crd.yaml: %v", err)
		}
		if err := waitRolledOut(ctx); err != nil {
			t.Error(err)
		}
	})
	if err := env.cluster.InstallCRDFile(ctx, "../e2e/testdata/article-crd.yaml"); err != nil {
		t.Fatal(err)
	}
	// The PDB's status is the disruption controller's view; eviction reads
	// it, so wait for it to count no healthy pod too.
	if err := framework.Poll(ctx, 2*time.Minute, "both replicas unready and the PDB counting none healthy", func(ctx context.Context) error {
		pods, err := controllerPods(ctx)
		if err != nil {
			return err
		}
		for i := range pods {
			if podReady(&pods[i]) {
				return fmt.Errorf("pod %s is still Ready", pods[i].Name)
			}
		}
		pdb, err := env.Kube.PolicyV1().PodDisruptionBudgets(ns).Get(ctx, deployName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if pdb.Status.CurrentHealthy != 0 || pdb.Status.ObservedGeneration < pdb.Generation {
			return fmt.Errorf("PDB status %+v", pdb.Status)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	victim := d.standby.Name
	ev := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: victim, Namespace: ns}}
	if err := env.Kube.PolicyV1().Evictions(ns).Evict(ctx, ev); err != nil {
		t.Fatalf("evicting unready pod %s: %v", victim, err)
	}
	if err := framework.Poll(ctx, time.Minute, "the evicted pod to go", func(ctx context.Context) error {
		p, err := env.Kube.CoreV1().Pods(ns).Get(ctx, victim, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if p.DeletionTimestamp == nil {
			return fmt.Errorf("pod %s not being deleted", victim)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
