// Command uuid-controller gives every demo.operator/v1 Uuid object a stable
// random UUID in its status.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"os"
	"reflect"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/demo-operator/uuid-controller/internal/crdcheck"
	"github.com/demo-operator/uuid-controller/internal/inflight"
	"github.com/demo-operator/uuid-controller/internal/kopf"
	"github.com/demo-operator/uuid-controller/internal/memlimit"
	"github.com/demo-operator/uuid-controller/internal/metricsserver"
	"github.com/demo-operator/uuid-controller/internal/nscheck"
	"github.com/demo-operator/uuid-controller/internal/version"
)

// crdFix is the remedy every CRD problem names.
const crdFix = "apply the controller's CRD: kubectl apply -f crd.yaml"

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
	if cfg.printVersion {
		fmt.Println(version.Get())
		os.Exit(0)
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
	build := version.Get()
	logger.Info("Starting uuid-controller", "version", build.Version, "revision", build.Revision, "goVersion", build.GoVersion)
	memLimit, err := memlimit.FromEnv(os.Getenv)
	if err != nil {
		return err
	}
	logger.Info("Go memory limit", "bytes", memLimit.Bytes, "source", memLimit.Source)
	setHTTP2HealthCheck(cfg.readIdle, cfg.pingTimeout)
	c, err := newClients(cfg)
	if err != nil {
		return err
	}
	metrics := NewMetrics()
	// Before the controller's queue exists, or the queue exports nothing.
	queueRegistry := registerWorkqueueMetrics()
	recorder, stopEvents := newRecorder(ctx, c.kube)
	defer stopEvents()
	nsCheck, err := newNamespaceCheck(cfg.namespaces, c.kube, metrics.Registerer())
	if err != nil {
		return err
	}
	ctrl, w, crd, err := newController(ctx, cfg, c, metrics, recorder, nsCheck)
	if err != nil {
		return err
	}
	ready := readiness(w.HasSynced, readyCheck{"watch", w.refusedAccess}, readyCheck{"crd", crd.Ready},
		readyCheck{"namespaces", nsCheck.Ready}, readyCheck{"kopf-migration-policy", ctrl.kopf.Ready})
	// Each deferred wait cancels ctx first: whatever ends run (an error, a
	// lost lease), what it waits for stops only then.
	waitServers, err := startServers(ctx, cancel, cfg, c.rest, ready, metrics, queueRegistry)
	if err != nil {
		return err
	}
	defer waitServers()
	// Standbys run the informer too, so a new leader starts with a warm
	// cache.
	defer background(cancel, func() { w.Run(ctx) })()
	// Once a wrong CRD is fixed, the objects held back are queued at once
	// rather than at the end of their backoff.
	defer background(cancel, func() { crd.Run(ctx, ctrl.requeueUnfinished) })()
	defer background(cancel, func() { nsCheck.Run(ctx) })()
	if cfg.opts.RemoveKopfFinalizer {
		logger.Info("Removing kopf's finalizer from Uuid objects being deleted", "finalizer", kopf.Finalizer)
	}
	logger.Info("Watching Uuid objects", "resource", uuidGVR.String(), "namespaces", cfg.namespaces)

	var runErr error
	work := func(ctx context.Context) { runErr = ctrl.Run(ctx, cfg.workers) }
	if !cfg.leaderElect {
		metrics.Leader.Set(1)
		work(ctx)
		return runErr
	}
	if err := runLeading(ctx, c.kube, cfg.leader, metrics, work); err != nil {
		return err
	}
	return runErr
}

// background runs f in a goroutine. The wait it returns cancels f's
// context (with cancel) and waits for f to return: deferred, it stops f
// before run returns.
func background(cancel context.CancelFunc, f func()) (wait func()) {
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	return func() { cancel(); <-done }
}

// clients are the controller's connections to the apiserver.
type clients struct {
	rest *rest.Config
	// informerDyn is the informer's client, which decodes a Uuid straight
	// into its cache entry (decode.go); its lister serves the sweep too.
	informerDyn informerClient
	kube        kubernetes.Interface
	// dyn reads the served CRD for the sweep's record (sweeprecord.go).
	dyn dynamic.Interface
	// meta reads objects' metadata only: the kopf report's watch.
	meta metadata.Interface
	disc discovery.DiscoveryInterfaceWithContext
	// status is the status transport: restPatcher, which does not decode
	// the object the apiserver returns (status.go).
	status statusPatcher
	// inFlight bounds the syncs at once; the status client reports the
	// apiserver's 429s to it.
	inFlight *inflight.Limiter
	// patch is the kopf migration's transport, which does not either.
	patch kopf.Patcher
}

// newClients builds every client from the flags' kubeconfig, tuned by
// tuneClient.
func newClients(cfg *config) (*clients, error) {
	restConfig, err := buildConfig(cfg.kubeconfig, cfg.master)
	if err != nil {
		return nil, err
	}
	tuneClient(restConfig, cfg)
	c := &clients{rest: restConfig}
	if c.informerDyn, err = newInformerClient(restConfig); err != nil {
		return nil, err
	}
	if c.kube, err = kubernetes.NewForConfig(restConfig); err != nil {
		return nil, fmt.Errorf("building clientset: %w", err)
	}
	if c.dyn, err = dynamic.NewForConfig(restConfig); err != nil {
		return nil, fmt.Errorf("building dynamic client: %w", err)
	}
	if c.meta, err = metadata.NewForConfig(restConfig); err != nil {
		return nil, fmt.Errorf("building metadata client: %w", err)
	}
	if c.disc, err = discovery.NewDiscoveryClientForConfig(restConfig); err != nil {
		return nil, fmt.Errorf("building discovery client: %w", err)
	}
	c.inFlight = newInFlight(cfg.workers)
	statusConfig := rest.CopyConfig(restConfig)
	statusConfig.Wrap(c.inFlight.WrapTransport)
	statusClient, err := newStatusClient(statusConfig)
	if err != nil {
		return nil, err
	}
	c.status = restPatcher(statusClient)
	c.patch = kopfPatcher(statusClient)
	return c, nil
}

