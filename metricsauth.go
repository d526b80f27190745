package main

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/cache"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
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

// Answers are cached for 10 s, kube-controller-manager's default for its
// delegated authentication and authorization: a scraper every 15-30 s costs
// one TokenReview and one SubjectAccessReview per scrape at most, and a
// revoked grant or token takes effect within 10 s. Failed reviews are not
// cached: the next scrape asks again.
const (
	reviewCacheTTL  = 10 * time.Second
	reviewCacheSize = 1024
	reviewTimeout   = 10 * time.Second
	// reviewQPS and reviewBurst limit the reviews sent for /metrics, on a
	// client of their own: a scraper needs at most two per scrape, and a
	// flood of requests with made-up tokens waits here (then gets 503)
	// instead of taking the controller's own API budget.
	reviewQPS   = 20
	reviewBurst = 40
)

// secureMetrics returns h behind delegated authentication and
// authorization and the TLS config serving it, or h and nil when
// --metrics-secure=false or the metrics server at addr is off.
func secureMetrics(ctx context.Context, addr string, c secureMetricsConfig, restConfig *rest.Config, m *Metrics, h http.Handler) (http.Handler, *tls.Config, error) {
	if !serverEnabled(addr) {
		return h, nil, nil
	}
	if !c.secure {
		klog.FromContext(ctx).Info("Serving /metrics over plain HTTP without authentication (--metrics-secure=false)")
		return h, nil, nil
	}
	cert, err := loadServingCert(c.certFile, c.keyFile)
	if err != nil {
		return nil, nil, err
	}
	// The reviews get a client, and so a client-side rate limit, of their
	// own: anyone who reaches the port can make the controller ask the
	// apiserver (a new made-up token each time), and those asks must never
	// queue the Lease's renewals or the Events behind them.
	reviewConfig := rest.CopyConfig(restConfig)
	reviewConfig.QPS, reviewConfig.Burst = reviewQPS, reviewBurst
	reviews, err := kubernetes.NewForConfig(reviewConfig)
	if err != nil {
		return nil, nil, fmt.Errorf("building the metrics review client: %w", err)
	}
	cert.run(ctx)
	return newDelegatedAuth(reviews, m).wrap(h), cert.tlsConfig(), nil
}

// delegatedAuth asks the apiserver who a bearer token belongs to
// (TokenReview) and whether that user may get the request's path
// (SubjectAccessReview: verb get on the non-resource URL /metrics), as
// kube-controller-manager and kube-scheduler do for their /metrics. It
// calls client-go's typed clients, already in the binary, rather than
// k8s.io/apiserver's webhook authenticator and authorizer, which would
// double the binary (README: Metrics).
type delegatedAuth struct {
	tokens  tokenReviewer
	access  accessReviewer
	answers *cache.LRUExpireCache
	metrics *Metrics
}

type (
	tokenReviewer interface {
		Create(context.Context, *authenticationv1.TokenReview, metav1.CreateOptions) (*authenticationv1.TokenReview, error)
	}
	accessReviewer interface {
		Create(context.Context, *authorizationv1.SubjectAccessReview, metav1.CreateOptions) (*authorizationv1.SubjectAccessReview, error)
	}
)

func newDelegatedAuth(kube kubernetes.Interface, m *Metrics) *delegatedAuth {
	return &delegatedAuth{
		tokens:  kube.AuthenticationV1().TokenReviews(),
		access:  kube.AuthorizationV1().SubjectAccessReviews(),
		answers: cache.NewLRUExpireCache(reviewCacheSize),
		metrics: m,
	}
}

// wrap serves h only to callers whose bearer token the apiserver accepts
// and whose user may get the path: 401 without a valid token, 403 without
// the grant, 503 when the apiserver cannot answer, so an outage never
// opens the metrics.
func (a *delegatedAuth) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ans := a.check(r)
		a.metrics.MetricsRequests.WithLabelValues(ans.result()).Inc()
		if ans.code != http.StatusOK {
			http.Error(w, ans.message, ans.code)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// answer is the outcome of a request's reviews: 200, or the status code
// and message to refuse it with.
type answer struct {
	code    int
	message string
}

// answerKey caches an answer by a hash of the token (the token itself
// stays out of memory dumps) with the verb and path it was asked for.
type answerKey struct {
	token      [sha256.Size]byte
	verb, path string
}

func (a *delegatedAuth) check(r *http.Request) answer {
	token, ok := bearerToken(r)
	if !ok {
		return answer{http.StatusUnauthorized, "Unauthorized: a bearer token is required"}
	}
	key := answerKey{sha256.Sum256([]byte(token)), strings.ToLower(r.Method), r.URL.Path}
	if v, ok := a.answers.Get(key); ok {
		return v.(answer)
	}
	ctx, cancel := context.WithTimeout(r.Context(), reviewTimeout)
	defer cancel()
	logger := klog.FromContext(ctx).WithValues("path", key.path, "remote", r.RemoteAddr)
	ans, err := a.review(ctx, token, key.verb, key.path)
	if err != nil {
		logger.Error(err, "Refusing a metrics request: the API server could not review it")
		return answer{http.StatusServiceUnavailable, "Service Unavailable: the API server could not review the request"}
	}
	if ans.code != http.StatusOK {
		logger.V(2).Info("Refusing a metrics request", "code", ans.code, "reason", ans.message)
	}
	a.answers.Add(key, ans, reviewCacheTTL)
	return ans
}

// review asks the apiserver about token, then about its user's access. An
// error means no answer (the apiserver or the controller's own permission
// to ask is missing), never a refusal.
func (a *delegatedAuth) review(ctx context.Context, token, verb, path string) (answer, error) {
	tr, err := a.tokens.Create(ctx, &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
	if err != nil {
		return answer{}, fmt.Errorf("TokenReview: %w", err)
	}
	if !tr.Status.Authenticated {
		return answer{http.StatusUnauthorized, "Unauthorized: the API server does not accept the token"}, nil
	}
	u := tr.Status.User
	extra := make(map[string]authorizationv1.ExtraValue, len(u.Extra))
	for k, v := range u.Extra {
		extra[k] = authorizationv1.ExtraValue(v)
	}
	sar, err := a.access.Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: u.Username, UID: u.UID, Groups: u.Groups, Extra: extra,
		NonResourceAttributes: &authorizationv1.NonResourceAttributes{Verb: verb, Path: path},
	}}, metav1.CreateOptions{})
	if err != nil {
		return answer{}, fmt.Errorf("SubjectAccessReview for user %q: %w", u.Username, err)
	}
	if !sar.Status.Allowed {
		return answer{http.StatusForbidden, fmt.Sprintf("Forbidden: user %q may not %s %s", u.Username, verb, path)}, nil
	}
	return answer{http.StatusOK, ""}, nil
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

// result is the metrics_requests_total label for an answer.
func (a answer) result() string {
	switch a.code {
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
