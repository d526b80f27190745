package gitops

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"

	"github.com/demo-operator/uuid-controller/test/cluster"
	"github.com/demo-operator/uuid-controller/test/framework"
)

// env is one cluster and one controller binary for the package's tests.
var env struct {
	cluster            *cluster.Cluster
	binary, kubeconfig string
	// Clients are admin clients, for the tests' own reads and writes.
	framework.Clients
}

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	binDir, err := os.MkdirTemp("", "uuid-gitops-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(binDir)
	if err := setup(binDir); err != nil {
		fmt.Fprintln(os.Stderr, "gitops setup:", err)
		if env.cluster != nil {
			_ = env.cluster.Stop()
		}
		return 1
	}
	code := m.Run()
	if err := env.cluster.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "gitops: stop cluster:", err)
		code = max(code, 1)
	}
	return code
}

func setup(binDir string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var err error
	if env.binary, err = cluster.BuildController(ctx, binDir); err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if env.cluster, err = cluster.Start(ctx, cluster.Options{Logger: logger}); err != nil {
		return err
	}
	if env.kubeconfig, err = env.cluster.ControllerKubeconfig(ctx); err != nil {
		return err
	}
	env.Clients, err = framework.NewClients(env.cluster.AdminConfig())
	return err
}

// TestKstatusCurrentOnceAssigned: kstatus, as Flux computes health, says
// InProgress for an object no controller has written yet (the CRD's
// default status) and Current once its UUID is assigned.
func TestKstatusCurrentOnceAssigned(t *testing.T) {
	ctx := framework.Context(t, 3*time.Minute)
	ns := env.NewNamespace(ctx, t)
	create(ctx, t, ns, "early")
	if res := compute(ctx, t, ns, "early"); res.Status != status.InProgressStatus {
		t.Errorf("kstatus of an object not yet written = %s (%s), want InProgress", res.Status, res.Message)
	}

	framework.StartController(ctx, t, cluster.ControllerOptions{Binary: env.binary, Kubeconfig: env.kubeconfig}, ns)
	create(ctx, t, ns, "new")
	for _, name := range []string{"early", "new"} {
		res := waitStatus(ctx, t, ns, name, status.CurrentStatus)
		if id, _, _ := unstructured.NestedString(get(ctx, t, ns, name).Object, "status", "uuid"); id == "" {
			t.Errorf("%s is Current (%s) without a UUID", name, res.Message)
		}
	}
}

// TestKstatusOnFailure: while the apiserver denies the UUID write, kstatus
// reports the object InProgress with the failure (it is retried) or Failed
// (it was given up), never Current; once the write goes through it is
// Current.
func TestKstatusOnFailure(t *testing.T) {
	for _, d := range cluster.UUIDDenials {
		want := status.FailedStatus
		if d.Retried {
			want = status.InProgressStatus
		}
		t.Run(d.Name, func(t *testing.T) {
			ctx := framework.Context(t, 3*time.Minute)
			ns := env.NewNamespace(ctx, t)
			remove, err := env.cluster.RejectUUIDWrites(ctx, ns, ns, d.Reason)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = remove(context.WithoutCancel(ctx)) })
			create(ctx, t, ns, "failing")
			framework.StartController(ctx, t, cluster.ControllerOptions{Binary: env.binary, Kubeconfig: env.kubeconfig}, ns, "--error-after", "3", "--max-retry-delay", "1s")

			// InProgress is also what the CRD's default says before the
			// first write; the message tells the reported failure apart.
			res := waitStatus(ctx, t, ns, "failing", want, cluster.DeniedMessage)
			t.Logf("kstatus while denied: %s: %s", res.Status, res.Message)

			if err := remove(ctx); err != nil {
				t.Fatal(err)
			}
			if err := env.cluster.RetryAfterDenial(ctx, d, ns, "failing"); err != nil {
				t.Fatal(err)
			}
			waitStatus(ctx, t, ns, "failing", status.CurrentStatus)
		})
	}
}

func create(ctx context.Context, t *testing.T, ns, name string) {
	t.Helper()
	if _, err := env.Uuids(ns).Create(ctx, framework.NewUuid(name), metav1.CreateOptions{}); err != nil {
		t.Fatalf("create %s/%s: %v", ns, name, err)
	}
}

func get(ctx context.Context, t *testing.T, ns, name string) *unstructured.Unstructured {
	t.Helper()
	u, err := env.Uuids(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get %s/%s: %v", ns, name, err)
	}
	return u
}

// compute is kstatus's verdict on ns/name as the API serves it now.
func compute(ctx context.Context, t *testing.T, ns, name string) *status.Result {
	t.Helper()
	res, err := status.Compute(get(ctx, t, ns, name))
	if err != nil {
		t.Fatalf("kstatus of %s/%s: %v", ns, name, err)
	}
	return res
}

// waitStatus waits up to 30 s for kstatus to compute want for ns/name,
// with a message containing each of msgs, and returns the result.
func waitStatus(ctx context.Context, t *testing.T, ns, name string, want status.Status, msgs ...string) *status.Result {
	t.Helper()
	var res *status.Result
	err := framework.Poll(ctx, 30*time.Second, fmt.Sprintf("kstatus %s with %q on %s/%s", want, msgs, ns, name), func(context.Context) error {
		res = compute(ctx, t, ns, name)
		if res.Status != want || !containsAll(res.Message, msgs) {
			return fmt.Errorf("kstatus is %s (%s)", res.Status, res.Message)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
