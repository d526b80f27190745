package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/demo-operator/uuid-controller/test/cluster"
	"github.com/demo-operator/uuid-controller/test/framework"
)

// TestDeploymentAsDeployed: the apiserver accepts deploy/deployment.yaml
// and deploy/pdb.yaml, and the binary run with the Deployment's own
// arguments, as its ServiceAccount, leads with the Lease in uuid-system
// (the Role there is enough), assigns UUIDs and releases the Lease on
// SIGTERM. No kubelet runs here, so the process stands in for the pod.
func TestDeploymentAsDeployed(t *testing.T) {
	ctx := testCtx(t)
	root := framework.RepoRoot(t)
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
	ns := env.fw.NewNamespace(ctx, t)
	// /metrics as deployed: HTTPS, read (by waitLeader) with a reader's token.
	reader, _ := metricsTokens(ctx, t, ns)
	p := startSecureController(ctx, t, env.kubeconfig, ns, cluster.MetricsAuth{Token: reader}, args...)
	waitLeader(ctx, t, 30*time.Second, p)
	if _, h, err := env.fw.LeaseHolder(ctx, cluster.ControllerNamespace, "uuid-controller"); err != nil {
		t.Fatal(err)
	} else if h == "" {
		t.Fatal("leading, but Lease uuid-system/uuid-controller has no holder")
	}
	env.fw.WaitUUIDs(ctx, t, ns, env.fw.CreateUuids(ctx, t, ns, "deployed", 5), 30*time.Second)
	if code, took := p.Stop(); code != 0 {
		t.Errorf("exit code %d after SIGTERM (%s), want 0", code, took)
	}
	if _, h, err := env.fw.LeaseHolder(ctx, cluster.ControllerNamespace, "uuid-controller"); err != nil {
		t.Fatal(err)
	} else if h != "" {
		t.Errorf("Lease still held by %q after SIGTERM", h)
	}
}

// TestDeploymentInAnotherNamespace: deploy/ rendered by kustomize into
// another namespace (namespace: in an overlay, as `kustomize edit set
// namespace` writes it) leads there: the Deployment names no Lease
// namespace, so the binary, run as that namespace's ServiceAccount with
// the Deployment's arguments and its env resolved as the kubelet would
// (POD_NAMESPACE from metadata.namespace, MEMORY_LIMIT_MIB from
// limits.memory), takes the Lease in its own namespace, where the rendered
// Role lets it. It also hands 90% of the memory limit to the Go runtime.
func TestDeploymentInAnotherNamespace(t *testing.T) {
	ctx := testCtx(t)
	installNS, d := installElsewhere(ctx, t, false)
	c := d.Spec.Template.Spec.Containers[0]
	ns := env.fw.NewNamespace(ctx, t)
	p := startAsDeployed(ctx, t, installNS, d, ns)
	waitLeader(ctx, t, 30*time.Second, p)
	l, err := env.kube.CoordinationV1().Leases(installNS).Get(ctx, "uuid-controller", metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" {
		t.Fatalf("leading, but Lease %s/uuid-controller has no holder (%v)", installNS, err)
	}
	env.fw.WaitUUIDs(ctx, t, ns, env.fw.CreateUuids(ctx, t, ns, "elsewhere", 5), 30*time.Second)

	limit := c.Resources.Limits.Memory().Value()
	if got, want := controllerMetric(ctx, t, p, "go_gc_gomemlimit_bytes", nil), float64(int64(float64(limit)*0.9)); got != want {
		t.Errorf("Go memory limit %.0f bytes, want 90%% of the container's %d: %.0f", got, limit, want)
	}
	if code, took := p.Stop(); code != 0 {
		t.Errorf("exit code %d after SIGTERM (%s), want 0", code, took)
	}
}

