package metricsserver

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"golang.org/x/time/rate"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"

	"github.com/demo-operator/uuid-controller/internal/testlog"
)

// reviewer stands in for the apiserver's TokenReview and
// SubjectAccessReview: users maps a token to a username, allowed names the
// users with get on /metrics, fail makes every review an error. A token
// "unbound-..." is the user "unbound".
type reviewer struct {
	users   map[string]string
	allowed map[string]bool
	fail    error
	calls   int
	asked   *authorizationv1.SubjectAccessReviewSpec
	// gate, when set, holds every TokenReview until it is closed.
	gate chan struct{}
	mu   sync.Mutex // guards calls and asked
}

type tokenReviews struct{ *reviewer }
type accessReviews struct{ *reviewer }

func (r tokenReviews) Create(_ context.Context, tr *authenticationv1.TokenReview, _ metav1.CreateOptions) (*authenticationv1.TokenReview, error) {
	r.mu.Lock()
	r.calls++
	r.mu.Unlock()
	if r.gate != nil {
		<-r.gate
	}
	if r.fail != nil {
		return nil, r.fail
	}
	out := tr.DeepCopy()
	name, ok := r.users[tr.Spec.Token]
	if strings.HasPrefix(tr.Spec.Token, "unbound-") {
		name, ok = "unbound", true // a ServiceAccount bound to nothing
	}
	if ok {
		out.Status = authenticationv1.TokenReviewStatus{Authenticated: true, User: authenticationv1.UserInfo{
			Username: name, UID: "uid-" + name, Groups: []string{"group-a"},
			Extra: map[string]authenticationv1.ExtraValue{"scope": {"x"}},
		}}
	}
	return out, nil
}

func (r accessReviews) Create(_ context.Context, sar *authorizationv1.SubjectAccessReview, _ metav1.CreateOptions) (*authorizationv1.SubjectAccessReview, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	r.asked = sar.Spec.DeepCopy()
	out := sar.DeepCopy()
	out.Status.Allowed = r.allowed[sar.Spec.User]
	return out, nil
}

func (r *reviewer) reviews() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls
}

func newTestAuth(r *reviewer) *delegatedAuth {
	return newAuth(tokenReviews{r}, accessReviews{r}, newRequests())
}

// scrape sends one request from an address of its own, so tests of other
// limits stay within each address's share of the review budget.
func scrape(h http.Handler, authorization string) *httptest.ResponseRecorder {
	n := scrapes.Add(1)
	return scrapeFrom(h, net.IPv4(10, byte(n>>16), byte(n>>8), byte(n)).String(), authorization)
}

var scrapes atomic.Int64

// scrapeFrom sends one request from ip.
func scrapeFrom(h http.Handler, ip, authorization string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	req.RemoteAddr = net.JoinHostPort(ip, "1234")
	if authorization != "" {
		req.Header.Set("Authorization", authorization)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func TestDelegatedAuthAnswers(t *testing.T) {
	r := &reviewer{users: map[string]string{"t-reader": "reader", "t-other": "other"}, allowed: map[string]bool{"reader": true}}
	a := newTestAuth(r)
	h := a.wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("the metrics")) }))
	for _, tc := range []struct {
		name, authorization string
		code                int
		body                string
	}{
		{"no header", "", http.StatusUnauthorized, "bearer token is required"},
		{"not bearer", "Basic dXNlcjpwYXNz", http.StatusUnauthorized, "bearer token is required"},
		{"empty bearer", "Bearer ", http.StatusUnauthorized, "bearer token is required"},
		{"unknown token", "Bearer nope", http.StatusUnauthorized, "does not accept the token"},
		{"no grant", "Bearer t-other", http.StatusForbidden, `user "other" may not get /metrics`},
		{"granted", "Bearer t-reader", http.StatusOK, "the metrics"},
		{"scheme in any case", "bearer t-reader", http.StatusOK, "the metrics"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := scrape(h, tc.authorization)
			if rec.Code != tc.code || !strings.Contains(rec.Body.String(), tc.body) {
				t.Errorf("got %d %q, want %d with %q", rec.Code, rec.Body.String(), tc.code, tc.body)
			}
		})
	}
	// The review carries the whole identity the token review returned.
	wantSpec := authorizationv1.SubjectAccessReviewSpec{
		User: "reader", UID: "uid-reader", Groups: []string{"group-a"},
		Extra:                 map[string]authorizationv1.ExtraValue{"scope": {"x"}},
		NonResourceAttributes: &authorizationv1.NonResourceAttributes{Verb: "get", Path: "/metrics"},
	}
	if got := r.asked; got == nil || got.User != wantSpec.User || got.UID != wantSpec.UID || len(got.Groups) != 1 ||
		len(got.Extra["scope"]) != 1 || *got.NonResourceAttributes != *wantSpec.NonResourceAttributes || got.ResourceAttributes != nil {
		t.Errorf("SubjectAccessReview spec = %+v, want %+v", got, wantSpec)
	}
	want := map[[2]string]float64{
		{"ok", "allowed"}: 2, {"unauthenticated", "no_token"}: 3, {"unauthenticated", "token_rejected"}: 1, {"forbidden", "no_grant"}: 1,
		{"rate_limited", "unknown_token_rate"}: 0, {"review_failed", "review_failed"}: 0, // exported from the start
	}
	if got := counts(a.requests); !maps.Equal(got, want) {
		t.Errorf("metrics_requests_total = %v, want %v", got, want)
	}
}

