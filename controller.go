package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilcache "k8s.io/apimachinery/pkg/util/cache"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/demo-operator/uuid-controller/internal/crdcheck"
	"github.com/demo-operator/uuid-controller/internal/inflight"
	"github.com/demo-operator/uuid-controller/internal/kopf"
)

// Controller assigns a UUID to the status of every Uuid object that lacks one.
type Controller struct {
	// sendStatus writes the status subresource (Deps.Status).
	sendStatus statusPatcher
	// store is the informer's cache of *cachedUUID objects (main's is a
	// watch, which may switch informers). Not a GenericLister: the dynamic
	// one insists on unstructured objects.
	store objectStore
	// synced reports whether the informer's cache has synced.
	synced cache.InformerSynced
	// queue holds the keys of objects that may need a UUID.
	queue workqueue.TypedRateLimitingInterface[cache.ObjectName]
	// recorder posts Events on the objects.
	recorder record.EventRecorder
	// metrics counts assignments and failures.
	metrics *Metrics
	// newUUID makes UUIDs; a field so tests can fix the value.
	newUUID func() uuid.UUID
	// syncHandler reconciles one key; a field so tests can inject failures.
	syncHandler func(ctx context.Context, key cache.ObjectName) error
	opts        Options
	// crd holds writes back while the CRD is known to be wrong.
	crd crdGate
	// kopf releases objects being deleted from kopf's finalizer, or
	// reports them without --remove-kopf-finalizer (internal/kopf).
	kopf kopf.Migration
	// sampled is the key anyCached last returned, or one enqueue saw.
	sampled atomic.Pointer[cache.ObjectName]
	// attach sets the cache transform and the event handlers on an
	// informer that has not started.
	attach func(cache.SharedIndexInformer) error
	// sweeps find the objects whose status.uuid is not a UUID, which a
	// narrowed watch cannot see, and read them for the workers (sweep.go).
	sweeps *sweeper
	// written maps the key of each object given a UUID in the last
	// ownWriteTTL to the resourceVersion the write replaced: until the
	// cache shows the write, it still holds that version, and writing
	// again would only earn a 409 (see alreadyWritten).
	written *utilcache.LRUExpireCache
	// drops maps the key of each object dropped in the last dropMemory
	// (a request the apiserver rejected) to the error's text, so a drop
	// repeated by resyncs is logged at -v=0 once (firstDrop).
	drops *utilcache.LRUExpireCache
	// inFlight bounds the syncs at once, between minInFlight and Run's
	// workers, moving with the apiserver's answers (internal/inflight).
	inFlight atomic.Pointer[inflight.Limiter]
}

// ownWriteTTL bounds how long a write is remembered: far longer than a
// watch event takes, and short enough that the memory stays bounded by
// the write rate; ownWriteMax bounds it under any burst.
const (
	ownWriteTTL = time.Minute
	ownWriteMax = 16384
)

// dropMemory is how long a drop is remembered (at most ownWriteMax of
// them): a drop repeated by the resyncs of a day costs one line.
const dropMemory = 24 * time.Hour

// objectStore is what the controller reads of an informer's cache.
type objectStore interface {
	GetByKey(key string) (any, bool, error)
	List() []any
	// ByIndex is the objects an index of attach files under value.
	ByIndex(index, value string) ([]any, error)
}

// crdGate is what the controller asks of the CRD check (internal/crdcheck):
// it reports the CRD's state and does nothing else.
type crdGate interface {
	// Blocked is an error wrapping crdcheck.ErrNotReady while the CRD is
	// known to be wrong, else nil.
	Blocked() error
	// Suspect asks for a check soon: a status write got 404 for an object
	// the cache still holds.
	Suspect()
}

// noCRDGate never blocks: for tests that do not exercise the CRD check.
type noCRDGate struct{}

func (noCRDGate) Blocked() error { return nil }
func (noCRDGate) Suspect()       {}

