package e2e

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	appsv1 "k8s.io/api/apps/v1"

	"github.com/demo-operator/uuid-controller/test/cluster"
	"github.com/demo-operator/uuid-controller/test/framework"
)

// installer renders deploy/ through hack/kustomize-overlay.sh with image img,
// as `make build-installer IMG=img` does, into a file, and returns its path
// and objects.
func installer(t *testing.T, root, img string) (string, []*unstructured.Unstructured) {
	t.Helper()
	dir := t.TempDir()
	overlay := filepath.Join(dir, "overlay")
	if out, err := exec.Command(filepath.Join(root, "hack", "kustomize-overlay.sh"), overlay, img).CombinedOutput(); err != nil {
		t.Fatalf("kustomize-overlay.sh %s: %v\n%s", img, err, out)
	}
	file := filepath.Join(dir, "install.yaml")
	if err := os.WriteFile(file, []byte(framework.Kubectl(t, env.cluster, "kustomize", overlay)), 0o644); err != nil {
		t.Fatal(err)
	}
	objs, err := cluster.ReadObjects(file)
	if err != nil {
		t.Fatal(err)
	}
	return file, objs
}

func objectKey(o *unstructured.Unstructured) string {
	return fmt.Sprintf("%s %s/%s", o.GetKind(), o.GetNamespace(), o.GetName())
}

// TestInstallManifests: deploy/ as a kustomization and dist/install.yaml
// (the same, rendered with an image) hold every manifest in deploy/ and
// crd.yaml, set the image in one place, and the apiserver accepts them; the
// namespace enforces Pod Security "restricted", and the Deployment's pod
// passes it.
func TestInstallManifests(t *testing.T) {
	ctx := testCtx(t)
	root := framework.RepoRoot(t)

	// kustomize loads no file from outside deploy/, so it holds a copy of
	// crd.yaml; users also apply crd.yaml by itself.
	crd, err := os.ReadFile(filepath.Join(root, "crd.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	crdCopy, err := os.ReadFile(filepath.Join(root, "deploy", "crd.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(crd, crdCopy) {
		t.Error("deploy/crd.yaml differs from crd.yaml: run make manifests")
	}

	// Every object in deploy/*.yaml, and nothing else, is in the install.
	want := map[string]bool{}
	manifests, err := filepath.Glob(filepath.Join(root, "deploy", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range manifests {
		if filepath.Base(m) == "kustomization.yaml" {
			continue
		}
		objs, err := cluster.ReadObjects(m)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objs {
			want[objectKey(o)] = true
		}
	}

	// The image is set in one place, whatever form it takes.
	for _, img := range []string{
		"uuid-controller:dev",
		"registry.example:5000/team/uuid-controller:v1.2.3",
		"registry.example/uuid-controller@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
		"registry.example/uuid-controller:v1@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
	} {
		_, objs := installer(t, root, img)
		var images []string
		for _, c := range deploymentOf(t, objs).Spec.Template.Spec.Containers {
			images = append(images, c.Image)
		}
		if !slices.Equal(images, []string{img}) {
			t.Errorf("IMG=%s: the Deployment's images are %v", img, images)
		}
	}
	// A bare name means :latest, as docker and the kubelet read it.
	_, objs := installer(t, root, "registry.example:5000/uuid-controller")
	if img := deploymentImage(t, objs); img != "registry.example:5000/uuid-controller:latest" {
		t.Errorf("IMG without a tag: image %q", img)
	}
	for _, bad := range []string{"", "has space:v1", ":v1"} {
		out, err := exec.Command(filepath.Join(root, "hack", "kustomize-overlay.sh"), t.TempDir(), bad).CombinedOutput()
		if code := exitCode(err); code != 2 {
			t.Errorf("kustomize-overlay.sh with image %q: exit %d, want 2 (%s)", bad, code, out)
		}
	}

	file, objs := installer(t, root, "uuid-controller:dev")
	got := map[string]bool{}
	var ns *unstructured.Unstructured
	for _, o := range objs {
		got[objectKey(o)] = true
		if o.GetKind() == "Namespace" {
			ns = o
		}
	}
	if !maps.Equal(got, want) {
		t.Errorf("install holds %v\nwant deploy/'s %v", slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want)))
	}

	// The apiserver accepts both ways users install. The objects exist
	// already (the cluster installed crd.yaml and the controller's
	// namespace and RBAC), so this is a server-side dry run: nothing the
	// other tests rely on changes.
	framework.Kubectl(t, env.cluster, "apply", "--dry-run=server", "-f", file)
	framework.Kubectl(t, env.cluster, "apply", "--dry-run=server", "-k", filepath.Join(root, "deploy"))

	if ns == nil {
		t.Fatal("no Namespace in the install")
	}
	for _, mode := range []string{"enforce", "warn", "audit"} {
		if v := ns.GetLabels()["pod-security.kubernetes.io/"+mode]; v != "restricted" {
			t.Errorf("namespace label pod-security.kubernetes.io/%s = %q, want restricted", mode, v)
		}
	}
	checkPodSecurity(ctx, t, ns.GetLabels(), deploymentPod(t, objs))
}

// checkPodSecurity creates a namespace with labels and, by server dry run, a
// pod from the Deployment's template in it: Pod Security admission refuses
// it if it breaks the namespace's level. A pod that may escalate privileges
// must be refused, or the check proves nothing.
func checkPodSecurity(ctx context.Context, t *testing.T, labels map[string]string, pod *corev1.Pod) {
	t.Helper()
	name := env.fw.NewNamespace(ctx, t)
	t.Cleanup(func() { _ = env.kube.CoreV1().Namespaces().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	nsObj, err := env.kube.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	maps.Copy(nsObj.Labels, labels)
	if _, err := env.kube.CoreV1().Namespaces().Update(ctx, nsObj, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: pod.Spec.ServiceAccountName}}
	if _, err := env.kube.CoreV1().ServiceAccounts(name).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	if _, err := env.kube.CoreV1().Pods(name).Create(ctx, pod, dryRun); err != nil {
		t.Errorf("the Deployment's pod in a namespace labelled %v: %v", labels, err)
	}
	bad := pod.DeepCopy()
	bad.Spec.Containers[0].SecurityContext.AllowPrivilegeEscalation = new(true)
	_, err = env.kube.CoreV1().Pods(name).Create(ctx, bad, dryRun)
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "PodSecurity") {
		t.Errorf("a pod with allowPrivilegeEscalation: got %v, want Forbidden by PodSecurity", err)
	}
}

func deploymentOf(t *testing.T, objs []*unstructured.Unstructured) *appsv1.Deployment {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == "Deployment" {
			var d appsv1.Deployment
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &d); err != nil {
				t.Fatal(err)
			}
			return &d
		}
	}
	t.Fatal("no Deployment in the install")
	return nil
}

func deploymentImage(t *testing.T, objs []*unstructured.Unstructured) string {
	t.Helper()
	return deploymentOf(t, objs).Spec.Template.Spec.Containers[0].Image
}

func deploymentPod(t *testing.T, objs []*unstructured.Unstructured) *corev1.Pod {
	t.Helper()
	d := deploymentOf(t, objs)
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{GenerateName: d.Name + "-"}, Spec: d.Spec.Template.Spec}
}

func exitCode(err error) int {
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}
