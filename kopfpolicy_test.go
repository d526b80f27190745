package main

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2"

	"github.com/demo-operator/uuid-controller/internal/kopf"
	"github.com/demo-operator/uuid-controller/internal/testlog"
)

// policyFixture is a fixture whose admission policy is not proven yet and
// answers probes with answer; probes counts them.
func policyFixture(t *testing.T, answer *error, probes *int) *fixture {
	t.Helper()
	f := newFixture(t, Options{RemoveKopfFinalizer: true}, kopfObject("deleting", true))
	f.ctrl.policy.proven = false
	f.ctrl.policy.probe = func(context.Context, string, string) error { *probes++; return *answer }
	return f
}

// Fail closed: while a dry run the policy must deny is allowed, no
// finalizer is removed, /readyz and the gauge say so, and the error is
// logged once, naming the policy; once it is denied, removals go on.
func TestKopfPolicyMissingRemovesNothing(t *testing.T) {
	answer, probes := kopf.ErrPolicyMissing, 0
	f := policyFixture(t, &answer, &probes)
	logger, logs := testlog.New(t, 0)
	ctx := klog.NewContext(f.ctx, logger)
	for range 2 {
		err := f.ctrl.syncHandler(ctx, key("default", "deleting"))
		if !errors.Is(err, kopf.ErrPolicyMissing) {
			t.Fatalf("sync = %v, want ErrPolicyMissing", err)
		}
	}
	if ps := f.patches(); len(ps) != 0 {
		t.Errorf("%d patches sent without the policy, want 0", len(ps))
	}
	if err := f.ctrl.policy.Ready(); !errors.Is(err, kopf.ErrPolicyMissing) || !strings.Contains(err.Error(), kopf.PolicyName) {
		t.Errorf("Ready = %v, want the missing policy named", err)
	}
	if v := testutil.ToFloat64(f.metrics.KopfPolicyBound); v != 0 {
		t.Errorf("kopf_policy_bound = %v, want 0", v)
	}
	if lines := logs.Messages(); len(lines) != 1 || !strings.Contains(logs.String(), kopf.PolicyName) {
		t.Errorf("logged %q, want one line naming %s", lines, kopf.PolicyName)
	}

	answer = nil // the policy applied: the next probe is denied
	if err := f.ctrl.syncHandler(ctx, key("default", "deleting")); err != nil {
		t.Fatal(err)
	}
	if ps := f.patches(); len(ps) != 1 {
		t.Errorf("%d patches once the policy binds, want the removal", len(ps))
	}
	if err := f.ctrl.policy.Ready(); err != nil {
		t.Errorf("Ready = %v once the policy binds", err)
	}
	if v := testutil.ToFloat64(f.metrics.KopfPolicyBound); v != 1 {
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
			return true, nil, apierrors.NewForbidden(uuidGVR.GroupResource(), "deleting", errors.New("no grant"))
		}
		return false, nil, nil
	})
	for range 2 {
		if err := f.ctrl.syncHandler(f.ctx, key("default", "deleting")); !apierrors.IsForbidden(err) {
			t.Fatalf("sync = %v, want the forbidden removal", err)
		}
	}
	if probes != 2 {
		t.Errorf("%d probes for two failed removals, want 2", probes)
	}
	fail = false
	if err := f.ctrl.syncHandler(f.ctx, key("default", "deleting")); err != nil {
		t.Fatal(err)
	}
	if probes != 3 {
		t.Errorf("%d probes, want 3: the removal after a failure proves the policy again", probes)
	}
}

// At start the policy is probed on a cached object, so a missing policy
// shows before the first deletion; with no object there is nothing to
// probe or remove.
func TestKopfPolicyProvedAtStart(t *testing.T) {
	answer, probes := kopf.ErrPolicyMissing, 0
	f := policyFixture(t, &answer, &probes)
	f.ctrl.policy.proveAtStart(f.ctx, f.ctrl.store.List())
	if probes != 1 || f.ctrl.policy.Ready() == nil {
		t.Errorf("%d probes at start, Ready %v; want 1 and the missing policy", probes, f.ctrl.policy.Ready())
	}
	f.ctrl.policy.proveAtStart(f.ctx, nil)
	if probes != 1 {
		t.Errorf("probed %d times with no object, want no probe", probes-1)
	}
}

// While the policy is missing it is probed again every few seconds, so
// applying it makes the controller ready with no removal waiting.
func TestKopfPolicyReprobedWhileMissing(t *testing.T) {
	var mu sync.Mutex
	answer := kopf.ErrPolicyMissing
	f := newFixture(t, Options{RemoveKopfFinalizer: true}, kopfObject("live", false))
	f.ctrl.policy.proven = false
	f.ctrl.policy.reprobe = 10 * time.Millisecond
	f.ctrl.policy.probe = func(context.Context, string, string) error { mu.Lock(); defer mu.Unlock(); return answer }
	f.ctrl.policy.proveAtStart(f.ctx, f.ctrl.store.List())
	if f.ctrl.policy.Ready() == nil {
		t.Fatal("ready with the policy missing")
	}
	ctx, cancel := context.WithCancel(f.ctx)
	done := make(chan struct{})
	go func() { defer close(done); f.ctrl.policy.reprobeWhileMissing(ctx, f.ctrl.store.List) }()
	defer func() { cancel(); <-done }()
	mu.Lock()
	answer = nil // the policy applied
	mu.Unlock()
	err := wait.PollUntilContextTimeout(f.ctx, 10*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		return f.ctrl.policy.Ready() == nil, nil
	})
	if err != nil {
		t.Errorf("still not ready 5 s after the policy was applied: %v", f.ctrl.policy.Ready())
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
	f.ctrl.policy.now = func() time.Time { return now }
	p := f.ctrl.policy
	if err := p.prove(f.ctx, "default", "deleting"); err != nil || probes != 1 {
		t.Fatalf("first proof: %v after %d probes, want nil after 1", err, probes)
	}
	now = now.Add(policyProofTTL - time.Millisecond)
	if err := p.prove(f.ctx, "default", "deleting"); err != nil || probes != 1 {
		t.Errorf("within the proof's %s: %v after %d probes, want nil with no new probe", policyProofTTL, err, probes)
	}
	answer = kopf.ErrPolicyMissing // the policy deleted after start
	now = now.Add(time.Millisecond)
	if err := p.prove(f.ctx, "default", "deleting"); !errors.Is(err, kopf.ErrPolicyMissing) || probes != 2 {
		t.Errorf("%s after the proof, the policy gone: %v after %d probes, want ErrPolicyMissing after a second probe", policyProofTTL, err, probes)
	}
	if err := p.Ready(); !errors.Is(err, kopf.ErrPolicyMissing) {
		t.Errorf("Ready = %v once the policy is gone, want ErrPolicyMissing", err)
	}
}
