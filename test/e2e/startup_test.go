package e2e

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/demo-operator/uuid-controller/test/cluster"
)

// TestStartupErrors: bad flags and an unusable kubeconfig stop the binary at
// once with a clear message and a non-zero exit code.
func TestStartupErrors(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "no-such-kubeconfig")
	apiserver := strings.TrimPrefix(env.cluster.URL(), "https://") // a port that is taken
	// In a pod without its ServiceAccount token mounted: the in-cluster
	// config is chosen (no --kubeconfig, no $KUBECONFIG) and cannot load.
	var podWithoutToken []string
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "KUBECONFIG=") {
			podWithoutToken = append(podWithoutToken, e)
		}
	}
	podWithoutToken = append(podWithoutToken, "KUBERNETES_SERVICE_HOST=127.0.0.1", "KUBERNETES_SERVICE_PORT=6443")
	// Two certificate/key pairs, to hand the controller one's certificate
	// with the other's key.
	certDir := t.TempDir()
	certA, keyB := filepath.Join(certDir, "a.crt"), filepath.Join(certDir, "b.key")
	for _, pair := range [][2]string{{certA, filepath.Join(certDir, "a.key")}, {filepath.Join(certDir, "b.crt"), keyB}} {
		if _, err := cluster.WriteServingCert(pair[0], pair[1]); err != nil {
			t.Fatal(err)
		}
	}
	serving := []string{"--kubeconfig", env.kubeconfig, "--health-addr", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0"}
	for _, tc := range []struct {
		name     string
		args     []string
		env      []string
		wantCode int
		mention  []string
	}{
		{"zero workers", []string{"--workers", "0"}, nil, 2, []string{"--workers must be between 1 and"}},
		{"unknown flag", []string{"--no-such-flag"}, nil, 2, []string{"no-such-flag"}},
		{"bad namespace", []string{"--namespace", "Team_A"}, nil, 2, []string{`--namespace "Team_A" is not a valid name`}},
		{"bad event level", []string{"--event-level", "Info"}, nil, 2, []string{"--event-level", "Info"}},
		{"missing kubeconfig", []string{"--kubeconfig", missing, "--health-addr", "0", "--metrics-addr", "0"}, nil, 1, []string{missing}},
		{"in-cluster without a token", []string{"--health-addr", "0", "--metrics-addr", "0"}, podWithoutToken, 1, []string{"loading in-cluster config"}},
		{"health port taken", []string{"--kubeconfig", env.kubeconfig, "--health-addr", apiserver, "--metrics-addr", "127.0.0.1:0"}, nil, 1, []string{"listening for health"}},
		{"metrics port taken", []string{"--kubeconfig", env.kubeconfig, "--health-addr", "127.0.0.1:0", "--metrics-addr", apiserver}, nil, 1, []string{"listening for metrics"}},
		{"metrics port taken, plain HTTP", []string{"--kubeconfig", env.kubeconfig, "--health-addr", "127.0.0.1:0", "--metrics-addr", apiserver, "--metrics-secure=false"}, nil, 1, []string{"listening for metrics"}},
		{"unreadable metrics cert", append(serving, "--metrics-cert-file", filepath.Join(certDir, "missing.crt"), "--metrics-key-file", keyB), nil, 1, []string{"--metrics-cert-file", "missing.crt", "no such file"}},
		{"metrics key of another cert", append(serving, "--metrics-cert-file", certA, "--metrics-key-file", keyB), nil, 1, []string{"--metrics-cert-file", "private key does not match public key"}},
		{"metrics cert without key", []string{"--metrics-cert-file", certA}, nil, 2, []string{"--metrics-cert-file and --metrics-key-file must be given together"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, env.binary, tc.args...)
			cmd.Env = tc.env
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) {
				t.Fatalf("err = %v, want a non-zero exit; output:\n%s", err, out)
			}
			if ee.ExitCode() != tc.wantCode {
				t.Errorf("exit code %d, want %d", ee.ExitCode(), tc.wantCode)
			}
			for _, m := range tc.mention {
				if !strings.Contains(string(out), m) {
					t.Errorf("output does not mention %q:\n%s", m, out)
				}
			}
		})
	}
}

// TestNoListPermissionIsNotReady: an identity that may not list Uuid
// objects leaves the controller up but not ready, saying why in its log,
// instead of crashing or reporting ready with an empty cache.
func TestNoListPermissionIsNotReady(t *testing.T) {
	ctx := testCtx(t)
	ns := env.fw.NewNamespace(ctx, t)
	kc, err := env.cluster.ServiceAccountKubeconfig(ctx, cluster.ControllerNamespace, "no-permissions")
	if err != nil {
		t.Fatal(err)
	}
	p, err := cluster.StartController(ctx, cluster.ControllerOptions{Binary: env.binary, Kubeconfig: kc, Args: []string{"--namespace", ns}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	if err := p.WaitReady(ctx, 5*time.Second); err == nil {
		t.Fatal("controller reports ready without permission to list Uuid objects")
	}
	mustStayRunning(t, p)
	if out := p.Output(); !strings.Contains(out, "forbidden") || !strings.Contains(out, "cannot list resource") {
		t.Errorf("log does not say listing uuid is forbidden:\n%s", out)
	}
	if code, _ := p.Stop(); code != 0 {
		t.Errorf("exit code after SIGTERM while not ready = %d, want 0", code)
	}
}
