// Package metricsserver protects a /metrics handler as the Kubernetes
// components do: HTTPS with a serving certificate (files or self-signed),
// and delegated authentication and authorization (TokenReview, then
// SubjectAccessReview for get on the path).
package metricsserver

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/singleflight"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/cache"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/demo-operator/uuid-controller/internal/httpserver"
)

// Config is how /metrics is protected: --metrics-secure and the serving
// certificate's files (both empty: self-signed).
type Config struct {
	Secure            bool
	CertFile, KeyFile string
	// Name is the self-signed certificate's host name when the host has
	// none.
	Name string
	// TLSMinVersion is the oldest TLS version served: "1.3" (the default)
	// or "1.2" (then with AEAD cipher suites only).
	TLSMinVersion string
}

// tlsVersions are TLSMinVersion's values.
var tlsVersions = map[string]uint16{"1.2": tls.VersionTLS12, "1.3": tls.VersionTLS13}

// Validate lists what is wrong with c, in the flags' words.
func (c Config) Validate() []error {
	var errs []error
	if (c.CertFile == "") != (c.KeyFile == "") {
		errs = append(errs, errors.New("--metrics-cert-file and --metrics-key-file must be given together"))
	}
	if !c.Secure && (c.CertFile != "" || c.KeyFile != "") {
		errs = append(errs, errors.New("--metrics-cert-file and --metrics-key-file need --metrics-secure (they would be ignored on plain HTTP)"))
	}
	if _, ok := tlsVersions[c.TLSMinVersion]; !ok {
		errs = append(errs, fmt.Errorf("--metrics-tls-min-version %q: want 1.2 or 1.3", c.TLSMinVersion))
	}
	return errs
}

// Answers that allowed a request and refusals are cached apart, so made-up
// tokens (never allowed) cannot evict a scraper's answer. Both are fresh
// for reviewCacheTTL, kube-controller-manager's default, so a revoked
// grant or token takes effect within it. A token once allowed stays known
// for knownTokenTTL: its next review does not wait for the unknown-token
// budget. Failed reviews are not cached: the next request asks again.
const (
	reviewCacheTTL   = 10 * time.Second
	knownTokenTTL    = 10 * time.Minute
	allowedCacheSize = 256  // one per scraper
	refusedCacheSize = 4096 // a flood's tokens get this far only at unknownReviewQPS
	reviewTimeout    = 10 * time.Second
	// reviewQPS and reviewBurst limit the reviews sent for /metrics, on a
	// client of their own, so they never take the controller's own API
	// budget: a scraper needs at most two per scrape.
	reviewQPS   = 20
	reviewBurst = 40
	// unknownReviewQPS and unknownReviewBurst limit the reviews of tokens
	// in neither cache (a flood's made-up tokens among them). A quarter of
	// the client's rate, so known tokens' reviews always find room.
	unknownReviewQPS   = 5
	unknownReviewBurst = 10
	// The budget goes to the client addresses asking in turns (turns.go):
	// a request whose address has no review kept for it gets 429 at once.
	// turnAddrs addresses are remembered, each for turnTTL after its last
	// ask: longer than a scrape interval, so a scraper refused keeps its
	// place until its next scrape.
	turnAddrs = 4096
	turnTTL   = 10 * time.Minute
)

// Secure returns h behind delegated authentication and authorization and
// the TLS config serving it, or h and nil when c.Secure is false. It
// registers metrics_requests_total on metrics, which counts the requests
// by result and reason, either way. The certificate is kept current until
// ctx is cancelled.
func Secure(ctx context.Context, c Config, restConfig *rest.Config, metrics prometheus.Registerer, h http.Handler) (http.Handler, *tls.Config, error) {
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "metrics_requests_total",
		Help: "Requests to the secure /metrics, by result of their authentication and authorization and the reason for it.",
	}, []string{"result", "reason"})
	if err := metrics.Register(requests); err != nil {
		return nil, nil, fmt.Errorf("registering the metrics server's counter: %w", err)
	}
	if !c.Secure {
		klog.FromContext(ctx).Info("Serving /metrics over plain HTTP without authentication (--metrics-secure=false)")
		return h, nil, nil
	}
	cert, err := loadServingCert(c.CertFile, c.KeyFile, c.Name, tlsVersions[c.TLSMinVersion])
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
	auth := newDelegatedAuth(reviews, requests)
	logger := klog.FromContext(ctx)
	go auth.log.Run(ctx, func(unlogged map[string]int) {
		logger.Info("Refused metrics requests, not logged one by one", "counts", unlogged)
	})
	return auth.wrap(h), cert.tlsConfig(), nil
}

