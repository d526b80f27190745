package main

import (
	"bytes"
	"context"
	"crypto/elliptic"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sigstore/sigstore/pkg/cryptoutils"
)

// TestChartPush runs `make chart-push` as a release would, against CNCF
// distribution's registry over TLS with htpasswd auth: the chart pushed
// with bin/helm as an OCI artifact, its image defaulting to the digest the
// image tag names, and signed. helm renders it from oci:// with that image.
// A chart-push for an image tag that is not in the registry fails.
func TestChartPush(t *testing.T) {
	helmBin, err := filepath.Abs("../../bin/helm")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(helmBin); err != nil {
		t.Fatalf("%v: build it with `make helm` (make image-test does)", err)
	}
	host, ca := startRegistry(t)
	dockerConfig(t, host, testUser, testPassword)
	// helm reads the same auths from its registry config.
	t.Setenv("HELM_REGISTRY_CONFIG", filepath.Join(os.Getenv("DOCKER_CONFIG"), "config.json"))
	t.Setenv("HELM_CACHE_HOME", t.TempDir())
	t.Setenv("HELM_CONFIG_HOME", t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	image, err := push(ctx, pauseArchive(t), host+"/uuid-controller:v1", ca)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	privPEM, pubPEM, err := cryptoutils.GeneratePEMEncodedECDSAKeyPair(elliptic.P256(), cryptoutils.StaticPasswordFunc([]byte("pw")))
	if err != nil {
		t.Fatal(err)
	}
	key := filepath.Join(dir, "cosign.key")
	if err := os.WriteFile(key, privPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("COSIGN_PASSWORD", "pw")
	chartPush := func(img string) (string, error) {
		cmd := exec.Command("make", "--no-print-directory", "-C", "../..", "chart-push", "IMG="+img,
			"CHART_REPO=oci://"+host+"/charts", "REGISTRY_CA="+ca, "SIGNING_KEY="+key)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return "", &exec.ExitError{ProcessState: cmd.ProcessState, Stderr: append(out, stderr.Bytes()...)}
		}
		return strings.TrimSpace(string(out)), nil
	}
	start := time.Now()
	chart, err := chartPush(host + "/uuid-controller:v1")
	if err != nil {
		t.Fatalf("make chart-push: %v\n%s", err, err.(*exec.ExitError).Stderr)
	}
	t.Logf("make chart-push printed %s (%s)", chart, time.Since(start).Round(time.Millisecond))
	if !strings.HasPrefix(chart, host+"/charts/uuid-controller@sha256:") {
		t.Fatalf("make chart-push printed %q last, want %s/charts/uuid-controller@sha256:...", chart, host)
	}

	// helm renders the chart from the registry by version; its image is
	// the pushed image by digest.
	helm := func(args ...string) (string, error) {
		out, err := exec.Command(helmBin, args...).CombinedOutput()
		return string(out), err
	}
	out, err := helm("template", "uuid-controller", "oci://"+host+"/charts/uuid-controller", "--version", "0.1.0", "--ca-file", ca)
	if err != nil {
		t.Fatalf("helm template oci://...: %v\n%s", err, out)
	}
	if want := `image: "` + image + `"`; !strings.Contains(out, want) {
		t.Errorf("the chart from the registry does not default to the pushed image: no %s in\n%s", want, out)
	}
	out, err = helm("template", "uuid-controller", "oci://"+host+"/charts/uuid-controller", "--version", "9.9.9", "--ca-file", ca)
	t.Logf("helm template of a version not pushed: %v: %s", err, strings.TrimSpace(out))
	if err == nil {
		t.Error("helm rendered a chart version that was never pushed")
	}

	// The chart is signed: verify (as cosign verify --key; cosign's own
	// verifier: hack/image/cosignverify) checks it against the public key.
	pubFile := filepath.Join(dir, "cosign.pub")
	if err := os.WriteFile(pubFile, pubPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := verifyCmd(ctx, chart, ca, pubFile); err != nil || got != chart {
		t.Errorf("verify %s: %s, %v", chart, got, err)
	}

	// An image tag that is not in the registry: nothing to pin the chart to.
	_, err = chartPush(host + "/uuid-controller:not-pushed")
	var msg string
	if ee, ok := err.(*exec.ExitError); ok {
		msg = strings.TrimSpace(string(ee.Stderr))
	}
	t.Logf("make chart-push for an image tag not pushed: %v: %s", err, msg)
	if err == nil || !strings.Contains(msg, "not found") {
		t.Errorf("make chart-push for an image not pushed: %v, %s", err, msg)
	}
}
