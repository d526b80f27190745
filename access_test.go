package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	apiwatch "k8s.io/apimachinery/pkg/watch"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2"

	"github.com/demo-operator/uuid-controller/internal/testlog"
	"github.com/demo-operator/uuid-controller/test/framework"
)

// A grant removed after the informer synced: the cache stays synced, so
// /readyz's informer check cannot tell, but the next list or watch is
// refused, and the watch check, uuid_controller_watch_refused and one log
// line say so until a request succeeds again (one more line then).
func TestWatchRefusedAfterSync(t *testing.T) {
	logger, logs := testlog.New(t, 0)
	ctx := klog.NewContext(context.Background(), logger)
	client := newClient(t, newUUIDObject("a", "one", "1"))
	var revoked atomic.Bool
	refuse := func() error { return apierrors.NewForbidden(uuidGVR.GroupResource(), "", errors.New("RBAC removed")) }
	watchers := make(chan *apiwatch.FakeWatcher, 100)
	client.PrependReactor("list", "uuid", func(k8stesting.Action) (bool, runtime.Object, error) {
		if revoked.Load() {
			return true, nil, refuse()
		}
		return false, nil, nil
	})
	client.PrependWatchReactor("uuid", func(k8stesting.Action) (bool, apiwatch.Interface, error) {
		if revoked.Load() {
			return true, nil, refuse()
		}
		fw := apiwatch.NewFake()
		watchers <- fw
		return true, fw, nil
	})
	w, _ := runWatchOver(t, ctx, client, nil, func() (bool, bool) { return false, true })
	if err := framework.PollTrue(ctx, 10*time.Second, "the informer to sync", w.HasSynced); err != nil {
		t.Fatal(err)
	}
	metric := func(forbidden int) string {
		return fmt.Sprintf(`# HELP uuid_controller_watch_refused %s
# TYPE uuid_controller_watch_refused gauge
uuid_controller_watch_refused{namespace="",reason="Forbidden"} %d
uuid_controller_watch_refused{namespace="",reason="Unauthorized"} 0
`, "1 while the controller's list or watch of the Uuid objects in namespace (empty: all) is refused for reason (Forbidden, Unauthorized): no object there gets a UUID.", forbidden)
	}
	if err := w.refusedAccess(); err != nil {
		t.Errorf("watch check with access: %v, want nil", err)
	}
	if err := testutil.CollectAndCompare(w.refusedMetric(), strings.NewReader(metric(0))); err != nil {
		t.Errorf("with access: %v", err)
	}

	revoked.Store(true)
	(<-watchers).Stop() // the watch ends, as the apiserver's do; the next request is refused
	if err := framework.PollTrue(ctx, 20*time.Second, "the watch check to fail", func() bool { return w.refusedAccess() != nil }); err != nil {
		t.Fatalf("the refused list and watch were never reported: %v", err)
	}
	if err := w.refusedAccess(); !strings.Contains(err.Error(), "Forbidden (namespaces all)") {
		t.Errorf("watch check = %v, want it to name Forbidden and the namespaces", err)
	}
	if !w.HasSynced() {
		t.Error("HasSynced became false: the informer check alone would have told")
	}
	if err := testutil.CollectAndCompare(w.refusedMetric(), strings.NewReader(metric(1))); err != nil {
		t.Errorf("refused: %v", err)
	}

	revoked.Store(false)
	if err := framework.PollTrue(ctx, 30*time.Second, "the watch check to pass again", func() bool { return w.refusedAccess() == nil }); err != nil {
		t.Fatalf("access granted again was never seen: %v", err)
	}
	if err := testutil.CollectAndCompare(w.refusedMetric(), strings.NewReader(metric(0))); err != nil {
		t.Errorf("granted again: %v", err)
	}
	var refused, allowed int
	for _, m := range logs.Messages() {
		switch {
		case strings.HasPrefix(m, "Listing or watching Uuid objects refused"):
			refused++
		case m == "Listing and watching Uuid objects allowed again":
			allowed++
		}
	}
	if refused != 1 || allowed != 1 {
		t.Errorf("logged %d lines for the refusal and %d for access back, want 1 and 1: %q", refused, allowed, logs.Messages())
	}
}

// Only Forbidden and Unauthorized are refusals; a passing fault (a
// timeout, a conflict, a closed connection) says nothing about access.
func TestRefusal(t *testing.T) {
	gr := uuidGVR.GroupResource()
	for _, c := range []struct {
		err  error
		want string
	}{
		{nil, ""},
		{apierrors.NewForbidden(gr, "", errors.New("x")), "Forbidden"},
		{apierrors.NewUnauthorized("token expired"), "Unauthorized"},
		{fmt.Errorf("listing: %w", apierrors.NewForbidden(gr, "", errors.New("x"))), "Forbidden"},
		{apierrors.NewTimeoutError("slow", 1), ""},
		{apierrors.NewResourceExpired("too old"), ""},
		{errors.New("connection refused"), ""},
	} {
		if got := refusal(c.err); got != c.want {
			t.Errorf("refusal(%v) = %q, want %q", c.err, got, c.want)
		}
	}
}
