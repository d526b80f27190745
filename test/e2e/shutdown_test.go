package e2e

import (
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
)

// stallingProxy forwards to the apiserver but holds every status PATCH until
// the test ends: an apiserver that has stopped answering writes. It returns
// the controller's kubeconfig pointed at it, and held, the count of PATCHes
// it is holding or has held.
func stallingProxy(t *testing.T) (kubeconfig string, held *atomic.Int32) {
	t.Helper()
	target, err := url.Parse(env.cluster.URL())
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	// The test's own proxy to its own loopback apiserver.
	rp.Transport = &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}
	release := make(chan struct{})
	held = &atomic.Int32{}
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPatch && strings.HasSuffix(r.URL.Path, "/status") {
			held.Add(1)
			select {
			case <-release:
			case <-r.Context().Done():
			}
			http.Error(w, "stalled by the test", http.StatusServiceUnavailable)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		close(release)
		srv.Close()
	})

	// The ServiceAccount's credentials (client-go sends a token over TLS
	// only), addressed to the proxy.
	cfg, err := clientcmd.LoadFromFile(env.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cfg.Clusters {
		c.Server = srv.URL
		c.CertificateAuthorityData = nil
		c.InsecureSkipTLSVerify = true
	}
	kubeconfig = filepath.Join(t.TempDir(), "via-proxy.kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, kubeconfig); err != nil {
		t.Fatal(err)
	}
	return kubeconfig, held
}

// waitHeld waits until the proxy holds n status PATCHes.
func waitHeld(t *testing.T, held *atomic.Int32, n int32) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); held.Load() < n; {
		if time.Now().After(deadline) {
			t.Fatalf("the controller sent %d status PATCHes within 30 s, want %d", held.Load(), n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestShutdownWithStalledWrite: a status PATCH the apiserver never answers
// bounds SIGTERM by --shutdown-timeout (exit 1, saying why), and a second
// signal exits at once, for an operator who will not wait.
func TestShutdownWithStalledWrite(t *testing.T) {
	ctx := testCtx(t)
	ns := newNamespace(ctx, t)
	viaProxy, held := stallingProxy(t)
	createUuids(ctx, t, ns, "stalled", 1)

	bounded := startControllerAs(ctx, t, viaProxy, ns, "--shutdown-timeout", "2s")
	waitHeld(t, held, 1)
	if err := bounded.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	code, err := bounded.Wait(15 * time.Second)
	if err != nil {
		t.Fatalf("--shutdown-timeout 2s: %v", err)
	}
	if code != 1 || !strings.Contains(bounded.Output(), "workers still busy after 2s") {
		t.Errorf("exit code %d (want 1), and the log should say the workers were still busy:\n%s", code, bounded.Output())
	}

	patient := startControllerAs(ctx, t, viaProxy, ns, "--shutdown-timeout", "10m")
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
