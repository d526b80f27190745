package metricsserver

import (
	"context"

	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
)

// maxReviewLogV is the highest verbosity client-go may log at while it
// sends a review. client-go logs request and response bodies at -v 8 (a
// TokenReview's carries the token, twice: the response echoes spec.token,
// as a hex dump of the protobuf), and it logs with the request context's
// logger (klog.FromContext), so the reviews run with a logger that drops
// every line above this level, at any -v. Headers (-v 7) come masked.
const maxReviewLogV = 5

// quietContext is ctx with its logger capped at maxReviewLogV; klog's
// global logger when ctx holds none, since client-go would use that.
func quietContext(ctx context.Context) context.Context {
	logger := klog.FromContext(ctx)
	return klog.NewContext(ctx, logr.New(cappedSink{LogSink: logger.GetSink(), max: maxReviewLogV}))
}

// cappedSink passes lines at or below max to the LogSink it wraps.
type cappedSink struct {
	logr.LogSink
	max int
}

// Init does nothing: the wrapped sink was initialized by its own logger.
func (cappedSink) Init(logr.RuntimeInfo) {}

// WithCallDepth keeps the file and line of each line the caller's.
func (s cappedSink) WithCallDepth(depth int) logr.LogSink {
	if cd, ok := s.LogSink.(logr.CallDepthLogSink); ok {
		return cappedSink{cd.WithCallDepth(depth), s.max}
	}
	return s
}

func (s cappedSink) Enabled(level int) bool {
	return level <= s.max && s.LogSink.Enabled(level)
}

func (s cappedSink) Info(level int, msg string, kv ...any) {
	if level <= s.max {
		s.LogSink.Info(level, msg, kv...)
	}
}

func (s cappedSink) WithValues(kv ...any) logr.LogSink {
	return cappedSink{s.LogSink.WithValues(kv...), s.max}
}

func (s cappedSink) WithName(name string) logr.LogSink {
	return cappedSink{s.LogSink.WithName(name), s.max}
}

// quietTokens and quietAccess send reviews with quietContext's logger, so
// no body of theirs reaches the log.
type (
	quietTokens struct{ tokenReviewer }
	quietAccess struct{ accessReviewer }
)

func (q quietTokens) Create(ctx context.Context, tr *authenticationv1.TokenReview, opts metav1.CreateOptions) (*authenticationv1.TokenReview, error) {
	return q.tokenReviewer.Create(quietContext(ctx), tr, opts)
}

func (q quietAccess) Create(ctx context.Context, sar *authorizationv1.SubjectAccessReview, opts metav1.CreateOptions) (*authorizationv1.SubjectAccessReview, error) {
	return q.accessReviewer.Create(quietContext(ctx), sar, opts)
}
