package e2e

import (
	"context"
	"crypto/rand"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/demo-operator/uuid-controller/test/cluster"
	"github.com/demo-operator/uuid-controller/test/framework"
)

// The flood TestMetricsTokenFlood sends: the figures.
const (
	floodClients  = 400
	floodFor      = 30 * time.Second
	scrapeEvery   = 2 * time.Second
	maxFloodLines = 100
)

// TestMetricsTokenFlood: 400 clients, each from an address of its own,
// send /metrics requests with a new made-up bearer token each time for
// 30 s, while a scraper with a valid token, scraping since before the
// flood as Prometheus would be, scrapes every 2 s and an object is created
// every 2 s. Every scrape is answered 200, the controller logs fewer than
// 100 lines in all, and every object gets its UUID. The create-to-UUID
// latencies are printed beside those of objects created one at a time
// just before the flood: the flood takes both cores, so they are the
// machine's figure as much as the controller's, and not asserted.
func TestMetricsTokenFlood(t *testing.T) {
	ctx := testCtx(t)
	ns := env.fw.NewNamespace(ctx, t)
	reader, _ := metricsTokens(ctx, t, ns)
	p := startSecureController(ctx, t, env.kubeconfig, ns, cluster.MetricsAuth{Token: reader})
	assigned := watchAssigned(ctx, t, ns)
	var idle []time.Duration
	for j := range 10 {
		name := fmt.Sprintf("idle-%d", j)
		start := time.Now()
		env.fw.CreateUuids(ctx, t, ns, name, 1)
		at, ok := assigned.at(ctx, name+"-0", 30*time.Second)
		if !ok {
			t.Fatalf("%s-0 has no UUID 30 s after its create, before any flood", name)
		}
		idle = append(idle, at.Sub(start))
	}
	// The scraper has scraped before the flood, as Prometheus would have.
	var scrapes answers
	scraper := clientFrom(goodAddr, 10*time.Second)
	scrapes.add(timedGet(ctx, scraper, p.MetricsURL(), reader))

	linesBefore := strings.Count(p.Output(), "\n")
	floodCtx, stop := context.WithTimeout(ctx, floodFor)
	defer stop()
	flood := &floodCodes{codes: map[int]int{}}
	var wg sync.WaitGroup
	for i := range floodClients {
		hc := clientFrom(floodAddr(i), 10*time.Second)
		wg.Go(func() {
			for floodCtx.Err() == nil {
				code, _, err := timedGet(floodCtx, hc, p.MetricsURL(), rand.Text())
				flood.add(code, err)
			}
			hc.CloseIdleConnections()
		})
	}
	// The scraper keeps one connection alive, with a 10 s scrape timeout.
	waitScrapes := every(floodCtx, scrapeEvery, func() { scrapes.add(timedGet(ctx, scraper, p.MetricsURL(), reader)) })
	created := map[string]time.Time{}
	i := 0
	waitCreates := every(floodCtx, scrapeEvery, func() {
		name := fmt.Sprintf("flood-%d", i)
		i++
		created[name] = time.Now()
		if _, err := env.fw.Uuids(ns).Create(ctx, framework.NewUuid(name), metav1.CreateOptions{}); err != nil {
			t.Errorf("create %s: %v", name, err)
		}
	})
	wg.Wait()
	waitScrapes()
	waitCreates()
	// What the flood made the controller log reaches the pipe a moment
	// later.
	lines := int(settled(t, func() (float64, error) { return float64(strings.Count(p.Output(), "\n")), nil })) - linesBefore

	t.Logf("flood: %d clients for %s sent %d requests: answers %v", floodClients, floodFor, flood.total(), flood.summary())
	flood.check(t)
	scrapes.check(t, "the legitimate scraper during the flood", http.StatusOK)
	t.Logf("the controller logged %d lines during the flood", lines)
	if lines >= maxFloodLines {
		t.Errorf("the controller logged %d lines during the flood, want fewer than %d; the last ones:\n%s", lines, maxFloodLines, framework.LastLines(p.Output(), 5))
	}
	names := slices.Sorted(maps.Keys(created))
	var took []time.Duration
	for _, n := range names {
		at, ok := assigned.at(ctx, n, 30*time.Second)
		if !ok {
			t.Errorf("%s, created during the flood, has no UUID 30 s later", n)
			continue
		}
		took = append(took, at.Sub(created[n]))
	}
	t.Logf("create-to-UUID of %d objects one at a time before the flood: %v", len(idle), roundAll(idle))
	t.Logf("create-to-UUID of the %d objects created during the flood: %v", len(names), roundAll(took))
	mustStayRunning(t, p)
}

