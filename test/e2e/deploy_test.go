package e2e

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/demo-operator/uuid-controller/test/cluster"
)

// TestDeploymentAsDeployed: the apiserver accepts deploy/deployment.yaml
// and deploy/pdb.yaml, and the binary run with the Deployment's own
// arguments, as its ServiceAccount, leads with the Lease in uuid-system
// (the Role there is enough), assigns UUIDs and releases the Lease on
// SIGTERM. No kubelet runs here, so the process stands in for the pod.
func TestDeploymentAsDeployed(t *testing.T) {
	ctx := testCtx(t)
	root, err := cluster.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	if err := env.cluster.Apply(ctx, filepath.Join(root, "deploy", "deployment.yaml"), filepath.Join(root, "deploy", "pdb.yaml")); err != nil {
		t.Fatalf("the apiserver rejects the deployment manifests: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = env.kube.AppsV1().Deployments(cluster.ControllerNamespace).Delete(ctx, "uuid-controller", metav1.DeleteOptions{})
		_ = env.kube.PolicyV1().PodDisruptionBudgets(cluster.ControllerNamespace).Delete(ctx, "uuid-controller", metav1.DeleteOptions{})
	})
	d, err := env.kube.AppsV1().Deployments(cluster.ControllerNamespace).Get(ctx, "uuid-controller", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod := d.Spec.Template.Spec
	if pod.ServiceAccountName != "uuid-controller" || len(pod.Containers) != 1 {
		t.Fatalf("Deployment runs as %q with %d containers, want the uuid-controller ServiceAccount and one", pod.ServiceAccountName, len(pod.Containers))
	}
	// The test picks the ports; everything else is the Deployment's.
	var args []string
	for _, a := range pod.Containers[0].Args {
		if !strings.HasPrefix(a, "--health-addr") && !strings.HasPrefix(a, "--metrics-addr") {
			args = append(args, a)
		}
	}
	ns := newNamespace(ctx, t)
	// /metrics as deployed: HTTPS, read (by waitLeader) with a reader's token.
	reader, _ := metricsTokens(ctx, t, ns)
	p := startSecureController(ctx, t, env.kubeconfig, ns, cluster.MetricsAuth{Token: reader}, args...)
	waitLeader(ctx, t, 30*time.Second, p)
	if h := leaseHolder(ctx, t, "uuid-controller"); h == "" {
		t.Fatal("leading, but Lease uuid-system/uuid-controller has no holder")
	}
	waitUUIDs(ctx, t, ns, createUuids(ctx, t, ns, "deployed", 5), 30*time.Second)
	if code, took := p.Stop(); code != 0 {
		t.Errorf("exit code %d after SIGTERM (%s), want 0", code, took)
	}
	if h := leaseHolder(ctx, t, "uuid-controller"); h != "" {
		t.Errorf("Lease still held by %q after SIGTERM", h)
	}
}
