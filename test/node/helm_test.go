//go:build node

package node

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/demo-operator/uuid-controller/internal/kopf"
	"github.com/demo-operator/uuid-controller/test/cluster"
	"github.com/demo-operator/uuid-controller/test/framework"
)

const (
	// release is the Helm release the test installs, in the default namespace.
	release = "uuid-controller"
	chart   = "charts/uuid-controller"
	// helmObjects is how many objects with UUIDs the upgrade runs over.
	helmObjects = 100
)

// TestHelmChart: the chart instead of deploy/ on the real node. It takes
// deploy/'s install away (but the CRD and its objects), then:
//   - helm install makes both pods Ready, one of them the leader, and the
//     example gets its UUID; objects assigned by deploy/'s controller keep
//     theirs with no write;
//   - helm upgrade with another verbosity replaces both pods, with zero
//     status writes (audit log) and no UUID changed;
//   - helm upgrade with kopfMigration.enabled lets a deletion held by
//     kopf's finalizer through (the controller fails closed, so the chart's
//     admission policy binds the chart's ServiceAccount);
//   - helm uninstall removes every object the release made, and leaves the
//     CRD and the Uuid objects with their UUIDs.
//
// Then deploy/ is applied again for the tests that follow.
func TestHelmChart(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
	defer cancel()
	if err := waitRolledOut(ctx); err != nil {
		t.Fatal(err)
	}
	objNS := env.NewNamespace(ctx, t)
	names := env.CreateUuids(ctx, t, objNS, "obj", helmObjects)
	before := env.WaitUUIDs(ctx, t, objNS, names, 2*time.Minute)
	// The audit log holds each object's one write, or "no write since"
	// below matches nothing and proves nothing.
	writesBefore := statusWrites(t, objNS)
	if len(writesBefore) != helmObjects {
		t.Fatalf("the audit log shows status writes to %d objects in %s, want %d", len(writesBefore), objNS, helmObjects)
	}
	ids := env.WatchUUIDs(ctx, t, objNS)

	removeKustomizeInstall(ctx, t)
	t.Cleanup(func() { restoreKustomizeInstall(t) })

	// install
	start := time.Now()
	if out, err := helm(ctx, append([]string{"install", release, chart, "--wait", "--timeout=5m"}, imageValues()...)...); err != nil {
		t.Fatalf("helm install: %v\n%s", err, out)
	} else if !strings.Contains(out, "Check the install:") {
		t.Errorf("helm install printed no NOTES.txt:\n%s", out)
	}
	waitChartLeader(ctx, t)
	d := rolledOutReplicas(ctx, t)
	t.Logf("helm install: both pods Ready in %s", time.Since(start).Round(time.Millisecond))
	chartPodsLabelled(t, d)
	example := freshExample(ctx, t)

	// upgrade: another verbosity, so a new pod template.
	exampleWrites := statusWrites(t, "default")["example"]
	upgradeReplacesPods(ctx, t, d, append([]string{chart}, imageValues()...)...)
	// The new leader has gone through every object once a sentinel created
	// now has its UUID: the queue is first in, first out.
	sentinelNS := env.NewNamespace(ctx, t)
	env.WaitUUIDs(ctx, t, sentinelNS, env.CreateUuids(ctx, t, sentinelNS, "sentinel", 1), 2*time.Minute)
	for name, n := range statusWrites(t, objNS) {
		if n != writesBefore[name] {
			t.Errorf("%s/%s: %d status writes since deploy/'s controller assigned it", objNS, name, n-writesBefore[name])
		}
	}
	if n := statusWrites(t, "default")["example"]; n != exampleWrites {
		t.Errorf("default/example: %d status writes during the upgrade", n-exampleWrites)
	}
	after := env.WaitUUIDs(ctx, t, objNS, names, time.Minute)
	for name, id := range before {
		if after[name] != id {
			t.Errorf("%s/%s: UUID %s became %s", objNS, name, id, after[name])
		}
	}
	ids.CheckUnchanged(t)

	// kopfMigration: one switch lets through a deletion held by kopf's
	// finalizer. The controller fails closed, so the removal also proves
	// the chart's admission policy binds the chart's ServiceAccount.
	if out, err := helm(ctx, append([]string{"upgrade", release, chart, "--wait", "--timeout=5m", "--reuse-values", "--set", "kopfMigration.enabled=true"}, imageValues()...)...); err != nil {
		t.Fatalf("helm upgrade --set kopfMigration.enabled=true: %v\n%s", err, out)
	}
	if err := waitRolledOut(ctx); err != nil {
		t.Fatal(err)
	}
	kopfHeldDeletionGoes(ctx, t, sentinelNS)

	uninstallChecked(ctx, t)
	left := env.WaitUUIDs(ctx, t, objNS, names, time.Minute)
	for name, id := range before {
		if left[name] != id {
			t.Errorf("after helm uninstall %s/%s: UUID %q, want %s", objNS, name, left[name], id)
		}
	}
	exampleKept(ctx, t, example)
}

