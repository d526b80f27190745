//go:build node

// Package node tests the controller as deployed: the image built and
// pushed by `make image-push` to the registry of a real single node on this
// machine (test/cluster with Options.Node: kube-controller-manager,
// kube-scheduler, containerd, a kubelet, kube-proxy and CNCF distribution's
// registry), and deploy/ applied with kubectl as a user would, its image
// pinned by digest as `make deploy IMG=...@sha256:...` pins it. The kubelet
// pulls it; nothing imports it. The controller has no kubeconfig there: it
// reaches the apiserver with rest.InClusterConfig, its projected token and
// the kubernetes Service's ClusterIP.
//
// The tests need root, `make node-tools node-deps pause-image`, and the
// build tag: `make node-e2e` runs them. They share one node and one
// Deployment; each starts by waiting for the Deployment to be rolled out,
// so each may follow any other. TestMain fails the run if the machine is
// not as it was before the node started (links, routes, iptables, mounts,
// cgroups, sysctls, processes).
package node

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/demo-operator/uuid-controller/test/cluster"
	"github.com/demo-operator/uuid-controller/test/framework"
)

// The Deployment under test, as deploy/ names it.
const (
	ns         = cluster.ControllerNamespace
	deployName = "uuid-controller"
	leaseName  = "uuid-controller"
	container  = "controller"
	appLabel   = "app.kubernetes.io/name=uuid-controller"
	// imageRepo is the controller's repository in the node's registry.
	imageRepo = "uuid-controller"
)

var env struct {
	cluster *cluster.Cluster
	root    string
	framework.Clients
	// image is the controller image as deployed: REGISTRY/REPO@sha256:...,
	// the index `make image-push` pushed to the node's registry.
	image string
	// signingKey and publicKey are the key pair setup generated and signed
	// the image with (SIGNING_KEY), as PEM files in keyDir.
	signingKey, publicKey, keyDir string
	// rolloutEvents are deploy/'s namespace's events once setup rolled it out.
	rolloutEvents []corev1.Event
}

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	defer func() { os.RemoveAll(env.keyDir) }()
	// An interrupted run (Ctrl-C, a cancelled CI job) still tears the node
	// down: its bridge, routes and rules outlive the test binary.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		sig := <-sigs
		fmt.Fprintln(os.Stderr, "node: interrupted by", sig, "- tearing the node down")
		stopCluster()
		os.Exit(1)
	}()

	start := time.Now()
	if err := setup(); err != nil {
		fmt.Fprintln(os.Stderr, "node setup:", err)
		stopCluster()
		return 1
	}
	fmt.Fprintf(os.Stderr, "node: node up and deploy/ rolled out in %s\n", time.Since(start).Round(time.Second))
	code := m.Run()
	if !stopCluster() {
		code = 1
	}
	return code
}

var (
	stopOnce sync.Once
	stopOK   bool
)

// stopCluster stops the node once; a second caller waits for the first.
// Teardown is part of the test: it reports false when the machine is not
// as it was before the node.
func stopCluster() bool {
	stopOnce.Do(func() {
		if env.cluster == nil {
			stopOK = true
			return
		}
		start := time.Now()
		if err := env.cluster.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "node: FAIL: stop:", err)
			return
		}
		stopOK = true
		fmt.Fprintf(os.Stderr, "node: teardown and machine check took %s\n", time.Since(start).Round(time.Second))
	})
	return stopOK
}

func setup() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var err error
	if env.root, err = cluster.RepoRoot(); err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	env.cluster, err = cluster.Start(ctx, cluster.Options{
		Logger: logger, Audit: true, Node: true,
		PauseImage: filepath.Join(env.root, "bin", "pause.tar"),
	})
	if err != nil {
		return err
	}
	if env.Clients, err = framework.NewClients(env.cluster.AdminConfig()); err != nil {
		return err
	}
	if env.keyDir, err = os.MkdirTemp("", "node-signing-"); err != nil {
		return err
	}
	if env.signingKey, env.publicKey, err = writeKeyPair(env.keyDir, "signing"); err != nil {
		return err
	}
	if env.image, err = pushImage(ctx, env.cluster.Registry()+"/"+imageRepo+":node-e2e"); err != nil {
		return err
	}
	if err := applyDeploy(ctx); err != nil {
		return err
	}
	if err := waitRolledOut(ctx); err != nil {
		return err
	}
	// Kept now: TestHelmChart deletes the namespace, and its events with it.
	events, err := env.Kube.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("the events in %s after the rollout: %w", ns, err)
	}
	env.rolloutEvents = events.Items
	return nil
}

// applyDeploy applies deploy/ as a user would, its image pinned to the
// pushed digest, as `make deploy IMG=...@sha256:...` applies it.
func applyDeploy(ctx context.Context) error {
	overlay, err := os.MkdirTemp("", "node-deploy-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(overlay)
	if out, err := exec.CommandContext(ctx, filepath.Join(env.root, "hack", "kustomize-overlay.sh"), overlay, env.image).CombinedOutput(); err != nil {
		return fmt.Errorf("hack/kustomize-overlay.sh: %w\n%s", err, out)
	}
	if out, err := env.cluster.Kubectl(ctx, "apply", "-k", overlay); err != nil {
		return fmt.Errorf("kubectl apply -k deploy/ (image %s): %w\n%s", env.image, err, out)
	}
	return nil
}

// pushImage runs `make image-push IMG=tag SIGNING_KEY=...` against the
// node's registry, as a user pushes a release (signed, with its SBOM and
// provenance), and returns the reference it printed
// (REPOSITORY@sha256:...). An empty docker config: the node's registry
// needs no credentials, and the user's must not leak into the test.
func pushImage(ctx context.Context, tag string) (string, error) {
	dockerConfig, err := os.MkdirTemp("", "node-docker-config-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dockerConfig)
	cmd := exec.CommandContext(ctx, "make", "--no-print-directory", "image-push", "IMG="+tag, "REGISTRY_CA="+env.cluster.RegistryCA(),
		"SIGNING_KEY="+env.signingKey)
	cmd.Dir = env.root
	cmd.Env = append(os.Environ(), "DOCKER_CONFIG="+dockerConfig)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("make image-push IMG=%s: %w\n%s%s", tag, err, out, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	ref := lines[len(lines)-1]
	repo, _, _ := strings.Cut(tag, ":node-e2e")
	if !strings.HasPrefix(ref, repo+"@sha256:") {
		return "", fmt.Errorf("make image-push IMG=%s printed %q last, want %s@sha256:...", tag, ref, repo)
	}
	fmt.Fprintf(os.Stderr, "node: pushed %s\n", ref)
	return ref, nil
}
