//go:build node

// Package node tests the controller as deployed: the image built by `make
// image`, loaded into a real single node on this machine (test/cluster
// with Options.Node: kube-controller-manager, kube-scheduler, containerd,
// a kubelet and kube-proxy), and deploy/ applied with kubectl as a user
// would. The controller has no kubeconfig there: it reaches the apiserver
// with rest.InClusterConfig, its projected token and the kubernetes
// Service's ClusterIP.
//
// The tests need root, `make node-tools node-deps image pause-image`, and
// the build tag: `make node-e2e` runs them. They share one node and one
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
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/demo-operator/uuid-controller/test/cluster"
)

// The Deployment under test, as deploy/ names it.
const (
	ns         = cluster.ControllerNamespace
	deployName = "uuid-controller"
	leaseName  = "uuid-controller"
	container  = "controller"
	appLabel   = "app.kubernetes.io/name=uuid-controller"
	// controllerImage is the tag `make image` gives bin/uuid-controller.tar.
	controllerImage = "uuid-controller:dev"
)

var env struct {
	cluster *cluster.Cluster
	root    string
	dyn     dynamic.Interface
	kube    kubernetes.Interface
}

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
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
	images := []string{filepath.Join(env.root, "bin", "pause.tar"), filepath.Join(env.root, "bin", "uuid-controller.tar")}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	env.cluster, err = cluster.Start(ctx, cluster.Options{
		Logger: logger, Audit: true, Node: true,
		PauseImage: images[0], NodeImages: images[1:],
	})
	if err != nil {
		return err
	}
	cfg := env.cluster.AdminConfig()
	if env.dyn, err = dynamic.NewForConfig(cfg); err != nil {
		return err
	}
	if env.kube, err = kubernetes.NewForConfig(cfg); err != nil {
		return err
	}
	// As a user would. The kustomization's image is the one `make image`
	// tags (uuid-controller:dev), already in the node's containerd.
	if out, err := kubectl(ctx, "apply", "-k", "deploy/"); err != nil {
		return fmt.Errorf("kubectl apply -k deploy/: %w\n%s", err, out)
	}
	return waitRolledOut(ctx)
}

// kubectl runs bin/kubectl as admin and returns its combined output.
func kubectl(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(env.cluster.BinDir(), cluster.KubectlBinary), args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+env.cluster.AdminKubeconfig())
	cmd.Dir = env.root
	out, err := cmd.CombinedOutput()
	return string(out), err
}
