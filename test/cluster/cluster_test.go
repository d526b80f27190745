package cluster

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

func TestCluster(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	c, err := Start(ctx, Options{})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = c.Stop()
		}
	}()
	etcdPID, apiPID := c.PIDs()
	if etcdPID == 0 || apiPID == 0 {
		t.Fatalf("PIDs = %d, %d; want both running", etcdPID, apiPID)
	}
	if !strings.HasPrefix(c.URL(), "https://127.0.0.1:") {
		t.Errorf("URL = %q", c.URL())
	}

	dyn, err := dynamic.NewForConfig(c.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}

	t.Run("CRDEstablished", func(t *testing.T) {
		crd, err := dyn.Resource(crdGVR).Get(ctx, CRDName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, cond := range []string{"Established", "NamesAccepted"} {
			if !crdCondition(crd, cond) {
				t.Errorf("CRD condition %s not True", cond)
			}
		}
	})

	t.Run("AdminKubeconfig", func(t *testing.T) {
		if u := whoami(ctx, t, clientFor(t, c.AdminKubeconfig())); u != "admin" {
			t.Errorf("admin kubeconfig user = %q, want admin", u)
		}
	})

	// Apply: the namespace and RBAC manifests, then an example object.
	if err := c.Apply(ctx, filepath.Join(c.repoRoot, "deploy", "namespace.yaml"), filepath.Join(c.repoRoot, "deploy", "rbac.yaml")); err != nil {
		t.Fatalf("Apply deploy manifests: %v", err)
	}
	if err := c.Apply(ctx, filepath.Join(c.repoRoot, "deploy", "rbac.yaml")); err != nil {
		t.Fatalf("Apply again (update): %v", err)
	}
	if err := c.Apply(ctx, filepath.Join(c.repoRoot, "examples", "uuid.yaml")); err != nil {
		t.Fatalf("Apply example: %v", err)
	}

	t.Run("CreateUuidAndPatchStatus", func(t *testing.T) {
		obj := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "demo.operator/v1",
			"kind":       "Uuid",
			"metadata":   map[string]any{"name": "from-test"},
			"spec":       map[string]any{},
		}}
		if _, err := dyn.Resource(UuidGVR).Namespace("default").Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		before, err := c.Metrics(ctx)
		if err != nil {
			t.Fatal(err)
		}
		n0, err := StatusWrites(before)
		if err != nil {
			t.Fatal(err)
		}
		patch := []byte(`{"status":{"state":"Ok","message":"test","uuid":"0b6e3c1e-8f7a-4c59-9d43-2f1d1a2b3c4d"}}`)
		for _, name := range []string{"from-test", "example"} {
			if _, err := dyn.Resource(UuidGVR).Namespace("default").Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
				t.Fatalf("patch status of %s: %v", name, err)
			}
		}
		// The apiserver counts a request as its handler returns, which can
		// be just after the client has the response: poll briefly.
		var after string
		var n1 float64
		// A timeout leaves n1 short, which the check below reports.
		_ = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
			if after, err = c.Metrics(ctx); err != nil {
				t.Fatal(err)
			}
			if n1, err = StatusWrites(after); err != nil {
				t.Fatal(err)
			}
			return n1-n0 >= 2, nil
		})
		for _, l := range strings.Split(after, "\n") {
			if strings.HasPrefix(l, "apiserver_request_total{") && strings.Contains(l, `resource="uuid"`) {
				t.Log(l)
			}
		}
		// Checks the label names and values against the real apiserver.
		if n1-n0 != 2 {
			t.Errorf("StatusWrites went from %v to %v, want +2", n0, n1)
		}
	})

	t.Run("ServiceAccountKubeconfig", func(t *testing.T) {
		path, err := c.ServiceAccountKubeconfig(ctx, "sa-test", "limited")
		if err != nil {
			t.Fatal(err)
		}
		cs := clientFor(t, path)
		if got, want := whoami(ctx, t, cs), "system:serviceaccount:sa-test:limited"; got != want {
			t.Errorf("identity = %q, want %q", got, want)
		}
		_, err = cs.CoreV1().Secrets("sa-test").List(ctx, metav1.ListOptions{})
		if !apierrors.IsForbidden(err) {
			t.Errorf("list secrets as the ServiceAccount: err = %v, want 403 Forbidden", err)
		}
		// The controller's own ServiceAccount, bound by deploy/rbac.yaml,
		// may patch uuid/status but not update Uuid objects.
		path, err = c.ServiceAccountKubeconfig(ctx, "uuid-system", "uuid-controller")
		if err != nil {
			t.Fatal(err)
		}
		cs = clientFor(t, path)
		for _, tc := range []struct {
			verb, sub string
			want      bool
		}{{"patch", "status", true}, {"list", "", true}, {"update", "", false}, {"delete", "", false}} {
			ssar := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
				ResourceAttributes: &authorizationv1.ResourceAttributes{
					Namespace: "default", Verb: tc.verb, Group: UuidGVR.Group, Resource: UuidGVR.Resource, Subresource: tc.sub,
				},
			}}
			res, err := cs.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, ssar, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if res.Status.Allowed != tc.want {
				t.Errorf("uuid-controller may %s uuid/%s = %v, want %v", tc.verb, tc.sub, res.Status.Allowed, tc.want)
			}
		}
	})

	t.Run("RestartAPIServerKeepsData", func(t *testing.T) {
		saPath, err := c.ServiceAccountKubeconfig(ctx, "sa-test", "limited")
		if err != nil {
			t.Fatal(err)
		}
		if err := c.RestartAPIServer(ctx); err != nil {
			t.Fatalf("RestartAPIServer: %v", err)
		}
		_, newAPIPID := c.PIDs()
		if newAPIPID == apiPID || newAPIPID == 0 {
			t.Errorf("apiserver pid after restart = %d (before %d)", newAPIPID, apiPID)
		}
		if err := syscall.Kill(apiPID, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("old apiserver pid %d still exists: kill(0) = %v", apiPID, err)
		}
		apiPID = newAPIPID
		dyn, err := dynamic.NewForConfig(c.AdminConfig())
		if err != nil {
			t.Fatal(err)
		}
		got, err := dyn.Resource(UuidGVR).Namespace("default").Get(ctx, "from-test", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("Uuid after restart: %v", err)
		}
		if u, _, _ := unstructured.NestedString(got.Object, "status", "uuid"); u == "" {
			t.Errorf("status.uuid lost across restart: %v", got.Object)
		}
		// A token issued before the restart still works.
		if got := whoami(ctx, t, clientFor(t, saPath)); got != "system:serviceaccount:sa-test:limited" {
			t.Errorf("identity after restart = %q", got)
		}
	})

	dir := c.Dir()
	if err := c.Stop(); err != nil {
		t.Errorf("Stop: %v", err)
	}
	stopped = true
	if err := c.Stop(); err != nil {
		t.Errorf("second Stop: %v", err)
	}
	for _, pid := range []int{etcdPID, apiPID} {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("pid %d still exists after Stop: kill(0) = %v", pid, err)
		}
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("temporary dir %s not removed: %v", dir, err)
	}
}

func TestStartMissingBinaries(t *testing.T) {
	dir := t.TempDir()
	_, err := Start(context.Background(), Options{BinDir: dir, Dir: t.TempDir()})
	if err == nil {
		t.Fatal("Start with an empty BinDir succeeded")
	}
	for _, want := range []string{filepath.Join(dir, "etcd"), "make tools"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

func TestRepoRoot(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "crd.yaml")); err != nil {
		t.Errorf("repo root %s has no crd.yaml: %v", root, err)
	}
}

// clientFor builds a clientset from a kubeconfig file the cluster wrote.
func clientFor(t *testing.T, kubeconfig string) kubernetes.Interface {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	return kubernetes.NewForConfigOrDie(cfg)
}

// whoami asks the apiserver which user cs authenticates as.
func whoami(ctx context.Context, t *testing.T, cs kubernetes.Interface) string {
	t.Helper()
	ssr, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("SelfSubjectReview: %v", err)
	}
	return ssr.Status.UserInfo.Username
}