// Deps are what a controller is built on. The caller picks each: main.go
// the real ones, tests fakes.
type Deps struct {
	// List reads strays and lists for sweeps: main's is streamLister,
	// unit tests' dynamicLister over a fake client.
	List pageLister
	// Patch removes kopf's finalizer: main's is objectPatcher, which
	// reads nothing of the answer but an error.
	Patch kopf.Patcher
	// Informer is the informer on uuidGVR, not yet started.
	Informer informers.GenericInformer
	// Status sends status writes: main's is restPatcher over
	// newStatusClient, unit tests' dynamicPatcher over a fake client.
	Status statusPatcher
	// InFlight bounds the syncs at once (main's sees the status client's
	// 429s); nil: Run makes one from its workers.
	InFlight *inflight.Limiter
	// Recorder posts Events on the objects.
	Recorder record.EventRecorder
	// Metrics are the controller's own; other packages register theirs
	// on Metrics.Registry.
	Metrics *Metrics
	// CRD holds writes back while the CRD is known to be wrong.
	CRD crdGate
	// Metadata watches the objects' metadata for deletions kopf's
	// finalizer holds, without --remove-kopf-finalizer (internal/kopf);
	// nil watches nothing (unit tests).
	Metadata metadata.Interface
	// Namespaces are the namespaces watched (nil: all).
	Namespaces []string
	// KopfProbe stands in for the dry run that proves the kopf migration's
	// admission policy (kopf.Config.Probe); nil but in unit tests.
	KopfProbe func(ctx context.Context, namespace, name string) error
}

// NewController wires a controller to an informer on uuidGVR. Event handlers
// are added here, so the informer must not have been started yet for the
// initial list to reach the queue.
func NewController(ctx context.Context, d Deps, opts Options) (*Controller, error) {
	opts = opts.withDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	logger := klog.FromContext(ctx)
	informer := d.Informer
	c := &Controller{
		sendStatus: d.Status,
		store:      informer.Informer().GetIndexer(),
		synced:     informer.Informer().HasSynced,
		recorder:   d.Recorder,
		metrics:    d.Metrics,
		newUUID:    uuid.New,
		opts:       opts,
		crd:        d.CRD,
		written:    utilcache.NewLRUExpireCache(ownWriteMax),
		drops:      utilcache.NewLRUExpireCache(ownWriteMax),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			rateLimiter(opts.MaxRetryDelay),
			workqueue.TypedRateLimitingQueueConfig[cache.ObjectName]{Name: "uuid"},
		),
	}
	c.syncHandler = c.syncUUID
	c.inFlight.Store(d.InFlight)
	if err := d.Metrics.Registerer().Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "syncs_in_flight_limit",
		Help: "How many objects the controller reconciles at once now: it rises while keys queue and the apiserver answers fast, and falls when the apiserver pushes back (429, slow answers), between the floor and --workers.",
	}, func() float64 {
		if l := c.inFlight.Load(); l != nil {
			return float64(l.Limit())
		}
		return 0
	})); err != nil {
		return nil, fmt.Errorf("registering the in-flight limit's metric: %w", err)
	}
	for _, cause := range []inflight.Cause{inflight.Throttled, inflight.Slow} {
		if err := d.Metrics.Registerer().Register(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "syncs_in_flight_cuts_total", ConstLabels: prometheus.Labels{"cause": cause.String()},
			Help: "Times the apiserver pushed the in-flight limit down: cause throttled, a 429 from API Priority and Fairness; slow, a round trip over 4 times and 250 ms more than the fastest of the last 30 s.",
		}, func() float64 {
			if l := c.inFlight.Load(); l != nil {
				return float64(l.Cuts(cause))
			}
			return 0
		})); err != nil {
			return nil, fmt.Errorf("registering the in-flight limit's metric: %w", err)
		}
	}
	c.sweeps = newSweeper(d.List, c.queue.Add, d.Metrics)
	var err error
	c.kopf, err = kopf.New(kopf.Config{
		Remove: opts.RemoveKopfFinalizer, Patch: d.Patch, Resource: uuidGVR.GroupResource(), FieldManager: FieldManager,
		Any:   c.anyCached,
		Held:  func() ([]any, error) { return c.store.ByIndex(kopf.HeldIndex, kopf.HeldValue) },
		Event: c.event, Metrics: d.Metrics.Registerer(), Probe: d.KopfProbe,
		Metadata: d.Metadata, GVR: uuidGVR, Namespaces: d.Namespaces,
	})
	if err != nil {
		return nil, err
	}
	c.attach = func(inf cache.SharedIndexInformer) error {
		if err := inf.SetTransform(trimForCache); err != nil {
			return fmt.Errorf("setting the cache transform (the informer must not have started): %w", err)
		}
		// The one index: it holds only objects kopf's finalizer holds, so
		// the migration's gauge is O(held) at every scrape.
		if err := inf.AddIndexers(cache.Indexers{kopf.HeldIndex: kopf.HeldIndexFunc}); err != nil {
			return fmt.Errorf("adding the kopf index: %w", err)
		}
		_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { c.enqueue(logger, obj) },
			UpdateFunc: func(old, cur any) { c.onUpdate(logger, old, cur) },
			// An object that leaves a narrowed watch (its UUID was
			// written) arrives here too: the normal end of its time in
			// the cache.
			DeleteFunc: c.onDelete,
		})
		if err != nil {
			return fmt.Errorf("adding event handler: %w", err)
		}
		return nil
	}
	if err := c.attach(informer.Informer()); err != nil {
		return nil, err
	}
	return c, nil
}

