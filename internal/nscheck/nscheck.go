// Package nscheck tells whether each namespace a scoped controller watches
// exists and may be read. Listing a namespace that does not exist returns
// an empty list, not an error, so without this check a misspelt or not yet
// created namespace would leave the controller idle and silent.
package nscheck

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
)

// The problems a namespace can have: the label reason of the gauge.
const (
	// NotFound: the namespace does not exist (yet). Its informer watches
	// it all the same, so objects created in it once it exists are served.
	NotFound = "NotFound"
	// Forbidden: the controller may not get the namespace, so its RBAC
	// does not reach it (a Role there grants get on it, see docs/install.md).
	Forbidden = "Forbidden"
)

// reasons are every problem, each exported as a series from the start so
// that an alert on one works before it first happens.
var reasons = []string{NotFound, Forbidden}

// DefaultInterval is how often each namespace is read when nothing pokes
// the check sooner; ProblemInterval, while one has a problem, so a
// namespace created or granted later clears soon after.
const (
	DefaultInterval = 30 * time.Second
	ProblemInterval = 5 * time.Second
)

// Getter reads a namespace (client-go's typed NamespaceInterface has it).
type Getter interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.Namespace, error)
}

// Config configures a Checker.
type Config struct {
	// Namespaces reads each namespace by name.
	Namespaces Getter
	// Names are the watched namespaces.
	Names []string
	// Interval is how often each is read, and Retry while one has a
	// problem. Default: DefaultInterval and ProblemInterval.
	Interval, Retry time.Duration
	// Registerer gets the gauge <MetricsNamespace>_namespace_problem.
	Registerer       prometheus.Registerer
	MetricsNamespace string
}

// Checker reads each watched namespace periodically and when poked (a
// watch failed), and reports those missing or forbidden: one log line
// when a namespace's problem changes, the gauge, and Ready. A nil
// Checker (every namespace watched) checks nothing and is always ready.
type Checker struct {
	cfg   Config
	gauge *prometheus.GaugeVec
	poke  chan struct{}

	mu sync.Mutex
	// problems maps a namespace with a problem to it and its error.
	problems map[string]problem
}

type problem struct {
	reason string
	err    error
}

// New is a Checker over cfg.Names; Run starts it.
func New(cfg Config) (*Checker, error) {
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Retry <= 0 {
		cfg.Retry = ProblemInterval
	}
	gauge := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: cfg.MetricsNamespace, Name: "namespace_problem",
		Help: "1 while a watched namespace (--namespace) has the problem reason: NotFound, or Forbidden (the controller may not get it).",
	}, []string{"namespace", "reason"})
	if err := cfg.Registerer.Register(gauge); err != nil {
		return nil, fmt.Errorf("registering the namespace problem gauge: %w", err)
	}
	for _, ns := range cfg.Names {
		for _, r := range reasons {
			gauge.WithLabelValues(ns, r).Set(0)
		}
	}
	return &Checker{cfg: cfg, gauge: gauge, poke: make(chan struct{}, 1), problems: map[string]problem{}}, nil
}

// Poke asks for a check soon: a list or watch failed, and a namespace
// deleted or no longer granted is one reason it may have.
func (c *Checker) Poke() {
	if c == nil {
		return
	}
	select {
	case c.poke <- struct{}{}:
	default:
	}
}

// Run checks every namespace at once, then every Interval (Retry while
// one has a problem) and when poked, until ctx ends.
func (c *Checker) Run(ctx context.Context) {
	if c == nil {
		return
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		c.CheckAll(ctx)
		next := c.cfg.Interval
		if c.Ready() != nil {
			next = c.cfg.Retry
		}
		timer.Reset(next)
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-c.poke:
		}
	}
}

// CheckAll reads every watched namespace once and records what it found.
func (c *Checker) CheckAll(ctx context.Context) {
	for _, ns := range c.cfg.Names {
		c.check(ctx, ns)
	}
}

// check reads namespace ns. An error other than NotFound or Forbidden
// (the apiserver unreachable) tells nothing about the namespace: what was
// known is kept, and the informers' own errors report the outage.
func (c *Checker) check(ctx context.Context, ns string) {
	logger := klog.LoggerWithValues(klog.FromContext(ctx), "namespace", ns)
	_, err := c.cfg.Namespaces.Get(ctx, ns, metav1.GetOptions{})
	var now *problem
	switch {
	case err == nil:
	case apierrors.IsNotFound(err):
		now = &problem{NotFound, fmt.Errorf("watched namespace %s does not exist", ns)}
	case apierrors.IsForbidden(err):
		now = &problem{Forbidden, fmt.Errorf("the controller may not get watched namespace %s (grant get on it with a Role there): %w", ns, err)}
	default:
		if ctx.Err() == nil {
			logger.V(2).Info("Could not read a watched namespace; keeping its last known state", "err", err)
		}
		return
	}
	c.mu.Lock()
	before, had := c.problems[ns]
	if now == nil {
		delete(c.problems, ns)
	} else {
		c.problems[ns] = *now
	}
	c.mu.Unlock()
	for _, r := range reasons {
		v := 0.0
		if now != nil && now.reason == r {
			v = 1
		}
		c.gauge.WithLabelValues(ns, r).Set(v)
	}
	switch {
	case now == nil && had:
		logger.Info("Watched namespace is available again; its objects are served", "was", before.reason)
	case now != nil && (!had || before.reason != now.reason):
		switch now.reason {
		case NotFound:
			logger.Info("Watched namespace does not exist: nothing in it is served until it is created (no restart needed); check --namespace",
				"reason", now.reason)
		default:
			logger.Error(err, "Watched namespace may not be read: grant the controller's Role in it (docs/install.md#installing-into-one-namespace)",
				"reason", now.reason)
		}
	}
}

// Ready is nil while every watched namespace exists and may be read, else
// an error naming each that does not and why: /readyz's "namespaces" check.
func (c *Checker) Ready() error {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.problems) == 0 {
		return nil
	}
	names := make([]string, 0, len(c.problems))
	for ns := range c.problems {
		names = append(names, ns)
	}
	sort.Strings(names)
	errs := make([]error, 0, len(names))
	for _, ns := range names {
		errs = append(errs, fmt.Errorf("%s: %w", c.problems[ns].reason, c.problems[ns].err))
	}
	return errors.Join(errs...)
}
