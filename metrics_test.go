package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// TestAssignmentLatencyFromCreation: an assignment observes the seconds
// since the object's creationTimestamp, once.
func TestAssignmentLatencyFromCreation(t *testing.T) {
	obj := newUUIDObject("default", "example", "1")
	created := time.Now().Add(-42 * time.Second)
	obj.SetCreationTimestamp(metav1.NewTime(created))
	f := newFixture(t, Options{}, obj)
	f.ctrl.queue.Add(key("default", "example"))
	f.drive(1)
	h := &dto.Metric{}
	if err := f.metrics.AssignmentLatency.Write(h); err != nil {
		t.Fatal(err)
	}
	// creationTimestamp keeps whole seconds, so the wait seen is 42 s
	// plus the fraction the timestamp lost (and the test's own time).
	upper := time.Since(created.Truncate(time.Second)).Seconds()
	if n, sum := h.GetHistogram().GetSampleCount(), h.GetHistogram().GetSampleSum(); n != 1 || sum < 42 || sum > upper {
		t.Errorf("latency histogram: %d observations summing %.3f s, want 1 of 42 to %.3f s", n, sum, upper)
	}
}

// TestKopfFinalizerWaitingGauge counts the cached objects being deleted
// that still carry kopf's finalizer, and nothing else.
func TestKopfFinalizerWaitingGauge(t *testing.T) {
	other := kopfObject("other", true)
	other.SetFinalizers([]string{"example.com/other"})
	f := newFixture(t, Options{}, kopfObject("held-1", true), kopfObject("held-2", true, "example.com/other"),
		kopfObject("live", false), other, newUUIDObject("default", "new", "1"))
	waiting := func() []float64 {
		t.Helper()
		families, err := f.metrics.Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		var got []float64
		for _, mf := range families {
			if mf.GetName() == "uuid_controller_kopf_finalizer_waiting_objects" {
				for _, m := range mf.GetMetric() {
					got = append(got, m.GetGauge().GetValue())
				}
			}
		}
		return got
	}
	if got := waiting(); len(got) != 1 || got[0] != 2 {
		t.Errorf("uuid_controller_kopf_finalizer_waiting_objects = %v, want [2]", got)
	}
	// The gauge reads the cache's index, which follows the cache: kopf's
	// finalizer removed from one, the other gone.
	released := kopfObject("held-1", true)
	released.SetFinalizers(nil)
	if err := f.indexer.Update(toCached(released)); err != nil {
		t.Fatal(err)
	}
	if err := f.indexer.Delete(toCached(kopfObject("held-2", true, "example.com/other"))); err != nil {
		t.Fatal(err)
	}
	if got := waiting(); len(got) != 1 || got[0] != 0 {
		t.Errorf("after the release and the deletion: uuid_controller_kopf_finalizer_waiting_objects = %v, want [0]", got)
	}
}

// TestFailureMetricReason: a failed write is counted under the apiserver's
// reason, or under what kept it from one; never under "".
func TestFailureMetricReason(t *testing.T) {
	gr := schema.GroupResource{Group: "demo.operator", Resource: "uuid"}
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"forbidden", apierrors.NewForbidden(gr, "a", errors.New("denied")), "Forbidden"},
		{"internal error", apierrors.NewInternalError(errors.New("boom")), "InternalError"},
		{"server timeout", apierrors.NewTimeoutError("slow", 1), "Timeout"},
		{"no answer before the deadline", &url.Error{Op: "Patch", URL: "https://apiserver", Err: context.DeadlineExceeded}, ReasonClientTimeout},
		{"held by the client's rate limiter", fmt.Errorf("client rate limiter Wait returned an error: %w", errors.New("rate: Wait(n=1) would exceed context deadline")), ReasonClientTimeout},
		{"connection refused", &url.Error{Op: "Patch", URL: "https://apiserver", Err: refused}, ReasonClientError},
	}
	for _, tt := range tests {
		if _, got := failureReasons(tt.err); got != tt.want {
			t.Errorf("%s: %q, want %q", tt.name, got, tt.want)
		}
	}
}
