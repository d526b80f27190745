//go:build node

package node

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestHelmChartFromRegistry: the chart as a release ships it. `make
// chart-push` pushes it to the node's registry as an OCI artifact, signed,
// its image defaulting to the digest the image tag names; the image's and
// the chart's signatures, the SBOM and the provenance are checked as a
// user checks them (signedRelease); then, with deploy/'s install taken
// away (but the CRD and its objects):
//   - helm install oci://.../uuid-controller --version (Chart.yaml's),
//     with no image value, runs the pushed image by digest: both pods Ready,
//     one the leader, and the example gets its UUID;
//   - helm upgrade from the same reference with another verbosity replaces
//     both pods, the image still the pushed digest;
//   - helm uninstall removes every object the release made, and leaves the
//     CRD and the example with its UUID.
//
// Then deploy/ is applied again for the tests that follow.
func TestHelmChartFromRegistry(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
	defer cancel()
	if err := waitRolledOut(ctx); err != nil {
		t.Fatal(err)
	}
	tag := env.cluster.Registry() + "/" + imageRepo + ":node-e2e"
	pushed := chartPush(ctx, t, tag, "oci://"+env.cluster.Registry()+"/charts")
	signedRelease(ctx, t, tag, pushed)
	from := []string{"oci://" + env.cluster.Registry() + "/charts/uuid-controller", "--version", chartVersion(t),
		"--ca-file", env.cluster.RegistryCA()}
	t.Logf("make chart-push pushed %s; installing %s", pushed, strings.Join(from, " "))

	removeKustomizeInstall(ctx, t)
	t.Cleanup(func() { restoreKustomizeInstall(t) })

	// install, not waiting: a wrong image would only show as a timeout.
	start := time.Now()
	if out, err := helm(ctx, append([]string{"install", release}, from...)...); err != nil {
		t.Fatalf("helm install: %v\n%s", err, out)
	}
	deployedImage(ctx, t)
	if err := waitRolledOut(ctx); err != nil {
		t.Fatal(err)
	}
	waitChartLeader(ctx, t)
	d := rolledOutReplicas(ctx, t)
	t.Logf("helm install from the registry: both pods Ready in %s", time.Since(start).Round(time.Millisecond))
	chartPodsLabelled(t, d)
	example := freshExample(ctx, t)

	// upgrade from the same reference: another verbosity, so new pods.
	upgradeReplacesPods(ctx, t, d, from...)
	deployedImage(ctx, t)
	waitChartLeader(ctx, t)
	sentinelNS := env.NewNamespace(ctx, t)
	env.WaitUUIDs(ctx, t, sentinelNS, env.CreateUuids(ctx, t, sentinelNS, "sentinel", 1), 2*time.Minute)

	uninstallChecked(ctx, t)
	exampleKept(ctx, t, example)
}

// deployedImage fails the test now unless the release's Deployment runs
// the image setup pushed, by digest: the chart's default, as chart-push
// set it.
func deployedImage(ctx context.Context, t *testing.T) {
	t.Helper()
	dep, err := env.Kube.AppsV1().Deployments(ns).Get(ctx, deployName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := dep.Spec.Template.Spec.Containers[0].Image; got != env.image {
		t.Fatalf("the chart from the registry runs image %q, want the pushed %s", got, env.image)
	}
}

// chartVersion is the version charts/uuid-controller/Chart.yaml names, the
// one a release pushes.
func chartVersion(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(env.root, chart, "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "version: "); ok {
			return v
		}
	}
	t.Fatal("Chart.yaml names no version")
	return ""
}

// chartPush runs `make chart-push` as a release does, for the image tag img
// and the chart repository repo (oci://...), signing the chart with the
// suite's key, and returns the chart by digest it printed last.
func chartPush(ctx context.Context, t *testing.T, img, repo string) string {
	t.Helper()
	cmd := exec.CommandContext(ctx, "make", "--no-print-directory", "chart-push", "IMG="+img, "CHART_REPO="+repo,
		"REGISTRY_CA="+env.cluster.RegistryCA(), "SIGNING_KEY="+env.signingKey)
	cmd.Dir, cmd.Env = env.root, helmEnv()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("make chart-push: %v\n%s%s", err, out, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	ref := lines[len(lines)-1]
	if want := strings.TrimPrefix(repo, "oci://") + "/uuid-controller@sha256:"; !strings.HasPrefix(ref, want) {
		t.Fatalf("make chart-push printed %q last, want %s...", ref, want)
	}
	return ref
}
