// Command uuid-controller gives every demo.operator/v1 Uuid object a stable
// random UUID in its status.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
)

func main() {
	klog.InitFlags(nil)
	cfg, err := parseFlags(flag.CommandLine, os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "uuid-controller:", err)
		os.Exit(2)
	}
	ctx := klog.NewContext(setupSignalHandler(), klog.Background())
	if err := run(ctx, cfg); err != nil {
		klog.FromContext(ctx).Error(err, "uuid-controller failed")
		klog.FlushAndExit(klog.ExitFlushTimeout, 1)
	}
	klog.Flush()
}

// run wires clients, informer, events, servers and the controller, and
// returns once ctx is cancelled (or the leader lease is lost) and the work in
// flight has finished.
func run(ctx context.Context, cfg *config) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	logger := klog.FromContext(ctx)
	restConfig, err := buildConfig(cfg.kubeconfig, cfg.master)
	if err != nil {
		return err
	}
	restConfig.QPS = float32(cfg.qps)
	restConfig.Burst = cfg.burst
	restConfig.UserAgent = controllerName
	dyn, err := dynamic.NewForConfig(restConfig)
	if err != nil {
		return fmt.Errorf("building dynamic client: %w", err)
	}
	kube, err := kubernetes.NewForConfig(restConfig)
	if err != nil {
		return fmt.Errorf("building clientset: %w", err)
	}

	metrics := NewMetrics()
	queueRegistry := registerWorkqueueMetrics()

	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartStructuredLogging(3)
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: kube.CoreV1().Events("")})
	defer broadcaster.Shutdown()
	recorder := broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: controllerName})

	factory := dynamicinformer.NewFilteredDynamicSharedInformerFactory(dyn, cfg.resync, cfg.namespace, nil)
	informer := factory.ForResource(uuidGVR)
	ctrl, err := NewController(ctx, dyn, informer, recorder, metrics, cfg.opts)
	if err != nil {
		return err
	}
	disc, err := discovery.NewDiscoveryClientForConfig(restConfig)
	if err != nil {
		return fmt.Errorf("building discovery client: %w", err)
	}
	crd := newCRDChecker(disc, metrics.CRDReady)
	ctrl.useCRDChecker(crd)
	ready := readiness(informer.Informer().HasSynced, crd.Ready)

	waitHealth, err := serve(ctx, "health", cfg.healthAddr, nil, healthHandler(ready))
	if err != nil {
		return err
	}
	// Each deferred wait cancels ctx first: whatever ends run (an error, a
	// lost lease), what it waits for stops only then.
	defer func() { cancel(); waitHealth() }()
	metricsPage, metricsTLS, err := secureMetrics(ctx, cfg.metricsAddr, cfg.secureMetrics, restConfig, metrics, metricsHandler(metrics.Registry, queueRegistry))
	if err != nil {
		return err
	}
	waitMetrics, err := serve(ctx, "metrics", cfg.metricsAddr, metricsTLS, metricsPage)
	if err != nil {
		return err
	}
	defer func() { cancel(); waitMetrics() }()

	// Start does not block. Standbys run the informer too, so a new leader
	// starts with a warm cache.
	factory.Start(ctx.Done())
	defer func() { cancel(); factory.Shutdown() }()
	crdDone := make(chan struct{})
	go func() { defer close(crdDone); crd.Run(ctx) }()
	defer func() { cancel(); <-crdDone }()
	if cfg.opts.RemoveKopfFinalizer {
		logger.Info("Removing kopf's finalizer from Uuid objects being deleted", "finalizer", kopfFinalizer)
	}
	logger.Info("Watching Uuid objects", "resource", uuidGVR.String(), "namespace", cfg.namespace)

	var runErr error
	work := func(ctx context.Context) { runErr = ctrl.Run(ctx, cfg.workers) }
	if !cfg.leaderElect {
		metrics.Leader.Set(1)
		work(ctx)
		return runErr
	}
	if err := runLeading(ctx, kube, cfg.leader, metrics, work); err != nil {
		return err
	}
	return runErr
}

// buildConfig picks the API server config: --kubeconfig or --master when
// given, else $KUBECONFIG, else the in-cluster config, else ~/.kube/config.
func buildConfig(kubeconfig, master string) (*rest.Config, error) {
	if kubeconfig == "" && master == "" && os.Getenv(clientcmd.RecommendedConfigPathEnvVar) == "" {
		cfg, err := rest.InClusterConfig()
		if err == nil {
			return cfg, nil
		}
		if !errors.Is(err, rest.ErrNotInCluster) {
			return nil, fmt.Errorf("loading in-cluster config: %w", err)
		}
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	overrides := &clientcmd.ConfigOverrides{}
	if master != "" {
		overrides.ClusterInfo.Server = master
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("building kubeconfig: %w", err)
	}
	return cfg, nil
}
