package e2e

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/demo-operator/uuid-controller/test/framework"
	"k8s.io/apimachinery/pkg/util/wait"
)

// stallingProxy holds every status PATCH until the test ends: an apiserver
// that has stopped answering writes. held counts the PATCHes it is holding
// or has held.
func stallingProxy(t *testing.T) (kubeconfig string, held *atomic.Int32) {
	t.Helper()
	release := make(chan struct{})
	held = &atomic.Int32{}
	kubeconfig = apiProxy(t, func(w http.ResponseWriter, r *http.Request) bool {
		if !isStatusPatch(r) {
			return false
		}
		held.Add(1)
		select {
		case <-release:
		case <-r.Context().Done():
		}
		http.Error(w, "stalled by the test", http.StatusServiceUnavailable)
		return true
	})
	// Registered after the server's Close, so it runs first and lets the
	// held requests finish.
	t.Cleanup(func() { close(release) })
	return kubeconfig, held
}

// waitHeld waits until the proxy holds n status PATCHes.
func waitHeld(t *testing.T, held *atomic.Int32, n int32) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return held.Load() >= n, nil
	})
	if err != nil {
		t.Fatalf("the controller sent %d status PATCHes within 30 s, want %d", held.Load(), n)
	}
}

// TestShutdownWithStalledWrite: a status PATCH the apiserver never answers
// bounds SIGTERM by --shutdown-timeout (exit 1, saying why), and a second
// signal exits at once, for an operator who will not wait.
func TestShutdownWithStalledWrite(t *testing.T) {
	ctx := testCtx(t)
	ns := env.fw.NewNamespace(ctx, t)
	viaProxy, held := stallingProxy(t)
	env.fw.CreateUuids(ctx, t, ns, "stalled", 1)

	bounded := framework.StartController(ctx, t, controllerAs(viaProxy), ns, "--shutdown-timeout", "2s")
	waitHeld(t, held, 1)
	if code := sigterm(t, bounded, 15*time.Second); code != 1 || !strings.Contains(bounded.Output(), "workers still busy after 2s") {
		t.Errorf("exit code %d (want 1), and the log should say the workers were still busy:\n%s", code, bounded.Output())
	}

	patient := framework.StartController(ctx, t, controllerAs(viaProxy), ns, "--shutdown-timeout", "10m")
	waitHeld(t, held, 2)
	if err := patient.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if _, err := patient.Wait(2 * time.Second); err == nil {
		t.Fatal("exited on the first SIGTERM with a write in flight and --shutdown-timeout 10m")
	}
	if err := patient.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code, err := patient.Wait(5 * time.Second); err != nil || code != 1 {
		t.Errorf("after a second SIGTERM: exit code %d, %v; want 1 at once", code, err)
	}
}
