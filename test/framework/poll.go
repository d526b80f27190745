package framework

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// pollInterval is how often Poll checks.
const pollInterval = 100 * time.Millisecond

// Poll calls check every 100 ms until it returns nil, and fails with its
// last error, naming what it waited for, once timeout passes or ctx ends.
// A call the deadline cut short does not hide the error before it.
func Poll(ctx context.Context, timeout time.Duration, what string, check func(context.Context) error) error {
	var last error
	err := wait.PollUntilContextTimeout(ctx, pollInterval, timeout, true, func(ctx context.Context) (bool, error) {
		err := check(ctx)
		if err != nil && last != nil && ctx.Err() != nil {
			// The deadline cut this call short: the call before says why.
			return false, nil
		}
		last = err
		return last == nil, nil
	})
	if err != nil {
		return fmt.Errorf("waiting %s for %s: %w (last: %v)", timeout, what, err, last)
	}
	return nil
}

// PollTrue is Poll for a condition that has no error of its own: it
// waits until cond returns true.
func PollTrue(ctx context.Context, timeout time.Duration, what string, cond func() bool) error {
	return Poll(ctx, timeout, what, func(context.Context) error {
		if !cond() {
			return errNotYet
		}
		return nil
	})
}

// errNotYet is PollTrue's last error while cond is false.
var errNotYet = errors.New("not yet")

// Reaches calls read every 50 ms for up to 5 s until it returns want, and
// returns its last value: a count read right after a client saw a status
// can trail it (a client counts a write when the response arrives, the
// apiserver may answer before its audit event is written).
func Reaches[T comparable](want T, read func() T) T {
	var v T
	// Only the timeout ends the wait, and then the last value is the answer.
	_ = wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		v = read()
		return v == want, nil
	})
	return v
}

// Settled calls read every 300 ms until it returns the same value twice in
// a row, and returns that value; it fails if read fails or the value is
// still changing after timeout.
func Settled(ctx context.Context, timeout time.Duration, read func() (float64, error)) (float64, error) {
	prev := -1.0
	err := wait.PollUntilContextTimeout(ctx, 300*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		v, err := read()
		if err != nil || v == prev {
			return err == nil, err
		}
		prev = v
		return false, nil
	})
	if wait.Interrupted(err) {
		return prev, fmt.Errorf("still changing after %s (last %v)", timeout, prev)
	}
	return prev, err
}
