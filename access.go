package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
)

// Access to the Uuid objects: whether each informer may still list and
// watch them. The apiserver checks RBAC when a request starts, so a grant
// removed while the controller runs shows only once the informer's watch
// ends and its next list or watch is refused. client-go then retries for
// ever, while the cache it synced once keeps the informer check of /readyz
// true, so without this no object there would get a UUID and nothing but
// client-go's retries would say so.

// refusalReasons are the failures that mean the controller may not read
// the objects, as opposed to a passing fault (a timeout, a restart).
var refusalReasons = []string{string(metav1.StatusReasonForbidden), string(metav1.StatusReasonUnauthorized)}

// refusal is the reason err refuses access, or "" when it does not.
func refusal(err error) string {
	switch {
	case apierrors.IsForbidden(err):
		return string(metav1.StatusReasonForbidden)
	case apierrors.IsUnauthorized(err):
		return string(metav1.StatusReasonUnauthorized)
	}
	return ""
}

// observe is what the informer of ns calls with the outcome of each list
// or watch request (nil: it succeeded). A refusal is recorded until a later
// request succeeds; any other failure changes nothing. Each change is one
// log line. A reflector calls it from one goroutine, one request at a time.
func (r *runningInformer) observe(ns string) func(context.Context, error) {
	return func(ctx context.Context, err error) {
		reason := refusal(err)
		if err != nil && reason == "" {
			return
		}
		prev, had := r.refused.Load(ns)
		logger := klog.FromContext(ctx)
		if reason == "" {
			if had {
				r.refused.Delete(ns)
				logger.Info("Listing and watching Uuid objects allowed again", "namespaces", scope(ns))
			}
			return
		}
		r.refused.Store(ns, reason)
		if prev != reason {
			logger.Error(err, "Listing or watching Uuid objects refused: no object there gets a UUID until the controller's "+
				"ServiceAccount may list and watch uuid again (docs/security.md#rbac)", "namespaces", scope(ns), "reason", reason)
		}
	}
}

// ignoreAccess is observe for an informer whose access nobody reports.
func ignoreAccess(context.Context, error) {}

// scope names ns for people: "" is every namespace.
func scope(ns string) string {
	if ns == metav1.NamespaceAll {
		return "all"
	}
	return ns
}

// refusedAccess is /readyz's "watch" check: an error naming each watched
// namespace whose informer is refused, nil when none is.
func (w *watch) refusedAccess() error {
	cur := w.cur.Load()
	if cur == nil {
		return nil
	}
	var refused []string
	for _, ns := range w.namespaces {
		if reason, ok := cur.refused.Load(ns); ok {
			refused = append(refused, fmt.Sprintf("%s (namespaces %s)", reason, scope(ns)))
		}
	}
	if len(refused) == 0 {
		return nil
	}
	return fmt.Errorf("listing or watching Uuid objects is refused: %s", strings.Join(refused, ", "))
}

// refusedCollector exports uuid_controller_watch_refused{namespace,
// reason}: 1 while the informer of namespace ("" for all) is refused for
// reason, else 0, every series from the start so that an alert on one
// works before it first happens.
type refusedCollector struct {
	w    *watch
	desc *prometheus.Desc
}

func (w *watch) refusedMetric() prometheus.Collector {
	return refusedCollector{w: w, desc: prometheus.NewDesc(metricsNamespace+"_watch_refused",
		"1 while the controller's list or watch of the Uuid objects in namespace (empty: all) is refused for reason (Forbidden, Unauthorized): no object there gets a UUID.",
		[]string{"namespace", "reason"}, nil)}
}

func (c refusedCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c refusedCollector) Collect(ch chan<- prometheus.Metric) {
	cur := c.w.cur.Load()
	for _, ns := range c.w.namespaces {
		var got any
		if cur != nil {
			got, _ = cur.refused.Load(ns)
		}
		for _, reason := range refusalReasons {
			v := 0.0
			if got == reason {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, v, ns, reason)
		}
	}
}
