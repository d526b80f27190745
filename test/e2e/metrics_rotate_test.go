package e2e

import (
	"context"
	"crypto/rand"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/demo-operator/uuid-controller/test/cluster"
)

// TestMetricsRotatedTokenDuringFlood: while one address (127.0.0.2) floods
// /metrics with a new made-up token on each request from 16 clients, a
// Prometheus from another address whose token was just rotated (a token
// never seen before) retries every second and gets 200 within 10 s: each
// address has its own share of the new-token review budget.
func TestMetricsRotatedTokenDuringFlood(t *testing.T) {
	ctx := testCtx(t)
	ns := env.fw.NewNamespace(ctx, t)
	reader, _ := metricsTokens(ctx, t, ns)
	p := startSecureController(ctx, t, env.kubeconfig, ns, cluster.MetricsAuth{Token: reader})
	rotated, err := env.cluster.ServiceAccountToken(ctx, ns, "metrics-reader")
	if err != nil {
		t.Fatal(err)
	}

	floodCtx, stop := context.WithCancel(ctx)
	defer stop()
	flood := &floodCodes{codes: map[int]int{}}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stop()
	for range 16 {
		hc := clientFrom(abusiveAddr, 10*time.Second)
		wg.Go(func() {
			for floodCtx.Err() == nil {
				code, _, err := timedGet(floodCtx, hc, p.MetricsURL(), rand.Text())
				flood.add(code, err)
			}
			hc.CloseIdleConnections()
		})
	}
	// The flood has spent the burst once it gets 429s.
	waitFor(t, 30*time.Second, "the flood to be rate limited", func() bool {
		flood.mu.Lock()
		defer flood.mu.Unlock()
		return flood.codes[http.StatusTooManyRequests] > 0
	})

	scraper := clientFrom(goodAddr, 10*time.Second)
	start := time.Now()
	var codes []int
	for time.Since(start) < 10*time.Second {
		code, _, _ := timedGet(ctx, scraper, p.MetricsURL(), rotated)
		codes = append(codes, code)
		if code == http.StatusOK {
			break
		}
		time.Sleep(time.Second) // Prometheus retries at its next scrape
	}
	stop()
	wg.Wait()
	t.Logf("the rotated token's answers, a second apart: %v (after %s); the flood's answers: %s", codes, time.Since(start).Round(time.Millisecond), flood.summary())
	if codes[len(codes)-1] != http.StatusOK {
		t.Errorf("a rotated token from another address got %v for 10 s during a one-address flood, want 200 within 10 s", codes)
	}
	mustStayRunning(t, p)
}
