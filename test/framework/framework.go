// Package framework holds the helpers that test/e2e, test/node,
// test/gitops and test/bench share: namespaces, creating Uuid objects and
// waiting for their UUIDs, and polling. It talks to a cluster through the
// admin clients it is given; test/cluster starts that cluster.
package framework

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/demo-operator/uuid-controller/test/cluster"
)

// UuidGVR is the resource of the Uuid custom resource.
var UuidGVR = cluster.UuidGVR

// Clients are a test's admin clients, for its own reads and writes.
type Clients struct {
	Dyn  dynamic.Interface
	Kube kubernetes.Interface
}

// NewClients makes the clients for cfg (the cluster's admin config).
func NewClients(cfg *rest.Config) (Clients, error) {
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return Clients{}, err
	}
	kube, err := kubernetes.NewForConfig(cfg)
	return Clients{Dyn: dyn, Kube: kube}, err
}

// Context is t's context, bounded by timeout so that a hung server fails
// the test instead of the CI job.
func Context(t *testing.T, timeout time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	t.Cleanup(cancel)
	return ctx
}

// Uuids is the Uuid resource in namespace ns.
func (c Clients) Uuids(ns string) dynamic.ResourceInterface {
	return c.Dyn.Resource(UuidGVR).Namespace(ns)
}

// NewUuid is a Uuid object named name, as a user would write it.
func NewUuid(name string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{}}}
	u.SetAPIVersion(UuidGVR.GroupVersion().String())
	u.SetKind("Uuid")
	u.SetName(name)
	return u
}

var nonDNS = regexp.MustCompile(`[^a-z0-9-]+`)

// NamespaceName is a fresh namespace name for test: its name, made a DNS
// label, and a random suffix, so that each test's objects and events stay
// apart from the others' and its namespace says whose it is.
func NamespaceName(test string) string {
	name := nonDNS.ReplaceAllString(strings.ToLower(test), "-")
	if len(name) > 40 {
		name = name[:40]
	}
	return strings.Trim(name, "-") + "-" + uuid.NewString()[:6]
}

// NewNamespace creates a namespace named after t (see NamespaceName).
func (c Clients) NewNamespace(ctx context.Context, t *testing.T) string {
	t.Helper()
	name := NamespaceName(t.Name())
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := c.Kube.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace %s: %v", name, err)
	}
	return name
}

// createWorkers is how many creates CreateUuids keeps in flight.
const createWorkers = 16

// CreateUuids creates n objects named prefix-0 .. prefix-(n-1) in ns, up
// to 16 at a time, and returns their names.
func (c Clients) CreateUuids(ctx context.Context, t *testing.T, ns, prefix string, n int) []string {
	t.Helper()
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	Each(t, names, createWorkers, func(name string) error {
		if _, err := c.Uuids(ns).Create(ctx, NewUuid(name), metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create %s/%s: %w", ns, name, err)
		}
		return nil
	})
	return names
}