// useWatch reads objects from w, whose informers it sets up with attach,
// instead of the informer NewController was given (which is not run).
// namespaces (nil for all) are what a sweep lists.
func (c *Controller) useWatch(w *watch, namespaces []string) {
	c.store, c.synced = w, w.Servable
	c.sweeps.namespaces, c.sweeps.narrowed = namespaces, w.Narrowed
	c.sweeps.onKopfHeld = func(ctx context.Context, obj kopf.Object) { _ = c.kopf.Release(ctx, obj) }
	w.onNarrowed = c.sweeps.request
}

// onUpdate queues the object unless the update is the informer returning
// the controller's own Error write.
func (c *Controller) onUpdate(logger klog.Logger, old, cur any) {
	if !isErrorWriteEcho(old, cur) {
		c.enqueue(logger, cur)
	}
}

// isErrorWriteEcho tells whether an update is the informer returning the
// controller's own Error status write (an object without a UUID whose
// status changed to state Error), as sample-controller tells a resync by
// comparing resourceVersions: queueing it would retry the object ahead of
// its backoff.
func isErrorWriteEcho(old, cur any) bool {
	o, ok := old.(*cachedUUID)
	n, ok2 := cur.(*cachedUUID)
	return ok && ok2 && !o.hasUUID() && !n.hasUUID() && o.GetUID() == n.GetUID() &&
		n.status().State == StateError && !sameStatus(o.status(), n.status())
}

// onDelete forgets a deleted object's failures: it needs nothing else (no
// finalizer, nothing owned), and a new object of the same name starts its
// own count of attempts, so its own failure is reported too.
func (c *Controller) onDelete(obj any) {
	if key, err := cache.DeletionHandlingObjectToName(obj); err == nil {
		c.queue.Forget(key)
	}
}

// enqueue queues obj only when it needs work, so objects already done (the
// whole cache at a restart, every resync) cost no queue traffic.
func (c *Controller) enqueue(logger klog.Logger, obj any) {
	u, ok := obj.(*cachedUUID)
	if !ok {
		utilruntime.HandleErrorWithLogger(logger, fmt.Errorf("unexpected object type %T", obj), "Ignoring event")
		return
	}
	if c.sampled.Load() == nil {
		key := cache.MetaObjectToName(u)
		c.sampled.Store(&key)
	}
	if needsWork(u) {
		c.queue.Add(cache.MetaObjectToName(u))
	}
}

// anyCached is one object of the cache, nil when it holds none: the kopf
// migration's policy proof dry-runs on it every few seconds while
// unproven, so it reads the object last sampled by key and lists the
// cache only when that one is gone.
func (c *Controller) anyCached() kopf.Object {
	if key := c.sampled.Load(); key != nil {
		if u, err := c.get(*key); err == nil {
			return u
		}
	}
	for _, obj := range c.store.List() {
		if u, ok := obj.(*cachedUUID); ok {
			key := cache.MetaObjectToName(u)
			c.sampled.Store(&key)
			return u
		}
	}
	return nil
}

// needsWork tells whether obj has anything for a worker: no UUID yet, or
// kopf's finalizer holding its deletion (removed, or reported with the fix
// when --remove-kopf-finalizer is off).
func needsWork(obj *cachedUUID) bool {
	return !obj.hasUUID() || kopf.FinalizerIndex(obj) >= 0
}

