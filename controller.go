package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
)

const (
	// controllerName names the controller in logs, events and the workqueue metrics.
	controllerName = "uuid-controller"
	// FieldManager is the field manager of every status write.
	FieldManager = controllerName
)

// Event reasons.
const (
	// ReasonAssigned: a UUID was written to the object's status (Normal).
	ReasonAssigned = "UUIDAssigned"
	// ReasonFailed: the controller gave up assigning a UUID (Warning).
	ReasonFailed = "UUIDFailed"
	// ReasonInvalid: status held something that is not a UUID and is being
	// replaced (Warning).
	ReasonInvalid = "InvalidUUID"
)

// uuidGVR is the resource the controller serves.
var uuidGVR = schema.GroupVersionResource{Group: "demo.operator", Version: "v1", Resource: "uuid"}

// Controller assigns a UUID to the status of every Uuid object that lacks one.
type Controller struct {
	// client writes the status subresource; reads come from store.
	client dynamic.NamespaceableResourceInterface
	// store is the informer's cache of *cachedUUID objects. Not a
	// GenericLister: the dynamic one insists on unstructured objects.
	store cache.Store
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
	// crd holds writes back while the CRD is known to be wrong; nil in
	// unit tests that do not need it.
	crd *crdChecker
}

// NewController wires a controller to an informer on uuidGVR. Event handlers
// are added here, so the informer must not have been started yet for the
// initial list to reach the queue.
func NewController(ctx context.Context, client dynamic.Interface, informer informers.GenericInformer,
	recorder record.EventRecorder, metrics *Metrics, opts Options) (*Controller, error) {
	opts = opts.withDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	logger := klog.FromContext(ctx)
	c := &Controller{
		client:   client.Resource(uuidGVR),
		store:    informer.Informer().GetStore(),
		synced:   informer.Informer().HasSynced,
		recorder: recorder,
		metrics:  metrics,
		newUUID:  uuid.New,
		opts:     opts,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			rateLimiter(opts.MaxRetryDelay),
			workqueue.TypedRateLimitingQueueConfig[cache.ObjectName]{Name: "uuid"},
		),
	}
	c.syncHandler = c.syncUUID
	if err := informer.Informer().SetTransform(trimForCache); err != nil {
		return nil, fmt.Errorf("setting the cache transform (the informer must not have started): %w", err)
	}
	_, err := informer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { c.enqueue(logger, obj) },
		UpdateFunc: func(old, cur any) { c.onUpdate(logger, old, cur) },
		DeleteFunc: c.onDelete,
	})
	if err != nil {
		return nil, fmt.Errorf("adding event handler: %w", err)
	}
	return c, nil
}

// onUpdate queues the object unless the update is the informer returning
// the controller's own Error write (see isErrorWriteEcho).
func (c *Controller) onUpdate(logger klog.Logger, old, cur any) {
	if !isErrorWriteEcho(old, cur) {
		c.enqueue(logger, cur)
	}
}

// isErrorWriteEcho tells whether an update is the return of the
// controller's own Error status write, as sample-controller tells a resync
// by comparing resourceVersions: the status of an object without a UUID
// changed to state Error. Queueing that update would retry the object ahead
// of its backoff, and after a rejected request (not retried until the
// object changes) with an error text that differs each time, loop. A user's
// update of a failed object leaves its status as it was, and a resync
// changes nothing, so both are queued. It needs no record of the writes:
// the informer delivers the write's update event with the version it was
// written against as old, whenever the PATCH response arrives. Someone
// else's status write of state Error looks the same; such an object waits
// for its backoff, or (if dropped) its next update or resync.
func isErrorWriteEcho(old, cur any) bool {
	o, ok := old.(*cachedUUID)
	n, ok2 := cur.(*cachedUUID)
	return ok && ok2 && o.UID == n.UID && o.Status.UUID == "" && n.Status.UUID == "" &&
		n.Status.State == StateError && !sameStatus(o.Status, n.Status)
}

// onDelete forgets a deleted object's failures: it needs nothing else (no
// finalizer, nothing owned), and a new object of the same name starts its
// own count of attempts, so its own failure is reported too.
func (c *Controller) onDelete(obj any) {
	if key, err := cache.DeletionHandlingObjectToName(obj); err == nil {
		c.queue.Forget(key)
	}
}

// enqueue queues obj only when it lacks a valid UUID, so objects already done
// (the whole cache at a restart, every resync) cost no queue traffic.
func (c *Controller) enqueue(logger klog.Logger, obj any) {
	u, ok := obj.(*cachedUUID)
	if !ok {
		utilruntime.HandleErrorWithLogger(logger, fmt.Errorf("unexpected object type %T", obj), "Ignoring event")
		return
	}
	if !c.needsWork(logger, u) {
		return
	}
	c.queue.Add(cache.MetaObjectToName(u))
}

