package e2e

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/demo-operator/uuid-controller/test/cluster"
	"github.com/demo-operator/uuid-controller/test/framework"
)

// componentOverlay writes a user's overlay: deploy/ with the kustomize
// component at repo path component, plus extra (more kustomization.yaml
// fields, or ""). It returns the overlay's directory.
func componentOverlay(t *testing.T, root, component, extra string) string {
	t.Helper()
	dir := t.TempDir()
	rel := func(p string) string {
		r, err := filepath.Rel(dir, filepath.Join(root, p))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	k := fmt.Sprintf("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - %s\ncomponents:\n  - %s\n",
		rel("deploy"), rel(component)) + extra
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// renderOverlay renders overlay with kubectl kustomize and returns its
// objects and the rendered file.
func renderOverlay(t *testing.T, overlay string) ([]*unstructured.Unstructured, string) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "rendered.yaml")
	if err := os.WriteFile(file, []byte(framework.Kubectl(t, env.cluster, "kustomize", overlay)), 0o644); err != nil {
		t.Fatal(err)
	}
	objs, err := cluster.ReadObjects(file)
	if err != nil {
		t.Fatal(err)
	}
	return objs, file
}

// networkPolicyOverlay is docs/security.md's overlay: deploy/ with the
// NetworkPolicy component, metrics open to namespace metricsNS ("" keeps
// the component's default).
func networkPolicyOverlay(t *testing.T, root, metricsNS string) string {
	t.Helper()
	patch := ""
	if metricsNS != "" {
		patch = fmt.Sprintf(`patches:
  - target: {kind: NetworkPolicy, name: uuid-controller}
    patch: |-
      - op: replace
        path: /spec/ingress/1/from/0/namespaceSelector/matchLabels/kubernetes.io~1metadata.name
        value: %s
`, metricsNS)
	}
	return componentOverlay(t, root, "deploy/components/networkpolicy", patch)
}

// renderNetworkPolicy renders overlay with kubectl kustomize and returns
// its NetworkPolicy and Deployment, and the rendered file.
func renderNetworkPolicy(t *testing.T, overlay string) (*networkingv1.NetworkPolicy, *appsv1.Deployment, string) {
	t.Helper()
	objs, file := renderOverlay(t, overlay)
	var np *networkingv1.NetworkPolicy
	var d *appsv1.Deployment
	for _, o := range objs {
		switch o.GetKind() {
		case "NetworkPolicy":
			np = &networkingv1.NetworkPolicy{}
			fromUnstructured(t, o, np)
		case "Deployment":
			d = &appsv1.Deployment{}
			fromUnstructured(t, o, d)
		}
	}
	if np == nil || d == nil {
		t.Fatalf("the rendered overlay holds NetworkPolicy %v and Deployment %v, want both", np != nil, d != nil)
	}
	return np, d, file
}

func fromUnstructured(t *testing.T, u *unstructured.Unstructured, into any) {
	t.Helper()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, into); err != nil {
		t.Fatalf("%s %s: %v", u.GetKind(), u.GetName(), err)
	}
}

// TestNetworkPolicyComponent: deploy/ with deploy/components/networkpolicy
// renders (kubectl kustomize); its NetworkPolicy, in the Deployment's
// namespace, selects the Deployment's Pods and admits the health port from
// anywhere and the metrics port only from the namespace named (by default
// "monitoring", or as the documented patch sets it), by port names the
// container declares; the apiserver accepts it. Whether traffic is then
// blocked is the network plugin's work: this cluster has none.
func TestNetworkPolicyComponent(t *testing.T) {
	ctx := testCtx(t)
	root := framework.RepoRoot(t)
	for _, metricsNS := range []string{"", "prometheus"} {
		np, d, _ := renderNetworkPolicy(t, networkPolicyOverlay(t, root, metricsNS))
		checkNetworkPolicy(t, np, d, cmp.Or(metricsNS, "monitoring"))
	}

	np, _, file := renderNetworkPolicy(t, networkPolicyOverlay(t, root, "prometheus"))
	only := filepath.Join(t.TempDir(), "networkpolicy.yaml")
	objs, err := cluster.ReadObjects(file)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.GetKind() == "NetworkPolicy" {
			b, err := o.MarshalJSON()
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(only, b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := env.cluster.Apply(ctx, only); err != nil {
		t.Fatalf("the apiserver rejects the NetworkPolicy: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = env.kube.NetworkingV1().NetworkPolicies(np.Namespace).Delete(ctx, np.Name, metav1.DeleteOptions{})
	})
	stored, err := env.kube.NetworkingV1().NetworkPolicies(np.Namespace).Get(ctx, np.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(stored.Spec.Ingress) != 2 {
		t.Errorf("stored NetworkPolicy has %d ingress rules, want 2", len(stored.Spec.Ingress))
	}
}

// checkNetworkPolicy fails the test unless np admits, to d's Pods, the
// health port from anywhere and the metrics port from metricsNS only.
func checkNetworkPolicy(t *testing.T, np *networkingv1.NetworkPolicy, d *appsv1.Deployment, metricsNS string) {
	t.Helper()
	if np.Namespace != d.Namespace {
		t.Errorf("NetworkPolicy in namespace %q, Deployment in %q", np.Namespace, d.Namespace)
	}
	sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
	if err != nil {
		t.Fatal(err)
	}
	if sel.Empty() || !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
		t.Errorf("NetworkPolicy podSelector %v does not select the Deployment's Pods %v", sel, d.Spec.Template.Labels)
	}
	if !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) {
		t.Errorf("policyTypes %v, want Ingress only (the controller's egress to the apiserver stays open)", np.Spec.PolicyTypes)
	}
	ports := map[string]int32{}
	for _, p := range d.Spec.Template.Spec.Containers[0].Ports {
		ports[p.Name] = p.ContainerPort
	}
	// Which sources each of the container's ports admits: "*" for anyone.
	admits := map[string][]string{}
	for _, rule := range np.Spec.Ingress {
		sources := []string{"*"}
		if len(rule.From) > 0 {
			sources = nil
			for _, f := range rule.From {
				if f.NamespaceSelector == nil || f.PodSelector != nil || f.IPBlock != nil || len(f.NamespaceSelector.MatchExpressions) > 0 {
					t.Errorf("ingress source %+v: want a namespace selected by name only", f)
					continue
				}
				sources = append(sources, f.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"])
			}
		}
		for _, p := range rule.Ports {
			if _, ok := ports[p.Port.String()]; !ok {
				t.Errorf("NetworkPolicy port %q is not a port of the controller's container %v", p.Port.String(), ports)
			}
			admits[p.Port.String()] = append(admits[p.Port.String()], sources...)
		}
	}
	want := map[string][]string{"health": {"*"}, "metrics": {metricsNS}}
	if fmt.Sprint(admits) != fmt.Sprint(want) {
		t.Errorf("NetworkPolicy admits %v, want %v", admits, want)
	}
}
