package kopf

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"k8s.io/klog/v2"
)

// reporterMax bounds the objects a reporter keeps: past it, one line says
// so and the rest are neither named nor counted, so no number of held
// objects grows the log or the memory without bound.
const reporterMax = 16384

// reporter is the Migration without --remove-kopf-finalizer: it removes
// nothing and says how to, once per object held (not per sync or sweep),
// and keeps the keys of the objects held, which the gauge counts. It
// never decides what the controller watches: it finds held objects with
// a watch of its own on metadata only, started from the present (Run), so
// that it costs nothing per object at a start, and from the sweep and the
// workers (Release), which see those held before it started.
type reporter struct {
	cfg Config
	// retry is the wait before a failed watch starts again; a field so
	// tests can shorten it.
	retry time.Duration

	mu   sync.Mutex
	held map[types.NamespacedName]types.UID
	full bool // reporterMax objects held; said so once
}

func newReporter(cfg Config) *reporter {
	return &reporter{cfg: cfg, retry: 5 * time.Second, held: map[types.NamespacedName]types.UID{}}
}

// Release logs the fix the first time obj, whose deletion kopf's finalizer
// holds, is handed over, and keeps its key until it is seen released or
// gone; ctx's logger names the object.
func (r *reporter) Release(ctx context.Context, obj Object) error {
	if FinalizerIndex(obj) < 0 {
		return nil
	}
	key := types.NamespacedName{Namespace: obj.GetNamespace(), Name: obj.GetName()}
	r.mu.Lock()
	uid, known := r.held[key]
	said := known && uid == obj.GetUID()
	full := !known && len(r.held) >= reporterMax
	sayFull := full && !r.full
	if full {
		r.full = true
	} else if !said {
		r.held[key] = obj.GetUID()
	}
	r.mu.Unlock()
	logger := klog.FromContext(ctx)
	switch {
	case said:
	case sayFull:
		logger.Info("More objects wait for kopf's finalizer than are counted and named one by one; run the controller with --remove-kopf-finalizer (docs/migrating-from-kopf.md)",
			"counted", reporterMax)
	case !full:
		logger.Info("Object is being deleted but waits for kopf's finalizer; if the kopf operator is gone, run the controller with --remove-kopf-finalizer (docs/migrating-from-kopf.md)",
			"finalizer", Finalizer)
	}
	return nil
}

// forget drops key: its deletion is no longer held (kopf's finalizer
// removed, or the object gone).
func (r *reporter) forget(key types.NamespacedName) {
	r.mu.Lock()
	delete(r.held, key)
	r.mu.Unlock()
}

// countWith is how many objects are known held: those kept, and those
// of cached (the cache's HeldIndex) not among them.
func (r *reporter) countWith(cached []any) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := len(r.held)
	for _, obj := range cached {
		if o, ok := obj.(metav1.Object); ok {
			if _, kept := r.held[types.NamespacedName{Namespace: o.GetNamespace(), Name: o.GetName()}]; !kept {
				n++
			}
		}
	}
	return n
}

func (*reporter) Ready() error { return nil }

// Run watches every watched namespace's objects' metadata for deletions
// kopf's finalizer holds, from the present on, until ctx is cancelled. A
// narrowed watch cannot see them (an object with a UUID is not in it);
// this one keeps no object, only the keys of those held.
func (r *reporter) Run(ctx context.Context) {
	if r.cfg.Metadata == nil {
		return
	}
	namespaces := r.cfg.Namespaces
	if len(namespaces) == 0 {
		namespaces = []string{metav1.NamespaceAll}
	}
	var wg sync.WaitGroup
	for _, ns := range namespaces {
		wg.Go(func() { r.watchNamespace(ctx, ns) })
	}
	wg.Wait()
}

// watchNamespace watches ns ("" for all) from the present, and again from
// the present after the watch ends (its resourceVersion compacted away),
// until ctx is cancelled. A deletion begun in such a gap is found by the
// next event on its object, or the next sweep.
func (r *reporter) watchNamespace(ctx context.Context, ns string) {
	logger := klog.FromContext(ctx)
	failing := false
	for ctx.Err() == nil {
		err := r.watchOnce(ctx, ns)
		if ctx.Err() != nil {
			return
		}
		// Said once per streak: a refused watch would otherwise log at
		// every retry.
		if err != nil && !failing {
			logger.Error(err, "Watching for deletions held by kopf's finalizer failed; retrying", "namespace", ns)
		}
		failing = err != nil
		select {
		case <-ctx.Done():
		case <-time.After(r.retry):
		}
	}
}

// watchOnce lists one object of ns for the present resourceVersion and
// watches from it until the watch ends.
func (r *reporter) watchOnce(ctx context.Context, ns string) error {
	client := r.cfg.Metadata.Resource(r.cfg.GVR).Namespace(ns)
	list, err := client.List(ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		return fmt.Errorf("reading the resourceVersion of %s: %w", r.cfg.GVR.GroupResource(), err)
	}
	lw := &cache.ListWatch{WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
		o.AllowWatchBookmarks = true
		return client.Watch(ctx, o)
	}}
	rw, err := watchtools.NewRetryWatcherWithContext(ctx, list.GetResourceVersion(), lw)
	if err != nil {
		return fmt.Errorf("watching %s: %w", r.cfg.GVR.GroupResource(), err)
	}
	defer rw.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-rw.ResultChan():
			if !ok {
				return nil
			}
			if err := r.observe(ctx, ev); err != nil {
				return err
			}
		}
	}
}

// observe keeps the key of an object held, and forgets one no longer held.
func (r *reporter) observe(ctx context.Context, ev watch.Event) error {
	switch ev.Type {
	case watch.Error:
		err := apierrors.FromObject(ev.Object)
		if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
			return nil // start again from the present
		}
		return fmt.Errorf("watching %s: %w", r.cfg.GVR.GroupResource(), err)
	case watch.Bookmark:
		return nil
	}
	obj, ok := ev.Object.(*metav1.PartialObjectMetadata)
	if !ok {
		return errors.New("the metadata watch sent a " + fmt.Sprintf("%T", ev.Object))
	}
	key := types.NamespacedName{Namespace: obj.Namespace, Name: obj.Name}
	if ev.Type == watch.Deleted || FinalizerIndex(obj) < 0 {
		r.forget(key)
		return nil
	}
	logger := klog.LoggerWithValues(klog.FromContext(ctx), "object", klog.KObj(obj))
	return r.Release(klog.NewContext(ctx, logger), obj)
}
