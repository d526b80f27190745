package main

import (
	"errors"
	"fmt"
	"time"

	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// Options tune a Controller. A zero field takes its value from
// defaultOptions; the flags of the same name set them.
type Options struct {
	// ErrorAfter (--error-after) is the failed attempt at which a failure
	// is reported on the object: state Error in its status and a Warning
	// Event. Retrying goes on; only a request the apiserver rejects as
	// malformed is given up at once.
	ErrorAfter int
	// MaxRetryDelay (--max-retry-delay) caps the per-object exponential
	// backoff, so an object that failed all through an outage is retried
	// within this long of the apiserver's return.
	MaxRetryDelay time.Duration
	// SyncTimeout bounds one reconcile's API calls.
	SyncTimeout time.Duration
	// ShutdownTimeout (--shutdown-timeout) bounds how long Run waits for
	// in-flight reconciles after its context is cancelled.
	ShutdownTimeout time.Duration
	// NormalEvents (--event-level Normal) posts Normal events (an
	// assignment) as well as Warnings.
	NormalEvents bool
	// RemoveKopfFinalizer removes kopf's finalizer from objects being
	// deleted (internal/kopf, Migration). Off by default: it needs patch on uuid itself.
	RemoveKopfFinalizer bool
}

// defaultOptions are the defaults of Options and of their flags.
func defaultOptions() Options {
	return Options{
		// The 15th attempt comes about 82 s into retrying (see
		// backoffBefore): past a blip, before an operator would look.
		ErrorAfter: 15,
		// client-go's default cap is 1,000 s, which an outage would add
		// to every failed object's recovery.
		MaxRetryDelay:   time.Minute,
		SyncTimeout:     30 * time.Second,
		ShutdownTimeout: 10 * time.Second,
	}
}

func (o Options) withDefaults() Options {
	d := defaultOptions()
	if o.ErrorAfter == 0 {
		o.ErrorAfter = d.ErrorAfter
	}
	if o.MaxRetryDelay == 0 {
		o.MaxRetryDelay = d.MaxRetryDelay
	}
	if o.SyncTimeout == 0 {
		o.SyncTimeout = d.SyncTimeout
	}
	if o.ShutdownTimeout == 0 {
		o.ShutdownTimeout = d.ShutdownTimeout
	}
	return o
}

// validate checks o as it is. NewController fills in the defaults first;
// the flags are checked without, so a flag set to 0 is an error rather
// than its default.
func (o Options) validate() error {
	var errs []error
	if o.ErrorAfter < 1 {
		errs = append(errs, fmt.Errorf("--error-after must be at least 1, got %d", o.ErrorAfter))
	}
	if o.MaxRetryDelay <= 0 {
		errs = append(errs, fmt.Errorf("--max-retry-delay must be positive, got %s", o.MaxRetryDelay))
	}
	if o.SyncTimeout <= 0 {
		errs = append(errs, fmt.Errorf("the sync timeout must be positive, got %s", o.SyncTimeout))
	}
	if o.ShutdownTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--shutdown-timeout must be positive, got %s", o.ShutdownTimeout))
	}
	return errors.Join(errs...)
}

// baseRetryDelay is an object's first retry delay; it doubles from there.
const baseRetryDelay = 5 * time.Millisecond

// rateLimiter is per-object exponential backoff from baseRetryDelay, capped at
// maxDelay, without client-go's overall 10 qps bucket, whose reservations
// pile up through an outage (docs/design.md); the apiserver's API Priority
// and Fairness (and --kube-api-qps, when set) protect the apiserver.
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