// An apiserver that cannot answer gets the scraper a 503, never the
// metrics, and the failure is not cached: once the apiserver answers
// again, so does /metrics.
func TestDelegatedAuthReviewFailure(t *testing.T) {
	r := &reviewer{users: map[string]string{"t-reader": "reader"}, allowed: map[string]bool{"reader": true}, fail: errors.New("connection refused")}
	a := newTestAuth(r)
	served := false
	h := a.wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { served = true }))
	for range 2 {
		if rec := scrape(h, "Bearer t-reader"); rec.Code != http.StatusServiceUnavailable || served {
			t.Fatalf("review failing: got %d (served %v), want 503 and nothing served", rec.Code, served)
		}
	}
	if r.calls != 2 {
		t.Errorf("%d reviews for two scrapes while failing, want 2 (failures are not cached)", r.calls)
	}
	if n := testutil.ToFloat64(a.requests.WithLabelValues("review_failed", "review_failed")); n != 2 {
		t.Errorf("metrics_requests_total{result=review_failed} = %v, want 2", n)
	}
	r.fail = nil
	if rec := scrape(h, "Bearer t-reader"); rec.Code != http.StatusOK || !served {
		t.Errorf("after the apiserver recovered: got %d, want 200", rec.Code)
	}
}

// Answers are cached (by token, verb and path): a scraper every few
// seconds does not cost two reviews a scrape.
func TestDelegatedAuthCachesAnswers(t *testing.T) {
	r := &reviewer{users: map[string]string{"t-reader": "reader", "t-other": "other"}, allowed: map[string]bool{"reader": true}}
	h := newTestAuth(r).wrap(http.NotFoundHandler())
	for range 3 {
		scrape(h, "Bearer t-reader")
		scrape(h, "Bearer t-other")
		scrape(h, "Bearer nope")
	}
	// reader: token + access review; other: token + access; nope: token.
	if r.calls != 5 {
		t.Errorf("%d reviews for 9 scrapes by 3 tokens, want 5", r.calls)
	}
}

// TestDelegatedAuthRevokedGrantStopsWithin10s: an allowed answer is
// reused for 10 s (docs/metrics.md: "a revoked grant stops within 10 s"),
// then the token is reviewed again and a revoked grant refused.
func TestDelegatedAuthRevokedGrantStopsWithin10s(t *testing.T) {
	r := &reviewer{users: map[string]string{"t-reader": "reader"}, allowed: map[string]bool{"reader": true}}
	a := newTestAuth(r)
	now := time.Unix(1_000_000, 0)
	a.now = func() time.Time { return now }
	h := a.wrap(http.NotFoundHandler())
	if rec := scrape(h, "Bearer t-reader"); rec.Code != http.StatusNotFound {
		t.Fatalf("reader: %d, want the handler's 404", rec.Code)
	}
	r.mu.Lock()
	r.allowed["reader"] = false // the grant is revoked
	r.mu.Unlock()
	before := r.reviews()
	now = now.Add(10*time.Second - time.Millisecond)
	if rec := scrape(h, "Bearer t-reader"); rec.Code != http.StatusNotFound || r.reviews() != before {
		t.Errorf("within 10 s: %d after %d more reviews, want the cached answer and none", rec.Code, r.reviews()-before)
	}
	now = now.Add(time.Millisecond)
	if rec := scrape(h, "Bearer t-reader"); rec.Code != http.StatusForbidden {
		t.Errorf("10 s after the review, with the grant revoked: %d, want 403", rec.Code)
	}
}

