package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// pendingSelector selects the objects still waiting for a UUID: an absent
// status.uuid selects as the empty string. It needs the CRD to declare
// status.uuid a selectable field (crd.yaml does; Kubernetes 1.31+).
const pendingSelector = "status.uuid="

// selectableField is the field the narrowed watch selects on.
const selectableField = "status.uuid"

// newInformer is the informer on uuidGVR in namespace ("" for all), over
// every object, or only the pending ones when narrowed. It has no index of
// its own: the controller reads objects by key, and the namespace index a
// shared informer factory adds costs memory for every object (attach adds
// the kopf index, which costs only for the objects it holds).
func newInformer(dyn informerClient, namespace string, resync time.Duration, narrowed bool,
	observe func(context.Context, error)) informers.GenericInformer {
	var tweak dynamicinformer.TweakListOptionsFunc
	if narrowed {
		tweak = func(o *metav1.ListOptions) { o.FieldSelector = pendingSelector }
	}
	return newCachedInformer(dyn, namespace, resync, tweak, observe)
}

// watchModes tells which informer the CRD allows: narrowed is whether the
// served CRD declares status.uuid selectable, known whether that has been
// read yet (crdcheck.Checker.Selectable).
type watchModes func() (narrowed, known bool)

// watch runs the controller's informer: narrowed to the objects still
// waiting for a UUID wherever the served CRD allows it, else over every
// object. When that changes (crd.yaml applied over the kopf article's CRD,
// or the other way), it starts the other informer, switches to it once it
// has synced, and stops the old one, without a restart. It is the
// controller's store: reads go to the informer in use.
type watch struct {
	// namespaces are the namespaces watched, one informer each ("" alone:
	// one informer over all namespaces).
	namespaces []string
	// newInformer builds the informer of one namespace, narrowed or not;
	// attach sets the controller's transform and handlers on it before it
	// starts.
	newInformer func(namespace string, narrowed bool, observe func(context.Context, error)) informers.GenericInformer
	attach      func(cache.SharedIndexInformer) error
	modes       watchModes
	// forceFull keeps the full informer whatever the CRD allows: the
	// operator's --remove-kopf-finalizer, under which the migration must
	// see every object being deleted. Nothing an object carries sets it.
	forceFull bool
	// onNarrowed runs each time the narrowed informer is put in use, so
	// what it cannot see (a status.uuid that is not a UUID) is looked for.
	onNarrowed func()
	// onWatchError runs when a list or watch fails: main's asks the CRD
	// check to look again at once, since a narrowed list fails when the
	// CRD loses the selectable field.
	onWatchError func()
	// changed wakes Run: the CRD check completed, or the watch failed.
	changed chan struct{}
	// narrowedGauge is uuid_controller_watch_narrowed.
	narrowedGauge prometheus.Gauge

	cur atomic.Pointer[runningInformer]
}

// runningInformer is the set of informers started by watch, one per
// watched namespace, all narrowed or all not, all feeding the same
// handlers (and so the controller's one queue).
type runningInformer struct {
	// infs holds each namespace's informer by name; "" is the one
	// informer over all namespaces.
	infs map[string]cache.SharedIndexInformer
	// refused holds each namespace whose last list or watch was refused
	// (access.go), with the reason (string → string) until a request
	// succeeds: a scoped install not yet granted there, or a grant removed.
	refused  sync.Map
	narrowed bool
	stop     context.CancelFunc
	done     chan struct{}
}

// newWatch is a watch over namespaces (nil or [""]: all); Run starts it.
func newWatch(namespaces []string, newInformer func(string, bool, func(context.Context, error)) informers.GenericInformer, attach func(cache.SharedIndexInformer) error,
	modes watchModes, forceFull bool, gauge prometheus.Gauge) *watch {
	if len(namespaces) == 0 {
		namespaces = []string{metav1.NamespaceAll}
	}
	return &watch{namespaces: namespaces, newInformer: newInformer, attach: attach, modes: modes, forceFull: forceFull,
		changed: make(chan struct{}, 1), narrowedGauge: gauge, onNarrowed: func() {}, onWatchError: func() {}}
}

// Poke asks Run to look at the modes again: the CRD check completed, or a
// list or watch failed (a narrowed one fails at once when the CRD loses
// the selectable field).
func (w *watch) Poke() {
	select {
	case w.changed <- struct{}{}:
	default:
	}
}

// want is the informer the CRD allows now, and whether that is known.
func (w *watch) want() (narrowed, known bool) {
	if w.forceFull {
		return false, true
	}
	return w.modes()
}

// Run starts the informer the CRD allows, once the first CRD check has
// completed or failed, and keeps it matching the CRD until ctx ends; it
// returns once its informers have stopped.
func (w *watch) Run(ctx context.Context) {
	logger := klog.FromContext(ctx)
	if w.forceFull {
		w.Poke() // nothing to wait for
	}
	defer func() {
		if cur := w.cur.Load(); cur != nil {
			cur.stop()
			<-cur.done
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.changed:
		}
		narrowed, known := w.want()
		cur := w.cur.Load()
		if cur != nil && (!known || cur.narrowed == narrowed) {
			continue
		}
		next, err := w.start(ctx, narrowed)
		if err != nil {
			logger.Error(err, "Could not start the Uuid informer")
			continue
		}
		if cur != nil && !w.waitSynced(ctx, next) {
			// The CRD changed back, or ctx ended, before it synced.
			next.stop()
			<-next.done
			continue
		}
		w.cur.Store(next)
		w.report(logger, narrowed, cur != nil)
		if cur != nil {
			cur.stop()
			<-cur.done
		}
		if narrowed {
			w.onNarrowed()
		}
	}
}