// TestKopfMigrationComponentInAnotherNamespace: deploy/ with the
// kopf-migration component enabled, rendered into another namespace, sets
// the admission policy's ServiceAccount from the one it installs there, so
// the controller (with the component's --remove-kopf-finalizer) proves at
// start that the policy binds it: ready, uuid_controller_kopf_policy_bound
// 1. A policy still naming uuid-system's ServiceAccount would let its
// dry run through, and it would stay unready.
func TestKopfMigrationComponentInAnotherNamespace(t *testing.T) {
	ctx := testCtx(t)
	installNS, d := installElsewhere(ctx, t, true)
	if args := d.Spec.Template.Spec.Containers[0].Args; !slices.Contains(args, "--remove-kopf-finalizer") {
		t.Fatalf("the component did not add --remove-kopf-finalizer: %q", args)
	}
	ns := env.fw.NewNamespace(ctx, t)
	// An object to prove the policy on at start.
	env.fw.CreateUuids(ctx, t, ns, "existing", 1)
	p := startAsDeployed(ctx, t, installNS, d, ns)
	// The apiserver enforces a new policy about a second after it is
	// created, which the controller's first proof can beat; a missing
	// policy is probed again every 5 s.
	var v float64
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		v = controllerMetric(ctx, t, p, "uuid_controller_kopf_policy_bound", nil)
		return v == 1, nil
	})
	if err != nil {
		t.Errorf("uuid_controller_kopf_policy_bound = %v after 30 s, want 1: the policy does not bind %s's ServiceAccount", v, installNS)
	}
	if code, body, err := p.Readyz(ctx); err != nil || code != 200 {
		t.Errorf("/readyz %d %q (%v) with the policy bound, want 200", code, body, err)
	}
}

// installElsewhere renders deploy/ (with the kopf-migration component
// when withKopf) into a new namespace, applies it, and returns the
// namespace and the Deployment. Cluster-scoped objects the other tests
// share are kept apart: the ClusterRoleBindings get the namespace as a
// suffix, and the cleanup deletes what the test added.
func installElsewhere(ctx context.Context, t *testing.T, withKopf bool) (string, *appsv1.Deployment) {
	t.Helper()
	root := framework.RepoRoot(t)
	installNS := "uuid-elsewhere-" + uuid.NewString()[:6]
	objs := renderInto(t, root, installNS, withKopf)
	// deploy/uuid-policy.yaml would bind every namespace, other tests'
	// included: TestOnlyControllerSetsUUID applies it, bound to its own.
	objs = slices.DeleteFunc(objs, func(o *unstructured.Unstructured) bool { return o.GetName() == uuidPolicy })
	var bindings []string
	for _, o := range objs {
		if o.GetKind() == "ClusterRoleBinding" {
			o.SetName(o.GetName() + "-" + installNS)
			bindings = append(bindings, o.GetName())
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, b := range bindings {
			_ = env.kube.RbacV1().ClusterRoleBindings().Delete(ctx, b, metav1.DeleteOptions{})
		}
		if withKopf {
			_ = env.kube.RbacV1().ClusterRoles().Delete(ctx, "uuid-controller-kopf-migration", metav1.DeleteOptions{})
			vap := env.kube.AdmissionregistrationV1()
			_ = vap.ValidatingAdmissionPolicyBindings().Delete(ctx, "uuid-controller-kopf-migration", metav1.DeleteOptions{})
			_ = vap.ValidatingAdmissionPolicies().Delete(ctx, "uuid-controller-kopf-migration", metav1.DeleteOptions{})
		}
		_ = env.kube.CoreV1().Namespaces().Delete(ctx, installNS, metav1.DeleteOptions{})
	})
	applyObjects(ctx, t, objs)
	d := deploymentOf(t, objs)
	// startAsDeployed's --namespace reads the namespace, as for env.kubeconfig.
	reads, err := env.cluster.GrantNamespaceReads(ctx, installNS, d.Spec.Template.Spec.ServiceAccountName)
	if err != nil {
		t.Fatal(err)
	}
	bindings = append(bindings, reads)
	if d.Namespace != installNS {
		t.Fatalf("rendered Deployment is in %q, want %q", d.Namespace, installNS)
	}
	return installNS, d
}

// applyObjects applies objs as the admin, as kubectl apply would.
func applyObjects(ctx context.Context, t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "objects.json")
	var buf bytes.Buffer
	for _, o := range objs {
		b, err := o.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		buf.Write(append(b, '\n'))
	}
	if err := os.WriteFile(file, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := env.cluster.Apply(ctx, file); err != nil {
		t.Fatalf("apply %d objects: %v", len(objs), err)
	}
}

