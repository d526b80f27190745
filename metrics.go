package main

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"k8s.io/client-go/util/workqueue"

	"github.com/demo-operator/uuid-controller/internal/version"
)

const metricsNamespace = "uuid_controller"

// Metrics are the controller's own counters. They live on a private registry
// so tests can build as many controllers as they like. Other packages
// register theirs on it through Registerer: internal/crdcheck,
// internal/kopf and internal/metricsserver (docs/metrics.md lists them by
// package).
type Metrics struct {
	Registry *prometheus.Registry
	// Assigned counts UUIDs written to a status.
	Assigned prometheus.Counter
	// StatusWrites counts status PATCH requests sent, by result
	// (ok, conflict, not_found, error), whatever they carried.
	StatusWrites *prometheus.CounterVec
	// PatchFailures counts failed status writes other than conflicts and
	// deletions, by reason (the apiserver's status reason, e.g. Forbidden).
	PatchFailures *prometheus.CounterVec
	// Dropped counts objects given up on because the apiserver rejected
	// the request as malformed; every other failure is retried.
	Dropped prometheus.Counter
	// Leader is 1 while this process holds the lease (or runs without
	// leader election).
	Leader prometheus.Gauge
	// AssignmentLatency observes, per UUID assigned, the seconds from the
	// object's creationTimestamp to the successful status write.
	AssignmentLatency prometheus.Histogram
	// WatchNarrowed is 1 while the informer in use watches only the
	// objects waiting for a UUID (watch.go), 0 while it watches every one.
	WatchNarrowed prometheus.Gauge
	// Sweeps counts sweeps for a status.uuid that is not a UUID
	// (sweep.go), by result (ok, error, skipped).
	Sweeps *prometheus.CounterVec
	// SweepInvalid is how many objects the last sweep found with a
	// status.uuid that is not a UUID; SweepDuration how long it took.
	SweepInvalid, SweepDuration prometheus.Gauge
}

