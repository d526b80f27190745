// Package e2e tests the uuid-controller binary end to end: a real etcd and
// kube-apiserver on loopback (test/cluster) with RBAC on, and the controller
// running as a separate process with the ServiceAccount token and the
// ClusterRole from deploy/rbac.yaml, never as admin.
//
// Tests run one after another and each stops the controllers it started,
// because some read the apiserver's global request counters.
package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/demo-operator/uuid-controller/test/cluster"
	"github.com/demo-operator/uuid-controller/test/framework"
)

// env is what every test shares: one cluster, one controller binary.
var env struct {
	cluster *cluster.Cluster
	// binary is the uuid-controller built from this checkout, in binDir.
	binary, binDir string
	// kubeconfig authenticates as the controller's ServiceAccount.
	kubeconfig string
	// dyn and kube are admin clients, for the tests' own reads and writes.
	dyn  dynamic.Interface
	kube kubernetes.Interface
	// fw is test/framework on dyn and kube.
	fw framework.Clients
}

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	defer func() {
		if env.binDir != "" {
			_ = os.RemoveAll(env.binDir)
		}
	}()
	if err := setup(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e setup:", err)
		if env.cluster != nil {
			_ = env.cluster.Stop()
		}
		return 1
	}
	code := m.Run()
	if err := env.cluster.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: stop cluster:", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

func setup() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	var err error
	if env.binDir, err = os.MkdirTemp("", "uuid-e2e-bin-"); err != nil {
		return err
	}
	if env.binary, err = cluster.BuildController(ctx, env.binDir); err != nil {
		return err
	}
	if env.cluster, err = cluster.Start(ctx, cluster.Options{Logger: logger, Audit: true}); err != nil {
		return err
	}
	if env.kubeconfig, err = env.cluster.ControllerKubeconfig(ctx); err != nil {
		return err
	}
	if env.fw, err = framework.NewClients(env.cluster.AdminConfig()); err != nil {
		return err
	}
	env.dyn, env.kube = env.fw.Dyn, env.fw.Kube
	// Which apiserver the run tested: make test-versions points
	// KUBE_TEST_BIN_DIR at an older minor's binaries.
	v, err := env.kube.Discovery().ServerVersion()
	if err != nil {
		return fmt.Errorf("reading the apiserver's version: %w", err)
	}
	fmt.Fprintf(os.Stderr, "e2e: kube-apiserver %s from %s\n", v.GitVersion, env.cluster.BinDir())
	return nil
}
