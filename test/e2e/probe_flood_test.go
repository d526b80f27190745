package e2e

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/demo-operator/uuid-controller/internal/testflood"
	"github.com/demo-operator/uuid-controller/test/framework"
)

// TestProbesUnderHeldRequests: for 60 s, requests held in flight on the
// health port, in each of testflood.ProbeShapes: 400 addresses one each
// (slow headers, made again the moment the controller closes them, so a
// full server must choose among connections all in their grace, each the
// only one of its address), and 1,100 from 35 addresses (31-32 each,
// under the per-client cap: slow headers, slow bodies, and pipelined
// requests whose answers are never read). Meanwhile /healthz and /readyz
// from an address that sorts before all of the flood's, on a new
// connection each as the kubelet's, answer 200 within 1 s, never failing
// 3 in a row (the kubelet's failureThreshold: what restarts a replica),
// and the controller's memory grows by at most 30 MiB. The 35-address
// shape must answer every probe; the 400-address one, whose connections
// are all in their grace, lost 1 probe of 242 in a CI-like run.
func TestProbesUnderHeldRequests(t *testing.T) {
	for _, shape := range testflood.ProbeShapes() {
		t.Run(shape.Name, func(t *testing.T) {
			ctx := testCtx(t)
			ns := env.fw.NewNamespace(ctx, t)
			p := framework.StartController(ctx, t, controllerAs(env.kubeconfig), ns)
			before, err := p.RSS()
			if err != nil {
				t.Fatal(err)
			}
			flood := shape.Start(ctx, hostOf(t, p.HealthURL()), "/healthz")
			defer flood.Stop()

			probeCtx, stop := context.WithTimeout(ctx, 60*time.Second)
			defer stop()
			var healthz, readyz answers
			probe := &http.Client{Timeout: time.Second, Transport: &http.Transport{
				DialContext:       dialerFrom(goodAddr).DialContext,
				DisableKeepAlives: true,
			}}
			wait := every(probeCtx, 500*time.Millisecond, func() {
				// ctx, not probeCtx: the last probe must not be cut off by
				// the end of the 60 s.
				healthz.add(timedGet(ctx, probe, p.HealthURL()+"/healthz", ""))
				readyz.add(timedGet(ctx, probe, p.HealthURL()+"/readyz", ""))
			})
			<-probeCtx.Done()
			wait()
			dials, closed := flood.Dials.Load(), flood.Closed.Load()
			flood.Stop()
			peak, err := p.PeakRSS()
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("flood: %d connections made in 60 s, %d closed by the server; controller RSS %s before, peak %s: +%s",
				dials, closed, framework.MiB(before), framework.MiB(peak), framework.MiB(peak-before))
			if dials < int64(shape.Conns) {
				t.Errorf("the flood made only %d connections, want at least %d held", dials, shape.Conns)
			}
			if shape.Reopening {
				healthz.checkNoRestart(t, "/healthz from "+goodAddr.String()+" during the flood", http.StatusOK, 3)
				readyz.checkNoRestart(t, "/readyz from "+goodAddr.String()+" during the flood", http.StatusOK, 3)
			} else {
				healthz.check(t, "/healthz from "+goodAddr.String()+" during the flood", http.StatusOK)
				readyz.check(t, "/readyz from "+goodAddr.String()+" during the flood", http.StatusOK)
			}
			if peak-before > maxRSSGrowth {
				t.Errorf("controller RSS grew by %s under the flood, want at most %s", framework.MiB(peak-before), framework.MiB(maxRSSGrowth))
			}
			mustStayRunning(t, p)
		})
	}
}
