package chart

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/demo-operator/uuid-controller/test/cluster"
	"github.com/demo-operator/uuid-controller/test/framework"
)

// chartDir is the chart under test, relative to the repository root.
const chartDir = "charts/uuid-controller"

// helmLabels are the labels the chart puts on its objects beside
// deploy/'s; the comparison with the kustomization ignores exactly these.
var helmLabels = []string{
	"helm.sh/chart",
	"app.kubernetes.io/managed-by",
	"app.kubernetes.io/instance",
	"app.kubernetes.io/version",
}

// run runs bin/NAME in the repository root with Helm's own directories in
// a temporary one, so no test reads or writes the user's Helm settings. It
// returns stdout and stderr apart: Helm warns on stderr.
func run(t *testing.T, name string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	root := framework.RepoRoot(t)
	bin := filepath.Join(root, "bin", name)
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%v: run `make %s` first (make test does)", err, map[string]string{"helm": "helm", "kubectl": "tools"}[name])
	}
	home := t.TempDir()
	cmd := exec.Command(bin, args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"),
		"KUBECONFIG="+filepath.Join(home, "no-kubeconfig"))
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	return out.String(), errOut.String(), err
}

// render runs `helm template` on the chart (release uuid-controller, CRDs
// included) with args added, and returns its objects.
func render(t *testing.T, args ...string) []*unstructured.Unstructured {
	t.Helper()
	out, errOut, err := run(t, "helm", append([]string{"template", "uuid-controller", chartDir, "--include-crds"}, args...)...)
	if err != nil {
		t.Fatalf("helm template %s: %v\n%s", strings.Join(args, " "), err, errOut)
	}
	return parse(t, out)
}

// kustomize runs `kubectl kustomize dir` and returns its objects.
func kustomize(t *testing.T, dir string) []*unstructured.Unstructured {
	t.Helper()
	out, errOut, err := run(t, "kubectl", "kustomize", dir)
	if err != nil {
		t.Fatalf("kubectl kustomize %s: %v\n%s", dir, err, errOut)
	}
	return parse(t, out)
}

// readObjects reads the objects of YAML files relative to the repository root.
func readObjects(t *testing.T, files ...string) []*unstructured.Unstructured {
	t.Helper()
	var objs []*unstructured.Unstructured
	for _, f := range files {
		o, err := cluster.ReadObjects(filepath.Join(framework.RepoRoot(t), f))
		if err != nil {
			t.Fatal(err)
		}
		objs = append(objs, o...)
	}
	return objs
}

func parse(t *testing.T, yaml string) []*unstructured.Unstructured {
	t.Helper()
	f := filepath.Join(t.TempDir(), "objects.yaml")
	if err := os.WriteFile(f, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	objs, err := cluster.ReadObjects(f)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func key(o *unstructured.Unstructured) string {
	return fmt.Sprintf("%s %s %s/%s", o.GetAPIVersion(), o.GetKind(), o.GetNamespace(), o.GetName())
}

// byKey indexes objects by apiVersion, kind, namespace and name; a
// duplicate fails the test.
func byKey(t *testing.T, objs []*unstructured.Unstructured) map[string]*unstructured.Unstructured {
	t.Helper()
	m := map[string]*unstructured.Unstructured{}
	for _, o := range objs {
		if _, dup := m[key(o)]; dup {
			t.Fatalf("%s rendered twice", key(o))
		}
		m[key(o)] = o
	}
	return m
}

// withoutHelmLabels returns a copy of o without Helm's labels, on the
// object and on a pod template, and without a labels map left empty.
func withoutHelmLabels(o *unstructured.Unstructured) *unstructured.Unstructured {
	c := o.DeepCopy()
	for _, path := range [][]string{{"metadata"}, {"spec", "template", "metadata"}} {
		labels, found, _ := unstructured.NestedStringMap(c.Object, append(path, "labels")...)
		if !found {
			continue
		}
		for _, k := range helmLabels {
			delete(labels, k)
		}
		if len(labels) == 0 {
			unstructured.RemoveNestedField(c.Object, append(path, "labels")...)
		} else {
			_ = unstructured.SetNestedStringMap(c.Object, labels, append(path, "labels")...)
		}
	}
	return c
}

// compare lists every object one set has and the other not, and every
// field where two objects of the same key differ, Helm's labels aside.
func compare(chart, want []*unstructured.Unstructured, wantName string) []string {
	var problems []string
	got, exp := map[string]*unstructured.Unstructured{}, map[string]*unstructured.Unstructured{}
	for _, o := range chart {
		got[key(o)] = withoutHelmLabels(o)
	}
	for _, o := range want {
		exp[key(o)] = withoutHelmLabels(o)
	}
	for _, k := range slices.Sorted(maps.Keys(exp)) {
		g, ok := got[k]
		if !ok {
			problems = append(problems, fmt.Sprintf("%s: in %s, not in the chart", k, wantName))
			continue
		}
		for _, d := range diff("", g.Object, exp[k].Object) {
			problems = append(problems, fmt.Sprintf("%s: %s", k, d))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(got)) {
		if _, ok := exp[k]; !ok {
			problems = append(problems, fmt.Sprintf("%s: in the chart, not in %s", k, wantName))
		}
	}
	return problems
}

// diff lists the paths where chart and want differ, with both values.
func diff(path string, chart, want any) []string {
	cm, cok := chart.(map[string]any)
	wm, wok := want.(map[string]any)
	if cok && wok {
		var out []string
		for _, k := range slices.Sorted(maps.Keys(wm)) {
			out = append(out, diff(path+"."+k, cm[k], wm[k])...)
		}
		for _, k := range slices.Sorted(maps.Keys(cm)) {
			if _, ok := wm[k]; !ok {
				out = append(out, diff(path+"."+k, cm[k], nil)...)
			}
		}
		return out
	}
	cl, cok := chart.([]any)
	wl, wok := want.([]any)
	if cok && wok && len(cl) == len(wl) {
		var out []string
		for i := range wl {
			out = append(out, diff(fmt.Sprintf("%s[%d]", path, i), cl[i], wl[i])...)
		}
		return out
	}
	if reflect.DeepEqual(chart, want) {
		return nil
	}
	return []string{fmt.Sprintf("%s: chart %s, want %s", strings.TrimPrefix(path, "."), show(chart), show(want))}
}

func show(v any) string {
	if v == nil {
		return "nothing"
	}
	return fmt.Sprintf("%v", v)
}
