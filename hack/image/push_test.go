package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// The registry's one user. testPasswordHash is bcrypt(testPassword), as
// `htpasswd -B` writes it.
const (
	testUser         = "pusher"
	testPassword     = "push-test-password"
	testPasswordHash = "$2a$04$H3sgriX0a8N6BEeD5y5g3OTh/mtd0PjGU8/dl.7xFopIBBPpoJfMy"
)

// startRegistry runs CNCF distribution's registry (bin/registry, from
// `make bin/registry`) on a free loopback port over TLS, with htpasswd
// auth, and returns its HOST:PORT and the CA file that trusts it.
func startRegistry(t *testing.T) (host, caFile string) {
	t.Helper()
	bin, err := filepath.Abs("../../bin/registry")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%v: build it with `make bin/registry` (make image-test does)", err)
	}
	dir := t.TempDir()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	host = l.Addr().String()
	l.Close()
	caFile = writeSelfSignedCert(t, dir)
	if err := os.WriteFile(filepath.Join(dir, "htpasswd"), []byte(testUser+":"+testPasswordHash+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf(`version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: %[1]s/data
http:
  addr: %[2]s
  secret: test-only-secret
  tls:
    certificate: %[1]s/tls.crt
    key: %[1]s/tls.key
auth:
  htpasswd:
    realm: test-registry
    path: %[1]s/htpasswd
`, dir, host)
	if err := os.WriteFile(filepath.Join(dir, "config.yml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "serve", filepath.Join(dir, "config.yml"))
	cmd.Env = append(os.Environ(), "OTEL_TRACES_EXPORTER=none")
	logf, err := os.Create(filepath.Join(dir, "registry.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
		logf.Close()
	})

	pem, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	defer hc.CloseIdleConnections()
	// Polled every 100 ms within a context that ends after a minute (or
	// with the test), and stopped at once if the registry exits.
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+host+"/v2/", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := hc.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusUnauthorized { // up, and asking for credentials
				return host, caFile
			}
			err = fmt.Errorf("/v2/: %s", resp.Status)
		}
		select {
		case werr := <-exited:
			log, _ := os.ReadFile(logf.Name())
			t.Fatalf("registry exited: %v\n%s", werr, log)
		case <-ctx.Done():
			t.Fatalf("registry not up within a minute: %v", err)
		case <-tick.C:
		}
	}
}

// writeSelfSignedCert writes tls.crt and tls.key for 127.0.0.1 into dir;
// the certificate is its own CA. It returns the certificate's path.
func writeSelfSignedCert(t *testing.T, dir string) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test-registry"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, BasicConstraintsValid: true, IsCA: true,
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	crt := filepath.Join(dir, "tls.crt")
	if err := os.WriteFile(crt, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return crt
}

// dockerConfig points DOCKER_CONFIG at a config.json holding user:password
// for host, as `docker login` writes it.
func dockerConfig(t *testing.T, host, user, password string) {
	t.Helper()
	dir := t.TempDir()
	auth := base64.StdEncoding.EncodeToString([]byte(user + ":" + password))
	cfg := fmt.Sprintf(`{"auths":{%q:{"auth":%q}}}`, host, auth)
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("DOCKER_CONFIG", dir)
}

// pauseArchive builds the pause image archive for this machine.
func pauseArchive(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	bin := goBuildFile(t, dir, dockerfileEnv, "-trimpath", "-ldflags=-s -w")
	archive := filepath.Join(dir, "pause.tar")
	if err := build(buildOptions{dockerfile: "pause/Dockerfile", contextDir: ".", binaries: []string{bin},
		tag: "registry.local/pause:test", out: archive, loadPlatform: hostPlatform}); err != nil {
		t.Fatal(err)
	}
	return archive
}

// TestPushAndResolve pushes an archive's index with the docker config's
// credentials, gets it back by digest, and resolves the tag to the same
// digest.
func TestPushAndResolve(t *testing.T) {
	host, ca := startRegistry(t)
	archive := pauseArchive(t)
	want, _, _ := readIndex(t, archive)
	dockerConfig(t, host, testUser, testPassword)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	pushed, err := push(ctx, archive, host+"/team/pause:v1", ca)
	if err != nil {
		t.Fatal(err)
	}
	if pushed != host+"/team/pause@"+want.String() {
		t.Errorf("push printed %s, want %s/team/pause@%s", pushed, host, want)
	}
	resolved, err := resolve(ctx, host+"/team/pause:v1", ca)
	if err != nil || resolved != pushed {
		t.Errorf("the tag resolves to %s (%v), pushed %s", resolved, err, pushed)
	}
	// The registry serves the index by digest, with its platforms' images.
	ref, err := name.NewDigest(pushed)
	if err != nil {
		t.Fatal(err)
	}
	opts, err := remoteOptions(ctx, ca)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := remote.Index(ref, opts...)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range im.Manifests {
		img, err := idx.Image(d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := img.ConfigFile(); err != nil {
			t.Errorf("%s: config not served: %v", d.Platform, err)
		}
	}
	if len(im.Manifests) != 1 || im.Manifests[0].Platform.String() != hostPlatform.String() {
		t.Errorf("index served: %+v", im.Manifests)
	}
}

// Each way a push or a lookup goes wrong says so: what was refused or
// missing, or which registry could not be reached.
func TestRegistryErrors(t *testing.T) {
	host, ca := startRegistry(t)
	archive := pauseArchive(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String() // nothing listens here once closed
	l.Close()
	notArchive := filepath.Join(t.TempDir(), "x.tar")
	if err := os.WriteFile(notArchive, []byte("not a tar"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Push the tag that the lookups below expect to find.
	dockerConfig(t, host, testUser, testPassword)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := push(ctx, archive, host+"/pause:there", ca); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name     string
		password string // for host in the docker config
		op       func() (string, error)
		want     []string
	}{
		{"wrong password", "wrong", func() (string, error) { return push(ctx, archive, host+"/pause:v1", ca) },
			[]string{"refused the credentials", "docker login " + host}},
		{"no credentials", "", func() (string, error) { return push(ctx, archive, host+"/pause:v1", ca) },
			[]string{"refused the credentials"}},
		{"nothing listening", testPassword, func() (string, error) { return push(ctx, archive, closed+"/pause:v1", ca) },
			[]string{"cannot reach the registry " + closed, "connection refused"}},
		{"missing tag", testPassword, func() (string, error) { return resolve(ctx, host+"/pause:not-there", ca) },
			[]string{"resolving " + host + "/pause:not-there: not found"}},
		{"missing repository", testPassword, func() (string, error) { return resolve(ctx, host+"/nothing:v1", ca) },
			[]string{"not found"}},
		{"untrusted CA", testPassword, func() (string, error) { return push(ctx, archive, host+"/pause:v1", "") },
			[]string{"pushing " + host + "/pause:v1", "not signed by a CA this machine trusts", "REGISTRY_CA="}},
		{"not an archive", testPassword, func() (string, error) { return push(ctx, notArchive, host+"/pause:v1", ca) },
			[]string{"reading " + notArchive}},
		{"bad reference", testPassword, func() (string, error) { return push(ctx, archive, "Not/A:Ref:", ca) },
			[]string{`image reference "Not/A:Ref:"`}},
		{"CA file missing", testPassword, func() (string, error) { return resolve(ctx, host+"/pause:there", ca+".missing") },
			[]string{"registry CA", "no such file"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.password != "" {
				dockerConfig(t, host, testUser, tt.password)
			} else {
				t.Setenv("DOCKER_CONFIG", t.TempDir())
			}
			start := time.Now()
			ref, err := tt.op()
			if err == nil {
				t.Fatalf("no error; got %s", ref)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			t.Logf("%s: error after %s: %v", tt.name, time.Since(start).Round(time.Millisecond), err)
		})
	}
	// The registry still holds the tag pushed first: nothing was lost.
	if _, err := resolve(ctx, host+"/pause:there", ca); err != nil {
		t.Errorf("after the failures: %v", err)
	}
}
