package metricsserver

import (
	"strings"
	"testing"

	"k8s.io/klog/v2"

	"github.com/demo-operator/uuid-controller/internal/testlog"
)

// TestQuietContext: under a logger at -v 10, the reviews' context logs
// lines up to maxReviewLogV and drops those above (client-go's bodies at
// 8), through WithValues and WithName too.
func TestQuietContext(t *testing.T) {
	logger, logs := testlog.New(t, 10)
	ctx := quietContext(klog.NewContext(t.Context(), logger))
	l := klog.FromContext(ctx)
	l.V(maxReviewLogV).Info("kept")
	l.V(8).Info("Request Body", "body", "secret")
	l.WithValues("k", "v").WithName("n").V(8).Info("Response Body", "body", "secret")
	if l.V(8).Enabled() {
		t.Error("V(8) enabled in the reviews' context")
	}
	if got := logs.String(); !strings.Contains(got, "kept") || strings.Contains(got, "secret") {
		t.Errorf("logged %q, want the V(%d) line and no V(8) line", got, maxReviewLogV)
	}
}
