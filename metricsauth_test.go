package main

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/cache"
)

// reviewer stands in for the apiserver's TokenReview and
// SubjectAccessReview: users maps a token to a username, allowed names the
// users with get on /metrics, fail makes every review an error.
type reviewer struct {
	users   map[string]string
	allowed map[string]bool
	fail    error
	calls   int
	asked   *authorizationv1.SubjectAccessReviewSpec
}

type tokenReviews struct{ *reviewer }
type accessReviews struct{ *reviewer }

func (r tokenReviews) Create(_ context.Context, tr *authenticationv1.TokenReview, _ metav1.CreateOptions) (*authenticationv1.TokenReview, error) {
	r.calls++
	if r.fail != nil {
		return nil, r.fail
	}
	out := tr.DeepCopy()
	if name, ok := r.users[tr.Spec.Token]; ok {
		out.Status = authenticationv1.TokenReviewStatus{Authenticated: true, User: authenticationv1.UserInfo{
			Username: name, UID: "uid-" + name, Groups: []string{"group-a"},
			Extra: map[string]authenticationv1.ExtraValue{"scope": {"x"}},
		}}
	}
	return out, nil
}

func (r accessReviews) Create(_ context.Context, sar *authorizationv1.SubjectAccessReview, _ metav1.CreateOptions) (*authorizationv1.SubjectAccessReview, error) {
	r.calls++
	r.asked = sar.Spec.DeepCopy()
	out := sar.DeepCopy()
	out.Status.Allowed = r.allowed[sar.Spec.User]
	return out, nil
}

func newTestAuth(r *reviewer) *delegatedAuth {
	return &delegatedAuth{tokens: tokenReviews{r}, access: accessReviews{r}, answers: cache.NewLRUExpireCache(10), metrics: NewMetrics()}
}

func scrape(h http.Handler, authorization string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
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
	want := authorizationv1.SubjectAccessReviewSpec{
		User: "reader", UID: "uid-reader", Groups: []string{"group-a"},
		Extra:                 map[string]authorizationv1.ExtraValue{"scope": {"x"}},
		NonResourceAttributes: &authorizationv1.NonResourceAttributes{Verb: "get", Path: "/metrics"},
	}
	if got := r.asked; got == nil || got.User != want.User || got.UID != want.UID || len(got.Groups) != 1 ||
		len(got.Extra["scope"]) != 1 || *got.NonResourceAttributes != *want.NonResourceAttributes || got.ResourceAttributes != nil {
		t.Errorf("SubjectAccessReview spec = %+v, want %+v", got, want)
	}
	results := map[string]float64{}
	for _, res := range []string{"ok", "unauthenticated", "forbidden", "review_failed"} {
		results[res] = testutil.ToFloat64(a.metrics.MetricsRequests.WithLabelValues(res))
	}
	if results["ok"] != 2 || results["unauthenticated"] != 4 || results["forbidden"] != 1 || results["review_failed"] != 0 {
		t.Errorf("metrics_requests_total = %v", results)
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
	if n := testutil.ToFloat64(a.metrics.MetricsRequests.WithLabelValues("review_failed")); n != 2 {
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