// delegatedAuth asks the apiserver who a bearer token belongs to
// (TokenReview) and whether that user may get the request's path
// (SubjectAccessReview: verb get on the non-resource URL /metrics), as
// kube-controller-manager and kube-scheduler do for their /metrics. It uses
// client-go's typed clients rather than k8s.io/apiserver's webhook
// authenticator and authorizer, which would double the binary.
type delegatedAuth struct {
	tokens tokenReviewer
	access accessReviewer
	// allowed holds when each allowed token (answerKey) was last
	// reviewed; refused holds refusals (answer).
	allowed, refused *cache.LRUExpireCache
	// flights coalesces concurrent reviews of one token, verb and path.
	flights singleflight.Group
	// unknown shares the reviews of tokens in neither cache between the
	// client addresses asking.
	unknown *turns
	// requests counts requests by result and reason.
	requests *prometheus.CounterVec
	// log samples the refusals' log lines.
	log *httpserver.Sampled
	// secret keys the caches' HMAC of each token: made at start and never
	// stored, so a hash seen in a memory dump cannot be checked against a
	// guessed token, as kube's cached token authenticator does.
	secret []byte
	now    func() time.Time // tests replace it
}

type (
	tokenReviewer interface {
		Create(context.Context, *authenticationv1.TokenReview, metav1.CreateOptions) (*authenticationv1.TokenReview, error)
	}
	accessReviewer interface {
		Create(context.Context, *authorizationv1.SubjectAccessReview, metav1.CreateOptions) (*authorizationv1.SubjectAccessReview, error)
	}
)

func newDelegatedAuth(kube kubernetes.Interface, requests *prometheus.CounterVec) *delegatedAuth {
	return newAuth(quietTokens{kube.AuthenticationV1().TokenReviews()}, quietAccess{kube.AuthorizationV1().SubjectAccessReviews()}, requests)
}

func newAuth(tokens tokenReviewer, access accessReviewer, requests *prometheus.CounterVec) *delegatedAuth {
	// Every result and reason is exported from the start, so a rate over
	// one works before the first such request.
	for _, ans := range []answer{allowedAnswer, noTokenAnswer, badTokenAnswer, forbiddenAnswer("", "", ""), rateLimitedAnswer, unavailableAnswer} {
		requests.WithLabelValues(ans.result(), ans.reason)
	}
	return &delegatedAuth{
		tokens:   tokens,
		access:   access,
		allowed:  cache.NewLRUExpireCache(allowedCacheSize),
		refused:  cache.NewLRUExpireCache(refusedCacheSize),
		unknown:  newTurns(unknownReviewQPS, unknownReviewBurst, turnAddrs, turnTTL),
		requests: requests,
		log:      httpserver.NewSampled(),
		secret:   newSecret(),
		now:      time.Now,
	}
}

// wrap serves h only to callers whose bearer token the apiserver accepts
// and whose user may get the path: 401 without a valid token, 403 without
// the grant, 429 for a new token when its address's turn for a review
// has not come, 503 when the apiserver cannot answer, so an outage never
// opens the metrics. Refusals are counted, and logged at a bounded rate.
func (a *delegatedAuth) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ans, err := a.check(r)
		a.requests.WithLabelValues(ans.result(), ans.reason).Inc()
		if ans.code == http.StatusOK {
			h.ServeHTTP(w, r)
			return
		}
		a.logRefusal(r, ans, err)
		if ans.code == http.StatusTooManyRequests {
			w.Header().Set("Retry-After", "1")
		}
		http.Error(w, ans.message, ans.code)
	})
}

