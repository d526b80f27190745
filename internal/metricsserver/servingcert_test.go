package metricsserver

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/demo-operator/uuid-controller/test/cluster"
)

// Bad certificate files are start-up errors that name the flags and say
// what is wrong.
func TestLoadServingCertErrors(t *testing.T) {
	dir := t.TempDir()
	certA, keyA := filepath.Join(dir, "a.crt"), filepath.Join(dir, "a.key")
	certB, keyB := filepath.Join(dir, "b.crt"), filepath.Join(dir, "b.key")
	for _, pair := range [][2]string{{certA, keyA}, {certB, keyB}} {
		if _, err := cluster.WriteServingCert(pair[0], pair[1]); err != nil {
			t.Fatal(err)
		}
	}
	garbage := filepath.Join(dir, "garbage.crt")
	if err := os.WriteFile(garbage, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty.crt")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.crt")
	for _, tc := range []struct {
		name, cert, key, want string
	}{
		{"missing cert", missing, keyA, "no such file"},
		{"missing key", certA, missing, "no such file"},
		{"a directory", dir, keyA, "is a directory"},
		{"not PEM", garbage, keyA, "failed to find any PEM data"},
		{"empty", empty, keyA, "missing content"},
		{"key of another certificate", certA, keyB, "private key does not match public key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := loadServingCert(tc.cert, tc.key, "uuid-controller", tls.VersionTLS13)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "--metrics-cert-file") {
				t.Errorf("error = %v, want one naming --metrics-cert-file and saying %q", err, tc.want)
			}
		})
	}
	if _, err := loadServingCert(certA, keyA, "uuid-controller", tls.VersionTLS13); err != nil {
		t.Errorf("a matching pair: %v", err)
	}
}

// Without files, the server presents a certificate made at start for the
// loopback addresses, and only over TLS 1.2 or later.
func TestSelfSignedServingCert(t *testing.T) {
	s, err := loadServingCert("", "", "uuid-controller", tls.VersionTLS13)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.tlsConfig()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.(*tls.Conn).Handshake()
			c.Close()
		}
	}()
	conn, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	leaf := conn.ConnectionState().PeerCertificates[0]
	if err := leaf.VerifyHostname("127.0.0.1"); err != nil {
		t.Errorf("self-signed certificate: %v", err)
	}
	if err := leaf.VerifyHostname("localhost"); err != nil {
		t.Errorf("self-signed certificate: %v", err)
	}
	old := &tls.Config{InsecureSkipVerify: true, MaxVersion: tls.VersionTLS11}
	if c, err := tls.Dial("tcp", ln.Addr().String(), old); err == nil {
		c.Close()
		t.Error("a TLS 1.1 client was accepted")
	}
}

// TestServingCertTLSVersions: by default only TLS 1.3 is served; with
// --metrics-tls-min-version=1.2, TLS 1.2 too, with AEAD suites only (a
// client offering only CBC is refused).
func TestServingCertTLSVersions(t *testing.T) {
	handshake := func(min uint16, client *tls.Config) error {
		t.Helper()
		s, err := loadServingCert("", "", "uuid-controller", min)
		if err != nil {
			t.Fatal(err)
		}
		ln, err := tls.Listen("tcp", "127.0.0.1:0", s.tlsConfig())
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go func() {
			if c, err := ln.Accept(); err == nil {
				_ = c.(*tls.Conn).Handshake()
				c.Close()
			}
		}()
		client.InsecureSkipVerify = true
		c, err := tls.Dial("tcp", ln.Addr().String(), client)
		if err == nil {
			c.Close()
		}
		return err
	}
	tls12 := func(suite uint16) *tls.Config {
		return &tls.Config{MaxVersion: tls.VersionTLS12, CipherSuites: []uint16{suite}}
	}
	if err := handshake(tls.VersionTLS13, &tls.Config{}); err != nil {
		t.Errorf("default, a TLS 1.3 client: %v", err)
	}
	if err := handshake(tls.VersionTLS13, tls12(tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256)); err == nil {
		t.Error("default: a TLS 1.2 client was accepted, want 1.3 only")
	}
	if err := handshake(tls.VersionTLS12, tls12(tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256)); err != nil {
		t.Errorf("1.2 allowed, a TLS 1.2 client with AES-GCM: %v", err)
	}
	if err := handshake(tls.VersionTLS12, tls12(tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA)); err == nil {
		t.Error("1.2 allowed: a TLS 1.2 client offering only a CBC suite was accepted, want AEAD suites only")
	}
}

// TestTLSMinVersionFlag: "1.3" and "1.2" mean those versions; anything
// else is a flag error.
func TestTLSMinVersionFlag(t *testing.T) {
	if tlsVersions["1.3"] != tls.VersionTLS13 || tlsVersions["1.2"] != tls.VersionTLS12 {
		t.Errorf("tlsVersions = %v, want 1.3 and 1.2 to mean TLS 1.3 and 1.2", tlsVersions)
	}
	for v, ok := range map[string]bool{"1.3": true, "1.2": true, "1.1": false, "": false} {
		if errs := (Config{TLSMinVersion: v}).Validate(); (len(errs) == 0) != ok {
			t.Errorf("--metrics-tls-min-version=%q: errors %v, want valid %v", v, errs, ok)
		}
	}
}
