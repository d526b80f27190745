package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/token/cache"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	webhooktoken "k8s.io/apiserver/plugin/pkg/authenticator/token/webhook"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
)

// secureMetricsConfig is how /metrics is protected: --metrics-secure and
// the serving certificate's files.
type secureMetricsConfig struct {
	secure            bool
	certFile, keyFile string
}

func (c secureMetricsConfig) validate() []error {
	var errs []error
	if (c.certFile == "") != (c.keyFile == "") {
		errs = append(errs, errors.New("--metrics-cert-file and --metrics-key-file must be given together"))
	}
	if !c.secure && (c.certFile != "" || c.keyFile != "") {
		errs = append(errs, errors.New("--metrics-cert-file and --metrics-key-file need --metrics-secure (they would be ignored on plain HTTP)"))
	}
	return errs
}

// The delegation's timings are kube-controller-manager's defaults
// (k8s.io/apiserver/pkg/server/options): answers are cached for 10 s, so a
// scraper every 15-30 s costs one TokenReview and one SubjectAccessReview
// per scrape at most, and a revoked grant takes effect within 10 s.
const (
	reviewCacheTTL = 10 * time.Second
	reviewTimeout  = 10 * time.Second
)

// reviewRetry is how a failed review is retried before the scrape gets its
// 503: about 4 s in all, within Prometheus' default 10 s scrape timeout.
var reviewRetry = wait.Backoff{Duration: 500 * time.Millisecond, Factor: 1.5, Jitter: 0.2, Steps: 5}

// secureMetrics returns h behind delegated authentication and
// authorization and the TLS config serving it, or h and nil when
// --metrics-secure=false.
func secureMetrics(ctx context.Context, c secureMetricsConfig, kube kubernetes.Interface, m *Metrics, h http.Handler) (http.Handler, *tls.Config, error) {
	if !c.secure {
		klog.FromContext(ctx).Info("Serving /metrics over plain HTTP without authentication (--metrics-secure=false)")
		return h, nil, nil
	}
	cert, err := loadServingCert(c.certFile, c.keyFile)
	if err != nil {
		return nil, nil, err
	}
	auth, err := newDelegatedAuth(kube, m)
	if err != nil {
		return nil, nil, err
	}
	cert.run(ctx)
	return auth.wrap(h), cert.tlsConfig(), nil
}

// delegatedAuth asks the apiserver who a bearer token belongs to
// (TokenReview) and whether that user may get the request's path
// (SubjectAccessReview), as kube-controller-manager and kube-scheduler do
// for their /metrics, with k8s.io/apiserver's cached webhook clients.
type delegatedAuth struct {
	tokens  authenticator.Token
	access  authorizer.Authorizer
	metrics *Metrics
}

func newDelegatedAuth(kube kubernetes.Interface, m *Metrics) (*delegatedAuth, error) {
	noop := webhooktoken.AuthenticatorMetrics{
		RecordRequestTotal:   func(context.Context, string) {},
		RecordRequestLatency: func(context.Context, string, float64) {},
	}
	// The token webhook is used without authenticatorfactory's union of
	// authenticators, which reports an unknown token and an unreachable
	// apiserver alike as an error: here the first is a 401, the second a 503.
	review, err := webhooktoken.NewFromInterface(kube.AuthenticationV1(), nil, reviewRetry, reviewTimeout, noop)
	if err != nil {
		return nil, fmt.Errorf("building the TokenReview client: %w", err)
	}
	access, err := authorizerfactory.DelegatingAuthorizerConfig{
		SubjectAccessReviewClient: kube.AuthorizationV1(),
		AllowCacheTTL:             reviewCacheTTL,
		DenyCacheTTL:              reviewCacheTTL,
		WebhookRetryBackoff:       &reviewRetry,
	}.New()
	if err != nil {
		return nil, fmt.Errorf("building the SubjectAccessReview client: %w", err)
	}
	// Failed reviews are not cached: the next scrape asks again.
	return &delegatedAuth{tokens: cache.New(review, false, reviewCacheTTL, reviewCacheTTL), access: access, metrics: m}, nil
}

// wrap serves h only to callers whose bearer token the apiserver accepts
// and whose user may get the path: 401 without a valid token, 403 without
// the grant, 503 when the apiserver cannot answer, so an outage never
// opens the metrics.
func (a *delegatedAuth) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		code, msg := a.check(r)
		a.metrics.MetricsRequests.WithLabelValues(authResult(code)).Inc()
		if code != http.StatusOK {
			http.Error(w, msg, code)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// check returns 200 when the request may be served, else the status code
// and message to answer with.
func (a *delegatedAuth) check(r *http.Request) (int, string) {
	ctx, cancel := context.WithTimeout(r.Context(), reviewTimeout)
	defer cancel()
	logger := klog.FromContext(ctx).WithValues("path", r.URL.Path, "remote", r.RemoteAddr)
	token, ok := bearerToken(r)
	if !ok {
		return http.StatusUnauthorized, "Unauthorized: a bearer token is required"
	}
	resp, ok, err := a.tokens.AuthenticateToken(ctx, token)
	if err != nil {
		logger.Error(err, "TokenReview failed; refusing the metrics request")
		return http.StatusServiceUnavailable, "Service Unavailable: the API server could not review the token"
	}
	if !ok {
		return http.StatusUnauthorized, "Unauthorized: the API server does not accept the token"
	}
	user := resp.User
	attrs := authorizer.AttributesRecord{User: user, Verb: strings.ToLower(r.Method), Path: r.URL.Path}
	decision, reason, err := a.access.Authorize(ctx, attrs)
	if err != nil {
		logger.Error(err, "SubjectAccessReview failed; refusing the metrics request", "user", user.GetName())
		return http.StatusServiceUnavailable, "Service Unavailable: the API server could not review the access"
	}
	if decision != authorizer.DecisionAllow {
		logger.V(2).Info("Metrics request forbidden", "user", user.GetName(), "reason", reason)
		return http.StatusForbidden, fmt.Sprintf("Forbidden: user %q may not %s %s", user.GetName(), attrs.Verb, attrs.Path)
	}
	return http.StatusOK, ""
}

// bearerToken is the token of an "Authorization: Bearer" header.
func bearerToken(r *http.Request) (string, bool) {
	scheme, token, ok := strings.Cut(strings.TrimSpace(r.Header.Get("Authorization")), " ")
	token = strings.TrimSpace(token)
	if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" {
		return "", false
	}
	return token, true
}

// authResult is the metrics_requests_total label for a response code.
func authResult(code int) string {
	switch code {
	case http.StatusOK:
		return "ok"
	case http.StatusUnauthorized:
		return "unauthenticated"
	case http.StatusForbidden:
		return "forbidden"
	default:
		return "review_failed"
	}
}
