package kopf

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/demo-operator/uuid-controller/internal/testlog"
)

var testGVR = schema.GroupVersionResource{Group: "demo.operator", Version: "v1", Resource: "uuid"}

// kopfObject is an object as kopf leaves it, terminating when deleting.
func kopfObject(name string, deleting bool) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{}}
	u.SetAPIVersion("demo.operator/v1")
	u.SetKind("Uuid")
	u.SetNamespace("default")
	u.SetName(name)
	u.SetResourceVersion("5")
	u.SetFinalizers([]string{Finalizer})
	if deleting {
		u.SetDeletionTimestamp(&metav1.Time{Time: time.Now()})
	}
	return u
}

// gateFixture is a remover over a fake client holding obj, whose
// admission policy is not proven yet and answers probes with *answer;
// *probes counts them.
type gateFixture struct {
	ctx    context.Context
	client *dynamicfake.FakeDynamicClient
	m      *remover
	obj    *unstructured.Unstructured
}

func newGateFixture(t *testing.T, obj *unstructured.Unstructured, probe func(ctx context.Context, namespace, name string) error) *gateFixture {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	client := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{testGVR: "UuidList"})
	if err := client.Tracker().Create(testGVR, obj.DeepCopy(), obj.GetNamespace()); err != nil {
		t.Fatal(err)
	}
	m, err := New(Config{
		Remove: true, Patch: DynamicPatcher(client.Resource(testGVR)), Resource: testGVR.GroupResource(), FieldManager: "test",
		Any:     func() Object { return obj },
		Event:   func(runtime.Object, string, string, string) {},
		Metrics: prometheus.NewRegistry(),
		Probe:   probe,
	})
	if err != nil {
		t.Fatal(err)
	}
	return &gateFixture{ctx: ctx, client: client, m: m.(*remover), obj: obj}
}

func policyFixture(t *testing.T, answer *error, probes *int) *gateFixture {
	t.Helper()
	return newGateFixture(t, kopfObject("deleting", true), func(context.Context, string, string) error { *probes++; return *answer })
}

// patches counts the patches sent.
func (f *gateFixture) patches() int {
	n := 0
	for _, a := range f.client.Actions() {
		if _, ok := a.(k8stesting.PatchAction); ok {
			n++
		}
	}
	return n
}

// Fail closed: while a dry run the policy must deny is allowed, no
// finalizer is removed, /readyz and the gauge say so, and the error is
// logged once, naming the policy; once it is denied, removals go on.
func TestKopfPolicyMissingRemovesNothing(t *testing.T) {
	answer, probes := ErrPolicyMissing, 0
	f := policyFixture(t, &answer, &probes)
	logger, logs := testlog.New(t, 0)
	ctx := klog.NewContext(f.ctx, logger)
	for range 2 {
		err := f.m.Release(ctx, f.obj)
		if !errors.Is(err, ErrPolicyMissing) {
			t.Fatalf("Release = %v, want ErrPolicyMissing", err)
		}
	}
	if n := f.patches(); n != 0 {
		t.Errorf("%d patches sent without the policy, want 0", n)
	}
	if err := f.m.Ready(); !errors.Is(err, ErrPolicyMissing) || !strings.Contains(err.Error(), PolicyName) {
		t.Errorf("Ready = %v, want the missing policy named", err)
	}
	if v := testutil.ToFloat64(f.m.policy.bound); v != 0 {
		t.Errorf("kopf_policy_bound = %v, want 0", v)
	}
	if lines := logs.Messages(); len(lines) != 1 || !strings.Contains(logs.String(), PolicyName) {
		t.Errorf("logged %q, want one line naming %s", lines, PolicyName)
	}

	answer = nil // the policy applied: the next probe is denied
	if err := f.m.Release(ctx, f.obj); err != nil {
		t.Fatal(err)
	}
	if n := f.patches(); n != 1 {
		t.Errorf("%d patches once the policy binds, want the removal", n)
	}
	if err := f.m.Ready(); err != nil {
		t.Errorf("Ready = %v once the policy binds", err)
	}
	if v := testutil.ToFloat64(f.m.policy.bound); v != 1 {
		t.Errorf("kopf_policy_bound = %v, want 1", v)
	}
	if probes != 3 {
		t.Errorf("%d probes, want one per removal until proven: 3", probes)
	}
}

// Proven once, the policy is not probed again until a removal fails; the
// next removal then proves it first.
func TestKopfPolicyProvenAgainAfterAFailure(t *testing.T) {
	var answer error
	probes := 0
	f := policyFixture(t, &answer, &probes)
	fail := true
	f.client.PrependReactor("patch", "uuid", func(k8stesting.Action) (bool, runtime.Object, error) {
		if fail {
			return true, nil, apierrors.NewForbidden(testGVR.GroupResource(), "deleting", errors.New("no grant"))
		}
		return false, nil, nil
	})
	for range 2 {
		if err := f.m.Release(f.ctx, f.obj); !apierrors.IsForbidden(err) {
			t.Fatalf("Release = %v, want the forbidden removal", err)
		}
	}
	if probes != 2 {
		t.Errorf("%d probes for two failed removals, want 2", probes)
	}
	fail = false
	if err := f.m.Release(f.ctx, f.obj); err != nil {
		t.Fatal(err)
	}
	if probes != 3 {
		t.Errorf("%d probes, want 3: the removal after a failure proves the policy again", probes)
	}
}

