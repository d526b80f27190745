package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"

	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	certutil "k8s.io/client-go/util/cert"
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
}

// loadServingCert reads certFile and keyFile, or makes a self-signed
// certificate when both are empty. An unreadable file or a key that does
// not match the certificate is an error here, at start-up.
func loadServingCert(certFile, keyFile string) (*servingCert, error) {
	s := &servingCert{}
	var content dynamiccertificates.CertKeyContentProvider
	if certFile == "" && keyFile == "" {
		selfSigned, err := selfSignedCert()
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
	base := &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}}
	s.tls = dynamiccertificates.NewDynamicServingCertificateController(base, nil, content, nil, nil)
	content.AddListener(s.tls)
	if err := s.tls.RunOnce(); err != nil {
		return nil, fmt.Errorf("metrics serving certificate: %w", err)
	}
	return s, nil
}

// selfSignedCert is a certificate for this host's name, localhost and the
// loopback addresses, signed by a CA made for it and thrown away. Scrapers
// cannot verify it (Prometheus needs insecure_skip_verify); the bearer
// token still decides who reads the metrics.
func selfSignedCert() (dynamiccertificates.CertKeyContentProvider, error) {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = controllerName
	}
	cert, key, err := certutil.GenerateSelfSignedCertKey(host, []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}, []string{"localhost"})
	if err != nil {
		return nil, fmt.Errorf("generating a self-signed metrics serving certificate: %w", err)
	}
	return dynamiccertificates.NewStaticCertKeyContent("self-signed metrics serving certificate", cert, key)
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
	return &tls.Config{GetConfigForClient: s.tls.GetConfigForClient, MinVersion: tls.VersionTLS12}
}
