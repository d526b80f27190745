package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/google/uuid"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"
)

// LeaderElection configures --leader-elect.
type LeaderElection struct {
	// Namespace and Name of the coordination.k8s.io Lease.
	Namespace, Name string
	// LeaseDuration is how long standbys wait before taking over a lease
	// that is not renewed.
	LeaseDuration time.Duration
	// RenewDeadline is how long the leader keeps retrying a renewal before it
	// gives up leading.
	RenewDeadline time.Duration
	// RetryPeriod is the wait between tries.
	RetryPeriod time.Duration
}

// defaultLeaderElection is the defaults of the --leader-elect flags: the
// timings of Kubernetes' own components. An empty Namespace is filled in
// after parsing (defaultLeaseNamespace), so an empty flag means it too.
func defaultLeaderElection() LeaderElection {
	return LeaderElection{
		Name:          controllerName,
		LeaseDuration: 15 * time.Second,
		RenewDeadline: 10 * time.Second,
		RetryPeriod:   2 * time.Second,
	}
}

// errLeaseLost ends a leader that could not renew its lease (an apiserver
// or etcd outage longer than the renew deadline, a lease taken over). The
// process exits non-zero, as Kubernetes' own components do, and restarts as
// a standby with a fresh view of the world. As the cause of the work's
// context it also cancels the writes in flight (Controller.Run).
var errLeaseLost = errors.New("leader lease lost")

// runLeading runs work while this process holds the lease, and stops
// writing before it lets go: whether ctx is cancelled (SIGTERM) or the
// lease is lost, work returns first (after a SIGTERM its writes in flight
// finish, after a loss they are cancelled), then the elector stops, and
// only then is the lease released, if this process still holds it. So the
// next leader's first write comes after this one's last. It returns nil
// when ctx is cancelled and errLeaseLost when the lease is lost.
//
// client-go's ReleaseOnCancel is not used: it releases the lease before
// cancelling the context work runs under.
func runLeading(ctx context.Context, client kubernetes.Interface, cfg LeaderElection, metrics *Metrics, work func(context.Context)) error {
	logger := klog.FromContext(ctx)
	host, err := os.Hostname()
	if err != nil {
		return fmt.Errorf("getting hostname for the leader identity: %w", err)
	}
	// The random suffix keeps two processes on one host apart.
	id := host + "_" + uuid.NewString()
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, cfg.Namespace, cfg.Name,
		client.CoreV1(), client.CoordinationV1(), resourcelock.ResourceLockConfig{Identity: id})
	if err != nil {
		return fmt.Errorf("building the leader election lock: %w", err)
	}

	// The elector gets a context of its own, cancelled only after work has
	// returned, so it renews the lease for as long as work may write.
	leCtx, leCancel := context.WithCancel(context.WithoutCancel(ctx))
	defer leCancel()
	workDone := make(chan struct{})
	// leading is set by the elector's goroutine when work starts, stopping
	// by this one when it stops waiting for the lease; under mu, exactly
	// one of them sees the other's flag, so work never starts unawaited.
	var (
		mu                sync.Mutex
		leading, stopping bool
	)
	elector, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:          lock,
		LeaseDuration: cfg.LeaseDuration,
		RenewDeadline: cfg.RenewDeadline,
		RetryPeriod:   cfg.RetryPeriod,
		Name:          controllerName,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(leadCtx context.Context) {
				mu.Lock()
				if stopping {
					mu.Unlock()
					return
				}
				leading = true
				mu.Unlock()
				defer close(workDone)
				metrics.Leader.Set(1)
				defer metrics.Leader.Set(0)
				// Not a child of leadCtx, whose cancellation carries no
				// cause: whichever of the two ends comes first names it.
				workCtx, cancel := context.WithCancelCause(context.WithoutCancel(leadCtx))
				defer cancel(nil)
				stopLost := context.AfterFunc(leadCtx, func() { cancel(errLeaseLost) })
				defer stopLost()
				stopCtx := context.AfterFunc(ctx, func() { cancel(context.Cause(ctx)) })
				defer stopCtx()
				work(workCtx)
			},
			OnStoppedLeading: func() {
				// client-go calls this on every exit, led or not.
				mu.Lock()
				led := leading
				mu.Unlock()
				if led {
					logger.Info("Stopped leading", "identity", id)
				}
			},
			OnNewLeader: func(holder string) {
				logger.Info("Leader observed", "leader", holder, "self", holder == id)
			},
		},
	})
	if err != nil {
		return fmt.Errorf("configuring leader election: %w", err)
	}
	logger.Info("Waiting for the leader lease", "lease", klog.KRef(cfg.Namespace, cfg.Name), "identity", id)
	elected := make(chan struct{})
	go func() {
		defer close(elected)
		elector.Run(klog.NewContext(leCtx, logger))
	}()

	select {
	case <-ctx.Done():
	case <-elected:
		// Run returns on its own only when the lease was lost.
	}
	mu.Lock()
	stopping = true
	wasLeading := leading
	mu.Unlock()
	if wasLeading {
		<-workDone
	}
	leCancel()
	<-elected
	if wasLeading {
		releaseLease(ctx, lock, id, cfg.RenewDeadline)
	}
	if ctx.Err() != nil {
		return nil
	}
	return fmt.Errorf("%w: %s", errLeaseLost, klog.KRef(cfg.Namespace, cfg.Name))
}

// releaseLease clears the lease's holder if it is still id, as client-go's
// ReleaseOnCancel would, so a standby takes over at once rather than after
// the lease duration. The update is conditional on the lease's
// resourceVersion from the read, so a lease taken over meanwhile is left
// alone. A failure only delays the takeover, so it is logged, not returned.
func releaseLease(ctx context.Context, lock resourcelock.Interface, id string, timeout time.Duration) {
	logger := klog.FromContext(ctx)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	rec, _, err := lock.Get(ctx)
	if err != nil {
		logger.Error(err, "Could not read the leader lease to release it; the next leader waits for it to expire", "lease", lock.Describe())
		return
	}
	if rec.HolderIdentity != id {
		return // taken over, or released
	}
	now := metav1.NewTime(time.Now())
	err = lock.Update(ctx, resourcelock.LeaderElectionRecord{
		LeaderTransitions:    rec.LeaderTransitions,
		LeaseDurationSeconds: 1,
		AcquireTime:          now,
		RenewTime:            now,
	})
	if err != nil {
		logger.Error(err, "Could not release the leader lease; the next leader waits for it to expire", "lease", lock.Describe())
		return
	}
	logger.Info("Released the leader lease", "lease", lock.Describe())
}