// start starts the informers of every watched namespace, narrowed or not.
func (w *watch) start(ctx context.Context, narrowed bool) (*runningInformer, error) {
	ictx, stop := context.WithCancel(ctx)
	r := &runningInformer{infs: make(map[string]cache.SharedIndexInformer, len(w.namespaces)),
		narrowed: narrowed, stop: stop, done: make(chan struct{})}
	for _, ns := range w.namespaces {
		inf := w.newInformer(ns, narrowed, r.observe(ns)).Informer()
		if err := w.attach(inf); err != nil {
			stop()
			return nil, err
		}
		if err := inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, refl *cache.Reflector, err error) {
			cache.DefaultWatchErrorHandler(ctx, refl, err)
			w.onWatchError()
		}); err != nil {
			stop()
			return nil, fmt.Errorf("setting the watch error handler: %w", err)
		}
		r.infs[ns] = inf
	}
	var running sync.WaitGroup
	for _, inf := range r.infs {
		running.Go(func() { inf.RunWithContext(ictx) })
	}
	go func() { running.Wait(); close(r.done) }()
	return r, nil
}

// synced tells whether every informer of r has synced; with
// skipForbidden, but those of named namespaces that refused their list as
// Forbidden (the one informer over all namespaces is never skipped: with
// nothing else to serve, the workers wait for it as before).
func (r *runningInformer) synced(skipForbidden bool) bool {
	for ns, inf := range r.infs {
		if inf.HasSynced() {
			continue
		}
		if reason, _ := r.refused.Load(ns); skipForbidden && ns != metav1.NamespaceAll && reason == string(metav1.StatusReasonForbidden) {
			continue
		}
		return false
	}
	return true
}

// waitSynced waits for next to sync while the CRD still allows it; false
// when the CRD changed back or ctx ended first.
func (w *watch) waitSynced(ctx context.Context, next *runningInformer) bool {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for !next.synced(true) {
		select {
		case <-ctx.Done():
			return false
		case <-w.changed:
			if narrowed, known := w.want(); known && narrowed != next.narrowed {
				return false
			}
		case <-tick.C:
		}
	}
	return true
}

// report says once, in the log and on a gauge, which informer is in use.
func (w *watch) report(logger klog.Logger, narrowed, switched bool) {
	if narrowed {
		w.narrowedGauge.Set(1)
		logger.Info("Watching only the Uuid objects still waiting for a UUID", "fieldSelector", pendingSelector, "switched", switched)
		return
	}
	w.narrowedGauge.Set(0)
	if w.forceFull {
		logger.Info("Watching every Uuid object: --remove-kopf-finalizer must see each object being deleted", "switched", switched)
		return
	}
	logger.Info("Watching and caching every Uuid object: the served CRD does not declare status.uuid a selectable field "+
		"(Kubernetes before 1.31, or a CRD from before this controller, such as the kopf article's); "+
		"apply the controller's CRD (kubectl apply -f crd.yaml) to watch only the objects waiting for a UUID",
		"switched", switched)
}

// GetByKey reads key from the informer in use for the key's namespace.
func (w *watch) GetByKey(key string) (any, bool, error) {
	cur := w.cur.Load()
	if cur == nil {
		return nil, false, nil
	}
	inf, ok := cur.infs[metav1.NamespaceAll]
	if !ok {
		ns, _, err := cache.SplitMetaNamespaceKey(key)
		if err != nil {
			return nil, false, err
		}
		if inf, ok = cur.infs[ns]; !ok {
			return nil, false, nil // a namespace not watched
		}
	}
	return inf.GetStore().GetByKey(key)
}

// List is every object the informers in use hold.
func (w *watch) List() []any {
	cur := w.cur.Load()
	if cur == nil {
		return nil
	}
	if inf, ok := cur.infs[metav1.NamespaceAll]; ok {
		return inf.GetStore().List()
	}
	var all []any
	for _, inf := range cur.infs {
		all = append(all, inf.GetStore().List()...)
	}
	return all
}

// ByIndex is the objects the informers in use file under value of index.
func (w *watch) ByIndex(index, value string) ([]any, error) {
	cur := w.cur.Load()
	if cur == nil {
		return nil, nil
	}
	var all []any
	for ns, inf := range cur.infs {
		objs, err := inf.GetIndexer().ByIndex(index, value)
		if err != nil {
			return nil, fmt.Errorf("reading index %s of the informer of namespace %q: %w", index, ns, err)
		}
		all = append(all, objs...)
	}
	return all, nil
}

// HasSynced tells whether informers are in use and all have synced:
// /readyz's informer check.
func (w *watch) HasSynced() bool {
	cur := w.cur.Load()
	return cur != nil && cur.synced(false)
}

// Servable tells whether informers are in use and all have synced but
// those of namespaces not granted (Forbidden): the workers start then, so
// one namespace a scoped install may not read yet does not stop the others
// being served. Its informer keeps retrying, and serves it once granted;
// meanwhile the namespace check and HasSynced keep /readyz at 503.
func (w *watch) Servable() bool {
	cur := w.cur.Load()
	return cur != nil && cur.synced(true)
}

// Narrowed tells whether the informer in use is the narrowed one.
func (w *watch) Narrowed() bool {
	cur := w.cur.Load()
	return cur != nil && cur.narrowed
}
