package cluster

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// The node's other Kubernetes binaries, from `make node-tools`.
const (
	ControllerManagerBinary = "kube-controller-manager"
	SchedulerBinary         = "kube-scheduler"
	ProxyBinary             = "kube-proxy"
)

// startControllerManager runs the controllers a Deployment needs
// (Deployments, ReplicaSets, ServiceAccounts, the kube-root-ca.crt
// ConfigMap, namespace deletion, the node's taints, the token Secrets of
// kubernetes.io/service-account-token, which deploy/monitoring/scraper.yaml
// ships), as admin. Its --root-ca-file is the CA alone: a bundle with the
// leaf loops on "does not have the CA bit set". The token controller signs
// with the apiserver's ServiceAccount key.
func (c *Cluster) startControllerManager(ctx context.Context) error {
	args := []string{
		"--kubeconfig", c.adminKC,
		"--leader-elect=false",
		"--bind-address", "127.0.0.1",
		"--secure-port", "0",
		"--root-ca-file", filepath.Join(c.dir, "certs", "ca.crt"),
		"--service-account-private-key-file", filepath.Join(c.dir, "certs", "sa.key"),
		"--service-cluster-ip-range", ServiceCIDR,
		"--allocate-node-cidrs=false",
		"--use-service-account-credentials=false",
	}
	p, err := c.spawn(ControllerManagerBinary, args)
	if err != nil {
		return err
	}
	c.setNodeProcess(ControllerManagerBinary, p)
	// Its ServiceAccount controller creates "default" in every namespace.
	cs, err := kubernetes.NewForConfig(c.shortTimeoutConfig())
	if err != nil {
		return err
	}
	return c.poll(ctx, p, 2*time.Minute, func(ctx context.Context) error {
		_, err := cs.CoreV1().ServiceAccounts(metav1.NamespaceDefault).Get(ctx, "default", metav1.GetOptions{})
		return err
	})
}

func (c *Cluster) startScheduler() error {
	p, err := c.spawn(SchedulerBinary, []string{
		"--kubeconfig", c.adminKC,
		"--leader-elect=false",
		"--bind-address", "127.0.0.1",
		"--secure-port", "0",
	})
	if err != nil {
		return err
	}
	c.setNodeProcess(SchedulerBinary, p)
	return nil
}

// startProxy runs kube-proxy in iptables mode (after the Service CIDR's
// unreachable route is in place) and waits until the kubernetes Service's
// ClusterIP is translated. Explicit ports for metrics and healthz: it
// rejects 0. The conntrack values 0 leave the machine's settings alone,
// and no localhost NodePorts keeps route_localnet off.
func (c *Cluster) startProxy(ctx context.Context) error {
	ports, err := freePorts(2)
	if err != nil {
		return err
	}
	args := []string{
		"--kubeconfig", c.adminKC,
		"--proxy-mode", "iptables",
		"--cluster-cidr", PodCIDR,
		"--nodeport-addresses", PodCIDR,
		"--iptables-localhost-nodeports=false",
		"--conntrack-max-per-core", "0",
		"--conntrack-tcp-timeout-established", "0",
		"--conntrack-tcp-timeout-close-wait", "0",
		"--metrics-bind-address", "127.0.0.1:" + strconv.Itoa(ports[0]),
		"--healthz-bind-address", "127.0.0.1:" + strconv.Itoa(ports[1]),
		"--hostname-override", NodeName,
	}
	p, err := c.spawn(ProxyBinary, args)
	if err != nil {
		return err
	}
	c.setNodeProcess(ProxyBinary, p)
	healthz := "http://127.0.0.1:" + strconv.Itoa(ports[1]) + "/healthz"
	hc := &http.Client{Timeout: 2 * time.Second}
	return c.poll(ctx, p, 2*time.Minute, func(ctx context.Context) error {
		if err := getOK(ctx, hc, healthz); err != nil {
			return fmt.Errorf("kube-proxy healthz: %w", err)
		}
		rules, err := run(ctx, "iptables", "-w", "-t", "nat", "-S", "KUBE-SERVICES")
		if err != nil {
			return err
		}
		if !strings.Contains(rules, KubernetesServiceIP+"/32") {
			return fmt.Errorf("no iptables rule for the kubernetes Service's ClusterIP %s yet", KubernetesServiceIP)
		}
		return nil
	})
}

// getOK GETs url and returns an error unless the answer is 200 OK.
func getOK(ctx context.Context, hc *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, body)
	}
	return nil
}