// newRequests is a counter like the controller's metrics_requests_total.
func newRequests() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "metrics_requests_total"}, []string{"result", "reason"})
}

// counts reads every series of requests: {result, reason} -> count.
func counts(requests *prometheus.CounterVec) map[[2]string]float64 {
	ch := make(chan prometheus.Metric, 100)
	requests.Collect(ch)
	close(ch)
	out := map[[2]string]float64{}
	for m := range ch {
		var pb dto.Metric
		if err := m.Write(&pb); err != nil {
			panic(err)
		}
		var key [2]string
		for _, l := range pb.GetLabel() {
			switch l.GetName() {
			case "result":
				key[0] = l.GetValue()
			case "reason":
				key[1] = l.GetValue()
			}
		}
		out[key] = pb.GetCounter().GetValue()
	}
	return out
}

// Made-up tokens cannot evict an allowed answer: after more refused
// tokens than both caches hold, the reader's answer still comes from the
// cache, with no new review.
func TestDelegatedAuthAllowedNotEvicted(t *testing.T) {
	r := &reviewer{users: map[string]string{"t-reader": "reader"}, allowed: map[string]bool{"reader": true}}
	a := newTestAuth(r)
	a.unknown.budget = rate.NewLimiter(rate.Inf, 1) // every made-up token is reviewed and cached
	h := a.wrap(http.NotFoundHandler())
	scrape(h, "Bearer t-reader")
	before := r.reviews()
	for i := range refusedCacheSize + allowedCacheSize + 1 {
		if rec := scrape(h, fmt.Sprintf("Bearer made-up-%d", i)); rec.Code != http.StatusUnauthorized {
			t.Fatalf("made-up token: %d, want 401", rec.Code)
		}
	}
	made := r.reviews() - before
	if rec := scrape(h, "Bearer t-reader"); rec.Code != http.StatusNotFound {
		t.Fatalf("the reader after the flood: %d, want the handler's 404", rec.Code)
	}
	if n := r.reviews() - before - made; n != 0 {
		t.Errorf("the reader's answer was reviewed again (%d reviews) after %d made-up tokens: they evicted it", n, made)
	}
}

// Concurrent requests with one token share one review.
func TestDelegatedAuthCoalesces(t *testing.T) {
	r := &reviewer{users: map[string]string{"t-reader": "reader"}, allowed: map[string]bool{"reader": true}, gate: make(chan struct{})}
	h := newTestAuth(r).wrap(http.NotFoundHandler())
	var wg sync.WaitGroup
	codes := make([]int, 20)
	for i := range codes {
		wg.Go(func() { codes[i] = scrape(h, "Bearer t-reader").Code })
	}
	// Let the first review start, and the others queue behind it.
	if err := wait.PollUntilContextTimeout(t.Context(), time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		return r.reviews() > 0, nil
	}); err != nil {
		t.Fatal(err)
	}
	close(r.gate)
	wg.Wait()
	for i, c := range codes {
		if c != http.StatusNotFound {
			t.Errorf("request %d: %d, want the handler's 404", i, c)
		}
	}
	// One TokenReview and one SubjectAccessReview, or a few more if some
	// requests came after the first review ended (then from the cache).
	if n := r.reviews(); n != 2 {
		t.Errorf("%d reviews for 20 concurrent requests with one token, want 2", n)
	}
}

