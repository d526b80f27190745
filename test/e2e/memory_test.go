package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/demo-operator/uuid-controller/test/cluster"
	"github.com/demo-operator/uuid-controller/test/framework"
)

// maxPeakRSS is the controller's peak resident memory allowed while it
// reads objects whatever they hold: well under the Deployment's 256 MiB
// limit (deploy/), so a cluster of huge objects cannot OOM-kill it.
const maxPeakRSS = 100 << 20

// hugeSpecBytes is about the size of each huge object's spec: near the
// apiserver's (etcd's 1.5 MiB) limit on an object.
const hugeSpecBytes = 1300 << 10

// deepSpecLevels nests the deep objects' specs beyond the bound the
// controller's decoder once had (1,000), under encoding/json's (10,000).
const deepSpecLevels = 1500

// hugeObject is the JSON of a Uuid object whose spec is a flat array of
// about hugeSpecBytes (an array of small numbers costs a decoder that
// builds maps about 16 bytes per 2 bytes of JSON), nested deepSpecLevels
// arrays deep when deep, with status (JSON, "" for none).
func hugeObject(name string, deep bool, status string) []byte {
	var b strings.Builder
	b.Grow(hugeSpecBytes + 2*deepSpecLevels + 512)
	b.WriteString(`{"apiVersion":"demo.operator/v1","kind":"Uuid","metadata":{"name":"` + name + `"},"spec":{"blob":`)
	levels := 1
	if deep {
		levels = deepSpecLevels
	}
	b.WriteString(strings.Repeat("[", levels))
	elem := `"` + strings.Repeat("x", 62) + `"`
	b.WriteString(strings.Repeat(elem+",", hugeSpecBytes/(len(elem)+1)))
	b.WriteString(elem + strings.Repeat("]", levels) + "}")
	if status != "" {
		b.WriteString(`,"status":` + status)
	}
	b.WriteString("}")
	return []byte(b.String())
}

// The statuses the huge objects start with.
const (
	// failedStatus is the controller's own report of a failed write: no
	// UUID, state Error, a Ready=False condition it keeps the time of.
	failedStatus = `{"state":"Error","message":"boom","conditions":[{"type":"Ready","status":"False","reason":"Forbidden","message":"boom","lastTransitionTime":"2026-12-01T00:00:00Z"}]}`
	// kopfStatus is what kopf left on an object it failed: a stray.
	kopfStatus = `{"state":"Erreur","message":"boom","uuid":"NA"}`
	// failedStrayStatus is a stray in state Error, with conditions.
	failedStrayStatus = `{"state":"Error","message":"boom","uuid":"NA","conditions":[{"type":"Ready","status":"False","reason":"Forbidden","message":"boom","lastTransitionTime":"2026-12-01T00:00:00Z"}]}`
)

// hugeObjects is the objects TestHugeObjectsBoundMemory starts with, by
// name: their status ("" for none), and whether their spec is deep.
func hugeObjects() map[string]struct {
	status string
	deep   bool
} {
	objs := map[string]struct {
		status string
		deep   bool
	}{}
	for i := range 50 {
		deep := i >= 40
		status := `{"state":"Ok","message":"resource created successfully","uuid":"` + uuid.NewString() + `"}`
		switch i % 10 {
		case 6, 7:
			status = ""
		case 8:
			status = failedStatus
		case 9:
			status = kopfStatus
			if deep {
				status = failedStrayStatus
			}
		}
		name := fmt.Sprintf("flat-%d", i)
		if deep {
			name = fmt.Sprintf("deep-%d", i)
		}
		objs[name] = struct {
			status string
			deep   bool
		}{status, deep}
	}
	return objs
}