// The policy's binding is logged when it is first proven and when it is
// proven again after being found missing, not at each proof that follows
// a failed removal: a removal failing for an hour would log it at every
// retry.
func TestKopfPolicyBindingLoggedOncePerChange(t *testing.T) {
	logger, logs := testlog.New(t, 0)
	ctx := klog.NewContext(context.Background(), logger)
	g := newPolicyGate(nil, prometheus.NewGauge(prometheus.GaugeOpts{Name: "bound"}))
	const binds = "The admission policy binds this controller; removing kopf's finalizer from objects being deleted"
	count := func() int {
		n := 0
		for _, m := range logs.Messages() {
			if m == binds {
				n++
			}
		}
		return n
	}
	for range 3 {
		g.record(ctx, nil)
		g.forget()
	}
	if n := count(); n != 1 {
		t.Errorf("binding logged %d times over three proofs, each after a failed removal, want 1", n)
	}
	g.record(ctx, ErrPolicyMissing)
	g.record(ctx, nil)
	if n := count(); n != 2 {
		t.Errorf("binding logged %d times once proven again after it was missing, want 2", n)
	}
}

// At start the policy is probed on a cached object, so a missing policy
// shows before the first deletion; with no object there is nothing to
// probe or remove.
func TestKopfPolicyProvedAtStart(t *testing.T) {
	answer, probes := ErrPolicyMissing, 0
	f := policyFixture(t, &answer, &probes)
	f.m.policy.proveAtStart(f.ctx, f.m.cfg.Any())
	if probes != 1 || f.m.Ready() == nil {
		t.Errorf("%d probes at start, Ready %v; want 1 and the missing policy", probes, f.m.Ready())
	}
	f.m.policy.proveAtStart(f.ctx, nil)
	if probes != 1 {
		t.Errorf("probed %d times with no object, want no probe", probes-1)
	}
}

// While the policy is missing it is probed again every few seconds, so
// applying it makes the controller ready with no removal waiting.
func TestKopfPolicyReprobedWhileMissing(t *testing.T) {
	var mu sync.Mutex
	answer := ErrPolicyMissing
	f := newGateFixture(t, kopfObject("live", false), func(context.Context, string, string) error {
		mu.Lock()
		defer mu.Unlock()
		return answer
	})
	f.m.policy.reprobe = 10 * time.Millisecond
	f.m.policy.proveAtStart(f.ctx, f.m.cfg.Any())
	if f.m.Ready() == nil {
		t.Fatal("ready with the policy missing")
	}
	ctx, cancel := context.WithCancel(f.ctx)
	done := make(chan struct{})
	go func() { defer close(done); f.m.Run(ctx) }()
	defer func() { cancel(); <-done }()
	mu.Lock()
	answer = nil // the policy applied
	mu.Unlock()
	err := wait.PollUntilContextTimeout(f.ctx, 10*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		return f.m.Ready() == nil, nil
	})
	if err != nil {
		t.Errorf("still not ready 5 s after the policy was applied: %v", f.m.Ready())
	}
}

// TestKopfPolicyProofExpires: a proof of the policy lasts policyProofTTL;
// a removal after that probes again, and once the policy is gone (deleted,
// unbound, or set to Warn: the dry run is allowed) removes nothing more.
func TestKopfPolicyProofExpires(t *testing.T) {
	var answer error
	probes := 0
	f := policyFixture(t, &answer, &probes)
	now := time.Unix(1000, 0)
	p := f.m.policy
	p.now = func() time.Time { return now }
	if err := p.prove(f.ctx, "default", "deleting"); err != nil || probes != 1 {
		t.Fatalf("first proof: %v after %d probes, want nil after 1", err, probes)
	}
	now = now.Add(policyProofTTL - time.Millisecond)
	if err := p.prove(f.ctx, "default", "deleting"); err != nil || probes != 1 {
		t.Errorf("within the proof's %s: %v after %d probes, want nil with no new probe", policyProofTTL, err, probes)
	}
	answer = ErrPolicyMissing // the policy deleted after start
	now = now.Add(time.Millisecond)
	if err := p.prove(f.ctx, "default", "deleting"); !errors.Is(err, ErrPolicyMissing) || probes != 2 {
		t.Errorf("%s after the proof, the policy gone: %v after %d probes, want ErrPolicyMissing after a second probe", policyProofTTL, err, probes)
	}
	if err := p.Ready(); !errors.Is(err, ErrPolicyMissing) {
		t.Errorf("Ready = %v once the policy is gone, want ErrPolicyMissing", err)
	}
}
