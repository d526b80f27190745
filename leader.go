package main

import (
	"context"
	"fmt"
	"os"
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
	// that is not renewed. Default 15 s, as in Kubernetes' own components.
	LeaseDuration time.Duration
	// RenewDeadline is how long the leader keeps retrying a renewal before it
	// gives up leading. Default 10 s.
	RenewDeadline time.Duration
	// RetryPeriod is the wait between tries. Default 2 s.
	RetryPeriod time.Duration
}

// runLeading runs work while this process holds the lease. It returns when
// ctx is cancelled (after work has returned and the lease is released, so
// the next leader starts as soon as this one's last write is done) or when
// the lease is lost (after work has returned).
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
	// returned: cancelling it releases the lease, and no write guarded by
	// the lease may happen after that.
	leCtx, leCancel := context.WithCancel(context.WithoutCancel(ctx))
	defer leCancel()
	workDone := make(chan struct{})
	started := make(chan struct{})
	elector, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   cfg.LeaseDuration,
		RenewDeadline:   cfg.RenewDeadline,
		RetryPeriod:     cfg.RetryPeriod,
		ReleaseOnCancel: true,
		Name:            controllerName,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(leadCtx context.Context) {
				defer close(workDone)
				close(started)
				metrics.Leader.Set(1)
				defer metrics.Leader.Set(0)
				workCtx, cancel := context.WithCancel(leadCtx)
				defer cancel()
				stop := context.AfterFunc(ctx, cancel)
				defer stop()
				work(workCtx)
			},
			OnStoppedLeading: func() {
				logger.Info("Stopped leading", "identity", id)
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
	select {
	case <-started:
		<-workDone
	default:
	}
	leCancel()
	<-elected
	if ctx.Err() == nil {
		logger.Info("Leader lease lost, exiting", "lease", klog.KRef(cfg.Namespace, cfg.Name))
	}
	return nil
}