// upgradeReplacesPods runs helm upgrade of the release from the chart
// (and flags) in from with logVerbosity=2, a new pod template, and checks
// that it rolls out pods that replace all of d's, with -v=2.
func upgradeReplacesPods(ctx context.Context, t *testing.T, d deployed, from ...string) {
	t.Helper()
	start := time.Now()
	if out, err := helm(ctx, append([]string{"upgrade", release, "--wait", "--timeout=5m", "--set", "logVerbosity=2"}, from...)...); err != nil {
		t.Fatalf("helm upgrade: %v\n%s", err, out)
	}
	if err := waitRolledOut(ctx); err != nil {
		t.Fatal(err)
	}
	newPods, err := controllerPods(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, np := range newPods {
		if slices.ContainsFunc(d.pods, func(op corev1.Pod) bool { return op.UID == np.UID }) {
			t.Errorf("pod %s was not replaced by the upgrade", np.Name)
		}
		if args := np.Spec.Containers[0].Args; !slices.Contains(args, "-v=2") {
			t.Errorf("pod %s: args %q, want -v=2", np.Name, args)
		}
	}
	t.Logf("helm upgrade %s: rolled out in %s", from[0], time.Since(start).Round(time.Millisecond))
}

// waitChartLeader waits until one of the release's pods holds the Lease.
// Ready does not wait for leadership: a standby is Ready too.
func waitChartLeader(ctx context.Context, t *testing.T) {
	t.Helper()
	if err := framework.Poll(ctx, time.Minute, "one of the chart's pods to hold the Lease", func(ctx context.Context) error {
		lease, _, err := env.LeaseHolder(ctx, ns, leaseName)
		if err != nil {
			return err
		}
		holder := holderPod(lease)
		pods, err := controllerPods(ctx)
		if err != nil {
			return err
		}
		if !slices.ContainsFunc(pods, func(p corev1.Pod) bool { return p.Name == holder }) {
			return fmt.Errorf("the Lease is held by %q, not a pod of the chart's", holder)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// chartPodsLabelled fails the test unless every pod of d carries the
// release's Helm labels.
func chartPodsLabelled(t *testing.T, d deployed) {
	t.Helper()
	for _, p := range d.pods {
		if p.Labels["app.kubernetes.io/managed-by"] != "Helm" || p.Labels["app.kubernetes.io/instance"] != release {
			t.Errorf("pod %s: labels %v, want the chart's", p.Name, p.Labels)
		}
	}
}

// freshExample applies examples/uuid.yaml anew, so its UUID is the running
// controller's, and returns that UUID.
func freshExample(ctx context.Context, t *testing.T) string {
	t.Helper()
	if out, err := env.cluster.Kubectl(ctx, "delete", "-f", "examples/uuid.yaml", "--ignore-not-found", "--wait"); err != nil {
		t.Fatalf("kubectl delete -f examples/uuid.yaml: %v\n%s", err, out)
	}
	if out, err := env.cluster.Kubectl(ctx, "apply", "-f", "examples/uuid.yaml"); err != nil {
		t.Fatalf("kubectl apply -f examples/uuid.yaml: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		_, _ = env.cluster.Kubectl(context.Background(), "delete", "-f", "examples/uuid.yaml", "--ignore-not-found")
	})
	id := env.WaitUUIDs(ctx, t, "default", []string{"example"}, time.Minute)["example"]
	t.Logf("the example got its UUID %s from the chart's controller", id)
	return id
}

// exampleKept fails the test unless default/example still has UUID id.
func exampleKept(ctx context.Context, t *testing.T, id string) {
	t.Helper()
	if got := env.WaitUUIDs(ctx, t, "default", []string{"example"}, time.Minute)["example"]; got != id {
		t.Errorf("after helm uninstall default/example: UUID %q, want %s", got, id)
	}
}

// uninstallChecked runs helm uninstall and checks that everything the
// release made is gone but the CRD.
func uninstallChecked(ctx context.Context, t *testing.T) {
	t.Helper()
	manifest, err := helm(ctx, "get", "manifest", release)
	if err != nil {
		t.Fatalf("helm get manifest: %v\n%s", err, manifest)
	}
	if out, err := helm(ctx, "uninstall", release, "--wait", "--timeout=5m"); err != nil {
		t.Fatalf("helm uninstall: %v\n%s", err, out)
	}
	waitNamespaceGone(ctx, t, ns)
	file := filepath.Join(t.TempDir(), "manifest.yaml")
	if err := os.WriteFile(file, []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := env.cluster.Kubectl(ctx, "get", "-f", file, "--ignore-not-found", "-o", "name"); err != nil || strings.TrimSpace(out) != "" {
		t.Errorf("after helm uninstall: %v; still there:\n%s", err, out)
	}
	if out, err := env.cluster.Kubectl(ctx, "get", "crd", "uuid.demo.operator", "-o", "name"); err != nil {
		t.Errorf("the CRD is gone after helm uninstall: %v\n%s", err, out)
	}
}

// kopfHeldDeletionGoes creates an object carrying kopf's finalizer in ns,
// deletes it and waits for it to be gone: only the controller, with
// --remove-kopf-finalizer and its admission policy proven, removes it.
func kopfHeldDeletionGoes(ctx context.Context, t *testing.T, ns string) {
	t.Helper()
	u := framework.NewUuid("kopf-held")
	u.SetFinalizers([]string{kopf.Finalizer})
	if _, err := env.Uuids(ns).Create(ctx, u, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // a failed run leaves no deletion hanging
		_, _ = env.Uuids(ns).Patch(context.Background(), u.GetName(), types.MergePatchType,
			[]byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
	})
	if err := env.Uuids(ns).Delete(ctx, u.GetName(), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := framework.Poll(ctx, 2*time.Minute, "the kopf-held object to be deleted", func(ctx context.Context) error {
		o, err := env.Uuids(ns).Get(ctx, u.GetName(), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		return fmt.Errorf("%s/%s still there, finalizers %q", ns, u.GetName(), o.GetFinalizers())
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("kopfMigration: the deletion held by kopf's finalizer went through in %s", time.Since(start).Round(time.Millisecond))
}

// imageValues sets the chart's image to the index setup pushed to the
// node's registry, by digest, so the kubelet pulls the chart's image too.
func imageValues() []string {
	repo, digest, _ := strings.Cut(env.image, "@")
	return []string{"--set", "image.repository=" + repo, "--set", "image.digest=" + digest}
}

// helm runs bin/helm as admin, with Helm's own directories in the node's
// directory, and returns its combined output.
func helm(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(env.root, "bin", "helm"), args...)
	cmd.Env = helmEnv()
	cmd.Dir = env.root
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// helmEnv is the environment helm runs in: admin's kubeconfig, and Helm's
// cache, config (registry logins) and data in the node's directory, so the
// user's never enter a test.
func helmEnv() []string {
	home := filepath.Join(env.cluster.Dir(), "helm")
	return append(os.Environ(), "KUBECONFIG="+env.cluster.AdminKubeconfig(),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"), "HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"))
}

// kustomizeInstall writes deploy/'s objects but the CRD to a file, as a
// List, for kubectl delete: deleting the CRD would delete every Uuid object.
func kustomizeInstall(ctx context.Context, dir string) (string, error) {
	objs, err := renderKustomization(ctx, dir, "deploy/")
	if err != nil {
		return "", err
	}
	list := map[string]any{"apiVersion": "v1", "kind": "List", "items": []any{}}
	for _, o := range objs {
		if o.GetKind() != "CustomResourceDefinition" {
			list["items"] = append(list["items"].([]any), o.Object)
		}
	}
	b, err := json.Marshal(list)
	if err != nil {
		return "", err
	}
	file := filepath.Join(dir, "deploy-but-crd.json")
	return file, os.WriteFile(file, b, 0o644)
}

// renderKustomization renders the kustomization in path with kubectl
// kustomize, through a file in dir.
func renderKustomization(ctx context.Context, dir, path string) ([]*unstructured.Unstructured, error) {
	out, err := env.cluster.Kubectl(ctx, "kustomize", path)
	if err != nil {
		return nil, fmt.Errorf("kubectl kustomize %s: %w\n%s", path, err, out)
	}
	f, err := os.CreateTemp(dir, "rendered-*.yaml")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if _, err := f.WriteString(out); err != nil {
		return nil, err
	}
	return cluster.ReadObjects(f.Name())
}

// removeKustomizeInstall deletes deploy/'s install but the CRD, and waits
// for its namespace to be gone.
func removeKustomizeInstall(ctx context.Context, t *testing.T) {
	t.Helper()
	file, err := kustomizeInstall(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if out, err := env.cluster.Kubectl(ctx, "delete", "-f", file, "--wait", "--ignore-not-found"); err != nil {
		t.Fatalf("kubectl delete deploy/ but the CRD: %v\n%s", err, out)
	}
	waitNamespaceGone(ctx, t, ns)
}

// restoreKustomizeInstall uninstalls the release if it is still there and
// applies deploy/ again, as the tests that follow expect the node.
func restoreKustomizeInstall(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	if out, err := helm(ctx, "uninstall", release, "--wait", "--ignore-not-found"); err != nil {
		t.Errorf("helm uninstall: %v\n%s", err, out)
	}
	waitNamespaceGone(ctx, t, ns)
	if err := applyDeploy(ctx); err != nil {
		t.Error(err)
	}
	if err := waitRolledOut(ctx); err != nil {
		t.Errorf("deploy/ again: %v", err)
	}
}

// waitNamespaceGone waits until the namespace is deleted, its pods with it.
func waitNamespaceGone(ctx context.Context, t *testing.T, name string) {
	t.Helper()
	err := framework.Poll(ctx, 3*time.Minute, "namespace "+name+" to be gone", func(ctx context.Context) error {
		_, err := env.Kube.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("namespace %s still there (%v)", name, err)
	})
	if err != nil {
		t.Error(err)
	}
}
