package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
)

// CompactEtcd compacts etcd up to its current revision, as the apiserver's
// compactor does every 5 minutes, through etcd's JSON gateway, and returns
// that revision. Continue tokens from before it expire.
func (c *Cluster) CompactEtcd(ctx context.Context) (int64, error) {
	var answer struct {
		Header struct {
			Revision string `json:"revision"`
		} `json:"header"`
	}
	// Any key: the answer's header carries the store's revision.
	if err := c.etcdCall(ctx, "/v3/kv/range", map[string]any{"key": "AA=="}, &answer); err != nil {
		return 0, err
	}
	rev, err := strconv.ParseInt(answer.Header.Revision, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("cluster: etcd revision %q: %w", answer.Header.Revision, err)
	}
	if err := c.etcdCall(ctx, "/v3/kv/compaction", map[string]any{"revision": strconv.FormatInt(rev, 10), "physical": true}, nil); err != nil {
		return 0, err
	}
	return rev, nil
}

// etcdCall posts body as JSON to etcd's gateway path and decodes the
// answer into out (nil: read and dropped).
func (c *Cluster) etcdCall(ctx context.Context, path string, body, out any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.etcdURL+path, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("cluster: etcd %s: %w", path, err)
	}
	defer resp.Body.Close()
	text, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("cluster: etcd %s: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("cluster: etcd %s: %s: %s", path, resp.Status, bytes.TrimSpace(text))
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(text, out); err != nil {
		return fmt.Errorf("cluster: etcd %s answered %q: %w", path, text, err)
	}
	return nil
}
