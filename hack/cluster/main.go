// Command cluster runs a local etcd + kube-apiserver (see test/cluster),
// applies the CRD and the given manifests, and writes an admin kubeconfig.
//
//	go run ./hack/cluster                       # until Ctrl-C
//	go run ./hack/cluster -- kubectl get uuid   # run a command against it, then stop
//	go run ./hack/cluster -node                 # with a node that runs Pods (root)
//	go run ./hack/cluster -node-cleanup         # after a node's process was killed
//
// With a command after "--", the command runs with KUBECONFIG set and the
// bin dir first in PATH; the cluster stops when it ends and this program
// exits with its exit code.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/demo-operator/uuid-controller/test/cluster"
)

func main() {
	os.Exit(run())
}

func run() int {
	binDir := flag.String("bin-dir", "", "dir with etcd, kube-apiserver, kubectl (default $KUBE_TEST_BIN_DIR or <repo>/bin)")
	kubeconfigOut := flag.String("kubeconfig-out", ".local/kubeconfig", "where to copy the admin kubeconfig")
	apply := flag.String("apply", "deploy/namespace.yaml,deploy/rbac.yaml", "comma-separated manifests to apply after the CRD (relative to the repo root unless absolute)")
	node := flag.Bool("node", false, "also run a node (kube-controller-manager, kube-scheduler, containerd, kubelet, kube-proxy) so Deployments run as Pods; needs root, `make node-tools node-deps image`")
	pauseImage := flag.String("pause-image", "bin/pause.tar", "with -node: the pod sandbox image archive")
	images := flag.String("images", "bin/uuid-controller.tar", "with -node: comma-separated image archives to load into the node's containerd")
	cleanup := flag.Bool("node-cleanup", false, "remove what a node whose process was killed left on the machine (processes, cgroups, mounts, bridge, route, iptables rules), then exit")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: %s [flags] [-- command [args...]]\n", os.Args[0])
		flag.PrintDefaults()
	}
	flag.Parse()
	command := flag.Args()

	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	slog.SetDefault(log)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if *cleanup {
		if err := cluster.CleanUpNodes(ctx, log); err != nil {
			log.Error("node cleanup", "err", err)
			return 1
		}
		return 0
	}

	root, err := cluster.RepoRoot()
	if err != nil {
		log.Error("find repo root", "err", err)
		return 1
	}
	opts := cluster.Options{BinDir: *binDir, Logger: log, Node: *node}
	if *node {
		opts.PauseImage = inRepo(root, *pauseImage)
		for _, img := range strings.Split(*images, ",") {
			if img = strings.TrimSpace(img); img != "" {
				opts.NodeImages = append(opts.NodeImages, inRepo(root, img))
			}
		}
	}
	startCtx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	c, err := cluster.Start(startCtx, opts)
	cancel()
	if err != nil {
		log.Error("start cluster", "err", err)
		return 1
	}
	if *node {
		log.Info("the node's registry: make image-push IMG=$REGISTRY/uuid-controller:TAG REGISTRY_CA=$CA",
			"REGISTRY", c.Registry(), "CA", c.RegistryCA())
	}
	code := serve(ctx, log, c, root, *apply, *kubeconfigOut, command)
	if err := c.Stop(); err != nil {
		log.Error("stop cluster", "err", err)
		return 1
	}
	// The last line: a stop the user asked for (Ctrl-C) is not a failure.
	if ctx.Err() != nil {
		fmt.Fprintln(os.Stderr, "Stopped as asked: the command and the cluster are down.")
	}
	return code
}