// Run starts workers and blocks until ctx is cancelled. It then stops taking
// work and waits, up to ShutdownTimeout, for in-flight reconciles to finish,
// then cancels those still running and waits for them to return, so a
// caller holding a lease can release it only after the last write.
// When ctx's cause is errLeaseLost, the reconciles in flight are cancelled
// rather than waited for.
func (c *Controller) Run(ctx context.Context, workers int) error {
	defer utilruntime.HandleCrashWithContext(ctx)
	logger := klog.FromContext(ctx)
	logger.Info("Starting controller", "controller", controllerName, "workers", workers)
	defer logger.Info("Shut down controller", "controller", controllerName)

	if !cache.WaitForNamedCacheSyncWithContext(ctx, c.synced) {
		// It gives up only when ctx is cancelled: a shutdown before the
		// first sync (no permission to list, no CRD yet) is not an error.
		c.queue.ShutDown()
		return nil
	}
	var wg sync.WaitGroup
	wg.Go(func() { c.sweeps.run(ctx) })
	wg.Go(func() { c.kopf.Run(ctx) })
	// Reconciles run under work: ctx's values (the logger) without its
	// cancellation, so one in flight is never cut off half-way through a
	// shutdown (SyncTimeout bounds it instead). Unless the lease is lost:
	// then another replica may be writing already, and work ends too.
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	context.AfterFunc(ctx, func() {
		if leaseLost(ctx) {
			cancelWork()
		}
	})
	if c.inFlight.Load() == nil {
		c.inFlight.Store(newInFlight(workers))
	}
	// One goroutine takes keys and starts a sync for each once the
	// limiter has a slot: the syncs at once follow the queue and the
	// apiserver, and an idle controller holds no worker goroutines.
	wg.Go(func() {
		for c.dispatch(ctx, work, &wg) {
		}
	})
	<-ctx.Done()
	logger.Info("Stopping workers", "controller", controllerName)
	c.queue.ShutDown()
	done := make(chan struct{})
	go func() { wg.Wait(); cancelWork(); close(done) }()
	select {
	case <-done:
		return nil
	case <-time.After(c.opts.ShutdownTimeout):
		// Cancel the writes still in flight and wait for them to return:
		// a caller holding a lease releases it only after the last write
		// has returned or been cancelled, never while one may still land.
		cancelWork()
		<-done
		return fmt.Errorf("workers still busy after %s; their writes were cancelled", c.opts.ShutdownTimeout)
	}
}

// newInFlight is the limit on the syncs at once: from minInFlight (or
// workers, if fewer) up to workers.
func newInFlight(workers int) *inflight.Limiter {
	return inflight.New(inflight.Config{Min: min(minInFlight, workers), Max: workers})
}

// dispatch takes one key, waits for a slot and handles the key under work
// in a goroutine of wg's (see Run). It returns false when the queue is shut
// down or ctx is cancelled.
func (c *Controller) dispatch(ctx, work context.Context, wg *sync.WaitGroup) bool {
	key, shutdown := c.queue.Get()
	if shutdown {
		return false
	}
	slot, err := c.inFlight.Load().Acquire(ctx)
	if err != nil {
		// Shutting down: the object is picked up by whichever process
		// runs next, from its own informer's list.
		c.queue.Done(key)
		return false
	}
	wg.Go(func() {
		defer slot.Release()
		c.processItem(ctx, work, key)
	})
	return true
}

// processItem handles one key under work, then marks it done.
func (c *Controller) processItem(ctx, work context.Context, key cache.ObjectName) {
	defer c.queue.Done(key)
	if ctx.Err() != nil {
		// Shutting down: don't start new work. The object is picked up by
		// whichever process runs next, from its own informer's list.
		return
	}
	syncCtx, cancel := context.WithTimeout(work, c.opts.SyncTimeout)
	defer cancel()
	err := c.syncHandler(syncCtx, key)
	if leaseLost(ctx) {
		// No retry and no Error status: the next leader's informer lists
		// the object and takes it from there.
		return
	}
	c.handleErr(syncCtx, key, err)
}

