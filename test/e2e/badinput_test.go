package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/demo-operator/uuid-controller/test/framework"
)

// TestSchemaRejectsBadStatus: the CRD schema turns away a status the
// controller could not trust, with an error that names the field, and the
// object keeps its UUID.
func TestSchemaRejectsBadStatus(t *testing.T) {
	ctx := testCtx(t)
	ns := env.fw.NewNamespace(ctx, t)
	p := framework.StartController(ctx, t, controllerAs(env.kubeconfig), ns)
	names := env.fw.CreateUuids(ctx, t, ns, "guarded", 1)
	want := env.fw.WaitUUIDs(ctx, t, ns, names, 30*time.Second)[names[0]]

	for _, tc := range []struct {
		name, patch string
		mention     []string
	}{
		{"not a UUID", `{"status":{"uuid":"not-a-uuid"}}`, []string{"status.uuid", "not-a-uuid"}},
		// The pattern is anchored at both ends.
		{"a UUID and more", `{"status":{"uuid":"0b6f2a8e-5d4c-4f3b-9a1e-7c2d8e6f4a10-x"}}`, []string{"status.uuid", "4a10-x"}},
		{"more and a UUID", `{"status":{"uuid":"x-0b6f2a8e-5d4c-4f3b-9a1e-7c2d8e6f4a10"}}`, []string{"status.uuid", "x-0b6f"}},
		{"a number", `{"status":{"uuid":12345}}`, []string{"status.uuid", "int64"}},
		{"an unknown state", `{"status":{"state":"Bogus"}}`, []string{"status.state", "Bogus"}},
		{"status not an object", `{"status":"done"}`, []string{"status", "object"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := patchStatus(ctx, ns, names[0], tc.patch)
			if !apierrors.IsInvalid(err) {
				t.Fatalf("patch %s: err = %v, want 422 Invalid", tc.patch, err)
			}
			for _, m := range tc.mention {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("error %q does not mention %q", err, m)
				}
			}
		})
	}
	if _, id := env.fw.Status(ctx, t, ns, names[0]); id != want {
		t.Errorf("UUID after rejected patches = %q, want %q", id, want)
	}

	bad := framework.NewUuid("bad-spec")
	bad.Object["spec"] = "not an object"
	if _, err := env.fw.Uuids(ns).Create(ctx, bad, metav1.CreateOptions{}); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec") {
		t.Errorf("create with a string spec: err = %v, want 422 Invalid naming spec", err)
	}
	mustStayRunning(t, p)
}

// TestUserCannotForgeOrKeepBadStatus: a status sent with the create is
// dropped by the status subresource, and a status a user cleared gets a new
// UUID.
func TestUserCannotForgeOrKeepBadStatus(t *testing.T) {
	ctx := testCtx(t)
	ns := env.fw.NewNamespace(ctx, t)
	p := framework.StartController(ctx, t, controllerAs(env.kubeconfig), ns)

	const forged = "00000000-0000-4000-8000-000000000000"
	obj := framework.NewUuid("forged")
	obj.Object["status"] = map[string]any{"state": "Ok", "uuid": forged}
	if _, err := env.fw.Uuids(ns).Create(ctx, obj, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ids := env.fw.WaitUUIDs(ctx, t, ns, []string{"forged"}, 30*time.Second)
	if ids["forged"] == forged {
		t.Error("a status sent with the create was kept; the status subresource should drop it")
	}

	for _, clear := range []string{`{"status":null}`, `{"status":{"uuid":null}}`} {
		old := ids["forged"]
		if err := patchStatus(ctx, ns, "forged", clear); err != nil {
			t.Fatalf("clear status with %s: %v", clear, err)
		}
		ids = env.fw.WaitUUIDs(ctx, t, ns, []string{"forged"}, 30*time.Second)
		if ids["forged"] == old {
			t.Errorf("after %s the UUID is still %s; want a new one", clear, old)
		}
		u, err := env.fw.Uuids(ns).Get(ctx, "forged", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if msg, _, _ := unstructured.NestedString(u.Object, "status", "message"); msg != "resource created successfully" {
			t.Errorf("status.message = %q after reassignment", msg)
		}
	}
	mustStayRunning(t, p)
}

// TestUnusualObjects: objects at the edges of what the API accepts (the
// longest name, a large spec, many labels, a pending finalizer and a
// deletion in progress) get their UUID like any other, and the controller
// stays up.
func TestUnusualObjects(t *testing.T) {
	ctx := testCtx(t)
	ns := env.fw.NewNamespace(ctx, t)
	// Deleted before the controller starts, so it first sees the object
	// already terminating: still there behind its finalizer, with no UUID,
	// and a status write still allowed.
	terminating := framework.NewUuid("terminating")
	terminating.SetFinalizers([]string{"example.com/hold"})
	if _, err := env.fw.Uuids(ns).Create(ctx, terminating, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = env.fw.Uuids(ns).Patch(ctx, "terminating", types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
	})
	if err := env.fw.Uuids(ns).Delete(ctx, "terminating", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	p := framework.StartController(ctx, t, controllerAs(env.kubeconfig), ns)

	long := strings.Repeat("a", 253) // a DNS subdomain's maximum
	big := framework.NewUuid("big-spec")
	big.Object["spec"] = map[string]any{"blob": strings.Repeat("x", 1<<20)}
	labelled := framework.NewUuid("many-labels")
	labels := map[string]string{}
	for i := range 200 {
		labels[fmt.Sprintf("label-%03d", i)] = "v"
	}
	labelled.SetLabels(labels)
	for _, u := range []*unstructured.Unstructured{framework.NewUuid(long), big, labelled} {
		if _, err := env.fw.Uuids(ns).Create(ctx, u, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create %.40s...: %v", u.GetName(), err)
		}
	}
	env.fw.WaitUUIDs(ctx, t, ns, []string{long, "big-spec", "many-labels", "terminating"}, 30*time.Second)
	u, err := env.fw.Uuids(ns).Get(ctx, "terminating", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if u.GetDeletionTimestamp() == nil {
		t.Error("the terminating object lost its deletionTimestamp")
	}
	mustStayRunning(t, p)
}
