package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/demo-operator/uuid-controller/internal/kopf"
)

// sweepPageSize is how many objects one page of a sweep asks for. A page
// is read as a stream, one object at a time, so the sweep's memory is one
// object's bytes, whatever the number or the size of the objects.
const sweepPageSize = 500

// sweeper finds, for the leader of a narrowed watch, the objects that
// watch cannot see: those whose status.uuid is set but is not a UUID.
type sweeper struct {
	// list lists the objects, one page at a time, as a stream.
	list pageLister
	// namespaces (nil for all) are what a sweep lists.
	namespaces []string
	// narrowed tells whether the narrowed informer is in use (watch.go):
	// the full one holds every object already, so no sweep is needed.
	narrowed func() bool
	// enqueue queues a key for the workers.
	enqueue func(cache.ObjectName)
	// onKopfHeld runs for each object a sweep finds being deleted and held
	// by kopf's finalizer (the kopf migration's Release, which without
	// --remove-kopf-finalizer names it once); ctx's logger names the
	// object. It changes nothing about the watch: a narrowed watch cannot
	// see such an object, and the sweep, which lists every object anyway,
	// is what finds it.
	onKopfHeld func(ctx context.Context, obj kopf.Object)
	metrics    *Metrics
	// record keeps the CRD of the last clean sweep (sweeprecord.go); nil
	// sweeps at every request (no leader election: no Lease to keep it).
	record sweepRecord
	// strays are the invalid objects found, until each has a UUID.
	strays strays
	// requests asks the leader for a sweep.
	requests chan struct{}
}

func newSweeper(list pageLister, enqueue func(cache.ObjectName), metrics *Metrics) *sweeper {
	return &sweeper{
		list:       list,
		narrowed:   func() bool { return false },
		enqueue:    enqueue,
		onKopfHeld: func(context.Context, kopf.Object) {},
		metrics:    metrics,
		strays:     strays{keys: map[cache.ObjectName]struct{}{}},
		requests:   make(chan struct{}, 1),
	}
}

// strays are the keys of objects a sweep found with a status.uuid that is
// not a UUID (kopf's "NA", or anything written under an older CRD). A
// narrowed watch cannot see them (they do not select as empty), so the
// worker reads each from the apiserver instead of the cache, until it has
// a UUID or is gone. Only keys are kept: such objects are rare.
type strays struct {
	mu   sync.Mutex
	keys map[cache.ObjectName]struct{}
}

func (s *strays) add(k cache.ObjectName) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.keys[k] = struct{}{}
}

func (s *strays) has(k cache.ObjectName) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.keys[k]
	return ok
}

func (s *strays) remove(k cache.ObjectName) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.keys, k)
}

// request asks for a sweep: the watch put its narrowed informer in use.
// The leader runs it (run); a standby keeps the request until it leads.
func (s *sweeper) request() {
	select {
	case s.requests <- struct{}{}:
	default: // one is pending already
	}
}

// run runs a sweep for each request while ctx lasts, only while the
// narrowed informer is in use, and unless a clean sweep is recorded under
// the CRD served now (skip).
func (s *sweeper) run(ctx context.Context) {
	logger := klog.FromContext(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.requests:
		}
		if !s.narrowed() {
			continue
		}
		crd, skip := s.skip(ctx)
		if skip {
			s.metrics.Sweeps.WithLabelValues("skipped").Inc()
			logger.Info("Not sweeping: a sweep found every status.uuid valid under the CRD served now, whose pattern refuses any other value",
				"crd", crd)
			continue
		}
		start := time.Now()
		n, err := s.sweep(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			s.metrics.Sweeps.WithLabelValues("error").Inc()
			logger.Error(err, "Sweep for invalid status.uuid values failed; retrying in a minute",
				"listed", n.listed, "expiredTokens", n.expired)
			time.AfterFunc(time.Minute, s.request)
			continue
		}
		if n.found == 0 && crd != "" {
			if err := s.record.Record(ctx, crd); err != nil {
				logger.Error(err, "Could not record the clean sweep; the next leader sweeps again")
			}
		}
		s.metrics.Sweeps.WithLabelValues("ok").Inc()
		s.metrics.SweepInvalid.Set(float64(n.found))
		s.metrics.SweepDuration.Set(time.Since(start).Seconds())
		logger.Info("Swept every Uuid object for a status.uuid that is not a UUID", "listed", n.listed, "invalid", n.found,
			"kopfFinalizer", n.kopf, "kopfHeld", n.kopfHeld, "expiredTokens", n.expired, "duration", time.Since(start).Round(time.Millisecond))
	}
}

