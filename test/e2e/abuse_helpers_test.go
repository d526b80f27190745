package e2e

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"sync"
	"testing"
	"time"
)

// Loopback addresses the abuse tests tell clients apart by (every 127.x
// address is loopback): the test's probes and legitimate scrapes come from
// 127.0.0.1, as the kubelet's and Prometheus' come from addresses of their
// own; abusive clients from others, as other Pods would.
var (
	goodAddr    = net.IPv4(127, 0, 0, 1)
	abusiveAddr = net.IPv4(127, 0, 0, 2)
)

// floodAddr is the i-th of many abusive client addresses (127.0.1.0 on),
// one per client, as many Pods would have.
func floodAddr(i int) net.IP { return net.IPv4(127, 0, byte(1+i/250), byte(1+i%250)) }

// dialerFrom dials from ip, any port.
func dialerFrom(ip net.IP) *net.Dialer {
	return &net.Dialer{LocalAddr: &net.TCPAddr{IP: ip}, Timeout: 15 * time.Second}
}

// clientFrom is an HTTP client that sends from ip, keeps its connection
// alive between requests as Prometheus does, trusts any certificate (the
// controller's own, made in memory) and gives up after timeout.
func clientFrom(ip net.IP, timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, Transport: &http.Transport{
		DialContext:     dialerFrom(ip).DialContext,
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true},
		MaxIdleConns:    1, MaxIdleConnsPerHost: 1,
	}}
}

// hostOf is the host:port of a URL.
func hostOf(t *testing.T, rawURL string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}

// timedGet sends one GET (with token as bearer token unless "") and returns
// the status code and how long the answer took; the body is read in full.
func timedGet(ctx context.Context, hc *http.Client, rawURL, token string) (int, time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, rawURL, nil)
	if err != nil {
		return 0, 0, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	start := time.Now()
	resp, err := hc.Do(req)
	if err != nil {
		return 0, time.Since(start), err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, time.Since(start), err
}

// answers collects the outcomes of a legitimate client's requests.
type answers struct {
	mu    sync.Mutex
	codes []int
	took  []time.Duration
	errs  []error
}

func (a *answers) add(code int, took time.Duration, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.codes, a.took = append(a.codes, code), append(a.took, took)
	if err != nil {
		a.errs = append(a.errs, err)
	}
}

// checkNoRestart fails the test when failureThreshold answers in a row
// were not want: what makes the kubelet restart a container (its default
// failureThreshold is 3) or take it out of its Service. A lone failure is
// logged with the count, not failed.
func (a *answers) checkNoRestart(t *testing.T, what string, want, failureThreshold int) {
	t.Helper()
	a.mu.Lock()
	codes := slices.Clone(a.codes)
	a.mu.Unlock()
	if len(codes) == 0 {
		t.Errorf("%s: no request was sent", what)
		return
	}
	bad, run, longest := 0, 0, 0
	for _, c := range codes {
		if c == want {
			run = 0
			continue
		}
		bad++
		run++
		longest = max(longest, run)
	}
	t.Logf("%s: %d of %d not answered %d, at most %d in a row (the kubelet acts on %d)", what, bad, len(codes), want, longest, failureThreshold)
	if longest >= failureThreshold {
		t.Errorf("%s: %d answers in a row were not %d: the kubelet would restart the controller", what, longest, want)
	}
}

// check fails the test unless every answer was want, and logs the latencies.
func (a *answers) check(t *testing.T, what string, want int) {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.codes) == 0 {
		t.Errorf("%s: no request was sent", what)
		return
	}
	bad := 0
	byCode := map[int]int{}
	for _, c := range a.codes {
		byCode[c]++
		if c != want {
			bad++
		}
	}
	sorted := slices.Sorted(slices.Values(a.took))
	t.Logf("%s: %d requests, answers by code %v (0: none); latency min %s, median %s, max %s",
		what, len(a.codes), byCode, sorted[0].Round(time.Millisecond), sorted[len(sorted)/2].Round(time.Millisecond),
		sorted[len(sorted)-1].Round(time.Millisecond))
	if bad > 0 {
		t.Errorf("%s: %d of %d requests were not answered %d (0: no answer); errors: %v", what, bad, len(a.codes), want, a.errs[:min(len(a.errs), 5)])
	}
}

// every calls f every interval until ctx ends, and waits for the last call.
func every(ctx context.Context, interval time.Duration, f func()) (wait func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			f()
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return func() { <-done }
}

// isTimeout is true for a deadline or timeout error.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}
