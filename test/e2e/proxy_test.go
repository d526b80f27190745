package e2e

import (
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/client-go/tools/clientcmd"
)

// apiProxy forwards the controller's requests to the apiserver, except
// those intercept answers itself (it returns true then). It returns the
// controller's kubeconfig pointed at the proxy.
func apiProxy(t *testing.T, intercept func(w http.ResponseWriter, r *http.Request) bool) (kubeconfig string) {
	t.Helper()
	target, err := url.Parse(env.cluster.URL())
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	// The test's own proxy to its own loopback apiserver.
	rp.Transport = &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !intercept(w, r) {
			rp.ServeHTTP(w, r)
		}
	}))
	t.Cleanup(srv.Close)

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
	return kubeconfig
}

func isStatusPatch(r *http.Request) bool {
	return r.Method == http.MethodPatch && strings.HasSuffix(r.URL.Path, "/status")
}