// logRefusal logs a refused request, sampled: a flood of them makes about
// a line a second, with the counts of those not logged.
func (a *delegatedAuth) logRefusal(r *http.Request, ans answer, err error) {
	a.log.Do(ans.reason, func(unlogged map[string]int) {
		logger := klog.FromContext(r.Context()).WithValues("path", r.URL.Path, "remote", r.RemoteAddr, "notLogged", unlogged)
		if err != nil {
			logger.Error(err, "Refusing a metrics request: the API server could not review it")
			return
		}
		logger.Info("Refused a metrics request", "code", ans.code, "reason", ans.reason, "message", ans.message)
	})
}

// answer is the outcome of a request's reviews: 200, or the status code
// and message to refuse it with; reason is metrics_requests_total's label.
type answer struct {
	code            int
	reason, message string
}

var (
	allowedAnswer     = answer{http.StatusOK, "allowed", ""}
	noTokenAnswer     = answer{http.StatusUnauthorized, "no_token", "Unauthorized: a bearer token is required"}
	badTokenAnswer    = answer{http.StatusUnauthorized, "token_rejected", "Unauthorized: the API server does not accept the token"}
	rateLimitedAnswer = answer{http.StatusTooManyRequests, "unknown_token_rate", "Too Many Requests: too many new tokens to review; retry later"}
	unavailableAnswer = answer{http.StatusServiceUnavailable, "review_failed", "Service Unavailable: the API server could not review the request"}
)

func forbiddenAnswer(user, verb, path string) answer {
	return answer{http.StatusForbidden, "no_grant", fmt.Sprintf("Forbidden: user %q may not %s %s", user, verb, path)}
}

// answerKey caches an answer by an HMAC of the token under the process's
// secret (the token itself stays out of memory dumps, and its hash cannot
// be matched to a guess without the secret) with the verb and path it was
// asked for.
type answerKey struct {
	token      [sha256.Size]byte
	verb, path string
}

// check answers from the caches, or reviews the token: one review at a
// time per key (singleflight), and a token in neither cache only within
// the unknown-token budget. err is why the apiserver gave no answer.
func (a *delegatedAuth) check(r *http.Request) (answer, error) {
	token, ok := bearerToken(r)
	if !ok {
		return noTokenAnswer, nil
	}
	key := answerKey{a.tokenHash(token), strings.ToLower(r.Method), r.URL.Path}
	known := false
	if v, ok := a.allowed.Get(key); ok {
		if a.now().Sub(v.(time.Time)) < reviewCacheTTL {
			return allowedAnswer, nil
		}
		known = true
	}
	if v, ok := a.refused.Get(key); ok {
		return v.(answer), nil
	}
	// The review outlives a caller that goes away, for the others waiting
	// on it; reviewTimeout bounds it.
	v, err, _ := a.flights.Do(string(key.token[:])+" "+key.verb+" "+key.path, func() (any, error) {
		if !known && !a.allowUnknown(r) {
			return rateLimitedAnswer, nil
		}
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), reviewTimeout)
		defer cancel()
		ans, err := a.review(ctx, token, key.verb, key.path)
		if err != nil {
			return nil, err
		}
		if ans.code == http.StatusOK {
			a.refused.Remove(key)
			a.allowed.Add(key, a.now(), knownTokenTTL)
		} else {
			a.allowed.Remove(key)
			a.refused.Add(key, ans, reviewCacheTTL)
		}
		return ans, nil
	})
	if err != nil {
		return unavailableAnswer, err
	}
	return v.(answer), nil
}

// newSecret is 32 random bytes (crypto/rand.Read never fails).
func newSecret() []byte {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return b
}

// allowUnknown is whether a token in neither cache may be reviewed now:
// whether the client address's turn has come (turns).
func (a *delegatedAuth) allowUnknown(r *http.Request) bool {
	ip := r.RemoteAddr
	if host, _, err := net.SplitHostPort(ip); err == nil {
		ip = host
	}
	return a.unknown.take(ip, a.now())
}

// tokenHash is the HMAC-SHA256 of token under a's secret.
func (a *delegatedAuth) tokenHash(token string) (sum [sha256.Size]byte) {
	m := hmac.New(sha256.New, a.secret)
	m.Write([]byte(token))
	m.Sum(sum[:0])
	return sum
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
		return badTokenAnswer, nil
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
		return forbiddenAnswer(u.Username, verb, path), nil
	}
	return allowedAnswer, nil
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
	case http.StatusTooManyRequests:
		return "rate_limited"
	default:
		return "review_failed"
	}
}