// Run starts workers and blocks until ctx is cancelled. It then stops taking
// work and waits, up to ShutdownTimeout, for in-flight reconciles to finish,
// so a caller holding a lease can release it only after the last write.
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
	for range workers {
		wg.Go(func() {
			for c.processNextWorkItem(ctx) {
			}
		})
	}
	<-ctx.Done()
	logger.Info("Stopping workers", "controller", controllerName)
	c.queue.ShutDown()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-time.After(c.opts.ShutdownTimeout):
		return fmt.Errorf("workers still busy after %s", c.opts.ShutdownTimeout)
	}
}

// processNextWorkItem handles one key. It returns false when the queue is shut
// down or ctx is cancelled.
func (c *Controller) processNextWorkItem(ctx context.Context) bool {
	key, shutdown := c.queue.Get()
	if shutdown {
		return false
	}
	defer c.queue.Done(key)
	if ctx.Err() != nil {
		// Shutting down: don't start new work. The object is picked up by
		// whichever process runs next, from its own informer's list.
		return false
	}
	// A reconcile in flight is allowed to finish after ctx is cancelled, so
	// a PATCH is never cut off half-way through shutdown; it keeps ctx's
	// values (the logger) and is bounded by SyncTimeout instead.
	syncCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.opts.SyncTimeout)
	defer cancel()
	err := c.syncHandler(syncCtx, key)
	c.handleErr(syncCtx, key, err)
	return true
}

// syncUUID assigns a UUID to the object named by key unless it has one.
func (c *Controller) syncUUID(ctx context.Context, key cache.ObjectName) error {
	logger := klog.LoggerWithValues(klog.FromContext(ctx), "object", klog.KRef(key.Namespace, key.Name))
	ctx = klog.NewContext(ctx, logger)

	obj, err := c.get(key)
	if apierrors.IsNotFound(err) {
		logger.V(4).Info("Object is gone, nothing to do")
		return nil
	}
	if err != nil {
		return err
	}
	id, problem := obj.Status.UUID, obj.UUIDProblem
	if id != "" {
		// A UUID is never regenerated: not on update, resync or restart.
		logger.V(4).Info("Object already has a UUID", "uuid", id)
		if c.releasesKopfFinalizer(obj) {
			return c.releaseKopfFinalizer(ctx, obj)
		}
		return nil
	}
	if err := c.crdBlocked(); err != nil {
		return err
	}
	if problem != "" {
		// Per object, so at -v=2 like the assignment; the Warning Event
		// tells the object's owner.
		logger.V(2).Info("Replacing an invalid status", "problem", problem)
		c.event(obj, corev1.EventTypeWarning, ReasonInvalid, "Replacing invalid status: "+problem)
	}
	st := assignedStatus(c.newUUID(), obj.Status.Conditions, metav1.Now())
	if err := c.writeStatus(ctx, obj, st); err != nil {
		return err
	}
	c.metrics.Assigned.Inc()
	// Per object: at -v=0 a burst of 100,000 objects would log 100,000
	// lines; uuids_assigned_total counts them.
	logger.V(2).Info("Assigned UUID", "uuid", st.UUID)
	c.event(obj, corev1.EventTypeNormal, ReasonAssigned, "Assigned UUID "+st.UUID)
	return nil
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

// writeStatus patches st onto obj and counts the result.
func (c *Controller) writeStatus(ctx context.Context, obj *cachedUUID, st Status) error {
	err := patchStatus(ctx, c.client, obj, st)
	switch {
	case err == nil:
		c.metrics.StatusWrites.WithLabelValues("ok").Inc()
	case apierrors.IsConflict(err):
		c.metrics.StatusWrites.WithLabelValues("conflict").Inc()
	case apierrors.IsNotFound(err):
		c.metrics.StatusWrites.WithLabelValues("not_found").Inc()
	default:
		c.metrics.StatusWrites.WithLabelValues("error").Inc()
		c.metrics.PatchFailures.WithLabelValues(string(apierrors.ReasonForError(err))).Inc()
	}
	return err
}

// event posts an Event on obj, leaving out Normal ones unless asked for: an
// Event per assignment doubles the API writes of a busy controller.
func (c *Controller) event(obj *cachedUUID, eventType, reason, message string) {
	if eventType == corev1.EventTypeNormal && !c.opts.NormalEvents {
		return
	}
	c.recorder.Event(obj, eventType, reason, message)
}

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
	case c.waitsForCRD(ctx, key, err):
		// The CRD cannot take the write (crdcheck.go): kept queued, so
		// fixing the CRD heals the object with no restart or update.
		c.queue.AddRateLimited(key)
	case err == nil, apierrors.IsNotFound(err):
		// Not found: the object was deleted between the cache read and the
		// write; nothing is left to do.
		c.queue.Forget(key)
	case apierrors.IsConflict(err):
		// Another writer (a second replica, a user) changed the object since
		// our cache saw it. The next try reads the newer version and, if
		// that writer assigned a UUID, writes nothing.
		logger.V(2).Info("Conflict writing status, will retry", "object", ref)
		c.queue.AddRateLimited(key)
	case isPermanent(err):
		c.queue.Forget(key)
		c.metrics.Dropped.Inc()
		utilruntime.HandleErrorWithContext(ctx, err, "Dropping object: the apiserver rejected the request; an update of the object retries it",
			"object", ref, "attempts", attempts)
		c.markFailed(ctx, key, err)
	default:
		// Exactly at the ErrorAfter-th attempt, so a streak is reported
		// once with no record of it: the count is the queue's, which Forget
		// resets when the streak ends (success, deletion, a rejected
		// request). A conflict counts as an attempt too; should it fall on
		// the ErrorAfter-th, that streak goes unreported.
		report := attempts == c.opts.ErrorAfter
		// Two error lines a streak, when it starts and when it is reported;
		// the retries between are at -v=2, or an outage would log every
		// object at every retry.
		switch {
		case report:
			logger.Error(err, "Failed to assign UUID; reporting it on the object, retrying goes on", "object", ref,
				"attempts", attempts)
		case attempts == 1:
			logger.Error(err, "Failed to assign UUID, will retry", "object", ref, "errorAfter", c.opts.ErrorAfter)
		default:
			logger.V(2).Info("Failed to assign UUID again, will retry", "object", ref, "attempt", attempts, "err", err)
		}
		if report {
			c.markFailed(ctx, key, err)
		}
		c.queue.AddRateLimited(key)
	}
}

