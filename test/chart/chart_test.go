// Package chart tests the Helm chart charts/uuid-controller against
// deploy/, with bin/helm (Helm v4, built from its own module, hack/helm,
// so Helm never enters this module's go.mod) and bin/kubectl run as
// processes. The chart on a real node is tested in test/node.
package chart

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/demo-operator/uuid-controller/test/framework"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestChartMatchesKustomize: with default values, `helm template
// --include-crds` renders the same objects as `kubectl kustomize deploy/`,
// field by field, apart from Helm's labels (which the chart must add to
// every object it templates). A change to one form alone fails here.
func TestChartMatchesKustomize(t *testing.T) {
	chart := render(t)
	for _, o := range chart {
		if o.GetKind() == "CustomResourceDefinition" {
			continue // crds/ is not templated: Helm adds nothing to it
		}
		if got := o.GetLabels()["app.kubernetes.io/managed-by"]; got != "Helm" {
			t.Errorf("%s: label app.kubernetes.io/managed-by = %q, want Helm", key(o), got)
		}
	}
	for _, p := range compare(chart, kustomize(t, "deploy"), "deploy/") {
		t.Error(p)
	}
}

// TestChartCRDIsCrdYAML: the chart's CRD is crd.yaml, byte for byte (make
// manifests copies it), so `helm show crds` gives users the file the
// README tells them to apply.
func TestChartCRDIsCrdYAML(t *testing.T) {
	out, errOut, err := run(t, "helm", "show", "crds", chartDir)
	if err != nil {
		t.Fatalf("helm show crds: %v\n%s", err, errOut)
	}
	want := readObjects(t, "crd.yaml")
	for _, p := range compare(parse(t, out), want, "crd.yaml") {
		t.Errorf("%s (run make manifests)", p)
	}
}

// TestChartKopfMigrationMatchesDeploy: kopfMigration.enabled renders what
// deploy/ with its kopf-migration component does (the flag, the grant, the
// admission policy), in deploy/'s namespace and in another: there the
// policy must name the ServiceAccount the install makes, as the
// component's replacements make it name deploy/'s.
func TestChartKopfMigrationMatchesDeploy(t *testing.T) {
	for _, ns := range []string{"uuid-system", "tenant-a"} {
		t.Run(ns, func(t *testing.T) {
			want := kustomize(t, deployWithKopfMigration(t, ns))
			for _, o := range want {
				// kubectl's kustomize does not know these kinds are
				// cluster-scoped and gives them the namespace, which the
				// apiserver drops (deploy/'s own namespace is not set, so
				// uuid-system stays exact).
				if k := o.GetKind(); k == "ValidatingAdmissionPolicy" || k == "ValidatingAdmissionPolicyBinding" {
					o.SetNamespace("")
				}
			}
			chart := render(t, "--set", "kopfMigration.enabled=true", "--set", "namespace.name="+ns)
			for _, p := range compare(chart, want, "deploy/ with the kopf-migration component in "+ns) {
				t.Error(p)
			}
		})
	}
}

