package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
)

// BenchmarkInformerSync is the controller's own share of a restart: an
// informer built as main builds it (the informer's decoding client,
// trimForCache, the controller's handlers) syncs over UUID_BENCH_OBJECTS
// (default 100,000) objects with a UUID, streamed (watch-list) by an in-process server that
// sends prepared bytes. Without the apiserver's work on the same cores,
// `go test -run ^$ -bench InformerSync -cpuprofile cpu.out` splits the
// time between decoding, the transform, the store and the garbage
// collector. It reports the time, CPU and allocation per object and the
// live heap per cached object after a GC. BENCHMARKS.md has the figures.
func BenchmarkInformerSync(b *testing.B) {
	n := 100_000
	if s := os.Getenv("UUID_BENCH_OBJECTS"); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil || n < 1 {
			b.Fatalf("UUID_BENCH_OBJECTS=%q is not a positive count", s)
		}
	}
	stream := watchListStream(n)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if q.Get("watch") != "true" || q.Get("sendInitialEvents") != "true" {
			// A list instead of a watch-list would make this benchmark
			// measure something other than what the controller does.
			http.Error(w, "only watch-list is served here", http.StatusNotImplemented)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(stream)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	defer srv.Close()

	var before, after runtime.MemStats
	var cpu time.Duration
	b.ReportAllocs()
	for b.Loop() {
		ctx, cancel := context.WithCancel(context.Background())
		cfg := &rest.Config{Host: srv.URL, QPS: -1}
		dyn, err := dynamic.NewForConfig(cfg)
		if err != nil {
			b.Fatal(err)
		}
		infDyn, err := newInformerClient(cfg)
		if err != nil {
			b.Fatal(err)
		}
		runtime.GC()
		runtime.ReadMemStats(&before)
		cpu0 := processCPU(b)
		informer := newInformer(infDyn, "bench", 0, false, ignoreAccess)
		if _, err := NewController(ctx, testDeps(dyn, informer, record.NewFakeRecorder(1), NewMetrics()), Options{}); err != nil {
			b.Fatal(err)
		}
		done := make(chan struct{})
		go func() { defer close(done); informer.Informer().RunWithContext(ctx) }()
		if !cache.WaitForCacheSync(ctx.Done(), informer.Informer().HasSynced) {
			b.Fatal("informer did not sync")
		}
		b.StopTimer()
		cpu += processCPU(b) - cpu0
		if got := len(informer.Informer().GetStore().ListKeys()); got != n {
			b.Fatalf("cache holds %d objects, want %d", got, n)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(n), "live-B/object")
		cancel()
		<-done
		b.StartTimer()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/object")
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N*n), "cpu-ns/object")
}

// processCPU is the CPU time (user and system) the process has used: on a
// loaded machine a fairer measure of the work than the time taken.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// watchListStream is what the apiserver sends a watch-list of n objects:
// an ADDED event for each, then the bookmark that ends the initial events.
// Each object is as the apiserver serves one after the controller's write
// (test/bench's objects: an empty spec, two managedFields entries).
func watchListStream(n int) []byte {
	var buf bytes.Buffer
	for i := range n {
		fmt.Fprintf(&buf, `{"type":"ADDED","object":{"apiVersion":"demo.operator/v1","kind":"Uuid","metadata":{"creationTimestamp":"2026-12-05T05:00:00Z","generation":1,"managedFields":[{"apiVersion":"demo.operator/v1","fieldsType":"FieldsV1","fieldsV1":{"f:spec":{}},"manager":"bench","operation":"Update","time":"2026-12-05T05:00:00Z"},{"apiVersion":"demo.operator/v1","fieldsType":"FieldsV1","fieldsV1":{"f:status":{"f:conditions":{".":{},"k:{\"type\":\"Ready\"}":{".":{},"f:lastTransitionTime":{},"f:message":{},"f:reason":{},"f:status":{},"f:type":{}}},"f:message":{},"f:state":{},"f:uuid":{}}},"manager":"uuid-controller","operation":"Update","subresource":"status","time":"2026-12-05T05:00:01Z"}],"name":"obj-%06d","namespace":"bench","resourceVersion":"%d","uid":"0c6f1a52-7d1e-4b8a-9f3e-%012d"},"spec":{},"status":{"conditions":[{"lastTransitionTime":"2026-12-05T05:00:01Z","message":"resource created successfully","reason":"UUIDAssigned","status":"True","type":"Ready"}],"message":"resource created successfully","state":"Ok","uuid":"3d6a4f0e-5b2c-4e7a-9c1d-%012d"}}}`+"\n",
			i, 1000+i, i, i)
	}
	fmt.Fprintf(&buf, `{"type":"BOOKMARK","object":{"apiVersion":"demo.operator/v1","kind":"Uuid","metadata":{"resourceVersion":"%d","annotations":{"k8s.io/initial-events-end":"true"}}}}`+"\n", 1000+n)
	return buf.Bytes()
}