// isPermanent tells errors that no retry can fix: the apiserver rejected the
// request itself.
func isPermanent(err error) bool {
	return apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) || apierrors.IsNotAcceptable(err) ||
		apierrors.IsUnsupportedMediaType(err) || apierrors.IsRequestEntityTooLargeError(err)
}

// markFailed reports a failure on the object: a Warning event, and state
// Error with the error text. The write carries the same precondition as an
// assignment, so it can never hide a UUID another writer just assigned.
func (c *Controller) markFailed(ctx context.Context, key cache.ObjectName, cause error) {
	logger := klog.FromContext(ctx)
	// The attempt's own deadline may be what just failed it.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.opts.SyncTimeout)
	defer cancel()
	obj, err := c.get(key)
	if err != nil {
		return // gone, or unreadable from the cache: nothing to mark
	}
	if obj.Status.UUID != "" {
		return
	}
	c.event(obj, corev1.EventTypeWarning, ReasonFailed, "Failed to assign a UUID: "+cause.Error())
	st := errorStatus(cause, !isPermanent(cause), obj.Status.Conditions, metav1.Now())
	if sameStatus(obj.Status, st) {
		return // already says so; writing again would only wake the informer
	}
	if err := c.writeStatus(ctx, obj, st); err != nil && !apierrors.IsNotFound(err) {
		logger.Error(err, "Failed to record the error in status", "object", klog.KObj(obj))
	}
}

// baseRetryDelay is an object's first retry delay; it doubles from there.
const baseRetryDelay = 5 * time.Millisecond

// rateLimiter is per-object exponential backoff from baseRetryDelay, capped at
// maxDelay. client-go's default controller limiter also has an overall
// 10 qps bucket; it is left out because its reservations pile up: with
// 10,000 objects failing through an outage each would be retried only every
// 1,000 s, and the last some 17 minutes after the apiserver came back. The
// apiserver is protected by the client's QPS limit and its own fairness.
func rateLimiter(maxDelay time.Duration) workqueue.TypedRateLimiter[cache.ObjectName] {
	return workqueue.NewTypedItemExponentialFailureRateLimiter[cache.ObjectName](baseRetryDelay, maxDelay)
}

// backoffBefore is how long an object has been retried, in backoff alone,
// when its attempt-th attempt starts.
func backoffBefore(attempt int, maxDelay time.Duration) time.Duration {
	rl := rateLimiter(maxDelay)
	var total time.Duration
	for range attempt - 1 {
		total += rl.When(cache.ObjectName{})
	}
	return total
}