// TestHugeObjectsBoundMemory: with 50 Uuid objects of about 1.3 MB each
// (40 flat, 10 nested 1,500 arrays deep), most with a UUID, some pending,
// some failed (state Error) and some strays (status.uuid "NA"), the
// controller starts, sweeps, assigns a UUID to every object without one
// and to a huge one created after its start, with a peak resident memory
// (VmHWM) of at most maxPeakRSS: narrowed (the sweep and the reads of
// strays), then with the full informer listing every object (watch-list
// off, as against an apiserver without it).
func TestHugeObjectsBoundMemory(t *testing.T) {
	ctx := framework.Context(t, 15*time.Minute)
	ns := env.fw.NewNamespace(ctx, t)
	t.Cleanup(func() {
		// The objects cost the apiserver and etcd memory: gone at once.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := env.kube.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil {
			t.Errorf("deleting namespace %s: %v", ns, err)
		}
		if err := env.cluster.InstallCRD(ctx); err != nil {
			t.Errorf("reinstalling crd.yaml: %v", err)
		}
	})
	objs := hugeObjects()
	installLaxCRD(ctx, t)
	start := time.Now()
	names := make([]string, 0, len(objs))
	for name := range objs {
		names = append(names, name)
	}
	createRaw(ctx, t, ns, names, func(name string) []byte { return hugeObject(name, objs[name].deep, objs[name].status) })
	t.Logf("created %d objects of %s each in %s", len(objs), framework.MiB(int64(len(hugeObject("x", true, failedStatus)))), time.Since(start).Round(time.Second))
	before := uuidTable(ctx, t, ns)

	for i, phase := range []struct {
		name string
		full bool
		env  []string
	}{
		{name: "narrowed"},
		{name: "full, listed", full: true, env: []string{"KUBE_FEATURE_WatchListClient=false"}},
	} {
		if i > 0 {
			// Back to the statuses the objects started with.
			installLaxCRD(ctx, t)
			for name, o := range objs {
				if before[name].uuid != "" && before[name].state == "Ok" {
					continue
				}
				patch := `[{"op":"remove","path":"/status"}]`
				if o.status != "" {
					patch = `[{"op":"add","path":"/status","value":` + o.status + `}]`
				}
				if _, err := env.fw.Uuids(ns).Patch(ctx, name, types.JSONPatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
					t.Fatal(err)
				}
			}
		}
		install := env.cluster.InstallCRDWithSelectableFields
		if phase.full {
			install = env.cluster.InstallCRDWithoutSelectableFields
		}
		if err := install(ctx); err != nil {
			t.Fatal(err)
		}
		opts := controllerAs(env.kubeconfig)
		opts.Env = phase.env
		p := framework.StartController(ctx, t, opts, ns)
		late := fmt.Sprintf("late-%d", i)
		createRaw(ctx, t, ns, []string{late}, func(name string) []byte { return hugeObject(name, false, "") })
		after := waitAllAssigned(ctx, t, ns, len(objs)+i+1)
		for name, was := range before {
			if was.state == "Ok" && was.uuid != "" && after[name].uuid != was.uuid {
				t.Errorf("%s: %s: UUID %q became %q", phase.name, name, was.uuid, after[name].uuid)
			}
		}
		if !phase.full {
			if v := metricReaches(ctx, t, p, "uuid_controller_sweep_invalid_objects", nil, 5); v != 5 {
				t.Errorf("%s: uuid_controller_sweep_invalid_objects = %v, want the 5 strays", phase.name, v)
			}
		} else if !informerListed(t, ns) {
			t.Errorf("%s: the audit log has no list by the controller's informer (resourceVersion set): it did not list", phase.name)
		}
		mustStayRunning(t, p)
		peak, err := p.PeakRSS()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: controller peak RSS %s (bound %s)", phase.name, framework.MiB(peak), framework.MiB(maxPeakRSS))
		if peak > maxPeakRSS {
			t.Errorf("%s: controller peak RSS %s, want at most %s", phase.name, framework.MiB(peak), framework.MiB(maxPeakRSS))
		}
		if code := sigterm(t, p, 30*time.Second); code != 0 {
			t.Errorf("%s: exit code %d on SIGTERM", phase.name, code)
		}
	}
}

// informerListed tells whether the controller's informer listed Uuid
// objects in ns: a list with a resourceVersion, which the sweep's pages and
// the reads of strays do not set.
func informerListed(t *testing.T, ns string) bool {
	t.Helper()
	lists, _ := controllerListsAndWatches(t, ns)
	for _, q := range lists {
		if q.Get("resourceVersion") != "" {
			return true
		}
	}
	return false
}