// leaseLost tells whether ctx was cancelled for a lost lease.
func leaseLost(ctx context.Context) bool {
	return errors.Is(context.Cause(ctx), errLeaseLost)
}

// syncUUID brings the object named by key to its one end state: a UUID in
// its status and, once it is being deleted with --remove-kopf-finalizer,
// no kopf finalizer.
func (c *Controller) syncUUID(ctx context.Context, key cache.ObjectName) error {
	logger := klog.LoggerWithValues(klog.FromContext(ctx), "object", klog.KRef(key.Namespace, key.Name))
	ctx = klog.NewContext(ctx, logger)

	obj, err := c.read(ctx, key)
	if apierrors.IsNotFound(err) {
		logger.V(4).Info("Object is gone, nothing to do")
		return nil
	}
	if err != nil {
		return err
	}
	switch {
	case !obj.hasUUID() && c.alreadyWritten(key, obj):
		// The cache (or, during a switch of watches, the other informer)
		// has not caught up with this controller's write; its event
		// follows.
		logger.V(4).Info("The cache does not show this controller's UUID write yet, nothing to do")
		return nil
	case !obj.hasUUID():
		if err := c.assignUUID(ctx, obj); err != nil {
			return err
		}
		if kopf.FinalizerIndex(obj) >= 0 && !c.opts.RemoveKopfFinalizer {
			// Named now: with its UUID it leaves a narrowed watch, and
			// only a sweep would find it again. (With the flag the full
			// watch brings it back to be released.)
			return c.kopf.Release(ctx, obj)
		}
		return nil
	case kopf.FinalizerIndex(obj) >= 0:
		// Released with --remove-kopf-finalizer, else reported with the fix.
		if err := c.kopf.Release(ctx, obj); err != nil {
			return fmt.Errorf("%w: %w", errRelease, err)
		}
		return nil
	default:
		// A UUID is never regenerated: not on update, resync or restart.
		logger.V(4).Info("Object already has a UUID", "uuid", obj.status().UUID)
		return nil
	}
}

// read reads key from the cache or, for a stray, from the apiserver.
func (c *Controller) read(ctx context.Context, key cache.ObjectName) (*cachedUUID, error) {
	obj, err := c.get(key)
	if apierrors.IsNotFound(err) && c.sweeps.strays.has(key) {
		return c.sweeps.getStray(ctx, key)
	}
	return obj, err
}

// get reads key from the informer's cache.
func (c *Controller) get(key cache.ObjectName) (*cachedUUID, error) {
	obj, exists, err := c.store.GetByKey(key.String())
	if err != nil {
		return nil, fmt.Errorf("reading %s from the cache: %w", key, err)
	}
	if !exists {
		return nil, apierrors.NewNotFound(uuidGVR.GroupResource(), key.Name)
	}
	u, ok := obj.(*cachedUUID)
	if !ok {
		return nil, fmt.Errorf("cache holds a %T for %s, not a *cachedUUID", obj, key)
	}
	return u, nil
}

// alreadyWritten tells whether obj is the version this controller gave a
// UUID to a moment ago.
func (c *Controller) alreadyWritten(key cache.ObjectName, obj *cachedUUID) bool {
	rv, ok := c.written.Get(key)
	return ok && rv == obj.GetResourceVersion()
}

// assignUUID writes a new UUID to obj's status, unless the CRD is known to
// be unable to hold it.
func (c *Controller) assignUUID(ctx context.Context, obj *cachedUUID) error {
	logger := klog.FromContext(ctx)
	if err := c.crd.Blocked(); err != nil {
		return err
	}
	if problem := obj.uuidProblem(); problem != "" {
		// Per object, so at -v=2 like the assignment; the Warning Event
		// tells the object's owner.
		logger.V(2).Info("Replacing an invalid status", "problem", problem)
		c.event(obj, corev1.EventTypeWarning, ReasonInvalid, "Replacing invalid status: "+problem)
	}
	st := assignedStatus(c.newUUID(), obj.status().Conditions, metav1.Now())
	if err := c.writeStatus(ctx, obj, st); err != nil {
		return err
	}
	c.written.Add(cache.MetaObjectToName(obj), obj.GetResourceVersion(), ownWriteTTL)
	c.metrics.Assigned.Inc()
	if created := obj.GetCreationTimestamp(); !created.IsZero() {
		c.metrics.AssignmentLatency.Observe(time.Since(created.Time).Seconds())
	}
	// Per object, so not at -v=0; uuids_assigned_total counts them.
	logger.V(2).Info("Assigned UUID", "uuid", st.UUID)
	c.event(obj, corev1.EventTypeNormal, ReasonAssigned, "Assigned UUID "+st.UUID)
	return nil
}

