package kopf

import (
	"context"
	"fmt"
	"math"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/metadata"
	"k8s.io/klog/v2"
)

// Event reasons of the migration.
const (
	// ReasonFinalizerRemoved: kopf's finalizer was removed from an object
	// being deleted (Normal).
	ReasonFinalizerRemoved = "KopfFinalizerRemoved"
	// ReasonFinalizerFailed: removing kopf's finalizer failed; it is
	// retried (Warning).
	ReasonFinalizerFailed = "KopfFinalizerRemovalFailed"
)

// Patcher sends a patch to the object namespace/name. It returns only
// the error: the object a successful patch answers with may be as large
// as the apiserver allows, and nothing here reads it, so the controller's
// Patcher does not decode or even hold it.
type Patcher func(ctx context.Context, namespace, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions) error

// Object is what the migration handles: an object of the cache, which
// Events can name.
type Object interface {
	metav1.Object
	runtime.Object
}

// Migration is what the controller asks of the move from kopf: what to do
// with an object being deleted that kopf's finalizer holds, and whether
// doing it is safe. New gives a no-op, which only reports such objects,
// unless Config.Remove is set.
type Migration interface {
	// Release handles obj, whose deletion kopf's finalizer holds
	// (FinalizerIndex >= 0): removes the finalizer, or logs the fix. An
	// error is retried with the object's backoff.
	Release(ctx context.Context, obj Object) error
	// Run proves the admission policy on a cached object at start, and
	// again while it is missing or its proof is stale, until ctx is
	// cancelled; a no-op without Remove.
	Run(ctx context.Context)
	// Ready is the migration's part of /readyz: an error while the
	// admission policy is known not to bind the controller.
	Ready() error
}

// Config is what New builds a Migration from.
type Config struct {
	// Remove is --remove-kopf-finalizer: remove kopf's finalizer from
	// objects being deleted. Without it Release only logs the fix.
	Remove bool
	// Patch patches the objects.
	Patch Patcher
	// Resource names the objects in a Conflict error.
	Resource schema.GroupResource
	// FieldManager names the controller's writes.
	FieldManager string
	// Any is one object of the controller's cache, nil when it holds
	// none: the policy's proof dry-runs on it at start and every few
	// seconds while unproven, so it must not walk the cache.
	Any func() Object
	// Held is the cached objects HeldIndex files under HeldValue: those
	// whose deletion kopf's finalizer holds. It feeds the gauge at every
	// scrape, so it must cost O(held), not O(cache).
	Held func() ([]any, error)
	// Event posts an Event on an object.
	Event func(obj runtime.Object, eventType, reason, message string)
	// Metrics is where New registers the migration's metrics:
	// kopf_finalizers_removed_total, kopf_policy_bound and
	// kopf_finalizer_waiting_objects (the caller adds its prefix).
	Metrics prometheus.Registerer
	// Probe proves the admission policy on one object; nil for Probe with
	// Patch. A field so tests can stand in for the apiserver's admission.
	Probe func(ctx context.Context, namespace, name string) error
	// Metadata, without Remove, watches the objects' metadata for
	// deletions kopf's finalizer holds (Reporter.Run); nil watches
	// nothing (unit tests).
	Metadata metadata.Interface
	// GVR is the objects' resource, for Metadata.
	GVR schema.GroupVersionResource
	// Namespaces are the namespaces watched (nil or [""]: all).
	Namespaces []string
}