// serve applies the manifests, writes the kubeconfigs, then runs command,
// or waits for a signal when there is none, and returns the exit code.
func serve(ctx context.Context, log *slog.Logger, c *cluster.Cluster, root, apply, kubeconfigOut string, command []string) int {
	var manifests []string
	for _, m := range strings.Split(apply, ",") {
		if m = strings.TrimSpace(m); m == "" {
			continue
		}
		manifests = append(manifests, inRepo(root, m))
	}
	if len(manifests) > 0 {
		if err := c.Apply(ctx, manifests...); err != nil {
			log.Error("apply manifests", "err", err)
			return 1
		}
		log.Info("applied", "manifests", manifests)
	}

	kc, err := filepath.Abs(kubeconfigOut)
	if err != nil {
		log.Error("kubeconfig path", "err", err)
		return 1
	}
	if err := copyFile(c.AdminKubeconfig(), kc); err != nil {
		log.Error("write kubeconfig", "err", err)
		return 1
	}
	// The controller's own identity, with only deploy/rbac.yaml's
	// permissions, so a local run proves the RBAC as a cluster would.
	saKC, err := c.ControllerKubeconfig(ctx)
	if err != nil {
		log.Error("controller kubeconfig", "err", err)
		return 1
	}
	ctrlKC := filepath.Join(filepath.Dir(kc), "controller.kubeconfig")
	if err := copyFile(saKC, ctrlKC); err != nil {
		log.Error("write kubeconfig", "err", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "\nCluster %s is up (logs in %s).\n  export KUBECONFIG=%s\n  export PATH=%s:$PATH\n  kubectl get uuid -A\n"+
		"The controller's ServiceAccount (uuid-system/uuid-controller): --kubeconfig %s\n\n",
		c.URL(), c.Dir(), kc, c.BinDir(), ctrlKC)

	if len(command) == 0 {
		log.Info("running until SIGINT/SIGTERM")
		<-ctx.Done()
		log.Info("signal received, stopping")
		return 0
	}
	return runCommand(ctx, log, command, kc, ctrlKC, c.BinDir())
}

// runCommand runs command with KUBECONFIG (admin), CONTROLLER_KUBECONFIG
// (the controller's ServiceAccount) and PATH set. When ctx is
// cancelled (SIGINT/SIGTERM) the command gets SIGTERM, and SIGKILL 30 s
// later if it is still running.
func runCommand(ctx context.Context, log *slog.Logger, command []string, kubeconfig, controllerKubeconfig, binDir string) int {
	env := os.Environ()
	path := binDir
	if p := os.Getenv("PATH"); p != "" {
		path += string(os.PathListSeparator) + p
	}
	env = append(env, "KUBECONFIG="+kubeconfig, "CONTROLLER_KUBECONFIG="+controllerKubeconfig, "PATH="+path)
	// Resolve the program with the new PATH, so bin/kubectl wins.
	prog := command[0]
	if !strings.Contains(prog, "/") {
		if p, err := lookPath(prog, path); err == nil {
			prog = p
		}
	}
	cmd := exec.CommandContext(ctx, prog, command[1:]...)
	cmd.Args[0] = command[0]
	cmd.Env = env
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 30 * time.Second
	log.Info("running command", "command", command)
	err := cmd.Run()
	if ee := (*exec.ExitError)(nil); err != nil && !errors.As(err, &ee) && ctx.Err() == nil {
		log.Error("run command", "command", command, "err", err)
	}
	code := exitCode(err, ctx.Err() != nil)
	log.Info("command finished", "exit_code", code)
	return code
}

// exitCode maps how the command ended (cmd.Run's error) to this program's
// exit code: the command's own code, 128+N if signal N killed it, 127 if it
// could not run. When the user asked to stop (stopping: SIGINT or SIGTERM
// reached this program, which sends the command SIGTERM), the command
// ending on that signal, by it, with a shell's 130 or 143, or with 0, is a
// clean stop: 0.
func exitCode(err error, stopping bool) int {
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case stopping && errors.Is(err, context.Canceled):
		// Wait's answer when the command exited 0 after the SIGTERM.
		return 0
	case !errors.As(err, &ee):
		return 127
	}
	code := ee.ExitCode()
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		code = 128 + int(ws.Signal())
	}
	if stopping && (code == 128+int(syscall.SIGINT) || code == 128+int(syscall.SIGTERM)) {
		return 0
	}
	return code
}

// inRepo makes a path relative to the repo root absolute.
func inRepo(root, path string) string {
	if filepath.IsAbs(path) {
		return path
	}
	return filepath.Join(root, path)
}

func lookPath(name, pathList string) (string, error) {
	for _, dir := range filepath.SplitList(pathList) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", exec.ErrNotFound
}

func copyFile(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o600)
}
