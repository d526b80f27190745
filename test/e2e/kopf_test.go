package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/demo-operator/uuid-controller/test/cluster"
	"github.com/demo-operator/uuid-controller/test/framework"
)

const (
	kopfFinalizer  = "kopf.zalando.org/KopfFinalizerMarker"
	kopfAnnotation = "kopf.zalando.org/last-handled-configuration"
	kopfMessage    = "Création de la ressource réussie"
	// otherFinalizer stands for anyone else's finalizer.
	otherFinalizer = "example.com/keep"
	// controllerUser is the identity deploy/rbac.yaml grants to.
	controllerUser = "system:serviceaccount:" + cluster.ControllerNamespace + ":" + cluster.ControllerServiceAccount
)

// kopfHandled leaves ns/name as kopf 1.36 leaves an object it handled
// (../shared/seed/README.md): three PATCHes of the object itself, in kopf's
// order: its finalizer (after any the object has), the status (on the
// main resource: the article's CRD has no status subresource), the
// annotation.
func kopfHandled(ctx context.Context, t *testing.T, ns, name, state, id, message string) {
	t.Helper()
	u, err := env.fw.Uuids(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fins, _ := jsonString(append(u.GetFinalizers(), kopfFinalizer))
	msg, _ := jsonString(message)
	for _, patch := range []string{
		`{"metadata":{"finalizers":` + fins + `}}`,
		fmt.Sprintf(`{"status":{"state":%q,"message":%s,"uuid":%q}}`, state, msg, id),
		`{"metadata":{"annotations":{"` + kopfAnnotation + `":"{}\n"}}}`,
	} {
		if _, err := env.fw.Uuids(ns).Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatalf("kopf's patch %s of %s/%s: %v", patch, ns, name, err)
		}
	}
}

func jsonString(v any) (string, error) {
	b, err := json.Marshal(v)
	return string(b), err
}

