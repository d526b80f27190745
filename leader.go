package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/google/uuid"
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
// a standby with a fresh view of the world.
var errLeaseLost = errors.New("leader lease lost")

// runLeading runs work while this process holds the lease. It returns nil
// when ctx is cancelled (after work has returned and the lease is released,
// so the next leader starts as soon as this one's last write is done), and
// errLeaseLost when the lease is lost (after work has returned).
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
	// returned: cancelling it releases the lease, so the next leader starts
	// after this one's last write. (If reconciles outlast
	// --shutdown-timeout, work returns without them; a write of theirs that
	// lands late is still guarded by its resourceVersion precondition.)
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
		Lock:            lock,
		LeaseDuration:   cfg.LeaseDuration,
		RenewDeadline:   cfg.RenewDeadline,
		RetryPeriod:     cfg.RetryPeriod,
		ReleaseOnCancel: true,
		Name:            controllerName,
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
				workCtx, cancel := context.WithCancel(leadCtx)
				defer cancel()
				stop := context.AfterFunc(ctx, cancel)
				defer stop()
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
	if ctx.Err() != nil {
		return nil
	}
	return fmt.Errorf("%w: %s", errLeaseLost, klog.KRef(cfg.Namespace, cfg.Name))
}
