package main

import (
	"context"
	"errors"
	"regexp"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// The names every file of the controller shares: what it serves, how it
// signs its writes, and the words of its status, Events and metrics.

const (
	// controllerName names the controller in logs, events, the leader
	// lease and the workqueue metrics.
	controllerName = "uuid-controller"
	// FieldManager is the field manager of every write.
	FieldManager = controllerName
)

// uuidGVR is the resource the controller serves.
var uuidGVR = schema.GroupVersionResource{Group: "demo.operator", Version: "v1", Resource: "uuid"}

// uuidKind is the kind of the resource uuidGVR.
const uuidKind = "Uuid"

// uuidGVK is the kind of every cached object.
var uuidGVK = uuidGVR.GroupVersion().WithKind(uuidKind)

// The values the controller writes into status.state. crd.yaml allows only these.
const (
	StateOk    = "Ok"
	StateError = "Error"
)

// Condition types. Ready is what `kubectl wait --for=condition=Ready`
// looks for. Reconciling and Stalled are kstatus's "abnormal-true"
// conditions (absent means False), which Flux's health checks and
// `kstatus.Compute` read before anything else: Reconciling=True makes an
// object InProgress, Stalled=True makes it Failed.
const (
	ConditionReady       = "Ready"
	ConditionReconciling = "Reconciling"
	ConditionStalled     = "Stalled"
)

// Reasons: of Events, of conditions, and of the patch_failures_total
// label. The kopf migration's Event reasons are internal/kopf's
// (kopf.ReasonFinalizerRemoved, kopf.ReasonFinalizerFailed).
const (
	// ReasonAssigned: a UUID was written to the object's status (a Normal
	// Event; Ready=True).
	ReasonAssigned = "UUIDAssigned"
	// ReasonFailed: the controller failed to assign a UUID (a Warning
	// Event; Ready=False when the apiserver gave no reason of its own).
	ReasonFailed = "UUIDFailed"
	// ReasonInvalid: status held something that is not a UUID and is being
	// replaced (a Warning Event).
	ReasonInvalid = "InvalidUUID"
	// ReasonRetrying: Reconciling=True, a failure that is being retried.
	ReasonRetrying = "Retrying"
	// ReasonRejected: Stalled=True, the apiserver rejected the request as
	// malformed; it is tried again on the object's next update or resync.
	ReasonRejected = "Rejected"
	// ReasonClientTimeout (a metric label): the request did not get an
	// answer, or could not leave the client-side rate limiter, within the
	// sync's deadline.
	ReasonClientTimeout = "ClientTimeout"
	// ReasonClientError (a metric label): no answer at all (connection
	// refused or reset, TLS).
	ReasonClientError = "ClientError"
)

// reasonPattern is the CRD's (and metav1.Condition's) pattern for a
// condition reason.
var reasonPattern = regexp.MustCompile(`^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`)

// failureReasons names a failed write twice. condition is the Ready=False
// reason: the apiserver's reason (Forbidden, InternalError, Invalid, ...),
// or ReasonFailed when it gave none (a timeout, a connection error) or
// one the CRD would not accept, which would get the failure report itself
// rejected. metric is the patch_failures_total label: the apiserver's
// reason as given, or what kept the request from getting one, so a
// failure is never counted under "".
func failureReasons(err error) (condition, metric string) {
	r := string(apierrors.ReasonForError(err))
	switch {
	case r != "" && len(r) <= 1024 && reasonPattern.MatchString(r):
		return r, r
	case r != "":
		return ReasonFailed, r
	// client-go wraps the rate limiter's refusal as text only
	// ("client rate limiter Wait returned an error: rate: Wait(n=1) would
	// exceed context deadline").
	case errors.Is(err, context.DeadlineExceeded) || strings.Contains(err.Error(), "rate limiter Wait"):
		return ReasonFailed, ReasonClientTimeout
	}
	return ReasonFailed, ReasonClientError
}