// Once the unknown-token budget is spent, a new token gets 429 at once
// (no review, a Retry-After), while a token allowed before is reviewed
// again when its answer is stale, and is served.
func TestDelegatedAuthRateLimitsUnknownTokens(t *testing.T) {
	r := &reviewer{users: map[string]string{"t-reader": "reader"}, allowed: map[string]bool{"reader": true}}
	a := newTestAuth(r)
	now := time.Unix(1000, 0)
	a.now = func() time.Time { return now }
	a.unknown.budget = rate.NewLimiter(0, unknownReviewBurst) // the burst, never refilled
	h := a.wrap(http.NotFoundHandler())
	if rec := scrape(h, "Bearer t-reader"); rec.Code != http.StatusNotFound {
		t.Fatalf("the reader: %d, want the handler's 404", rec.Code)
	}
	for i := range unknownReviewBurst - 1 {
		if rec := scrape(h, fmt.Sprintf("Bearer made-up-%d", i)); rec.Code != http.StatusUnauthorized {
			t.Fatalf("made-up token %d within the budget: %d, want 401", i, rec.Code)
		}
	}
	before := r.reviews()
	rec := scrape(h, "Bearer one-too-many")
	if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") == "" || r.reviews() != before {
		t.Errorf("a new token over the budget: %d, Retry-After %q, %d reviews; want 429, a Retry-After and none",
			rec.Code, rec.Header().Get("Retry-After"), r.reviews()-before)
	}
	now = now.Add(reviewCacheTTL + time.Second)
	if rec := scrape(h, "Bearer t-reader"); rec.Code != http.StatusNotFound || r.reviews() != before+2 {
		t.Errorf("the reader, stale, over the budget: %d after %d reviews; want the handler's 404 after 2", rec.Code, r.reviews()-before)
	}
	if n := testutil.ToFloat64(a.requests.WithLabelValues("rate_limited", "unknown_token_rate")); n != 1 {
		t.Errorf("metrics_requests_total{result=rate_limited} = %v, want 1", n)
	}
}

// A refused token is asked about once per reviewCacheTTL, then again.
func TestDelegatedAuthCachesRefusals(t *testing.T) {
	r := &reviewer{users: map[string]string{"t-other": "other"}}
	a := newTestAuth(r)
	now := time.Unix(1000, 0)
	a.now = func() time.Time { return now }
	h := a.wrap(http.NotFoundHandler())
	for range 3 {
		if rec := scrape(h, "Bearer t-other"); rec.Code != http.StatusForbidden {
			t.Fatalf("no grant: %d, want 403", rec.Code)
		}
	}
	if n := r.reviews(); n != 2 {
		t.Errorf("%d reviews for 3 refused requests with one token, want 2 (one of each)", n)
	}
}

// A flood of refusals is logged about once a second: 200 requests with
// made-up tokens make at most 3 lines (the burst), each with the path and
// the client, the later ones with the counts not logged.
func TestDelegatedAuthSamplesRefusalLogs(t *testing.T) {
	r := &reviewer{}
	a := newTestAuth(r)
	a.unknown.budget = rate.NewLimiter(rate.Inf, 1)
	logger, logs := testlog.New(t, 0)
	h := a.wrap(http.NotFoundHandler())
	for i := range 200 {
		req := httptest.NewRequestWithContext(klog.NewContext(t.Context(), logger), http.MethodGet, "/metrics", nil)
		req.Header.Set("Authorization", fmt.Sprintf("Bearer made-up-%d", i))
		h.ServeHTTP(httptest.NewRecorder(), req)
	}
	msgs := logs.Messages()
	if len(msgs) < 1 || len(msgs) > 3 {
		t.Fatalf("200 refused requests logged %d lines, want 1 to 3:\n%s", len(msgs), logs)
	}
	for _, want := range []string{"Refused a metrics request", "token_rejected", "remote", "/metrics"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the log does not mention %q:\n%s", want, logs)
		}
	}
}

// TestTokenHashIsKeyed: the caches key a token by an HMAC under a secret
// of each process (here each delegatedAuth), not by its plain SHA-256: the
// same token has one key in one process, another in the next, and neither
// is its SHA-256.
func TestTokenHashIsKeyed(t *testing.T) {
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "r"}, []string{"result", "reason"})
	a, b := newAuth(nil, nil, requests), newAuth(nil, nil, requests)
	const token = "a-token"
	if a.tokenHash(token) != a.tokenHash(token) {
		t.Error("one token has two keys in one process")
	}
	if a.tokenHash(token) == b.tokenHash(token) {
		t.Error("one token has the same key in two processes: the secret is not per process")
	}
	if a.tokenHash(token) == sha256.Sum256([]byte(token)) {
		t.Error("the key is the token's plain SHA-256")
	}
}
