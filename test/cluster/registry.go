package cluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// RegistryBinary is CNCF distribution's registry (`make node-tools` builds
// it from hack/registry).
const RegistryBinary = "registry"

// registryConfig is the node's registry: storage under the node's dir,
// TLS on the bridge address, no auth (pods pull anonymously, as from a
// cluster-internal registry), no tracing exporter, no log line per request.
const registryConfig = `version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: {{D}}/data
  delete:
    enabled: false
http:
  addr: {{ADDR}}
  secret: {{SECRET}}
  tls:
    certificate: {{D}}/tls.crt
    key: {{D}}/tls.key
`

// registryHostsTOML tells containerd how to reach the registry: over TLS,
// trusting the CA that signed its certificate.
const registryHostsTOML = `server = "https://{{HOST}}"

[host."https://{{HOST}}"]
  capabilities = ["pull", "resolve"]
  ca = "{{CA}}"
`

func (c *Cluster) registryDir() string { return filepath.Join(c.dir, "registry") }

// Registry is the node's image registry, HOST:PORT on the node's bridge
// (NodeIP). Push with `make image-push IMG=$(Registry)/NAME:TAG
// REGISTRY_CA=$(RegistryCA)`; the kubelet pulls from it.
func (c *Cluster) Registry() string {
	if c.node == nil {
		return ""
	}
	return c.node.registry
}

// RegistryCA is the CA certificate (PEM file) that signed the registry's
// serving certificate, for clients that push to it.
func (c *Cluster) RegistryCA() string { return filepath.Join(c.registryDir(), "ca.crt") }

// startRegistry runs the registry on the bridge over TLS, with a CA of its
// own, and waits until it answers /v2/ through that CA.
func (c *Cluster) startRegistry(ctx context.Context) error {
	d := c.registryDir()
	if err := os.MkdirAll(filepath.Join(d, "data"), 0o700); err != nil {
		return err
	}
	ports, err := freePorts(1)
	if err != nil {
		return err
	}
	host := net.JoinHostPort(NodeIP, strconv.Itoa(ports[0]))
	caPEM, err := WriteServingCert(filepath.Join(d, "tls.crt"), filepath.Join(d, "tls.key"), NodeIP)
	if err != nil {
		return fmt.Errorf("cluster: registry certificate: %w", err)
	}
	if err := os.WriteFile(c.RegistryCA(), caPEM, 0o644); err != nil {
		return err
	}
	secret, err := randomToken() // signs upload state between requests
	if err != nil {
		return err
	}
	cfg := filepath.Join(d, "config.yml")
	r := strings.NewReplacer("{{D}}", d, "{{ADDR}}", host, "{{SECRET}}", secret)
	if err := os.WriteFile(cfg, []byte(r.Replace(registryConfig)), 0o600); err != nil {
		return err
	}
	// distribution exports traces over OTLP by default (to localhost);
	// none here.
	p, err := c.spawnEnv(RegistryBinary, []string{"serve", cfg}, []string{"OTEL_TRACES_EXPORTER=none"})
	if err != nil {
		return err
	}
	c.setNodeProcess(RegistryBinary, p)
	c.mu.Lock()
	c.node.registry = host
	c.mu.Unlock()

	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	defer hc.CloseIdleConnections()
	return c.poll(ctx, p, time.Minute, func(ctx context.Context) error {
		return getOK(ctx, hc, "https://"+host+"/v2/")
	})
}

// writeRegistryHosts writes containerd's hosts.toml for the registry under
// certsDir, the CRI plugin's registry config_path.
func (c *Cluster) writeRegistryHosts(certsDir string) error {
	host := c.Registry()
	dir := filepath.Join(certsDir, host)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	r := strings.NewReplacer("{{HOST}}", host, "{{CA}}", c.RegistryCA())
	return os.WriteFile(filepath.Join(dir, "hosts.toml"), []byte(r.Replace(registryHostsTOML)), 0o600)
}