// skip tells whether a sweep can be skipped: a clean one is recorded under
// the CRD served now. crd is that CRD ("" when unknown: no record kept,
// or the CRD or the record unreadable, which is said, and swept over).
// A sweep that found invalid values is not recorded: the next leader
// sweeps again, and records it once they have been replaced.
func (s *sweeper) skip(ctx context.Context) (crd string, skip bool) {
	if s.record == nil {
		return "", false
	}
	logger := klog.FromContext(ctx)
	crd, err := s.record.CRD(ctx)
	if err != nil {
		logger.Info("Sweeping: could not read the CRD to tell whether a clean sweep is recorded under it", "err", err)
		return "", false
	}
	recorded, err := s.record.Recorded(ctx)
	if err != nil {
		logger.Info("Sweeping: could not read the record of the last clean sweep", "err", err)
		return crd, false
	}
	return crd, recorded == crd
}

// sweepCounts are what one sweep saw: objects found invalid, objects
// listed, continue tokens that expired on the way, objects carrying kopf's
// finalizer, and those of them being deleted.
type sweepCounts struct {
	found, listed, expired int
	kopf, kopfHeld         int
}

// sweep pages through every object in each of s.namespaces (all when
// none), sweepPageSize at a time, each page read as a stream (pageLister),
// and queues those whose status.uuid is set but is not a UUID. Each object
// held in deletion by kopf's finalizer goes to onKopfHeld. A namespace whose
// list fails does not stop the others.
func (s *sweeper) sweep(ctx context.Context) (sweepCounts, error) {
	namespaces := s.namespaces
	if len(namespaces) == 0 {
		namespaces = []string{metav1.NamespaceAll}
	}
	var n sweepCounts
	var errs []error
	for _, ns := range namespaces {
		if err := s.sweepNamespace(ctx, ns, &n); err != nil {
			errs = append(errs, err)
		}
	}
	return n, errors.Join(errs...)
}

// sweepNamespace is sweep over namespace ns ("" for all), adding to n.
//
// A continue token names a revision, and the apiserver compacts etcd every
// 5 minutes, which a sweep over a million objects outlasts: the next page
// then fails with 410 Expired. That answer carries a token for the same
// next key at the latest revision, and the sweep goes on from it rather
// than starting over (which would never finish). Pages after it are newer
// than those before; the sweep looks for values written before it began,
// which they still show.
func (s *sweeper) sweepNamespace(ctx context.Context, ns string, n *sweepCounts) error {
	opts := metav1.ListOptions{Limit: sweepPageSize}
	for {
		page, err := s.list(ctx, ns, opts, func(c *cachedUUID) error { s.check(ctx, c, n); return nil })
		if err != nil {
			if next := continueAfterExpiry(err); opts.Continue != "" && next != "" && next != opts.Continue {
				n.expired++
				opts.Continue = next
				continue
			}
			if ns == metav1.NamespaceAll {
				return fmt.Errorf("listing %s (%d listed): %w", uuidGVR.GroupResource(), n.listed, err)
			}
			return fmt.Errorf("listing %s in namespace %s (%d listed): %w", uuidGVR.GroupResource(), ns, n.listed, err)
		}
		if opts.Continue = page.Continue; opts.Continue == "" {
			return nil
		}
	}
}

// continueAfterExpiry is the continue token a 410 Expired answer to a
// paginated list carries, or "".
func continueAfterExpiry(err error) string {
	var status apierrors.APIStatus
	if !apierrors.IsResourceExpired(err) || !errors.As(err, &status) {
		return ""
	}
	return status.Status().Continue
}

// check counts u into n, queues it when its status.uuid is set but is not
// a UUID, and hands it to onKopfHeld when kopf's finalizer holds its
// deletion.
func (s *sweeper) check(ctx context.Context, u *cachedUUID, n *sweepCounts) {
	n.listed++
	if u.carriesKopfFinalizer() {
		n.kopf++
		if kopf.FinalizerIndex(u) >= 0 {
			n.kopfHeld++
			logger := klog.LoggerWithValues(klog.FromContext(ctx), "object", klog.KObj(u))
			s.onKopfHeld(klog.NewContext(ctx, logger), u)
		}
	}
	if u.uuidProblem() != "" {
		n.found++
		key := cache.ObjectName{Namespace: u.GetNamespace(), Name: u.GetName()}
		s.strays.add(key)
		s.enqueue(key)
	}
}

// getStray reads a stray from the apiserver, by a list narrowed to its
// name (the controller may list, not get) read as a stream; NotFound once
// it is gone or has a UUID, when it stops being a stray.
func (s *sweeper) getStray(ctx context.Context, key cache.ObjectName) (*cachedUUID, error) {
	var obj *cachedUUID
	_, err := s.list(ctx, key.Namespace, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("metadata.name", key.Name).String(),
	}, func(c *cachedUUID) error {
		if c.GetName() == key.Name {
			obj = c
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading %s, whose status.uuid is not a UUID: %w", key, err)
	}
	if obj == nil {
		s.strays.remove(key)
		return nil, apierrors.NewNotFound(uuidGVR.GroupResource(), key.Name)
	}
	if obj.hasUUID() {
		s.strays.remove(key)
	}
	return obj, nil
}