// startAsDeployed runs the binary as d's pod would run in installNS: as its
// ServiceAccount there, with its arguments (but the ports) and its env
// resolved as the kubelet would; it watches ns.
func startAsDeployed(ctx context.Context, t *testing.T, installNS string, d *appsv1.Deployment, ns string) *cluster.ControllerProcess {
	t.Helper()
	c := d.Spec.Template.Spec.Containers[0]
	var args []string
	for _, a := range c.Args {
		if strings.HasPrefix(a, "--leader-elect-namespace") {
			t.Errorf("the Deployment sets %s: the Lease would not follow the namespace", a)
		}
		if !strings.HasPrefix(a, "--health-addr") && !strings.HasPrefix(a, "--metrics-addr") {
			args = append(args, a)
		}
	}
	kubeconfig, err := env.cluster.ServiceAccountKubeconfig(ctx, installNS, d.Spec.Template.Spec.ServiceAccountName)
	if err != nil {
		t.Fatal(err)
	}
	return framework.StartController(ctx, t, cluster.ControllerOptions{Binary: env.binary, Kubeconfig: kubeconfig, Env: podEnv(t, installNS, c)}, ns, args...)
}

// renderInto renders deploy/ with kustomize (bin/kubectl) through an
// overlay that sets namespace ns, and returns the objects.
func renderInto(t *testing.T, root, ns string, withKopf bool) []*unstructured.Unstructured {
	t.Helper()
	dir := t.TempDir()
	rel, err := filepath.Rel(dir, filepath.Join(root, "deploy"))
	if err != nil {
		t.Fatal(err)
	}
	k := fmt.Sprintf("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: %s\nresources:\n  - %s\n", ns, rel)
	if withKopf {
		// As `kustomize edit add component kopf-migration` and `kustomize
		// edit set namespace` leave deploy/kustomization.yaml, in a copy.
		copyDir(t, filepath.Join(root, "deploy"), filepath.Join(dir, "deploy"))
		b, err := os.ReadFile(filepath.Join(dir, "deploy", "kustomization.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		b = fmt.Appendf(b, "namespace: %s\ncomponents:\n  - kopf-migration\n", ns)
		if err := os.WriteFile(filepath.Join(dir, "deploy", "kustomization.yaml"), b, 0o644); err != nil {
			t.Fatal(err)
		}
		k = "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - deploy\n"
	}
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "rendered.yaml")
	if err := os.WriteFile(file, []byte(framework.Kubectl(t, env.cluster, "kustomize", dir)), 0o644); err != nil {
		t.Fatal(err)
	}
	objs, err := cluster.ReadObjects(file)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// podEnv resolves c's env as the kubelet does for a pod in namespace ns:
// plain values, metadata.namespace, and resource limits over their divisor
// (rounded up). Anything else fails the test, so a new env source gets a
// resolution here rather than being dropped.
func podEnv(t *testing.T, ns string, c corev1.Container) []string {
	t.Helper()
	var out []string
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			out = append(out, e.Name+"="+e.Value)
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.namespace":
			out = append(out, e.Name+"="+ns)
		case e.ValueFrom.ResourceFieldRef != nil:
			r := e.ValueFrom.ResourceFieldRef
			name, ok := strings.CutPrefix(r.Resource, "limits.")
			q, found := c.Resources.Limits[corev1.ResourceName(name)]
			if !ok || !found {
				t.Fatalf("env %s: no %s on the container", e.Name, r.Resource)
			}
			divisor := r.Divisor.Value()
			if divisor == 0 {
				divisor = 1
			}
			out = append(out, fmt.Sprintf("%s=%d", e.Name, (q.Value()+divisor-1)/divisor))
		default:
			t.Fatalf("env %s: a source podEnv does not resolve: %+v", e.Name, e.ValueFrom)
		}
	}
	return out
}

// copyDir copies the files of src, and its directories', into dst.
func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}