// installLaxCRD installs crd.yaml with no rule on status.uuid or state and
// no status subresource, as an older CRD served: a create may then carry
// any status, kopf's "NA" included.
func installLaxCRD(ctx context.Context, t *testing.T) {
	t.Helper()
	objs, err := cluster.ReadObjects(filepath.Join(framework.RepoRoot(t), "crd.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	crd := objs[0]
	versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
	for _, v := range versions {
		m := v.(map[string]any)
		delete(m, "selectableFields")
		delete(m, "subresources")
		for _, field := range []string{"uuid", "state"} {
			if err := unstructured.SetNestedField(m, map[string]any{"type": "string"},
				"schema", "openAPIV3Schema", "properties", "status", "properties", field); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := unstructured.SetNestedSlice(crd.Object, versions, "spec", "versions"); err != nil {
		t.Fatal(err)
	}
	b, err := crd.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "lax-crd.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := env.cluster.InstallCRDFile(ctx, path); err != nil {
		t.Fatal(err)
	}
}

// createRaw creates the objects body gives the JSON of, 4 at a time,
// sending the bytes as they are.
func createRaw(ctx context.Context, t *testing.T, ns string, names []string, body func(name string) []byte) {
	t.Helper()
	framework.Each(t, names, 4, func(name string) error {
		err := env.kube.CoreV1().RESTClient().Post().AbsPath("/apis", cluster.UuidGVR.Group, cluster.UuidGVR.Version,
			"namespaces", ns, cluster.UuidGVR.Resource).SetHeader("Content-Type", "application/json").
			Body(body(name)).Do(ctx).Error()
		if err != nil {
			return fmt.Errorf("create %s/%s: %w", ns, name, err)
		}
		return nil
	})
}

// tableRow is what the apiserver's table of Uuid objects shows of one.
type tableRow struct{ uuid, state string }

// uuidTable reads every object's status.uuid and status.state in ns from
// the apiserver's table view (the CRD's printer columns), which leaves out
// the huge specs.
func uuidTable(ctx context.Context, t *testing.T, ns string) map[string]tableRow {
	t.Helper()
	raw, err := env.kube.CoreV1().RESTClient().Get().AbsPath("/apis", cluster.UuidGVR.Group, cluster.UuidGVR.Version,
		"namespaces", ns, cluster.UuidGVR.Resource).SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io").
		Do(ctx).Raw()
	if err != nil {
		t.Fatalf("listing %s as a table: %v", ns, err)
	}
	var table metav1.Table
	if err := json.Unmarshal(raw, &table); err != nil {
		t.Fatalf("reading the table of %s: %v", ns, err)
	}
	col := map[string]int{}
	for i, c := range table.ColumnDefinitions {
		col[c.Name] = i
	}
	out := map[string]tableRow{}
	for _, r := range table.Rows {
		text := func(name string) string {
			i, ok := col[name]
			if !ok || i >= len(r.Cells) {
				t.Fatalf("the table of %s has no column %s", ns, name)
			}
			s, _ := r.Cells[i].(string)
			return s
		}
		out[text("Name")] = tableRow{uuid: text("UUID"), state: text("Status")}
	}
	return out
}

// waitAllAssigned waits up to 3 minutes until the n objects of ns all have
// state Ok and a valid UUID, and returns the table.
func waitAllAssigned(ctx context.Context, t *testing.T, ns string, n int) map[string]tableRow {
	t.Helper()
	var rows map[string]tableRow
	err := framework.Poll(ctx, 3*time.Minute, fmt.Sprintf("a UUID on each of %d objects", n), func(ctx context.Context) error {
		rows = uuidTable(ctx, t, ns)
		var missing []string
		for name, r := range rows {
			if _, err := uuid.Parse(r.uuid); err != nil || len(r.uuid) != 36 || r.state != "Ok" {
				missing = append(missing, name)
			}
		}
		if len(rows) != n || len(missing) > 0 {
			return fmt.Errorf("%d objects, %d without a UUID: %v", len(rows), len(missing), missing)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return rows
}