// createBare creates ns/name as the article's example is: no spec.
func createBare(ctx context.Context, t *testing.T, ns, name string, finalizers ...string) {
	t.Helper()
	u := framework.NewUuid(name)
	delete(u.Object, "spec")
	u.SetFinalizers(finalizers)
	if _, err := env.fw.Uuids(ns).Create(ctx, u, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// object reads ns/name, nil once it is gone.
func object(ctx context.Context, t *testing.T, ns, name string) *unstructured.Unstructured {
	t.Helper()
	u, err := env.fw.Uuids(ns).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// waitFor polls cond for up to timeout.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if err := framework.PollTrue(t.Context(), timeout, what, cond); err != nil {
		t.Fatal(err)
	}
}

// deleteUuid deletes ns/name as kubectl delete would.
func deleteUuid(ctx context.Context, t *testing.T, ns, name string) {
	t.Helper()
	if err := env.fw.Uuids(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}

// dropFinalizers clears what the tests leave on their objects.
func dropFinalizers(ns string, names ...string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, n := range names {
		_, _ = env.fw.Uuids(ns).Patch(ctx, n, types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
	}
}

// useKopfMigration applies deploy/kopf-migration/ (the opt-in's RBAC and,
// withPolicy, its admission policy) until the test ends, and waits until
// the policy denies the ServiceAccount a change RBAC allows.
func useKopfMigration(ctx context.Context, t *testing.T, ns string, withPolicy bool) {
	t.Helper()
	root := framework.RepoRoot(t)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		rbac := env.kube.RbacV1()
		_ = rbac.ClusterRoleBindings().Delete(ctx, "uuid-controller-kopf-migration", metav1.DeleteOptions{})
		_ = rbac.ClusterRoles().Delete(ctx, "uuid-controller-kopf-migration", metav1.DeleteOptions{})
		vap := env.kube.AdmissionregistrationV1()
		_ = vap.ValidatingAdmissionPolicyBindings().Delete(ctx, "uuid-controller-kopf-migration", metav1.DeleteOptions{})
		_ = vap.ValidatingAdmissionPolicies().Delete(ctx, "uuid-controller-kopf-migration", metav1.DeleteOptions{})
	})
	dir := filepath.Join(root, "deploy", "kopf-migration")
	if err := env.cluster.Apply(ctx, filepath.Join(dir, "rbac.yaml")); err != nil {
		t.Fatal(err)
	}
	if withPolicy {
		applyKopfPolicy(ctx, t, ns, filepath.Join(dir, "policy.yaml"), []string{labelPatch, annotationPatch}, nil)
	} else {
		// A policy another test just deleted acts for a moment longer.
		waitKopfPolicy(ctx, t, ns, nil, []string{labelPatch})
	}
}

// Patches of the ServiceAccount's that tell admission policies apart.
const (
	labelPatch      = `{"metadata":{"labels":{"probe":"%s"}}}`
	annotationPatch = `{"metadata":{"annotations":{"probe":"%s"}}}`
)

// applyKopfPolicy applies an admission policy file (removed by
// useKopfMigration's cleanup) and waits until the apiserver enforces it:
// the patches denied are refused, those allowed go through.
func applyKopfPolicy(ctx context.Context, t *testing.T, ns, file string, denied, allowed []string) {
	t.Helper()
	if err := env.cluster.Apply(ctx, file); err != nil {
		t.Fatal(err)
	}
	waitKopfPolicy(ctx, t, ns, denied, allowed)
}

// waitKopfPolicy waits until the ServiceAccount's patches (each with a
// fresh value) of an object of its own in ns, "policy-probe", are refused
// by a ValidatingAdmissionPolicy if in denied and go through if in
// allowed. The apiserver reloads its policies about once a second, so one
// just deleted or replaced still acts for a moment.
func waitKopfPolicy(ctx context.Context, t *testing.T, ns string, denied, allowed []string) {
	t.Helper()
	const probe = "policy-probe"
	if object(ctx, t, ns, probe) == nil {
		createBare(ctx, t, ns, probe)
	}
	sa := saClient(t).Resource(cluster.UuidGVR).Namespace(ns)
	send := func(patch string) error {
		_, err := sa.Patch(ctx, probe, types.MergePatchType, []byte(fmt.Sprintf(patch, uuid.NewString()[:8])), metav1.PatchOptions{})
		return err
	}
	waitFor(t, 30*time.Second, "the admission policies to be as the test applied them", func() bool {
		for _, p := range denied {
			if err := send(p); err == nil || !strings.Contains(err.Error(), "ValidatingAdmissionPolicy") {
				return false
			}
		}
		for _, p := range allowed {
			if send(p) != nil {
				return false
			}
		}
		return true
	})
}

// probeOnlyPolicy is an admission policy of the migration's name that
// denies the controller's ServiceAccount label changes and nothing else:
// the controller's proof that the policy binds it passes, and the policy
// judges no finalizer, so a test can show what the patch itself does.
const probeOnlyPolicy = `apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: uuid-controller-kopf-migration
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
      - apiGroups: ["demo.operator"]
        apiVersions: ["*"]
        operations: ["UPDATE"]
        resources: ["uuid"]
  matchConditions:
    - name: controller-service-account
      expression: request.userInfo.username == "` + controllerUser + `"
  validations:
    - expression: object.metadata.?labels == oldObject.metadata.?labels
      message: labels only, in this test
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: uuid-controller-kopf-migration
spec:
  policyName: uuid-controller-kopf-migration
  validationActions: ["Deny"]
`

// saClient is a dynamic client authenticated as the controller's
// ServiceAccount.
func saClient(t *testing.T) dynamic.Interface {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", env.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return dyn
}

// TestKopfMigration follows docs/migrating-from-kopf.md on objects in exactly
// the state kopf leaves them, created through the API on the article's
// CRD: kopf's UUIDs are kept with zero writes, the objects kopf failed on
// (state Erreur or Error, uuid NA) get a real UUID and state Ok, deleting
// hangs on kopf's finalizer until --remove-kopf-finalizer is on and then
// completes, and nobody else's finalizer and kopf's annotation are never
// touched.
func TestKopfMigration(t *testing.T) {
	ctx := testCtx(t)
	ns := env.fw.NewNamespace(ctx, t)
	useArticleCRD(ctx, t)

	handled := []string{"handled-0", "handled-1", "handled-2", "shared"}
	kopfUUIDs := map[string]string{}
	for _, n := range handled {
		if n == "shared" {
			createBare(ctx, t, ns, n, otherFinalizer) // kopf's lands after it, at index 1
		} else {
			createBare(ctx, t, ns, n)
		}
		kopfUUIDs[n] = uuid.NewString()
		kopfHandled(ctx, t, ns, n, "Ok", kopfUUIDs[n], kopfMessage)
	}
	failed := map[string]string{"failed-erreur": "Erreur", "failed-error": "Error"}
	for n, state := range failed {
		createBare(ctx, t, ns, n)
		kopfHandled(ctx, t, ns, n, state, "NA", "Exception ... boom")
	}
	// The article's example names no namespace: kubectl puts it in default.
	const first = "my-first-ressource"
	if err := env.cluster.Apply(ctx, "testdata/article-example.yaml"); err != nil {
		t.Fatal(err)
	}
	kopfUUIDs[first] = uuid.NewString()
	kopfHandled(ctx, t, "default", first, "Ok", kopfUUIDs[first], kopfMessage)
	t.Cleanup(func() {
		dropFinalizers(ns, append(handled, "failed-erreur", "failed-error")...)
		dropFinalizers("default", first)
		_ = env.fw.Uuids("default").Delete(context.Background(), first, metav1.DeleteOptions{})
	})

	// Step 1 of the migration: kopf is stopped (it never ran here).
	// Step 2: crd.yaml replaces the article's CRD.
	if err := env.cluster.InstallCRD(ctx); err != nil {
		t.Fatal(err)
	}
	// Step 3: the controller, as deployed (every namespace, its own RBAC).
	p := framework.StartController(ctx, t, controllerAs(env.kubeconfig), "", "--resync", "1s")
	env.fw.WaitUUIDs(ctx, t, ns, []string{"failed-erreur", "failed-error"}, 30*time.Second)
	for n := range failed {
		waitWarning(ctx, t, ns, n, "InvalidUUID")
	}
	// Without the opt-in, deleting an object kopf handled hangs, and the
	// controller says why and what to do, once however many resyncs pass
	// (the object is the resync witness: the full watch queues it at each).
	deleteUuid(ctx, t, ns, "handled-0")
	witness := &resyncWitness{ns: ns, name: "handled-0"}
	witness.waitResyncs(t, p)
	waitFor(t, 30*time.Second, "handled-0 named as waiting for kopf's finalizer", func() bool { return witness.logged(p) >= 1 })
	witness.waitResyncs(t, p)
	if n := witness.logged(p); n != 1 {
		t.Errorf("handled-0 named %d times as waiting for kopf's finalizer, want once:\n%s", n, p.Output())
	}

	statusWrites := auditedStatusPatchCodes(t, ns)
	for _, n := range handled {
		if u := object(ctx, t, ns, n); u == nil {
			t.Fatalf("%s is gone", n)
		} else {
			checkKopfObject(t, u, kopfUUIDs[n])
		}
		if w := statusWrites[n]; len(w) != 0 {
			t.Errorf("%s: status writes %v to an object kopf gave a UUID, want none", n, w)
		}
	}
	for n := range failed {
		if w := statusWrites[n]; len(w) != 1 || w[0] != 200 {
			t.Errorf("%s: status writes %v, want exactly one", n, w)
		}
		u := object(ctx, t, ns, n)
		if msg, _, _ := unstructured.NestedString(u.Object, "status", "message"); msg != "resource created successfully" {
			t.Errorf("%s: status.message = %q", n, msg)
		}
		if fins := u.GetFinalizers(); !slices.Equal(fins, []string{kopfFinalizer}) {
			t.Errorf("%s: finalizers = %v, want kopf's untouched", n, fins)
		}
	}
	checkKopfObject(t, object(ctx, t, "default", first), kopfUUIDs[first])
	if w := auditedStatusPatchCodes(t, "default")[first]; len(w) != 0 {
		t.Errorf("%s: status writes %v, want none", first, w)
	}

	if u := object(ctx, t, ns, "handled-0"); u == nil || u.GetDeletionTimestamp() == nil {
		t.Fatal("handled-0 was deleted without the opt-in: the test proves nothing")
	}
	if out := p.Output(); !strings.Contains(out, "--remove-kopf-finalizer") || !strings.Contains(out, ns+"/handled-0") {
		t.Errorf("the log does not say that handled-0 waits for kopf's finalizer and how to release it:\n%s", out)
	}
	if code, took := p.Stop(); code != 0 {
		t.Fatalf("exit code %d after SIGTERM (%s)", code, took)
	}

	// Step 4: the opt-in, with its RBAC and admission policy.
	useKopfMigration(ctx, t, ns, true)
	p = framework.StartController(ctx, t, controllerAs(env.kubeconfig), "", "--resync", "1s", "--remove-kopf-finalizer")
	waitFor(t, 30*time.Second, "handled-0, deleted while the opt-in was off, is gone", func() bool { return object(ctx, t, ns, "handled-0") == nil })
	deleteUuid(ctx, t, ns, "shared")
	waitFor(t, 30*time.Second, "kopf's finalizer leaves shared", func() bool {
		u := object(ctx, t, ns, "shared")
		return u != nil && !slices.Contains(u.GetFinalizers(), kopfFinalizer)
	})
	deleteUuid(ctx, t, "default", first)
	waitFor(t, 30*time.Second, first+" is gone", func() bool { return object(ctx, t, "default", first) == nil })
	// No wait: first's removal, a later event, was handled after shared's,
	// and shared, without kopf's finalizer, is never queued again.
	if u := object(ctx, t, ns, "shared"); u == nil || !slices.Equal(u.GetFinalizers(), []string{otherFinalizer}) {
		t.Errorf("shared: %v, want it still terminating with the other finalizer alone", u)
	}
	for _, n := range []string{"handled-1", "handled-2"} {
		checkKopfObject(t, object(ctx, t, ns, n), kopfUUIDs[n])
	}

	// The controller's own writes to objects: one removal per object
	// deleted, nothing on live ones.
	removed := auditedObjectWrites(t, ns, controllerUser)
	removed[first] = auditedObjectWrites(t, "default", controllerUser)[first]
	for _, n := range []string{"handled-0", "shared", first} {
		if !slices.Equal(removed[n], []int{200}) {
			t.Errorf("%s: the controller's writes to the object answered %v, want one 200", n, removed[n])
		}
		delete(removed, n)
	}
	delete(removed, "policy-probe") // the policy check's own denied probes
	if len(removed) != 0 {
		t.Errorf("the controller wrote to live objects: %v", removed)
	}
	if v := metricReaches(ctx, t, p, "uuid_controller_kopf_finalizers_removed_total", nil, 3); v != 3 {
		t.Errorf("kopf_finalizers_removed_total = %v, want 3", v)
	}
	for _, n := range handled[1:3] {
		if w := auditedStatusPatchCodes(t, ns)[n]; len(w) != 0 {
			t.Errorf("%s: status writes %v, want none", n, w)
		}
	}
	mustStayRunning(t, p)
}

// checkKopfObject fails unless u is as kopf left it: its UUID, state and
// message, its finalizer and its annotation.
func checkKopfObject(t *testing.T, u *unstructured.Unstructured, id string) {
	t.Helper()
	if u == nil {
		t.Fatal("object is gone")
	}
	st, _, _ := unstructured.NestedStringMap(u.Object, "status")
	if st["uuid"] != id || st["state"] != "Ok" || st["message"] != kopfMessage {
		t.Errorf("%s: status = %v, want kopf's (uuid %s)", u.GetName(), st, id)
	}
	if !slices.Contains(u.GetFinalizers(), kopfFinalizer) {
		t.Errorf("%s: finalizers = %v, kopf's is gone from a live object", u.GetName(), u.GetFinalizers())
	}
	if a := u.GetAnnotations()[kopfAnnotation]; a != "{}\n" {
		t.Errorf("%s: annotation %s = %q, want kopf's {}\\n", u.GetName(), kopfAnnotation, a)
	}
}

// TestKopfFinalizerRaceWithKopf: kopf (still running) removes its own
// finalizer while the controller's removal is in flight. The controller's
// patch, computed against the old list, must fail its test instead of
// removing the entry that moved into kopf's place; the object ends with
// the other finalizer intact. kopf putting its finalizer back on the
// object being deleted is refused by the apiserver, so the two never
// ping-pong. The migration's admission policy, which would also stop the
// wrong removal, is replaced by one of its name that judges no finalizer
// (the controller removes nothing without one): the patch's test must hold
// on its own. The controller's dry-run proofs of the policy are not held.
func TestKopfFinalizerRaceWithKopf(t *testing.T) {
	ctx := testCtx(t)
	ns := env.fw.NewNamespace(ctx, t)
	useKopfMigration(ctx, t, ns, false)
	// The controller removes nothing unless a policy of the migration's
	// name binds it; this one judges no finalizer.
	policyFile := filepath.Join(t.TempDir(), "probe-only-policy.yaml")
	if err := os.WriteFile(policyFile, []byte(probeOnlyPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	applyKopfPolicy(ctx, t, ns, policyFile, []string{labelPatch}, []string{annotationPatch})
	const name = "raced"
	createBare(ctx, t, ns, name, kopfFinalizer, otherFinalizer)
	t.Cleanup(func() { dropFinalizers(ns, name) })
	if err := patchStatus(ctx, ns, name, `{"status":{"state":"Ok","uuid":"`+uuid.NewString()+`"}}`); err != nil {
		t.Fatal(err)
	}

	// Hold the controller's first write to the object itself.
	held, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	kc := apiProxy(t, func(w http.ResponseWriter, r *http.Request) bool {
		if r.Method == http.MethodPatch && strings.HasSuffix(r.URL.Path, "/uuid/"+name) && r.URL.Query().Get("dryRun") == "" {
			once.Do(func() { close(held); <-release })
		}
		return false
	})
	framework.StartController(ctx, t, controllerAs(kc), ns, "--remove-kopf-finalizer")
	deleteUuid(ctx, t, ns, name)
	<-held
	// kopf handles the deletion itself: its finalizer goes, the other
	// moves to index 0.
	if _, err := env.fw.Uuids(ns).Patch(ctx, name, types.MergePatchType, []byte(`{"metadata":{"finalizers":["`+otherFinalizer+`"]}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	close(release)
	// The held patch fails its test (422), then the controller's writes
	// to the object stop: it sees kopf's finalizer gone.
	writes := func() []int { return auditedObjectWrites(t, ns, controllerUser)[name] }
	if err := framework.Poll(ctx, 10*time.Second, "the held patch to fail its test", func(context.Context) error {
		if codes := writes(); !slices.Contains(codes, 422) {
			return fmt.Errorf("the controller's writes to %s answered %v", name, codes)
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
	settled(t, func() (float64, error) { return float64(len(writes())), nil })
	u := object(ctx, t, ns, name)
	if u == nil || !slices.Equal(u.GetFinalizers(), []string{otherFinalizer}) {
		t.Fatalf("after the race: %v, want the object terminating with %s alone", u, otherFinalizer)
	}
	// kopf re-adding its finalizer is refused on an object being deleted.
	_, err := env.fw.Uuids(ns).Patch(ctx, name, types.MergePatchType, []byte(`{"metadata":{"finalizers":["`+otherFinalizer+`","`+kopfFinalizer+`"]}}`), metav1.PatchOptions{})
	if err == nil || !strings.Contains(err.Error(), "finalizers") {
		t.Errorf("adding kopf's finalizer back to an object being deleted: %v, want it refused", err)
	}
}

// TestKopfMigrationPolicy: with deploy/kopf-migration/ applied, the
// controller's ServiceAccount may remove kopf's finalizer from an object
// being deleted, and nothing else: every other change it sends to a Uuid
// object is denied by the ValidatingAdmissionPolicy, though RBAC would
// allow it (patch from the opt-in, create and delete from a Role the test
// adds). Each of the policy's rules has a case that only it refuses; the
// last one's cases remove kopf's finalizer from an object being deleted
// and change something else in the same request. Its status writes are
// unaffected.
func TestKopfMigrationPolicy(t *testing.T) {
	ctx := testCtx(t)
	ns := env.fw.NewNamespace(ctx, t)
	useKopfMigration(ctx, t, ns, true)
	grantCreateDelete(ctx, t, ns)
	createBare(ctx, t, ns, "live", kopfFinalizer)
	createBare(ctx, t, ns, "deleting", otherFinalizer, kopfFinalizer)
	t.Cleanup(func() { dropFinalizers(ns, "live", "deleting", "policy-probe") })
	for _, n := range []string{"live", "deleting"} {
		if _, err := env.fw.Uuids(ns).Patch(ctx, n, types.MergePatchType, []byte(`{"metadata":{"annotations":{"`+kopfAnnotation+`":"{}\n"}}}`), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	deleteUuid(ctx, t, ns, "deleting")
	sa := saClient(t).Resource(cluster.UuidGVR).Namespace(ns)
	jsonPatch := func(name, ops string) error {
		_, err := sa.Patch(ctx, name, types.JSONPatchType, []byte(ops), metav1.PatchOptions{})
		return err
	}
	merge := func(name, patch string) error {
		_, err := sa.Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		return err
	}
	// removeKopf is the one change allowed: kopf's finalizer, at index 1 of
	// "deleting", removed; alone it goes through (last, below).
	removeKopf := `{"op":"test","path":"/metadata/finalizers/1","value":"` + kopfFinalizer + `"},{"op":"remove","path":"/metadata/finalizers/1"}`
	removeKopfAnd := func(op string) func() error {
		return func() error { return jsonPatch("deleting", "["+removeKopf+","+op+"]") }
	}
	const (
		onlyUpdates  = "may only update Uuid objects"
		onlyDeleting = "may only change Uuid objects being deleted"
		onlyKopf     = "may only remove the finalizer " + kopfFinalizer
		nothingElse  = "may not change labels, annotations, owners, spec or status"
	)
	denied := []struct {
		name, rule string
		try        func() error
	}{
		{"a new object", onlyUpdates, func() error {
			_, err := sa.Create(ctx, framework.NewUuid("created"), metav1.CreateOptions{})
			return err
		}},
		{"a live object, deleted", onlyUpdates, func() error { return sa.Delete(ctx, "live", metav1.DeleteOptions{}) }},
		{"a label", onlyDeleting, func() error { return merge("live", `{"metadata":{"labels":{"a":"b"}}}`) }},
		{"kopf's annotation", onlyDeleting, func() error { return merge("live", `{"metadata":{"annotations":{"`+kopfAnnotation+`":null}}}`) }},
		{"kopf's finalizer from a live object", onlyDeleting, func() error {
			return jsonPatch("live", `[{"op":"test","path":"/metadata/finalizers/0","value":"`+kopfFinalizer+`"},{"op":"remove","path":"/metadata/finalizers/0"}]`)
		}},
		{"another annotation", onlyKopf, func() error { return merge("deleting", `{"metadata":{"annotations":{"a":"b"}}}`) }},
		{"the spec", onlyKopf, func() error { return merge("deleting", `{"spec":{"a":"b"}}`) }},
		{"another finalizer", onlyKopf, func() error {
			return jsonPatch("deleting", `[{"op":"remove","path":"/metadata/finalizers/0"}]`)
		}},
		{"every finalizer", onlyKopf, func() error { return merge("deleting", `{"metadata":{"finalizers":null}}`) }},
		// A status sent to the object itself is dropped by the apiserver
		// (the CRD has a status subresource) before admission sees it.
		{"kopf's finalizer and a label", nothingElse, removeKopfAnd(`{"op":"add","path":"/metadata/labels","value":{"a":"b"}}`)},
		{"kopf's finalizer and kopf's annotation", nothingElse, removeKopfAnd(`{"op":"remove","path":"/metadata/annotations/kopf.zalando.org~1last-handled-configuration"}`)},
		{"kopf's finalizer and another annotation", nothingElse, removeKopfAnd(`{"op":"add","path":"/metadata/annotations/a","value":"b"}`)},
		{"kopf's finalizer and an owner", nothingElse, removeKopfAnd(`{"op":"add","path":"/metadata/ownerReferences","value":[{"apiVersion":"v1","kind":"ConfigMap","name":"owner","uid":"` + uuid.NewString() + `"}]}`)},
		{"kopf's finalizer and the spec", nothingElse, removeKopfAnd(`{"op":"add","path":"/spec","value":{"a":"b"}}`)},
	}
	for _, d := range denied {
		err := d.try()
		if err == nil || !strings.Contains(err.Error(), "ValidatingAdmissionPolicy") || !strings.Contains(err.Error(), d.rule) {
			t.Errorf("the ServiceAccount changing %s: %v, want it denied by the admission policy: %q", d.name, err, d.rule)
		}
	}
	for _, n := range []string{"live", "deleting"} {
		if w := auditedObjectWrites(t, ns, controllerUser)[n]; slices.Contains(w, 200) {
			t.Errorf("%s: a write of the ServiceAccount went through: %v", n, w)
		}
	}
	if u := object(ctx, t, ns, "created"); u != nil {
		t.Errorf("the ServiceAccount's create went through: %v", u)
	}
	if u := object(ctx, t, ns, "live"); u == nil || u.GetDeletionTimestamp() != nil {
		t.Errorf("the ServiceAccount's delete of live went through: %v", u)
	}
	if err := jsonPatch("deleting", "["+removeKopf+"]"); err != nil {
		t.Errorf("the ServiceAccount removing kopf's finalizer from an object being deleted: %v, want it allowed", err)
	}
	u := object(ctx, t, ns, "deleting")
	if u == nil || !slices.Equal(u.GetFinalizers(), []string{otherFinalizer}) || u.GetAnnotations()[kopfAnnotation] != "{}\n" || len(u.GetLabels()) != 0 || len(u.GetOwnerReferences()) != 0 {
		t.Errorf("deleting: %v, want only %s left of the finalizers and nothing else changed", u, otherFinalizer)
	}
	// The status subresource is not the policy's business.
	_, err := sa.Patch(ctx, "live", types.MergePatchType, []byte(`{"status":{"state":"Ok","uuid":"`+uuid.NewString()+`"}}`), metav1.PatchOptions{}, "status")
	if err != nil {
		t.Errorf("the ServiceAccount's status write: %v, want it allowed", err)
	}
}

// TestKopfMigrationFailsClosed: with the migration's RBAC but not its
// admission policy, the grant is unbounded, so the controller run with
// --remove-kopf-finalizer removes nothing: its dry-run proof is allowed, it
// says so in /readyz, uuid_controller_kopf_policy_bound and its log, naming
// the policy, and an object stuck on kopf's finalizer stays. Once the
// policy is applied, the next removal proves it and goes ahead, with no
// restart.
func TestKopfMigrationFailsClosed(t *testing.T) {
	ctx := testCtx(t)
	ns := env.fw.NewNamespace(ctx, t)
	useKopfMigration(ctx, t, ns, false)
	const name = "stuck"
	createBare(ctx, t, ns, name, kopfFinalizer)
	t.Cleanup(func() { dropFinalizers(ns, name) })
	if err := patchStatus(ctx, ns, name, `{"status":{"state":"Ok","uuid":"`+uuid.NewString()+`"}}`); err != nil {
		t.Fatal(err)
	}
	deleteUuid(ctx, t, ns, name)
	p := framework.LaunchController(ctx, t, controllerAs(env.kubeconfig), ns, "--remove-kopf-finalizer", "--max-retry-delay=2s")

	body := waitNotReady(ctx, t, p, time.Minute, "uuid-controller-kopf-migration")
	t.Logf("/readyz without the policy: %s", body)
	if v := controllerMetric(ctx, t, p, "uuid_controller_kopf_policy_bound", nil); v != 0 {
		t.Errorf("uuid_controller_kopf_policy_bound = %v without the policy, want 0", v)
	}
	// The removal itself was tried and held back for want of the proof
	// (the re-probe alone, every 5 s, also makes dry runs, so their count
	// would not tell), and the proofs reached the apiserver as dry runs.
	heldBack := "not removing finalizer " + kopfFinalizer + " from " + ns + "/" + name
	waitFor(t, 30*time.Second, "the removal held back in the log", func() bool { return strings.Contains(p.Output(), heldBack) })
	dryRuns := func() int {
		return len(auditedEvents(t, ns, func(ev cluster.AuditEvent) bool {
			return ev.DryRun() && ev.User.Username == controllerUser && ev.ObjectRef.Name == name
		}))
	}
	waitFor(t, 30*time.Second, "dry-run proofs of the policy in the audit log", func() bool { return dryRuns() >= 2 })
	if u := object(ctx, t, ns, name); u == nil || !slices.Contains(u.GetFinalizers(), kopfFinalizer) {
		t.Fatalf("without the policy: %v, want the object still held by kopf's finalizer", u)
	}
	if w := auditedObjectWrites(t, ns, controllerUser)[name]; len(w) != 0 {
		t.Errorf("the controller wrote to %s without the policy: %v", name, w)
	}
	if out := p.Output(); !strings.Contains(out, "Removing no kopf finalizer until the admission policy binds this controller") ||
		!strings.Contains(out, "uuid-controller-kopf-migration") {
		t.Errorf("the log does not name the missing policy:\n%s", out)
	}

	root := framework.RepoRoot(t)
	applyKopfPolicy(ctx, t, ns, filepath.Join(root, "deploy", "kopf-migration", "policy.yaml"), []string{labelPatch, annotationPatch}, nil)
	waitFor(t, time.Minute, "the object to go once the policy binds", func() bool { return object(ctx, t, ns, name) == nil })
	if err := p.WaitReady(ctx, 30*time.Second); err != nil {
		t.Errorf("not ready once the policy binds: %v", err)
	}
	if v := controllerMetric(ctx, t, p, "uuid_controller_kopf_policy_bound", nil); v != 1 {
		t.Errorf("uuid_controller_kopf_policy_bound = %v with the policy, want 1", v)
	}
	if w := auditedObjectWrites(t, ns, controllerUser)[name]; !slices.Equal(w, []int{200}) {
		t.Errorf("the controller's writes to %s answered %v, want one 200", name, w)
	}
}

// grantCreateDelete lets the controller's ServiceAccount create and delete
// Uuid objects in ns, which deploy/ never grants, so that the admission
// policy is what refuses them; it waits until RBAC lets a create through
// to admission.
func grantCreateDelete(ctx context.Context, t *testing.T, ns string) {
	t.Helper()
	rbac := env.kube.RbacV1()
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "uuid-create-delete"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{cluster.UuidGVR.Group}, Resources: []string{cluster.UuidGVR.Resource}, Verbs: []string{"create", "delete"}}},
	}
	if _, err := rbac.Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: cluster.ControllerServiceAccount, Namespace: cluster.ControllerNamespace}},
	}
	if _, err := rbac.RoleBindings(ns).Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sa := saClient(t).Resource(cluster.UuidGVR).Namespace(ns)
	err := framework.Poll(ctx, 30*time.Second, "RBAC to let the ServiceAccount's create reach admission", func(ctx context.Context) error {
		_, err := sa.Create(ctx, framework.NewUuid("rbac-probe"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil && strings.Contains(err.Error(), "cannot create resource") {
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
