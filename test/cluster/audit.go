package cluster

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// auditPolicy records every request on Uuid objects and their status, at
// Metadata level (who, what, the response code), once each request is done.
// Nothing else is recorded, so the log stays small under load.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived", "ResponseStarted"]
rules:
  - level: Metadata
    resources:
      - group: demo.operator
        resources: ["uuid", "uuid/status"]
  - level: None
`

// AuditEvent is the part of an audit.k8s.io/v1 Event the tests read.
type AuditEvent struct {
	Verb string `json:"verb"`
	User struct {
		Username string `json:"username"`
		// Extra holds, for a pod's projected token, the pod it was
		// issued to (authentication.kubernetes.io/pod-name).
		Extra map[string][]string `json:"extra"`
	} `json:"user"`
	SourceIPs []string `json:"sourceIPs"`
	UserAgent string   `json:"userAgent"`
	ObjectRef struct {
		Resource    string `json:"resource"`
		Namespace   string `json:"namespace"`
		Name        string `json:"name"`
		Subresource string `json:"subresource"`
	} `json:"objectRef"`
	ResponseStatus struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
	// RequestReceived is when the apiserver received the request, on its
	// own clock.
	RequestReceived time.Time `json:"requestReceivedTimestamp"`
	// RequestURI is the request's path and query.
	RequestURI string `json:"requestURI"`
}

// DryRun tells a server-side dry run, which writes nothing.
func (ev AuditEvent) DryRun() bool { return strings.Contains(ev.RequestURI, "dryRun=") }

func (c *Cluster) auditArgs() ([]string, error) {
	policy := filepath.Join(c.dir, "audit-policy.yaml")
	if err := os.WriteFile(policy, []byte(auditPolicy), 0o600); err != nil {
		return nil, err
	}
	return []string{
		"--audit-policy-file", policy,
		"--audit-log-path", c.auditLogPath(),
		// blocking: an event is written before the response is sent, so a
		// read right after a request sees it.
		"--audit-log-mode", "blocking",
		"--audit-log-format", "json",
	}, nil
}

func (c *Cluster) auditLogPath() string { return filepath.Join(c.dir, "audit.log") }

// AuditEvents reads the audit log: every completed request on Uuid objects
// and their status subresource since the cluster started. It needs
// Options.Audit.
func (c *Cluster) AuditEvents() ([]AuditEvent, error) {
	if !c.opts.Audit {
		return nil, errors.New("cluster: audit log is off (Options.Audit)")
	}
	f, err := os.Open(c.auditLogPath())
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	defer f.Close()
	var lines [][]byte
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		lines = append(lines, append([]byte(nil), sc.Bytes()...))
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("cluster: read audit log: %w", err)
	}
	evs := make([]AuditEvent, 0, len(lines))
	for i, line := range lines {
		var ev AuditEvent
		if err := json.Unmarshal(line, &ev); err != nil {
			if i == len(lines)-1 {
				break // still being written by a request completing now
			}
			return nil, fmt.Errorf("cluster: audit log line %d: %w", i+1, err)
		}
		evs = append(evs, ev)
	}
	return evs, nil
}