// The budget for new tokens' reviews (internal/metricsserver's
// unknownReviewQPS and unknownReviewBurst, docs/security.md): 5 a second
// after a burst of 10.
const (
	unknownReviewQPS   = 5
	unknownReviewBurst = 10
)

// check asserts what the flood got back: each made-up token either
// reviewed and refused (401) within the new-token budget over the flood's
// length (a second more for requests in flight as it ends), or refused
// unreviewed with 429; never the metrics, never a 403, never a 503.
func (f *floodCodes) check(t *testing.T) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	budget := unknownReviewBurst + unknownReviewQPS*int((floodFor+time.Second)/time.Second)
	if n := f.codes[http.StatusUnauthorized]; n == 0 || n > budget {
		t.Errorf("the flood got %d 401s (tokens reviewed), want 1 to %d, the new-token budget over %s", n, budget, floodFor)
	}
	if f.codes[http.StatusTooManyRequests] == 0 {
		t.Errorf("the flood got no 429 (answers %v): its tokens were not rate limited", f.codes)
	}
	for code, n := range f.codes {
		if code != http.StatusUnauthorized && code != http.StatusTooManyRequests && code != 0 {
			t.Errorf("the flood got %d answers %d; want only 401 and 429", n, code)
		}
	}
}

// floodCodes counts the flood's answers by status code (0: no answer).
type floodCodes struct {
	mu    sync.Mutex
	codes map[int]int
	err   error
}

func (f *floodCodes) add(code int, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.codes[code]++
	if err != nil && code == 0 {
		f.err = err
	}
}

func (f *floodCodes) total() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.codes {
		n += c
	}
	return n
}

func (f *floodCodes) summary() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := fmt.Sprint(f.codes)
	if f.err != nil {
		s += fmt.Sprintf(" (a failed request: %v)", f.err)
	}
	return s
}

// assignedTimes records when each object in a namespace is first seen
// with a UUID, from a watch started before the objects are created.
type assignedTimes struct {
	mu   sync.Mutex
	seen map[string]time.Time
}

func watchAssigned(ctx context.Context, t *testing.T, ns string) *assignedTimes {
	t.Helper()
	w, err := env.fw.Uuids(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	a := &assignedTimes{seen: map[string]time.Time{}}
	go func() {
		for ev := range w.ResultChan() {
			u, ok := ev.Object.(*unstructured.Unstructured)
			if !ok || ev.Type == watch.Deleted {
				continue
			}
			if framework.UUIDOf(u.Object) != "" {
				a.mu.Lock()
				if _, ok := a.seen[u.GetName()]; !ok {
					a.seen[u.GetName()] = time.Now()
				}
				a.mu.Unlock()
			}
		}
	}()
	return a
}

// at waits up to timeout for name's UUID and returns when it was seen.
func (a *assignedTimes) at(ctx context.Context, name string, timeout time.Duration) (time.Time, bool) {
	var at time.Time
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		a.mu.Lock()
		defer a.mu.Unlock()
		at = a.seen[name]
		return !at.IsZero(), nil
	})
	return at, err == nil
}

func roundAll(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(100 * time.Microsecond)
	}
	return out
}
