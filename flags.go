package main

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/tools/leaderelection"

	"github.com/demo-operator/uuid-controller/internal/metricsserver"
)

// config is everything main reads from the command line.
type config struct {
	kubeconfig, master string
	namespace          string
	workers            int
	resync             time.Duration
	qps                float64
	burst              int
	// readIdle and pingTimeout are client-go's HTTP/2 health check of the
	// apiserver connection.
	readIdle, pingTimeout time.Duration
	healthAddr            string
	metricsAddr           string
	secureMetrics         metricsserver.Config
	eventLevel            string
	leaderElect           bool
	leader                LeaderElection
	// printVersion: print the build's version and exit (--version).
	printVersion bool
	// opts is the controller's options, NormalEvents from eventLevel.
	opts Options
	// namespaces is namespace split (splitNamespaces): nil for all.
	namespaces []string
}

// serviceAccountNamespaceFile holds the pod's namespace inside a cluster; a
// variable so a test can point it elsewhere.
var serviceAccountNamespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// parseFlags registers the controller's flags on fs, parses args and checks
// the values against each other. klog's flags are registered by the caller.
func parseFlags(fs *flag.FlagSet, args []string) (*config, error) {
	d := defaultOptions()
	c := &config{opts: d, leader: defaultLeaderElection()}
	fs.StringVar(&c.kubeconfig, "kubeconfig", "", "Path to a kubeconfig. Default: $KUBECONFIG, then the in-cluster config, then ~/.kube/config.")
	fs.StringVar(&c.master, "master", "", "The address of the Kubernetes API server. Overrides any value in kubeconfig.")
	fs.StringVar(&c.namespace, "namespace", "", "Watch Uuid objects in these namespaces only: one name, or a comma-separated list (team-a,team-b). Default: all namespaces.")
	fs.IntVar(&c.workers, "workers", defaultWorkers, fmt.Sprintf("Most objects reconciled at once. The controller runs from %d up to this many, more while keys queue and the apiserver answers fast, fewer when it pushes back (429, slow answers).", minInFlight))
	fs.IntVar(&c.opts.ErrorAfter, "error-after", d.ErrorAfter, fmt.Sprintf("Failed attempts on an object (about %s of backoff by default) before its status says state Error and a Warning Event is posted. Retrying goes on.",
		backoffBefore(d.ErrorAfter, d.MaxRetryDelay).Round(time.Second)))
	fs.DurationVar(&c.opts.MaxRetryDelay, "max-retry-delay", d.MaxRetryDelay, fmt.Sprintf("Cap on an object's exponential retry backoff (%s doubling).", baseRetryDelay))
	fs.DurationVar(&c.resync, "resync", 10*time.Minute, "How often every cached object is re-checked; objects with a UUID cost nothing. 0 disables.")
	fs.Float64Var(&c.qps, "kube-api-qps", noClientLimit, "Requests per second to the API server (client-side limit). -1: no client-side limit; the API server's Priority and Fairness paces the controller.")
	fs.IntVar(&c.burst, "kube-api-burst", 1000, "Burst of requests to the API server above --kube-api-qps, when it is set.")
	fs.DurationVar(&c.readIdle, "kube-api-read-idle-timeout", 5*time.Second, "When nothing has been read from the API server connection for this long, ping it (client-go's HTTP2_READ_IDLE_TIMEOUT_SECONDS, whole seconds).")
	fs.DurationVar(&c.pingTimeout, "kube-api-ping-timeout", 3*time.Second, "Close the API server connection, and reconnect, when a ping gets no answer within this long (client-go's HTTP2_PING_TIMEOUT_SECONDS, whole seconds).")
	fs.StringVar(&c.healthAddr, "health-addr", ":8080", "Address serving /healthz and /readyz. Empty or 0 disables.")
	fs.StringVar(&c.metricsAddr, "metrics-addr", ":9090", "Address serving Prometheus /metrics. Empty or 0 disables.")
	fs.BoolVar(&c.secureMetrics.Secure, "metrics-secure", true, "Serve /metrics over HTTPS, only to callers the API server authenticates (TokenReview) and authorizes (SubjectAccessReview: get on /metrics). false serves plain HTTP to anyone, for local development.")
	fs.StringVar(&c.secureMetrics.CertFile, "metrics-cert-file", "", "PEM certificate (chain) for /metrics, re-read when it changes on disk. Default: a self-signed one made in memory at start.")
	fs.StringVar(&c.secureMetrics.KeyFile, "metrics-key-file", "", "PEM private key of --metrics-cert-file.")
	fs.StringVar(&c.secureMetrics.TLSMinVersion, "metrics-tls-min-version", "1.3", "Oldest TLS version /metrics serves: 1.3, or 1.2 for scrapers without 1.3 (then with ECDHE and AEAD cipher suites only).")
	fs.StringVar(&c.eventLevel, "event-level", "Warning", "Lowest Kubernetes Event type posted on objects: Normal (every assignment) or Warning (failures only).")
	fs.DurationVar(&c.opts.ShutdownTimeout, "shutdown-timeout", d.ShutdownTimeout, "How long in-flight reconciles may run after SIGTERM before the process exits anyway.")
	fs.BoolVar(&c.leaderElect, "leader-elect", false, "Elect a leader with a coordination.k8s.io Lease, so several replicas can run with one active.")
	fs.StringVar(&c.leader.Namespace, "leader-elect-namespace", "", "Namespace of the Lease. Default: the pod's namespace ($POD_NAMESPACE, else the ServiceAccount's namespace file) in a cluster, else uuid-system.")
	fs.StringVar(&c.leader.Name, "leader-elect-name", c.leader.Name, "Name of the Lease.")
	fs.DurationVar(&c.leader.LeaseDuration, "leader-elect-lease-duration", c.leader.LeaseDuration, "How long a standby waits before taking over a lease that is not renewed.")
	fs.DurationVar(&c.leader.RenewDeadline, "leader-elect-renew-deadline", c.leader.RenewDeadline, "How long the leader retries renewing before it stops leading.")
	fs.DurationVar(&c.leader.RetryPeriod, "leader-elect-retry-period", c.leader.RetryPeriod, "Wait between leader election tries.")
	fs.BoolVar(&c.opts.RemoveKopfFinalizer, "remove-kopf-finalizer", false, "Remove the kopf operator's finalizer from Uuid objects being deleted, so they do not hang once kopf is gone. Needs deploy/kopf-migration/.")
	fs.BoolVar(&c.printVersion, "version", false, "Print the version, git commit and Go version, and exit.")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if c.printVersion {
		return c, nil // whatever else is on the command line
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if c.leader.Namespace == "" {
		c.leader.Namespace = defaultLeaseNamespace()
	}
	c.eventLevel = canonicalEventLevel(c.eventLevel)
	c.opts.NormalEvents = c.eventLevel == corev1.EventTypeNormal
	return c, c.validate()
}

// canonicalEventLevel spells an event type as the API does, whatever its
// case; anything else is returned as it is, for validate to reject.
func canonicalEventLevel(level string) string {
	for _, t := range []string{corev1.EventTypeNormal, corev1.EventTypeWarning} {
		if strings.EqualFold(level, t) {
			return t
		}
	}
	return level
}

func (c *config) validate() error {
	var errs []error
	if c.workers < 1 || c.workers > maxWorkers {
		errs = append(errs, fmt.Errorf("--workers must be between 1 and %d, got %d", maxWorkers, c.workers))
	}
	errs = append(errs, c.opts.validate())
	if c.resync < 0 {
		errs = append(errs, fmt.Errorf("--resync must not be negative, got %s", c.resync))
	}
	if math.IsNaN(c.qps) || math.IsInf(c.qps, 0) || c.qps <= 0 && c.qps != noClientLimit || c.burst < 1 {
		errs = append(errs, fmt.Errorf("--kube-api-qps (or -1 for no limit) and --kube-api-burst must be positive, got %v and %d", c.qps, c.burst))
	}
	if c.readIdle < time.Second || c.pingTimeout < time.Second || c.readIdle%time.Second != 0 || c.pingTimeout%time.Second != 0 {
		errs = append(errs, fmt.Errorf("--kube-api-read-idle-timeout and --kube-api-ping-timeout must be whole seconds, at least 1s, got %s and %s", c.readIdle, c.pingTimeout))
	}
	errs = append(errs, c.secureMetrics.Validate()...)
	var nsErrs []error
	c.namespaces, nsErrs = splitNamespaces(c.namespace)
	errs = append(errs, nsErrs...)
	if c.eventLevel != corev1.EventTypeNormal && c.eventLevel != corev1.EventTypeWarning {
		errs = append(errs, fmt.Errorf("--event-level must be Normal or Warning, got %q", c.eventLevel))
	}
	if c.leaderElect {
		le := c.leader
		if le.Name == "" {
			errs = append(errs, errors.New("--leader-elect-name must not be empty"))
		} else {
			errs = append(errs, checkName("--leader-elect-name", le.Name, validation.IsDNS1123Subdomain)...)
		}
		errs = append(errs, checkName("--leader-elect-namespace", le.Namespace, validation.IsDNS1123Label)...)
		if le.RetryPeriod <= 0 || le.RenewDeadline <= 0 || le.LeaseDuration <= 0 {
			errs = append(errs, errors.New("--leader-elect durations must be positive"))
		} else if le.LeaseDuration <= le.RenewDeadline || le.RenewDeadline <= jitteredRetry(le.RetryPeriod) {
			// client-go's own check, made here so it fails at start-up.
			errs = append(errs, fmt.Errorf("--leader-elect-lease-duration (%s) must exceed --leader-elect-renew-deadline (%s), which must exceed %v times --leader-elect-retry-period (%s)",
				le.LeaseDuration, le.RenewDeadline, leaderelection.JitterFactor, le.RetryPeriod))
		}
	}
	return errors.Join(errs...)
}

// defaultWorkers caps the syncs at once (internal/inflight moves the limit
// below it): high enough that the creators, not the cap, are what the
// limit follows; a sync in flight costs a goroutine only while it runs.
const defaultWorkers = 512

// minInFlight is where the limit starts and the least it falls to: the
// apiserver pushing back never stops the controller.
const minInFlight = 8

// noClientLimit, as --kube-api-qps, turns client-go's client-side rate
// limit off (rest.Config.QPS < 0), as controller-runtime does by default:
// a fixed limit caps a large apiserver, and API Priority and Fairness
// already protects any apiserver from the controller.
const noClientLimit = -1

// maxWorkers bounds --workers: beyond it a typo costs memory, not speed (the
// apiserver takes a few hundred writes a second; see docs/flags.md).
const maxWorkers = 1000

func jitteredRetry(d time.Duration) time.Duration {
	return time.Duration(leaderelection.JitterFactor * float64(d))
}

// checkName validates a non-empty Kubernetes object name.
func checkName(flagName, value string, check func(string) []string) []error {
	if value == "" {
		return nil
	}
	var errs []error
	for _, msg := range check(value) {
		errs = append(errs, fmt.Errorf("%s %q is not a valid name: %s", flagName, value, msg))
	}
	return errs
}

// defaultLeaseNamespace is the pod's namespace: $POD_NAMESPACE (the
// Deployment sets it from the downward API, as client-go's in-cluster
// config reads it), else the ServiceAccount's namespace file; out of a
// cluster, uuid-system.
func defaultLeaseNamespace() string {
	if ns := strings.TrimSpace(os.Getenv("POD_NAMESPACE")); ns != "" {
		return ns
	}
	if b, err := os.ReadFile(serviceAccountNamespaceFile); err == nil {
		if ns := strings.TrimSpace(string(b)); ns != "" {
			return ns
		}
	}
	return "uuid-system"
}