// newRecorder posts Events through kube, and logs them at -v=3; stop
// flushes and stops it.
func newRecorder(ctx context.Context, kube kubernetes.Interface) (_ record.EventRecorder, stop func()) {
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartStructuredLogging(3)
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: kube.CoreV1().Events("")})
	return broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: controllerName}), broadcaster.Shutdown
}

// newController builds the CRD check, the controller and the watch that
// feeds it, none of them started.
func newController(ctx context.Context, cfg *config, c *clients, metrics *Metrics, recorder record.EventRecorder,
	nsCheck *nscheck.Checker) (*Controller, *watch, *crdcheck.Checker, error) {
	var w *watch
	crd, err := crdcheck.New(crdcheck.Config{
		Discovery: c.disc, Resource: uuidGVR, Kind: uuidKind,
		Status: reflect.TypeFor[Status](), Samples: statusSamples,
		Fix:     crdFix,
		Metrics: metrics.Registerer(),
		// The watch follows the CRD: narrowed while it declares the field.
		SelectableField: selectableField,
		Checked:         func() { w.Poke() },
	})
	if err != nil {
		return nil, nil, nil, err
	}
	newInf := func(namespace string, narrowed bool, observe func(context.Context, error)) informers.GenericInformer {
		return newInformer(c.informerDyn, namespace, cfg.resync, narrowed, observe)
	}
	ctrl, err := NewController(ctx, Deps{List: c.informerDyn.list, Patch: c.patch, Informer: newInf("", false, ignoreAccess), Status: c.status,
		InFlight: c.inFlight, Recorder: recorder, Metrics: metrics, CRD: crd, Metadata: c.meta, Namespaces: cfg.namespaces}, cfg.opts)
	if err != nil {
		return nil, nil, nil, err
	}
	w = newWatch(cfg.namespaces, newInf, ctrl.attach, crd.Selectable, cfg.opts.RemoveKopfFinalizer, metrics.WatchNarrowed)
	w.onWatchError = func() { crd.Suspect(); nsCheck.Poke() }
	if err := metrics.Registry.Register(w.refusedMetric()); err != nil {
		return nil, nil, nil, fmt.Errorf("registering the watch's metric: %w", err)
	}
	ctrl.useWatch(w, cfg.namespaces)
	if cfg.leaderElect {
		ctrl.sweeps.record = leaseRecord{kube: c.kube, dyn: c.dyn, namespace: cfg.leader.Namespace, name: cfg.leader.Name}
	}
	return ctrl, w, crd, nil
}

// startServers starts the health server and the metrics server. The wait
// it returns cancels ctx (with cancel) and waits for both to stop.
func startServers(ctx context.Context, cancel context.CancelFunc, cfg *config, rc *rest.Config, ready func() []notReady,
	metrics *Metrics, queueRegistry *prometheus.Registry) (wait func(), err error) {
	waitHealth, err := serveProbes(ctx, "health", cfg.healthAddr, healthHandler(ready))
	if err != nil {
		return nil, err
	}
	stopHealth := func() { cancel(); waitHealth() }
	page, tlsConfig := metricsHandler(metrics.Registry, queueRegistry), (*tls.Config)(nil)
	if serverEnabled(cfg.metricsAddr) {
		secure := cfg.secureMetrics
		secure.Name = controllerName
		if page, tlsConfig, err = metricsserver.Secure(ctx, secure, rc, metrics.Registerer(), page); err != nil {
			stopHealth()
			return nil, err
		}
	}
	waitMetrics, err := serve(ctx, "metrics", cfg.metricsAddr, tlsConfig, page)
	if err != nil {
		stopHealth()
		return nil, err
	}
	return func() { cancel(); waitMetrics(); waitHealth() }, nil
}

// tuneClient sets what the controller asks of every client: its rate limit
// (none by default) and user agent, and no gzip. Since 1.37 the apiserver
// compresses a watch-list stream (the informer's initial state) when asked,
// and Go's transport asks by default; on the apiserver's own network that
// costs both sides CPU at a restart and saves nothing (BENCHMARKS.md).
func tuneClient(rc *rest.Config, cfg *config) {
	rc.QPS = float32(cfg.qps)
	rc.Burst = cfg.burst
	rc.UserAgent = controllerName
	rc.DisableCompression = true
}

// setHTTP2HealthCheck sets how soon a silently dead apiserver connection (a
// firewall or NAT that forgot the flow) is noticed: after readIdle without
// a frame read the connection is pinged, and closed if the ping is not
// answered within ping, so requests and watches reconnect. client-go reads
// these from the environment when it builds a transport
// (k8s.io/apimachinery/pkg/util/net), so they are set before any client
// is; its defaults (30 s and 15 s) take 45 s, past the leader's 10 s renew
// deadline.
func setHTTP2HealthCheck(readIdle, ping time.Duration) {
	os.Setenv("HTTP2_READ_IDLE_TIMEOUT_SECONDS", strconv.Itoa(int(readIdle/time.Second)))
	os.Setenv("HTTP2_PING_TIMEOUT_SECONDS", strconv.Itoa(int(ping/time.Second)))
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
