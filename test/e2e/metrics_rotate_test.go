package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/demo-operator/uuid-controller/test/cluster"
	"github.com/demo-operator/uuid-controller/test/framework"
)

// rotateFloodAddrs is how many addresses flood in
// TestMetricsRotatedTokenDuringFlood; each sends a request every
// rotateFloodEvery, far more than the new-token budget.
const (
	rotateFloodAddrs = 50
	rotateFloodEvery = 100 * time.Millisecond
)

// TestMetricsRotatedTokenDuringFlood: 50 addresses flood /metrics with
// well-formed tokens the controller has not seen: half JWTs of an issuer
// the apiserver does not know (TokenReview: unauthenticated, 401), half
// tokens of a ServiceAccount bound to nothing (TokenReview ok,
// SubjectAccessReview denied, 403), a new one after each review. A
// Prometheus from another address whose token was just rotated retries
// every second and gets 200 within 10 s: during the flood, and right after
// the controller restarts during it (same port, nothing remembered, the
// flood asking first). The new-token budget goes to the addresses in turns:
// the scraper's token is reviewed before those of addresses served already.
func TestMetricsRotatedTokenDuringFlood(t *testing.T) {
	ctx := testCtx(t)
	ns := env.fw.NewNamespace(ctx, t)
	reader, _ := metricsTokens(ctx, t, ns)
	opts := cluster.ControllerOptions{Binary: env.binary, Kubeconfig: env.kubeconfig, MetricsAuth: &cluster.MetricsAuth{Token: reader}}
	p := framework.StartController(ctx, t, opts, ns)
	url := p.MetricsURL()
	rotated, err := env.cluster.ServiceAccountToken(ctx, ns, "metrics-reader")
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := newForeignIssuer()
	if err != nil {
		t.Fatal(err)
	}

	floodCtx, stop := context.WithCancel(ctx)
	reviewed := make([]atomic.Bool, rotateFloodAddrs)
	flood := &floodCodes{codes: map[int]int{}}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stop()
	for i := range rotateFloodAddrs {
		hc := clientFrom(floodAddr(i), 10*time.Second)
		wg.Go(func() {
			defer hc.CloseIdleConnections()
			next := foreign.token
			if i%2 == 1 {
				next = func() string { return unboundToken(floodCtx, ns) }
			}
			token := next()
			tick := time.NewTicker(rotateFloodEvery)
			defer tick.Stop()
			for floodCtx.Err() == nil {
				code, _, err := timedGet(floodCtx, hc, url, token)
				flood.add(code, err)
				if code == http.StatusUnauthorized || code == http.StatusForbidden { // reviewed
					reviewed[i].Store(true)
					token = next()
				}
				select {
				case <-floodCtx.Done():
				case <-tick.C:
				}
			}
		})
	}
	// In turns, each flooding address has a review within (50 - 10)/5 =
	// 8 s of the flood's start; then the flood is at full strength.
	floodStart := time.Now()
	if err := framework.PollTrue(ctx, 30*time.Second, "each flooding address to have had a token reviewed", func() bool {
		for i := range reviewed {
			if !reviewed[i].Load() {
				return false
			}
		}
		return true
	}); err != nil {
		t.Errorf("%v: the budget did not go to the addresses in turns (answers so far %s)", err, flood.summary())
	} else {
		t.Logf("each flooding address had a token reviewed within %s", time.Since(floodStart).Round(time.Millisecond))
	}

	scraper := clientFrom(goodAddr, 10*time.Second)
	codes, took := scrapeUntilOK(ctx, scraper, url, rotated)
	t.Logf("during the flood, the rotated token's answers a second apart: %v (last after %s)", codes, took.Round(time.Millisecond))
	if codes[len(codes)-1] != http.StatusOK {
		t.Errorf("a rotated token from another address got %v for 10 s while %d addresses flooded, want 200 within 10 s", codes, rotateFloodAddrs)
	}
	mustStayRunning(t, p)

	// The restart: the flood goes on against the port, which the new
	// process opens again; the scraper retries every second meanwhile and
	// has 10 s from the new process's first answer.
	p.Stop()
	restarted := time.Now()
	p2 := framework.LaunchController(ctx, t, opts, ns, "--metrics-addr", hostOf(t, url))
	for {
		code, _, _ := timedGet(ctx, scraper, url, rotated)
		if code != 0 {
			break
		}
		if time.Since(restarted) > time.Minute {
			t.Fatalf("no answer on %s a minute after the restart; controller output:\n%s", url, p2.Output())
		}
		time.Sleep(time.Second)
	}
	firstAnswer := time.Since(restarted)
	codes, took = scrapeUntilOK(ctx, scraper, url, rotated)
	t.Logf("after the restart (its first answer %s after it), the scraper's answers a second apart: %v (last after %s)",
		firstAnswer.Round(time.Millisecond), codes, took.Round(time.Millisecond))
	if codes[len(codes)-1] != http.StatusOK {
		t.Errorf("right after a restart, the scraper's token got %v for 10 s while %d addresses flooded, want 200 within 10 s", codes, rotateFloodAddrs)
	}
	stop()
	wg.Wait()
	t.Logf("the flood's answers (0: none, across the restart): %s", flood.summary())
	flood.mu.Lock()
	for _, code := range []int{http.StatusUnauthorized, http.StatusForbidden, http.StatusTooManyRequests} {
		if flood.codes[code] == 0 {
			t.Errorf("the flood got no %d (answers %v): not the flood this test means (401: foreign JWTs reviewed, 403: unbound tokens reviewed, 429: over the budget)", code, flood.codes)
		}
	}
	flood.mu.Unlock()
	mustStayRunning(t, p2)
}

