package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/demo-operator/uuid-controller/test/framework"
)

// fieldManager names the benchmark's own writes.
const fieldManager = "uuid-bench"

func createNamespace(ctx context.Context, kube kubernetes.Interface, name string) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := kube.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating namespace %s: %w", name, err)
	}
	return nil
}

// objectNames is prefix-000000 ... for n objects.
func objectNames(prefix string, n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("%s%06d", prefix, i)
	}
	return names
}

// loader creates objects in one namespace, optionally patching each one's
// status right after its create (the raw loop).
type loader struct {
	client dynamic.ResourceInterface
	// concurrency is the number of goroutines sending requests.
	concurrency int
	// patch, when set, writes a status to every object after its create,
	// the same merge PATCH with a resourceVersion precondition the
	// controller sends.
	patch bool
	// onCreated is called with each object's name when its create call
	// has returned.
	onCreated func(name string, at time.Time)
	// retries counts requests sent again after a transient error.
	retries atomic.Int64
}

// run sends the requests for every name, concurrency at a time, and returns
// the first error (which stops the others).
func (l *loader) run(ctx context.Context, names []string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		next     atomic.Int64
		wg       sync.WaitGroup
		once     sync.Once
		firstErr error
	)
	for range min(l.concurrency, len(names)) {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(names) || ctx.Err() != nil {
					return
				}
				if err := l.one(ctx, names[i]); err != nil {
					once.Do(func() { firstErr = err; cancel() })
					return
				}
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	return ctx.Err()
}

func (l *loader) one(ctx context.Context, name string) error {
	var obj *unstructured.Unstructured
	err := l.retry(ctx, "create "+name, func(attempt int) error {
		var err error
		obj, err = l.client.Create(ctx, framework.NewUuid(name), metav1.CreateOptions{FieldManager: fieldManager})
		if apierrors.IsAlreadyExists(err) && attempt > 1 {
			// An earlier attempt did land before its response was lost.
			obj, err = l.client.Get(ctx, name, metav1.GetOptions{})
		}
		return err
	})
	if err != nil {
		return err
	}
	if l.onCreated != nil {
		l.onCreated(name, time.Now())
	}
	if !l.patch {
		return nil
	}
	body, err := statusPatch(obj.GetResourceVersion())
	if err != nil {
		return err
	}
	return l.retry(ctx, "patch status of "+name, func(int) error {
		_, err := l.client.Patch(ctx, name, types.MergePatchType, body,
			metav1.PatchOptions{FieldManager: fieldManager}, "status")
		return err
	})
}

// statusPatch is the body the controller sends for a new object: state,
// message and a fresh UUID, with the read resourceVersion as precondition.
func statusPatch(resourceVersion string) ([]byte, error) {
	b, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"resourceVersion": resourceVersion},
		"status": map[string]any{
			"state":   "Ok",
			"message": "resource created successfully",
			"uuid":    uuid.NewString(),
		},
	})
	if err != nil {
		return nil, fmt.Errorf("encoding status patch: %w", err)
	}
	return b, nil
}

const maxAttempts = 5

// retry calls f until it succeeds, fails with an error no retry can fix,
// or maxAttempts is reached.
func (l *loader) retry(ctx context.Context, what string, f func(attempt int) error) error {
	var err error
	for attempt := 1; attempt <= maxAttempts; attempt++ {
		if err = f(attempt); err == nil {
			return nil
		}
		if !transient(err) || ctx.Err() != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		l.retries.Add(1)
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w", what, context.Cause(ctx))
		case <-time.After(time.Duration(attempt) * 100 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s: giving up after %d attempts: %w", what, maxAttempts, err)
}

// transient tells errors that a busy apiserver may answer and that a later
// try may not get.
func transient(err error) bool {
	var ne net.Error
	return apierrors.IsTooManyRequests(err) || apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) ||
		apierrors.IsServiceUnavailable(err) || apierrors.IsInternalError(err) ||
		(errors.As(err, &ne) && ne.Timeout())
}