// NewMetrics builds the controller metrics plus Go and process collectors.
func NewMetrics() *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		Assigned: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: metricsNamespace, Name: "uuids_assigned_total",
			Help: "UUIDs assigned and written to an object's status.",
		}),
		StatusWrites: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: metricsNamespace, Name: "status_writes_total",
			Help: "Status PATCH requests sent, by result.",
		}, []string{"result"}),
		PatchFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: metricsNamespace, Name: "patch_failures_total",
			Help: "Failed status PATCH requests, excluding conflicts and deleted objects, by reason.",
		}, []string{"reason"}),
		Dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: metricsNamespace, Name: "dropped_total",
			Help: "Objects given up on because the apiserver rejected the status write as malformed.",
		}),
		Leader: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: metricsNamespace, Name: "leader",
			Help: "1 while this process is the active controller.",
		}),
		AssignmentLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: metricsNamespace, Name: "assignment_latency_seconds",
			Help: "Seconds from an object's creationTimestamp (whole seconds, so up to 1 s early) to the status write that assigned its UUID.",
			// From the apiserver's one-second timestamp resolution up to
			// the hour an outage or a stopped controller can take.
			Buckets: []float64{0.5, 1, 2, 5, 10, 30, 60, 300, 900, 3600},
		}),
		WatchNarrowed: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: metricsNamespace, Name: "watch_narrowed",
			Help: "1 while the controller lists and watches only the Uuid objects waiting for a UUID (fieldSelector status.uuid=); 0 while it caches every object, because the served CRD does not declare status.uuid selectable or --remove-kopf-finalizer is on.",
		}),
		Sweeps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: metricsNamespace, Name: "sweeps_total",
			Help: "Paginated lists of every Uuid object, made by the leader of a narrowed watch to find a status.uuid that is not a UUID, by result (skipped: a clean sweep is recorded under the CRD served now).",
		}, []string{"result"}),
		SweepInvalid: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: metricsNamespace, Name: "sweep_invalid_objects",
			Help: "Uuid objects the last sweep found with a status.uuid that is not a UUID (each is then given one).",
		}),
		SweepDuration: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: metricsNamespace, Name: "sweep_duration_seconds",
			Help: "Seconds the last successful sweep took.",
		}),
	}
	for _, result := range []string{"ok", "error", "skipped"} {
		m.Sweeps.WithLabelValues(result)
	}
	// Known results are exported as 0 from the start, so a rate over them
	// works before the first write and a missing series means a rename.
	for _, result := range []string{"ok", "conflict", "not_found", "error"} {
		m.StatusWrites.WithLabelValues(result)
	}
	// Constant 1, its labels the running build, as kube-state-metrics and
	// Prometheus export theirs: join on it to see versions during a rollout.
	buildInfo := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: metricsNamespace, Name: "build_info",
		Help: "1, labelled with the running build's version, git revision and Go version.",
	}, []string{"version", "revision", "goversion"})
	build := version.Get()
	buildInfo.WithLabelValues(build.Version, build.Revision, build.GoVersion).Set(1)
	m.Registry.MustRegister(buildInfo)
	m.Registry.MustRegister(m.Assigned, m.StatusWrites, m.PatchFailures, m.Dropped, m.Leader, m.AssignmentLatency,
		m.WatchNarrowed, m.Sweeps, m.SweepInvalid, m.SweepDuration,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Registerer is where another package registers its metrics: on the
// controller's registry, each name prefixed with uuid_controller_.
func (m *Metrics) Registerer() prometheus.Registerer {
	return prometheus.WrapRegistererWithPrefix(metricsNamespace+"_", m.Registry)
}

// workqueue metrics are process-global in client-go (SetProvider takes effect
// once), so they get one registry of their own and the metrics handler gathers
// it beside the controller's.
var (
	workqueueMetricsOnce sync.Once
	workqueueMetrics     = newWorkqueueProvider()
)

// registerWorkqueueMetrics makes every named workqueue export depth, adds,
// latency, work duration, unfinished work, longest running processor and
// retries, under the names client-go's own components use.
func registerWorkqueueMetrics() *prometheus.Registry {
	workqueueMetricsOnce.Do(func() { workqueue.SetProvider(workqueueMetrics) })
	return workqueueMetrics.registry
}

type workqueueProvider struct {
	registry                   *prometheus.Registry
	depth, unfinished, longest *prometheus.GaugeVec
	adds, retries              *prometheus.CounterVec
	latency, workDuration      *prometheus.HistogramVec
}

func newWorkqueueProvider() *workqueueProvider {
	buckets := prometheus.ExponentialBuckets(1e-6, 10, 10)
	p := &workqueueProvider{
		registry: prometheus.NewRegistry(),
		depth: prometheus.NewGaugeVec(prometheus.GaugeOpts{Subsystem: "workqueue", Name: "depth",
			Help: "Current depth of the workqueue."}, []string{"name"}),
		adds: prometheus.NewCounterVec(prometheus.CounterOpts{Subsystem: "workqueue", Name: "adds_total",
			Help: "Total adds handled by the workqueue."}, []string{"name"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Subsystem: "workqueue", Name: "queue_duration_seconds",
			Help: "Seconds an item stays in the workqueue before being requested.", Buckets: buckets}, []string{"name"}),
		workDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Subsystem: "workqueue", Name: "work_duration_seconds",
			Help: "Seconds processing an item from the workqueue takes.", Buckets: buckets}, []string{"name"}),
		unfinished: prometheus.NewGaugeVec(prometheus.GaugeOpts{Subsystem: "workqueue", Name: "unfinished_work_seconds",
			Help: "Seconds of work in progress not yet observed by work_duration."}, []string{"name"}),
		longest: prometheus.NewGaugeVec(prometheus.GaugeOpts{Subsystem: "workqueue", Name: "longest_running_processor_seconds",
			Help: "Seconds the longest running processor has been running."}, []string{"name"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{Subsystem: "workqueue", Name: "retries_total",
			Help: "Total retries handled by the workqueue."}, []string{"name"}),
	}
	p.registry.MustRegister(p.depth, p.adds, p.latency, p.workDuration, p.unfinished, p.longest, p.retries)
	return p
}

func (p *workqueueProvider) NewDepthMetric(name string) workqueue.GaugeMetric {
	return p.depth.WithLabelValues(name)
}
func (p *workqueueProvider) NewAddsMetric(name string) workqueue.CounterMetric {
	return p.adds.WithLabelValues(name)
}
func (p *workqueueProvider) NewLatencyMetric(name string) workqueue.HistogramMetric {
	return p.latency.WithLabelValues(name)
}
func (p *workqueueProvider) NewWorkDurationMetric(name string) workqueue.HistogramMetric {
	return p.workDuration.WithLabelValues(name)
}
func (p *workqueueProvider) NewUnfinishedWorkSecondsMetric(name string) workqueue.SettableGaugeMetric {
	return p.unfinished.WithLabelValues(name)
}
func (p *workqueueProvider) NewLongestRunningProcessorSecondsMetric(name string) workqueue.SettableGaugeMetric {
	return p.longest.WithLabelValues(name)
}
func (p *workqueueProvider) NewRetriesMetric(name string) workqueue.CounterMetric {
	return p.retries.WithLabelValues(name)
}
