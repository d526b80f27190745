package nscheck

import (
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/klog/v2"

	"github.com/demo-operator/uuid-controller/internal/testlog"
)

// namespaces answers Get from answers: nil for a namespace that exists.
type namespaces map[string]error

func (n namespaces) Get(_ context.Context, name string, _ metav1.GetOptions) (*corev1.Namespace, error) {
	if err := n[name]; err != nil {
		return nil, err
	}
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, nil
}

// TestProblemsReportedOnceAndCleared: a missing and a forbidden namespace
// are named by Ready, set the gauge and log one line each however often
// they are checked; once they can be read, all of that clears.
func TestProblemsReportedOnceAndCleared(t *testing.T) {
	logger, logs := testlog.New(t, 0)
	ctx := klog.NewContext(context.Background(), logger)
	gr := schema.GroupResource{Resource: "namespaces"}
	answers := namespaces{
		"missing":   apierrors.NewNotFound(gr, "missing"),
		"forbidden": apierrors.NewForbidden(gr, "forbidden", nil),
	}
	reg := prometheus.NewRegistry()
	c, err := New(Config{Namespaces: answers, Names: []string{"fine", "missing", "forbidden"}, Registerer: reg, MetricsNamespace: "test"})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Ready(); err != nil {
		t.Fatalf("Ready before any check = %v, want nil", err)
	}
	for range 3 {
		c.CheckAll(ctx)
	}
	err = c.Ready()
	if err == nil || !strings.Contains(err.Error(), "NotFound: watched namespace missing does not exist") ||
		!strings.Contains(err.Error(), "Forbidden: the controller may not get watched namespace forbidden") || strings.Contains(err.Error(), "fine") {
		t.Errorf("Ready = %v, want the missing and the forbidden namespace named, not the fine one", err)
	}
	gauge := func(ns, reason string) float64 {
		return testutil.ToFloat64(c.gauge.WithLabelValues(ns, reason))
	}
	for _, tc := range []struct {
		ns, reason string
		want       float64
	}{{"missing", NotFound, 1}, {"missing", Forbidden, 0}, {"forbidden", Forbidden, 1}, {"forbidden", NotFound, 0}, {"fine", NotFound, 0}, {"fine", Forbidden, 0}} {
		if got := gauge(tc.ns, tc.reason); got != tc.want {
			t.Errorf("namespace_problem{namespace=%s,reason=%s} = %v, want %v", tc.ns, tc.reason, got, tc.want)
		}
	}
	if n := len(logs.Messages()); n != 2 {
		t.Errorf("three checks logged %d lines, want one per problem (2):\n%s", n, logs)
	}

	delete(answers, "missing")
	delete(answers, "forbidden")
	c.CheckAll(ctx)
	if err := c.Ready(); err != nil {
		t.Errorf("Ready once every namespace can be read = %v, want nil", err)
	}
	if gauge("missing", NotFound)+gauge("forbidden", Forbidden) != 0 {
		t.Error("the gauge still reports a problem once every namespace can be read")
	}
	if msgs := logs.Messages(); len(msgs) != 4 || !strings.Contains(msgs[3], "available again") {
		t.Errorf("clearing logged %q, want one line per namespace cleared", msgs[2:])
	}
}

// TestOtherErrorsKeepTheState: an apiserver that does not answer tells
// nothing about the namespace, so the last known state stays.
func TestOtherErrorsKeepTheState(t *testing.T) {
	ctx := context.Background()
	gr := schema.GroupResource{Resource: "namespaces"}
	answers := namespaces{"ns": apierrors.NewNotFound(gr, "ns")}
	c, err := New(Config{Namespaces: answers, Names: []string{"ns"}, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	c.CheckAll(ctx)
	answers["ns"] = apierrors.NewServiceUnavailable("down")
	c.CheckAll(ctx)
	if err := c.Ready(); err == nil {
		t.Error("an unanswered check cleared the NotFound problem")
	}
}
