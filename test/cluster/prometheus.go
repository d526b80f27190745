package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/yaml"
)

// ShippedScrapeJob reads a scrape config file holding one job
// (deploy/monitoring/prometheus/scrape-config.yaml) and returns that job,
// for a test to change only what it must before running it.
func ShippedScrapeJob(path string) (map[string]any, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var shipped struct {
		ScrapeConfigs []map[string]any `json:"scrape_configs"`
	}
	if err := yaml.Unmarshal(raw, &shipped); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(shipped.ScrapeConfigs) != 1 {
		return nil, fmt.Errorf("%s: %d jobs, want 1", path, len(shipped.ScrapeConfigs))
	}
	return shipped.ScrapeConfigs[0], nil
}

// PrometheusBinary is Prometheus's server in the binary directory, built
// by `make prometheus` from hack/prometheus.
const PrometheusBinary = "prometheus"

// Prometheus is a Prometheus server on loopback, with its storage and
// config in a directory of its own.
type Prometheus struct {
	p   *process
	url string
	hc  *http.Client
}

// StartPrometheus writes config (a prometheus.yml) and any files into
// dir, starts Prometheus on a free loopback port with its storage in dir,
// and returns once it answers /-/ready. Its log goes to the cluster's log
// as "prometheus".
func (c *Cluster) StartPrometheus(ctx context.Context, dir string, config []byte) (*Prometheus, error) {
	bin := filepath.Join(c.binDir, PrometheusBinary)
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("cluster: %s not found (run `make prometheus` to build it): %w", bin, err)
	}
	cfg := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfg, config, 0o600); err != nil {
		return nil, err
	}
	ports, err := freePorts(1)
	if err != nil {
		return nil, err
	}
	addr := "127.0.0.1:" + strconv.Itoa(ports[0])
	p, err := c.spawnPath(PrometheusBinary, bin, []string{
		"--config.file=" + cfg,
		"--storage.tsdb.path=" + filepath.Join(dir, "data"),
		"--web.listen-address=" + addr,
	}, nil)
	if err != nil {
		return nil, err
	}
	prom := &Prometheus{p: p, url: "http://" + addr, hc: &http.Client{Timeout: 10 * time.Second}}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		if done, err := p.exited(); done {
			return false, fmt.Errorf("cluster: prometheus exited: %v (its log: %s)", err, c.logHint(PrometheusBinary))
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, prom.url+"/-/ready", nil)
		if err != nil {
			return false, err
		}
		resp, err := prom.hc.Do(req)
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		_ = p.stop()
		return nil, fmt.Errorf("cluster: prometheus not ready: %w", err)
	}
	return prom, nil
}

// URL is Prometheus's base URL.
func (p *Prometheus) URL() string { return p.url }

// Stop stops Prometheus (SIGTERM, then SIGKILL).
func (p *Prometheus) Stop() error { return p.p.stop() }

// API GETs /api/v1/<path> with query and decodes its data into out. It
// returns the response body too, as Prometheus sent it.
func (p *Prometheus) API(ctx context.Context, path string, query url.Values, out any) ([]byte, error) {
	u := p.url + "/api/v1/" + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := p.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("prometheus %s: %w", path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("prometheus %s: %w", path, err)
	}
	var env struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(body, &env); err != nil {
		return body, fmt.Errorf("prometheus %s: %d %q: %w", path, resp.StatusCode, body, err)
	}
	if env.Status != "success" {
		return body, fmt.Errorf("prometheus %s: %s: %s", path, env.Status, env.Error)
	}
	if out != nil {
		if err := json.Unmarshal(env.Data, out); err != nil {
			return body, fmt.Errorf("prometheus %s: decoding %s: %w", path, env.Data, err)
		}
	}
	return body, nil
}
