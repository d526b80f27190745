package metricsserver

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"time"

	"k8s.io/apiserver/pkg/server/dynamiccertificates"
)

// servingCert is the metrics server's certificate: read from files (a
// mounted Secret, say from cert-manager) and re-read when they change, or
// self-signed in memory. It is kube-apiserver's own machinery
// (dynamiccertificates), so files rotated on disk behave as they do for
// the Kubernetes components: a new pair is served to new connections once
// both files match; a half-written or broken pair is logged and the last
// good one stays in use.
type servingCert struct {
	// files is nil for the self-signed certificate, which never changes.
	files *dynamiccertificates.DynamicCertKeyPairContent
	tls   *dynamiccertificates.DynamicServingCertificateController
	// minVersion is the oldest TLS version served (--metrics-tls-min-version).
	minVersion uint16
}

// aeadSuites are the TLS 1.2 cipher suites served when
// --metrics-tls-min-version=1.2: ECDHE with an AEAD cipher only, for ECDSA
// (the self-signed certificate) and RSA keys. TLS 1.3's suites are all
// AEAD and not configurable.
var aeadSuites = []uint16{
	tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
	tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
}

// loadServingCert reads certFile and keyFile, or makes a self-signed
// certificate when both are empty. An unreadable file or a key that does
// not match the certificate is an error here, at start-up.
func loadServingCert(certFile, keyFile, fallbackHost string, minVersion uint16) (*servingCert, error) {
	s := &servingCert{minVersion: minVersion}
	var content dynamiccertificates.CertKeyContentProvider
	if certFile == "" && keyFile == "" {
		selfSigned, err := selfSignedCert(fallbackHost)
		if err != nil {
			return nil, err
		}
		content = selfSigned
	} else {
		files, err := dynamiccertificates.NewDynamicServingContentFromFiles("metrics", certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("loading --metrics-cert-file %q and --metrics-key-file %q: %w", certFile, keyFile, err)
		}
		s.files, content = files, files
	}
	// HTTP/1.1 only: a scrape gains nothing from HTTP/2, and leaving it out
	// closes HTTP/2's denial-of-service issues (rapid reset), as
	// controller-runtime's metrics server does by default.
	base := &tls.Config{MinVersion: minVersion, CipherSuites: aeadSuites, NextProtos: []string{"http/1.1"}}
	s.tls = dynamiccertificates.NewDynamicServingCertificateController(base, nil, content, nil, nil)
	content.AddListener(s.tls)
	if err := s.tls.RunOnce(); err != nil {
		return nil, fmt.Errorf("metrics serving certificate: %w", err)
	}
	return s, nil
}

// selfSignedCert is a certificate for this host's name (fallbackHost when
// it has none), localhost and the loopback addresses, signed by its own
// key. Scrapers cannot verify it; the bearer token still decides who reads
// the metrics. The key is ECDSA P-256, one key where client-go's
// certutil.GenerateSelfSignedCertKey makes two slow RSA-2048 ones.
func selfSignedCert(fallbackHost string) (dynamiccertificates.CertKeyContentProvider, error) {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = fallbackHost
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating a metrics serving key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("generating a certificate serial number: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: fmt.Sprintf("%s@%d", host, now.Unix())},
		// An hour back for clocks that disagree; a year ahead, as
		// client-go's self-signed certificates.
		NotBefore:   now.Add(-time.Hour),
		NotAfter:    now.Add(365 * 24 * time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:    []string{host, "localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("self-signing the metrics serving certificate: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encoding the metrics serving key: %w", err)
	}
	return dynamiccertificates.NewStaticCertKeyContent("self-signed metrics serving certificate",
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}))
}

// run keeps the served certificate current until ctx is cancelled.
func (s *servingCert) run(ctx context.Context) {
	if s.files != nil {
		go s.files.Run(ctx, 1)
	}
	go s.tls.Run(1, ctx.Done())
}

// tlsConfig serves whichever certificate is current at each handshake.
func (s *servingCert) tlsConfig() *tls.Config {
	return &tls.Config{GetConfigForClient: s.tls.GetConfigForClient, MinVersion: s.minVersion, CipherSuites: aeadSuites}
}
