package kopf

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"
)

// policyGate makes the migration fail closed. Removing kopf's
// finalizer needs patch on the objects themselves, a grant only the
// admission policy narrows; so with --remove-kopf-finalizer no finalizer
// is removed until a dry run the policy must deny has been denied
// (Probe): at start, before the next removal after one failed, and
// before any removal once the last proof is policyProofTTL old, so a policy
// deleted, unbound or switched to Warn after start stops removals within
// that long of the apiserver enforcing the change. While a probe is
// allowed, /readyz and uuid_controller_kopf_policy_bound say so, the error
// is logged once, and the probe is repeated every few seconds.
type policyGate struct {
	// probe runs Probe on one object; a field so unit tests can
	// replace the apiserver's admission.
	probe func(ctx context.Context, namespace, name string) error
	// bound is the uuid_controller_kopf_policy_bound gauge.
	bound prometheus.Gauge
	// reprobe is how often a missing policy is probed again; a field so
	// tests can shorten it.
	reprobe time.Duration
	now     func() time.Time // tests replace it

	mu       sync.Mutex
	proven   bool      // a probe was denied since the policy was last found missing
	provenAt time.Time // when that probe was denied; zero once a removal failed
	missing  bool      // the last probe was allowed
}

// newPolicyGate is a gate that proves the policy with probe and reports
// it on bound.
func newPolicyGate(probe func(ctx context.Context, namespace, name string) error, bound prometheus.Gauge) *policyGate {
	return &policyGate{
		probe:   probe,
		bound:   bound,
		reprobe: policyReprobe,
		now:     time.Now,
	}
}

// policyReprobe is how often, while the policy is missing, it is probed
// again: applying it makes the controller ready within this long even
// when no removal is waiting (the apiserver enforces a new policy about a
// second after it is created, which a controller started in the same
// apply can beat).
const policyReprobe = 5 * time.Second

// policyProofTTL is how long a denied probe proves the policy: a removal
// after that probes again first (one dry run, at most one every
// policyProofTTL while objects are being deleted). It bounds how long
// removals go on after the policy is deleted, its binding deleted, or its
// validationActions set to Warn.
const policyProofTTL = 3 * time.Second

// prove returns nil once the policy is proven to bind the controller, else
// probes it on the object namespace/name and returns why it is not.
func (p *policyGate) prove(ctx context.Context, namespace, name string) error {
	if p.fresh() {
		return nil
	}
	err := p.probe(ctx, namespace, name)
	p.record(ctx, err)
	return err
}

// record keeps a probe's result and reports a change.
func (p *policyGate) record(ctx context.Context, err error) {
	logger := klog.FromContext(ctx)
	missing := errors.Is(err, ErrPolicyMissing)
	p.mu.Lock()
	wasMissing, wasProven := p.missing, p.proven
	p.missing = missing
	if err == nil {
		p.proven, p.provenAt = true, p.now()
	}
	if missing {
		p.proven = false
	}
	p.mu.Unlock()
	switch {
	case err == nil:
		p.bound.Set(1)
		if !wasProven {
			logger.Info("The admission policy binds this controller; removing kopf's finalizer from objects being deleted", "policy", PolicyName)
		}
	case missing:
		p.bound.Set(0)
		if !wasMissing {
			logger.Error(err, "Removing no kopf finalizer until the admission policy binds this controller", "policy", PolicyName)
		}
	}
	// Any other error proves nothing either way: what was known stands,
	// and the caller reports the error.
}

// fresh is whether the policy was proven less than policyProofTTL ago.
func (p *policyGate) fresh() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.proven && p.now().Sub(p.provenAt) < policyProofTTL
}

// forget makes the next removal prove the policy again: one just failed,
// and the policy may be why. What was proven stands, so proving it again
// is not news to log.
func (p *policyGate) forget() {
	p.mu.Lock()
	p.provenAt = time.Time{}
	p.mu.Unlock()
}

// Ready is the policy's part of /readyz: an error while the last probe
// was allowed.
func (p *policyGate) Ready() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.missing {
		return ErrPolicyMissing
	}
	return nil
}

// proveAtStart probes the policy on obj, any cached object, so a missing
// policy shows at start rather than at the first deletion. With no object
// (nil) there is nothing to remove yet; the first removal probes.
func (p *policyGate) proveAtStart(ctx context.Context, obj Object) {
	if obj == nil {
		return
	}
	if err := p.prove(ctx, obj.GetNamespace(), obj.GetName()); err != nil && !errors.Is(err, ErrPolicyMissing) {
		klog.FromContext(ctx).Error(err, "Could not prove the admission policy binds this controller; the next finalizer removal tries again", "policy", PolicyName)
	}
}

// reprobeWhileMissing probes again every p.reprobe while the last probe
// was allowed or the proof is stale (so /readyz and the gauge follow a
// policy removed after start even with no removal waiting), until ctx is
// cancelled.
func (p *policyGate) reprobeWhileMissing(ctx context.Context, sample func() Object) {
	t := time.NewTicker(p.reprobe)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if p.Ready() != nil || !p.fresh() {
			p.proveAtStart(ctx, sample())
		}
	}
}
