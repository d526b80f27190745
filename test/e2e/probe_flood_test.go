package e2e

import (
	"context"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/demo-operator/uuid-controller/internal/testflood"
	"github.com/demo-operator/uuid-controller/test/framework"
)

// TestProbesUnderHeldRequests: for 60 s, requests held in flight on the
// health port: from 400 addresses one each (slow headers, so every one is
// still in its grace when the next arrives, and a full server must choose
// among connections that all hold one from their address), each made
// again the moment the controller closes it; and 1,100 from 35 addresses
// (31-32 each, under the per-client cap: slow headers, slow bodies, and
// pipelined requests whose answers are never read), each made again at its
// next write once closed.
// Meanwhile /healthz and /readyz from an address that sorts before all of
// the flood's, on a new connection each as the kubelet's, answer 200
// within 1 s every time, and the controller's memory grows by at most
// 30 MiB.
func TestProbesUnderHeldRequests(t *testing.T) {
	mixed := []testflood.Kind{testflood.SlowHeaders}
	for range 9 {
		mixed = append(mixed, testflood.SlowBody, testflood.Pipelined)
	}
	for _, shape := range []struct {
		name         string
		addrs, conns int
		kinds        []testflood.Kind
		start        func(context.Context, string, string, []net.IP, int, ...testflood.Kind) *testflood.Flood
	}{
		{"400 addresses, one each", 400, 400, []testflood.Kind{testflood.SlowHeaders}, testflood.StartReopening},
		{"35 addresses, 31-32 each", 35, 1100, mixed, testflood.Start},
	} {
		t.Run(shape.name, func(t *testing.T) {
			ctx := testCtx(t)
			ns := env.fw.NewNamespace(ctx, t)
			p := framework.StartController(ctx, t, controllerAs(env.kubeconfig), ns)
			before, err := p.RSS()
			if err != nil {
				t.Fatal(err)
			}
			var from []net.IP
			for i := range shape.addrs {
				from = append(from, floodAddr(i))
			}
			flood := shape.start(ctx, hostOf(t, p.HealthURL()), "/healthz", from, shape.conns, shape.kinds...)
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
			if dials < int64(shape.conns) {
				t.Errorf("the flood made only %d connections, want at least %d held", dials, shape.conns)
			}
			healthz.check(t, "/healthz from "+goodAddr.String()+" during the flood", http.StatusOK)
			readyz.check(t, "/readyz from "+goodAddr.String()+" during the flood", http.StatusOK)
			if peak-before > maxRSSGrowth {
				t.Errorf("controller RSS grew by %s under the flood, want at most %s", framework.MiB(peak-before), framework.MiB(maxRSSGrowth))
			}
			mustStayRunning(t, p)
		})
	}
}