// deployWithKopfMigration is a copy of deploy/ with the kopf-migration
// component enabled and, unless ns is uuid-system, the namespace set, as
// `kustomize edit add component kopf-migration` and `kustomize edit set
// namespace` leave deploy/kustomization.yaml. Only there do deploy/'s
// replacements set the policy's ServiceAccount.
func deployWithKopfMigration(t *testing.T, ns string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "deploy")
	if err := os.CopyFS(dir, os.DirFS(filepath.Join(framework.RepoRoot(t), "deploy"))); err != nil {
		t.Fatal(err)
	}
	k := filepath.Join(dir, "kustomization.yaml")
	b, err := os.ReadFile(k)
	if err != nil {
		t.Fatal(err)
	}
	b = append(b, "components:\n  - kopf-migration\n"...)
	if ns != "uuid-system" {
		b = fmt.Appendf(b, "namespace: %s\n", ns)
	}
	if err := os.WriteFile(k, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestChartNetworkPolicyMatchesComponent: networkPolicy.enabled renders
// what deploy/ with the component deploy/components/networkpolicy does.
func TestChartNetworkPolicyMatchesComponent(t *testing.T) {
	for _, p := range compare(render(t, "--set", "networkPolicy.enabled=true"), kustomize(t, withComponent(t, "deploy/components/networkpolicy")), "deploy/ with the networkpolicy component") {
		t.Error(p)
	}
}

// TestChartMonitoringMatchesComponent: monitoring.enabled renders what
// deploy/ with the component deploy/monitoring does: the Service, the
// scraper, the ServiceMonitor, the alerts, the dashboard and the
// certificate mounted into the Deployment.
func TestChartMonitoringMatchesComponent(t *testing.T) {
	for _, p := range compare(render(t, "--set", "monitoring.enabled=true"), kustomize(t, withComponent(t, "deploy/monitoring")), "deploy/ with the monitoring component") {
		t.Error(p)
	}
}

// withComponent is an overlay of deploy/ with one component, as a user
// writes it.
func withComponent(t *testing.T, component string) string {
	t.Helper()
	root := framework.RepoRoot(t)
	overlay := t.TempDir()
	rel := func(p string) string {
		r, err := filepath.Rel(overlay, filepath.Join(root, p))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	k := fmt.Sprintf("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [%s]\ncomponents: [%s]\n",
		rel("deploy"), rel(component))
	if err := os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	return overlay
}

// TestChartValues: values change the objects the way values.yaml says.
func TestChartValues(t *testing.T) {
	const digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	tests := []struct {
		name  string
		set   []string
		check func(t *testing.T, objs map[string]*unstructured.Unstructured)
	}{{
		name: "image by digest",
		set:  []string{"image.repository=registry.example:5000/uuid-controller", "image.digest=" + digest, "image.pullPolicy=Always"},
		check: func(t *testing.T, objs map[string]*unstructured.Unstructured) {
			c := container(t, objs)
			if img := c["image"]; img != "registry.example:5000/uuid-controller@"+digest || c["imagePullPolicy"] != "Always" {
				t.Errorf("image %v, pull policy %v", img, c["imagePullPolicy"])
			}
		},
	}, {
		name: "image by tag and digest",
		set:  []string{"image.tag=v0.1.0", "image.digest=" + digest},
		check: func(t *testing.T, objs map[string]*unstructured.Unstructured) {
			if img := container(t, objs)["image"]; img != "uuid-controller:v0.1.0@"+digest {
				t.Errorf("image %v", img)
			}
		},
	}, {
		name: "verbosity, extra args, plain metrics on another port",
		set:  []string{"logVerbosity=2", "extraArgs={--workers=32,--event-level=Normal}", "metrics.secure=false", "metrics.port=9443"},
		check: func(t *testing.T, objs map[string]*unstructured.Unstructured) {
			want := []string{"--leader-elect", "--health-addr=:8080",
				"--metrics-addr=:9443", "--metrics-secure=false", "-v=2", "--workers=32", "--event-level=Normal"}
			if got := args(t, deployment(t, objs)); !slices.Equal(got, want) {
				t.Errorf("args %q, want %q", got, want)
			}
			ann := deployment(t, objs).Object["spec"].(map[string]any)["template"].(map[string]any)["metadata"].(map[string]any)["annotations"].(map[string]any)
			if ann["prometheus.io/scheme"] != "http" || ann["prometheus.io/port"] != "9443" {
				t.Errorf("annotations %v", ann)
			}
		},
	}, {
		name: "one replica without leader election, no namespace, no reader role",
		set:  []string{"replicas=1", "leaderElection.enabled=false", "namespace.create=false", "namespace.name=", "metrics.reader.create=false"},
		check: func(t *testing.T, objs map[string]*unstructured.Unstructured) {
			for k, o := range objs {
				if o.GetKind() == "Namespace" || o.GetKind() == "Role" || strings.Contains(k, "metrics-reader") {
					t.Errorf("%s rendered", k)
				}
				if ns := o.GetNamespace(); ns != "" && ns != "tenant" {
					t.Errorf("%s: namespace %q, want the release's, tenant", k, ns)
				}
			}
			if got := args(t, deployment(t, objs)); slices.Contains(got, "--leader-elect") {
				t.Errorf("args %q", got)
			}
		},
	}, {
		name: "monitoring without a certificate Secret",
		set:  []string{"monitoring.enabled=true", "monitoring.insecureSkipVerify=true", "monitoring.interval=15s", "namespace.name=team-a"},
		check: func(t *testing.T, objs map[string]*unstructured.Unstructured) {
			sm, ok := objs["monitoring.coreos.com/v1 ServiceMonitor team-a/uuid-controller"]
			if !ok {
				t.Fatal("no ServiceMonitor team-a/uuid-controller")
			}
			eps, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
			if len(eps) != 1 {
				t.Fatalf("%d endpoints, want 1", len(eps))
			}
			ep := eps[0].(map[string]any)
			if tls := ep["tlsConfig"].(map[string]any); tls["insecureSkipVerify"] != true || tls["ca"] != nil || ep["interval"] != "15s" {
				t.Errorf("endpoint %v", ep)
			}
			d := deployment(t, objs)
			if got := args(t, d); slices.ContainsFunc(got, func(a string) bool { return strings.HasPrefix(a, "--metrics-cert-file") }) {
				t.Errorf("args %q: a certificate with no Secret to hold it", got)
			}
			if v, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "volumes"); v != nil {
				t.Errorf("volumes %v", v)
			}
			if b := objs["rbac.authorization.k8s.io/v1 ClusterRoleBinding /uuid-controller-metrics-scraper"]; b == nil ||
				b.Object["subjects"].([]any)[0].(map[string]any)["namespace"] != "team-a" {
				t.Errorf("scraper binding %v, want its subject in team-a", b)
			}
		},
	}, {
		name: "scheduling and a metrics reader binding",
		set: []string{"nodeSelector.kubernetes\\.io/arch=arm64", "tolerations[0].key=dedicated", "tolerations[0].operator=Exists",
			"topologySpreadConstraints[0].maxSkew=1", "topologySpreadConstraints[0].topologyKey=topology.kubernetes.io/zone",
			"topologySpreadConstraints[0].whenUnsatisfiable=ScheduleAnyway",
			"metrics.reader.subjects[0].kind=ServiceAccount", "metrics.reader.subjects[0].name=prometheus", "metrics.reader.subjects[0].namespace=monitoring"},
		check: func(t *testing.T, objs map[string]*unstructured.Unstructured) {
			spec := deployment(t, objs).Object["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
			for _, f := range []string{"nodeSelector", "tolerations", "topologySpreadConstraints", "affinity"} {
				if spec[f] == nil {
					t.Errorf("pod spec has no %s", f)
				}
			}
			b, ok := objs["rbac.authorization.k8s.io/v1 ClusterRoleBinding /uuid-controller-metrics-reader"]
			if !ok {
				t.Fatal("no ClusterRoleBinding uuid-controller-metrics-reader")
			}
			if s := b.Object["subjects"].([]any)[0].(map[string]any); s["name"] != "prometheus" || s["namespace"] != "monitoring" {
				t.Errorf("subject %v", s)
			}
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var args []string
			for _, s := range tt.set {
				args = append(args, "--set", s)
			}
			tt.check(t, byKey(t, render(t, append(args, "--namespace", "tenant")...)))
		})
	}
}

func deployment(t *testing.T, objs map[string]*unstructured.Unstructured) *unstructured.Unstructured {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == "Deployment" {
			return o
		}
	}
	t.Fatal("no Deployment rendered")
	return nil
}

func container(t *testing.T, objs map[string]*unstructured.Unstructured) map[string]any {
	t.Helper()
	cs, _, _ := unstructured.NestedSlice(deployment(t, objs).Object, "spec", "template", "spec", "containers")
	if len(cs) != 1 {
		t.Fatalf("%d containers, want 1", len(cs))
	}
	return cs[0].(map[string]any)
}

func args(t *testing.T, d *unstructured.Unstructured) []string {
	t.Helper()
	cs, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
	a, _, err := unstructured.NestedStringSlice(cs[0].(map[string]any), "args")
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestChartLeaseGrantByName: the leader-election Role grants get and
// update on the controller's Lease by name only, and create (which RBAC
// cannot limit by name) in a rule of its own; deploy/ matches it
// (TestChartMatchesKustomize).
func TestChartLeaseGrantByName(t *testing.T) {
	objs := byKey(t, render(t))
	var role *unstructured.Unstructured
	for k, o := range objs {
		if o.GetKind() == "Role" && strings.HasSuffix(o.GetName(), "-leader-election") {
			role = objs[k]
		}
	}
	if role == nil {
		t.Fatal("no leader-election Role rendered")
	}
	rules, _, _ := unstructured.NestedSlice(role.Object, "rules")
	var got []string
	for _, r := range rules {
		rule := r.(map[string]any)
		names, _, _ := unstructured.NestedStringSlice(rule, "resourceNames")
		verbs, _, _ := unstructured.NestedStringSlice(rule, "verbs")
		got = append(got, fmt.Sprintf("%v on %v", verbs, names))
	}
	want := []string{"[get update] on [uuid-controller]", "[create] on []"}
	if !slices.Equal(got, want) {
		t.Errorf("leader-election Role rules: %q, want %q", got, want)
	}
}
