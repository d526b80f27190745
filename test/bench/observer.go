package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	"github.com/demo-operator/uuid-controller/test/cluster"
)

// observer watches one namespace and records, per object whose name has
// prefix, when the create call that made it returned and when the watch
// first delivered it with a non-empty status.uuid.
type observer struct {
	prefix string
	client dynamic.ResourceInterface
	cancel context.CancelFunc
	done   chan struct{}
	notify chan struct{} // a value is sent (without blocking) on every first sighting

	mu      sync.Mutex
	created map[string]time.Time // create call returned
	seen    map[string]sighting
	err     error // the watch ended before it was stopped
	relists int   // times the watch expired and the namespace was listed again
}

type sighting struct {
	at      time.Time   // when this process decoded the event
	created metav1.Time // the object's creationTimestamp (1 s resolution)
}

// observe starts a watch on ns from the namespace's current resourceVersion,
// so only changes after the call are seen. The watch is re-established on
// its own if the apiserver closes it, and after it expires (410) from a new
// list. Call stop when done.
func observe(ctx context.Context, dyn dynamic.Interface, ns, prefix string) (*observer, error) {
	client := dyn.Resource(cluster.UuidGVR).Namespace(ns)
	// A list of one item still carries the collection's current resourceVersion.
	list, err := client.List(ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		return nil, fmt.Errorf("listing %s to start a watch: %w", ns, err)
	}
	wctx, cancel := context.WithCancel(ctx)
	w, err := watchFrom(wctx, client, list.GetResourceVersion())
	if err != nil {
		cancel()
		return nil, err
	}
	o := &observer{
		prefix:  prefix,
		client:  client,
		cancel:  cancel,
		done:    make(chan struct{}),
		notify:  make(chan struct{}, 1),
		created: map[string]time.Time{},
		seen:    map[string]sighting{},
	}
	go o.run(wctx, w)
	return o, nil
}

// watchFrom watches client's objects from resourceVersion rv on.
func watchFrom(ctx context.Context, client dynamic.ResourceInterface, rv string) (*watchtools.RetryWatcher, error) {
	w, err := watchtools.NewRetryWatcherWithContext(ctx, rv, &cache.ListWatch{
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			return client.Watch(ctx, opts)
		},
	})
	if err != nil {
		return nil, fmt.Errorf("watching from resourceVersion %s: %w", rv, err)
	}
	return w, nil
}

func (o *observer) run(ctx context.Context, w *watchtools.RetryWatcher) {
	defer close(o.done)
	defer func() { w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-w.ResultChan():
			if !ok {
				o.fail(errors.New("watch closed"))
				return
			}
			if expired(ev) {
				next, err := o.relist(ctx)
				if err != nil {
					o.fail(err)
					return
				}
				w.Stop()
				w = next
				continue
			}
			o.handle(ev)
		}
	}
}

// expired tells whether ev ends a watch whose resourceVersion the
// apiserver no longer holds events from (410), as a watch that falls
// behind a burst can.
func expired(ev watch.Event) bool {
	if ev.Type != watch.Error {
		return false
	}
	err := apierrors.FromObject(ev.Object)
	return apierrors.IsResourceExpired(err) || apierrors.IsGone(err)
}

// relist catches up after the watch expired: it lists the namespace, takes
// every object in it as seen now (which can be later than a watch would
// have delivered it, so latencies err long), and watches again from the
// list's resourceVersion.
func (o *observer) relist(ctx context.Context) (*watchtools.RetryWatcher, error) {
	o.mu.Lock()
	o.relists++
	o.mu.Unlock()
	opts := metav1.ListOptions{Limit: 500}
	rv := ""
	for {
		list, err := o.client.List(ctx, opts)
		if err != nil {
			return nil, fmt.Errorf("listing again after the watch expired: %w", err)
		}
		for i := range list.Items {
			o.handle(watch.Event{Type: watch.Added, Object: &list.Items[i]})
		}
		if rv == "" {
			rv = list.GetResourceVersion() // every page is of the first one's snapshot
		}
		if opts.Continue = list.GetContinue(); opts.Continue == "" {
			return watchFrom(ctx, o.client, rv)
		}
	}
}

// relisted is how many times the watch expired and was started again
// from a list.
func (o *observer) relisted() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.relists
}

func (o *observer) handle(ev watch.Event) {
	now := time.Now()
	switch ev.Type {
	case watch.Added, watch.Modified:
	case watch.Error:
		o.fail(fmt.Errorf("watch error: %v", ev.Object))
		return
	default:
		return
	}
	u, ok := ev.Object.(*unstructured.Unstructured)
	if !ok || !strings.HasPrefix(u.GetName(), o.prefix) {
		return
	}
	if id, _, _ := unstructured.NestedString(u.Object, "status", "uuid"); id == "" {
		return
	}
	o.mu.Lock()
	if _, dup := o.seen[u.GetName()]; !dup {
		o.seen[u.GetName()] = sighting{at: now, created: u.GetCreationTimestamp()}
	}
	o.mu.Unlock()
	select {
	case o.notify <- struct{}{}:
	default:
	}
}

func (o *observer) fail(err error) {
	o.mu.Lock()
	if o.err == nil {
		o.err = err
	}
	o.mu.Unlock()
	select {
	case o.notify <- struct{}{}:
	default:
	}
}

// stop ends the watch and waits for its goroutine.
func (o *observer) stop() {
	o.cancel()
	<-o.done
}

// markCreated records that the create call for name returned at t.
func (o *observer) markCreated(name string, t time.Time) {
	o.mu.Lock()
	o.created[name] = t
	o.mu.Unlock()
}

// wait blocks until n objects have been seen with a UUID, the watch fails,
// or ctx ends.
func (o *observer) wait(ctx context.Context, n int) error {
	for {
		o.mu.Lock()
		got, err := len(o.seen), o.err
		o.mu.Unlock()
		if got >= n {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%d of %d objects seen with a UUID: %w", got, n, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d of %d objects seen with a UUID: %w", got, n, context.Cause(ctx))
		case <-o.notify:
		}
	}
}

// lastSeen is the latest first sighting.
func (o *observer) lastSeen() time.Time {
	o.mu.Lock()
	defer o.mu.Unlock()
	var last time.Time
	for _, s := range o.seen {
		if s.at.After(last) {
			last = s.at
		}
	}
	return last
}

// latencies returns, for every created object seen with a UUID, the time
// from its create call's return to the sighting, and the time from its
// creationTimestamp to the sighting. A sighting before the create call's
// response was read (possible: the watch and the response race) counts as
// 0; negative is how many did.
func (o *observer) latencies() (fromCreate, fromTimestamp []time.Duration, negative int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	fromCreate = make([]time.Duration, 0, len(o.created))
	fromTimestamp = make([]time.Duration, 0, len(o.created))
	for name, c := range o.created {
		s, ok := o.seen[name]
		if !ok {
			continue
		}
		d := s.at.Sub(c)
		if d < 0 {
			negative++
			d = 0
		}
		fromCreate = append(fromCreate, d)
		fromTimestamp = append(fromTimestamp, s.at.Sub(s.created.Time))
	}
	return fromCreate, fromTimestamp, negative
}