// writeStatus patches st onto obj and counts the result.
func (c *Controller) writeStatus(ctx context.Context, obj *cachedUUID, st Status) error {
	err := patchStatus(ctx, c.sendStatus, obj, st)
	switch {
	case err == nil:
		c.metrics.StatusWrites.WithLabelValues("ok").Inc()
	case apierrors.IsConflict(err):
		c.metrics.StatusWrites.WithLabelValues("conflict").Inc()
	case apierrors.IsNotFound(err):
		c.metrics.StatusWrites.WithLabelValues("not_found").Inc()
	default:
		c.metrics.StatusWrites.WithLabelValues("error").Inc()
		_, reason := failureReasons(err)
		c.metrics.PatchFailures.WithLabelValues(reason).Inc()
	}
	return err
}

// event posts an Event on obj, leaving out Normal ones unless asked for: an
// Event per assignment doubles the API writes of a busy controller.
func (c *Controller) event(obj runtime.Object, eventType, reason, message string) {
	if eventType == corev1.EventTypeNormal && !c.opts.NormalEvents {
		return
	}
	c.recorder.Event(obj, eventType, reason, message)
}

// errRelease wraps a failure to release an object from kopf's finalizer,
// so handleErr tells it from a UUID not assigned.
var errRelease = errors.New("releasing the object from kopf's finalizer")

// handleErr is the one place for retry policy. Everything but a request the
// apiserver rejects as malformed is retried for as long as it takes, with
// backoff: an outage, a 429 or a missing RBAC grant all heal without a
// restart. At the ErrorAfter-th failed attempt the failure is also reported on
// the object.
func (c *Controller) handleErr(ctx context.Context, key cache.ObjectName, err error) {
	logger := klog.FromContext(ctx)
	ref := klog.KRef(key.Namespace, key.Name)
	// Read before any Forget, which resets the count.
	attempts := c.queue.NumRequeues(key) + 1
	switch {
	case errors.Is(err, crdcheck.ErrNotReady):
		// Kept queued, so fixing the CRD heals the object with no restart or
		// update. The check has logged the problem and its fix once.
		logger.V(4).Info("Holding back the status write until the CRD is fixed", "object", ref)
		c.queue.AddRateLimited(key)
	case apierrors.IsNotFound(err) && c.inCache(key):
		// A missing status subresource, or a deletion the informer has yet
		// to deliver; the check and the retry tell them apart.
		logger.V(2).Info("Status write answered 404 for an object still in the cache; checking the CRD", "object", ref)
		c.crd.Suspect()
		c.queue.AddRateLimited(key)
	case err == nil, apierrors.IsNotFound(err):
		// Not found: the object was deleted between the cache read and the
		// write; nothing is left to do.
		c.queue.Forget(key)
		c.sweeps.strays.remove(key)
	case apierrors.IsConflict(err):
		// Another writer (a second replica, a user) changed the object since
		// our cache saw it. The next try reads the newer version and, if
		// that writer assigned a UUID, writes nothing.
		logger.V(2).Info("Conflict writing status, will retry", "object", ref)
		c.queue.AddRateLimited(key)
	case isPermanent(err):
		c.queue.Forget(key)
		c.sweeps.strays.remove(key)
		c.metrics.Dropped.Inc()
		// A resync brings a dropped object back (it still needs work) and
		// drops it again: said at -v=0 once per object and error.
		first := c.firstDrop(key, err)
		if first {
			utilruntime.HandleErrorWithContext(ctx, err, "Dropping object: the apiserver rejected the request; an update of the object retries it",
				"object", ref, "attempts", attempts)
		} else {
			logger.V(2).Info("Dropping object again: the apiserver rejected the request", "object", ref, "err", err)
		}
		c.markFailed(ctx, key, err, first)
	default:
		// Exactly at the ErrorAfter-th attempt, so a streak is reported
		// once with no record of it: the count is the queue's, which Forget
		// resets when the streak ends (success, deletion, a rejected
		// request). A conflict counts as an attempt too; should it fall on
		// the ErrorAfter-th, that streak goes unreported.
		// A failed release is not reported in status: the object has its
		// UUID, and kopf's Warning Event already names the failure.
		release := errors.Is(err, errRelease)
		report := attempts == c.opts.ErrorAfter && !release
		// Two error lines a streak, when it starts and when it is reported;
		// the retries between are at -v=2, or an outage would log every
		// object at every retry.
		switch {
		case release && attempts == 1:
			logger.Error(err, "Failed to remove kopf's finalizer from an object being deleted, will retry", "object", ref)
		case release:
			logger.V(2).Info("Failed to remove kopf's finalizer again, will retry", "object", ref, "attempt", attempts, "err", err)
		case report:
			logger.Error(err, "Failed to assign UUID; reporting it on the object, retrying goes on", "object", ref,
				"attempts", attempts)
		case attempts == 1:
			logger.Error(err, "Failed to assign UUID, will retry", "object", ref, "errorAfter", c.opts.ErrorAfter)
		default:
			logger.V(2).Info("Failed to assign UUID again, will retry", "object", ref, "attempt", attempts, "err", err)
		}
		if report {
			c.markFailed(ctx, key, err, true)
		}
		c.queue.AddRateLimited(key)
	}
}