// scrapeUntilOK sends token from hc every second, as a Prometheus retrying
// would, until it gets 200 or 10 s have passed; it returns the answers
// and how long it took.
func scrapeUntilOK(ctx context.Context, hc *http.Client, url, token string) ([]int, time.Duration) {
	start := time.Now()
	var codes []int
	for {
		code, _, _ := timedGet(ctx, hc, url, token)
		codes = append(codes, code)
		if code == http.StatusOK || time.Since(start) >= 10*time.Second {
			return codes, time.Since(start)
		}
		time.Sleep(time.Second)
	}
}

// unboundToken is a new token of ns's ServiceAccount "stranger", which
// metricsTokens binds to nothing; "" if the apiserver gave none.
func unboundToken(ctx context.Context, ns string) string {
	tr, err := env.kube.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "stranger", &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		return ""
	}
	return tr.Status.Token
}

// foreignIssuer signs JWTs shaped as a ServiceAccount's, with a key and
// an issuer the apiserver does not know.
type foreignIssuer struct{ key *ecdsa.PrivateKey }

func newForeignIssuer() (*foreignIssuer, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	return &foreignIssuer{key}, err
}

// token is a new ES256 JWT (a fresh jti each), "" if signing failed.
func (f *foreignIssuer) token() string {
	now := time.Now().Unix()
	enc := base64.RawURLEncoding
	header, _ := json.Marshal(map[string]string{"alg": "ES256", "typ": "JWT", "kid": "flood"})
	claims, _ := json.Marshal(map[string]any{
		"iss": "https://issuer.attacker.example", "sub": "system:serviceaccount:default:default",
		"aud": []string{"https://kubernetes.default.svc"}, "iat": now, "nbf": now, "exp": now + 3600, "jti": rand.Text(),
	})
	signed := enc.EncodeToString(header) + "." + enc.EncodeToString(claims)
	digest := sha256.Sum256([]byte(signed))
	r, s, err := ecdsa.Sign(rand.Reader, f.key, digest[:])
	if err != nil {
		return ""
	}
	sig := make([]byte, 64)
	r.FillBytes(sig[:32])
	s.FillBytes(sig[32:])
	return signed + "." + enc.EncodeToString(sig)
}
