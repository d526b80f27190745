package main

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/pager"
	"k8s.io/klog/v2"

	"github.com/demo-operator/uuid-controller/internal/kopf"
)

// sweepPageSize is how many objects one page of a sweep holds: the sweep's
// memory is one page, whatever the number of objects.
const sweepPageSize = 500

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

// requestSweep asks for a sweep: the watch put its narrowed informer in
// use. The leader runs it (runSweeps); a standby keeps the request until
// it leads.
func (c *Controller) requestSweep() {
	select {
	case c.sweepRequests <- struct{}{}:
	default: // one is pending already
	}
}

// runSweeps runs a sweep for each request while ctx lasts, only while the
// narrowed informer is in use: the full one holds every object already.
func (c *Controller) runSweeps(ctx context.Context) {
	logger := klog.FromContext(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.sweepRequests:
		}
		if w, ok := c.store.(*watch); !ok || !w.Narrowed() {
			continue
		}
		start := time.Now()
		found, listed, err := c.sweep(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			c.metrics.Sweeps.WithLabelValues("error").Inc()
			logger.Error(err, "Sweep for invalid status.uuid values failed; retrying in a minute", "listed", listed)
			time.AfterFunc(time.Minute, c.requestSweep)
			continue
		}
		c.metrics.Sweeps.WithLabelValues("ok").Inc()
		c.metrics.SweepInvalid.Set(float64(found))
		c.metrics.SweepDuration.Set(time.Since(start).Seconds())
		logger.Info("Swept every Uuid object for a status.uuid that is not a UUID", "listed", listed, "invalid", found,
			"duration", time.Since(start).Round(time.Millisecond))
	}
}

// sweep pages through every object in c.namespace, sweepPageSize at a
// time, and queues those whose status.uuid is set but is not a UUID.
// The first object carrying kopf's finalizer calls onKopfFinalizer.
func (c *Controller) sweep(ctx context.Context) (found, listed int, err error) {
	kopfSeen := false
	p := pager.New(func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
		return c.client.Namespace(c.namespace).List(ctx, opts)
	})
	p.PageSize = sweepPageSize
	err = p.EachListItemWithAlloc(ctx, metav1.ListOptions{}, func(obj runtime.Object) error {
		listed++
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			return nil
		}
		if slices.Contains(u.GetFinalizers(), kopf.Finalizer) && !kopfSeen {
			kopfSeen = true
			c.onKopfFinalizer()
		}
		if _, problem := existingUUID(u); problem != "" {
			found++
			key := cache.ObjectName{Namespace: u.GetNamespace(), Name: u.GetName()}
			c.strays.add(key)
			c.queue.Add(key)
		}
		return nil
	})
	if err != nil {
		return found, listed, fmt.Errorf("listing %s: %w", uuidGVR.GroupResource(), err)
	}
	return found, listed, nil
}

// read reads key from the cache or, for a stray, from the apiserver.
func (c *Controller) read(ctx context.Context, key cache.ObjectName) (*cachedUUID, error) {
	obj, err := c.get(key)
	if apierrors.IsNotFound(err) && c.strays.has(key) {
		return c.getStray(ctx, key)
	}
	return obj, err
}

// getStray reads a stray from the apiserver, by a list narrowed to its
// name (the controller may list, not get); NotFound once it is gone or has
// a UUID, when it stops being a stray.
func (c *Controller) getStray(ctx context.Context, key cache.ObjectName) (*cachedUUID, error) {
	list, err := c.client.Namespace(key.Namespace).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("metadata.name", key.Name).String(),
	})
	if err != nil {
		return nil, fmt.Errorf("reading %s, whose status.uuid is not a UUID: %w", key, err)
	}
	i := slices.IndexFunc(list.Items, func(u unstructured.Unstructured) bool { return u.GetName() == key.Name })
	if i < 0 {
		c.strays.remove(key)
		return nil, apierrors.NewNotFound(uuidGVR.GroupResource(), key.Name)
	}
	obj := toCached(&list.Items[i])
	if obj.hasUUID() {
		c.strays.remove(key)
	}
	return obj, nil
}