// Each calls f with each of names, up to workers at a time, and fails the
// test with f's errors.
func Each(t *testing.T, names []string, workers int, f func(name string) error) {
	t.Helper()
	work := make(chan string)
	errs := make(chan error, len(names))
	var wg sync.WaitGroup
	for range min(len(names), workers) {
		wg.Go(func() {
			for name := range work {
				if err := f(name); err != nil {
					errs <- err
				}
			}
		})
	}
	for _, name := range names {
		work <- name
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// Status reads an object's status.state and status.uuid from the API.
func (c Clients) Status(ctx context.Context, t *testing.T, ns, name string) (state, id string) {
	t.Helper()
	u, err := c.Uuids(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get %s/%s: %v", ns, name, err)
	}
	state, _, _ = unstructured.NestedString(u.Object, "status", "state")
	return state, UUIDOf(u.Object)
}

// UUIDOf is an object's status.uuid ("" when it has none).
func UUIDOf(obj map[string]any) string {
	id, _, _ := unstructured.NestedString(obj, "status", "uuid")
	return id
}

// AssignedUUIDs lists ns and returns name -> UUID for the objects with
// state Ok and a UUID.
func (c Clients) AssignedUUIDs(ctx context.Context, t *testing.T, ns string) map[string]string {
	t.Helper()
	got, err := c.assigned(ctx, ns)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func (c Clients) assigned(ctx context.Context, ns string) (map[string]string, error) {
	list, err := c.Uuids(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", ns, err)
	}
	got := map[string]string{}
	for _, u := range list.Items {
		state, _, _ := unstructured.NestedString(u.Object, "status", "state")
		if id := UUIDOf(u.Object); state == "Ok" && id != "" {
			got[u.GetName()] = id
		}
	}
	return got, nil
}

// WaitUUIDs polls until every named object in ns has state Ok and a UUID,
// fails the test unless each is a valid UUID, and returns name -> UUID for
// every object of ns that has one.
func (c Clients) WaitUUIDs(ctx context.Context, t *testing.T, ns string, names []string, timeout time.Duration) map[string]string {
	t.Helper()
	var got map[string]string
	err := Poll(ctx, timeout, fmt.Sprintf("%d UUIDs in %s", len(names), ns), func(ctx context.Context) error {
		var err error
		if got, err = c.assigned(ctx, ns); err != nil {
			return err
		}
		var missing []string
		for _, n := range names {
			if _, ok := got[n]; !ok {
				missing = append(missing, n)
			}
		}
		if len(missing) > 0 {
			return fmt.Errorf("%d of %d objects have no UUID, e.g. %v", len(missing), len(names), missing[:min(5, len(missing))])
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if _, err := uuid.Parse(got[n]); err != nil {
			t.Errorf("%s/%s: status.uuid %q is not a UUID: %v", ns, n, got[n], err)
		}
	}
	return got
}

// LaunchController starts the controller as opts say (opts.Binary and
// opts.Kubeconfig set by the caller), at -v 2, watching only namespace ns
// ("" watches every namespace, as deployed), with args after opts.Args. It
// stops the controller when the test ends, logging its output if the test
// failed, and does not wait for readiness.
func LaunchController(ctx context.Context, t *testing.T, opts cluster.ControllerOptions, ns string, args ...string) *cluster.ControllerProcess {
	t.Helper()
	if ns != "" {
		args = append([]string{"--namespace", ns}, args...)
	}
	opts.Args = append(append([]string{"-v", "2"}, opts.Args...), args...)
	p, err := cluster.StartController(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Stop()
		if t.Failed() {
			t.Logf("controller pid %d output:\n%s", p.PID(), p.Output())
		}
	})
	return p
}

// StartController is LaunchController, then waits up to a minute for the
// controller to be ready (its cache synced).
func StartController(ctx context.Context, t *testing.T, opts cluster.ControllerOptions, ns string, args ...string) *cluster.ControllerProcess {
	t.Helper()
	p := LaunchController(ctx, t, opts, ns, args...)
	if err := p.WaitReady(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	return p
}

// LeaseHolder reads the Lease ns/name and returns it with its holder
// identity, "" when no one holds it. It returns the error rather than
// failing the test so that a poll can retry it.
func (c Clients) LeaseHolder(ctx context.Context, ns, name string) (*coordinationv1.Lease, string, error) {
	l, err := c.Kube.CoordinationV1().Leases(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, "", fmt.Errorf("get lease %s/%s: %w", ns, name, err)
	}
	if l.Spec.HolderIdentity == nil {
		return l, "", nil
	}
	return l, *l.Spec.HolderIdentity, nil
}

// Kubectl is c.Kubectl for a command that must succeed: it returns the
// output and fails the test otherwise. It runs even in a t.Cleanup, after
// t's context has ended.
func Kubectl(t *testing.T, c *cluster.Cluster, args ...string) string {
	t.Helper()
	out, err := c.Kubectl(context.WithoutCancel(t.Context()), args...)
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// RepoRoot is the repository root (cluster.RepoRoot), failing the test
// when the working directory is outside the repository.
func RepoRoot(t *testing.T) string {
	t.Helper()
	root, err := cluster.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}