// inCache tells whether the informer's cache holds key.
func (c *Controller) inCache(key cache.ObjectName) bool {
	_, err := c.get(key)
	return err == nil
}

// requeueUnfinished queues every cached object that still needs work, with
// its backoff and its count towards ErrorAfter started again: the attempts
// held back for the CRD were no failure of the object's. It is the CRD
// check's heal callback.
func (c *Controller) requeueUnfinished(context.Context) {
	for _, obj := range c.store.List() {
		if u, ok := obj.(*cachedUUID); ok && needsWork(u) {
			key := cache.MetaObjectToName(u)
			c.queue.Forget(key)
			c.queue.Add(key)
		}
	}
}

// isPermanent tells errors that no retry can fix: the apiserver rejected the
// request itself.
func isPermanent(err error) bool {
	return apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) || apierrors.IsNotAcceptable(err) ||
		apierrors.IsUnsupportedMediaType(err) || apierrors.IsRequestEntityTooLargeError(err)
}

// firstDrop tells whether key is dropped with err for the first time in
// dropMemory (and remembers it): a drop that repeats, at each resync of an
// object nothing changed, is logged at -v=2 only.
func (c *Controller) firstDrop(key cache.ObjectName, err error) bool {
	msg := err.Error()
	if prev, ok := c.drops.Get(key); ok && prev == msg {
		return false
	}
	c.drops.Add(key, msg, dropMemory)
	return true
}

// markFailed reports a failure on the object: a Warning event, and state
// Error with the error text. The write carries the same precondition as an
// assignment, so it can never hide a UUID another writer just assigned.
// Its own failure is logged at -v=0 when loud, else at -v=2 (a drop that
// repeats).
func (c *Controller) markFailed(ctx context.Context, key cache.ObjectName, cause error, loud bool) {
	logger := klog.FromContext(ctx)
	// The attempt's own deadline may be what just failed it.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.opts.SyncTimeout)
	defer cancel()
	obj, err := c.read(ctx, key)
	if err != nil {
		return // gone, or unreadable from the cache: nothing to mark
	}
	if obj.hasUUID() {
		return
	}
	c.event(obj, corev1.EventTypeWarning, ReasonFailed, "Failed to assign a UUID: "+cause.Error())
	st := errorStatus(cause, !isPermanent(cause), obj.status().Conditions, metav1.Now())
	if sameStatus(obj.status(), st) {
		return // already says so; writing again would only wake the informer
	}
	if err := c.writeStatus(ctx, obj, st); err != nil && !apierrors.IsNotFound(err) {
		if loud {
			logger.Error(err, "Failed to record the error in status", "object", klog.KObj(obj))
		} else {
			logger.V(2).Info("Failed to record the error in status again", "object", klog.KObj(obj), "err", err)
		}
	}
}