// New registers the migration's metrics (with or without Remove, so the
// series do not come and go with the flag) and returns the Migration.
func New(cfg Config) (Migration, error) {
	removed := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kopf_finalizers_removed_total",
		Help: "kopf finalizers removed from Uuid objects being deleted (--remove-kopf-finalizer).",
	})
	bound := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kopf_policy_bound",
		Help: "1 once a dry run the admission policy uuid-controller-kopf-migration must deny was denied (--remove-kopf-finalizer); 0 before, or while such a dry run is allowed, when no kopf finalizer is removed.",
	})
	rep := newReporter(cfg)
	// Computed at each scrape from the cache's index, so a scrape never
	// walks the whole cache: with Remove the full watch holds every
	// object, and the index is exact without tracking keys; without, the
	// index (every object under a full watch, only those without a UUID
	// under a narrowed one) joined with the reporter's keys.
	waiting := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kopf_finalizer_waiting_objects",
		Help: "Uuid objects being deleted whose deletion waits for kopf's finalizer (see --remove-kopf-finalizer).",
	}, func() float64 {
		objs, err := cfg.Held()
		if err != nil {
			return math.NaN() // the index is missing: unknown, not zero
		}
		if cfg.Remove {
			return float64(len(objs))
		}
		return float64(rep.countWith(objs))
	})
	for _, c := range []prometheus.Collector{removed, bound, waiting} {
		if err := cfg.Metrics.Register(c); err != nil {
			return nil, fmt.Errorf("registering the kopf migration's metrics: %w", err)
		}
	}
	if !cfg.Remove {
		return rep, nil
	}
	probe := cfg.Probe
	if probe == nil {
		probe = func(ctx context.Context, namespace, name string) error {
			return Probe(ctx, cfg.Patch, namespace, name, cfg.FieldManager)
		}
	}
	return &remover{cfg: cfg, removed: removed, policy: newPolicyGate(probe, bound)}, nil
}

// remover removes kopf's finalizer once the admission policy is proven.
type remover struct {
	cfg     Config
	removed prometheus.Counter
	policy  *policyGate
}

// Release removes kopf's finalizer from obj, which is being deleted. A
// failed patch test (the finalizers changed under the cache) comes back as
// a Conflict, so the object is retried from the cache's newer view.
func (m *remover) Release(ctx context.Context, obj Object) error {
	logger := klog.FromContext(ctx)
	i := FinalizerIndex(obj)
	if i < 0 {
		return nil
	}
	if err := m.policy.prove(ctx, obj.GetNamespace(), obj.GetName()); err != nil {
		return fmt.Errorf("not removing finalizer %s from %s/%s: %w", Finalizer, obj.GetNamespace(), obj.GetName(), err)
	}
	patch, err := RemoveFinalizerPatch(i)
	if err != nil {
		return err
	}
	err = m.cfg.Patch(ctx, obj.GetNamespace(), obj.GetName(), types.JSONPatchType, patch,
		metav1.PatchOptions{FieldManager: m.cfg.FieldManager})
	switch {
	case err == nil:
		m.removed.Inc()
		// Per object, so at -v=2 like an assignment; the metric counts them.
		logger.V(2).Info("Removed kopf's finalizer from an object being deleted", "finalizer", Finalizer)
		m.cfg.Event(obj, corev1.EventTypeNormal, ReasonFinalizerRemoved, "Removed finalizer "+Finalizer+": the kopf operator is gone")
		return nil
	case apierrors.IsNotFound(err):
		return nil // deleted: its last finalizer went meanwhile
	case IsFailedPatchTest(err):
		return apierrors.NewConflict(m.cfg.Resource, obj.GetName(),
			fmt.Errorf("kopf's finalizer is no longer at index %d: %w", i, err))
	}
	m.policy.forget()
	err = fmt.Errorf("removing finalizer %s from %s/%s: %w", Finalizer, obj.GetNamespace(), obj.GetName(), err)
	// Said on the object too: kubectl describe is where a user looks when
	// a deletion hangs.
	m.cfg.Event(obj, corev1.EventTypeWarning, ReasonFinalizerFailed, "Failed to remove kopf's finalizer: "+err.Error())
	return err
}

// Run proves the policy at start, so a missing one shows before the first
// deletion, then again while it is missing or its proof is stale.
func (m *remover) Run(ctx context.Context) {
	m.policy.proveAtStart(ctx, m.cfg.Any())
	m.policy.reprobeWhileMissing(ctx, m.cfg.Any)
}

func (m *remover) Ready() error { return m.policy.Ready() }
