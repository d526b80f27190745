package e2e

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/demo-operator/uuid-controller/test/framework"
)

// TestMonitoringComponent: deploy/ with the deploy/monitoring component,
// rendered by kustomize as a user's overlay would, fits together: the
// Service selects the controller's Pods and names their metrics port, the
// ServiceMonitor selects the Service, its CA Secret is the one the
// Deployment mounts for --metrics-cert-file, its token Secret belongs to a
// ServiceAccount that the apiserver authorizes for get on /metrics, and
// the dashboard ConfigMap holds dashboard.json. The apiserver accepts the
// core objects (server dry run; prometheus-operator's kinds are checked
// against its Go types by hack/prometheus).
func TestMonitoringComponent(t *testing.T) {
	ctx := testCtx(t)
	root := framework.RepoRoot(t)
	objs, _ := renderOverlay(t, componentOverlay(t, root, "deploy/monitoring", ""))
	byKind := map[string]*unstructured.Unstructured{}
	var core []string
	for _, o := range objs {
		byKind[o.GetKind()+"/"+o.GetName()] = o
		if !strings.HasSuffix(o.GetAPIVersion(), "monitoring.coreos.com/v1") {
			core = append(core, objectKey(o))
		}
	}
	get := func(kind, name string, into any) {
		t.Helper()
		o := byKind[kind+"/"+name]
		if o == nil {
			t.Fatalf("no %s %s in the rendered component", kind, name)
		}
		fromUnstructured(t, o, into)
	}

	dep := deploymentOf(t, objs)
	pod := dep.Spec.Template
	c := pod.Spec.Containers[0]
	var svc corev1.Service
	get("Service", "uuid-controller-metrics", &svc)
	if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(pod.Labels)) {
		t.Errorf("the Service's selector %v does not match the Pods' labels %v", svc.Spec.Selector, pod.Labels)
	}
	if !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == svc.Spec.Ports[0].TargetPort.String() }) {
		t.Errorf("the Service's targetPort %s is no port of the container (%v)", svc.Spec.Ports[0].TargetPort.String(), c.Ports)
	}

	var sm struct {
		Spec struct {
			Selector  metav1.LabelSelector `json:"selector"`
			Endpoints []struct {
				Port          string `json:"port"`
				Authorization struct {
					Credentials corev1.SecretKeySelector `json:"credentials"`
				} `json:"authorization"`
				TLSConfig struct {
					CA struct {
						Secret corev1.SecretKeySelector `json:"secret"`
					} `json:"ca"`
				} `json:"tlsConfig"`
			} `json:"endpoints"`
		} `json:"spec"`
	}
	get("ServiceMonitor", "uuid-controller", &sm)
	sel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
	if err != nil || !sel.Matches(labels.Set(svc.Labels)) {
		t.Errorf("the ServiceMonitor's selector %v does not match the Service's labels %v (%v)", sm.Spec.Selector, svc.Labels, err)
	}
	ep := sm.Spec.Endpoints[0]
	if ep.Port != svc.Spec.Ports[0].Name {
		t.Errorf("the ServiceMonitor scrapes port %q, the Service's is %q", ep.Port, svc.Spec.Ports[0].Name)
	}

	// The CA the ServiceMonitor trusts is the Secret whose certificate the
	// controller serves.
	var mount string
	for _, v := range pod.Spec.Volumes {
		if v.Secret != nil && v.Secret.SecretName == ep.TLSConfig.CA.Secret.Name {
			for _, m := range c.VolumeMounts {
				if m.Name == v.Name {
					mount = m.MountPath
				}
			}
		}
	}
	if mount == "" {
		t.Fatalf("the Deployment mounts no Secret %s (the ServiceMonitor's CA)", ep.TLSConfig.CA.Secret.Name)
	}
	for _, flag := range []string{"--metrics-cert-file=" + mount + "/tls.crt", "--metrics-key-file=" + mount + "/tls.key"} {
		if !slices.Contains(c.Args, flag) {
			t.Errorf("the controller's args %v lack %s", c.Args, flag)
		}
	}

	// The token is the scraper's, and the apiserver lets it read /metrics.
	var secret corev1.Secret
	get("Secret", ep.Authorization.Credentials.Name, &secret)
	sa := secret.Annotations[corev1.ServiceAccountNameKey]
	if secret.Type != corev1.SecretTypeServiceAccountToken || sa == "" {
		t.Fatalf("the ServiceMonitor's token Secret is a %s for %q", secret.Type, sa)
	}
	var crb rbacv1.ClusterRoleBinding
	get("ClusterRoleBinding", "uuid-controller-metrics-scraper", &crb)
	if crb.RoleRef.Name != metricsReaderRole || crb.Subjects[0].Name != sa || crb.Subjects[0].Namespace != secret.Namespace {
		t.Errorf("the binding %+v does not bind %s/%s to %s", crb, secret.Namespace, sa, metricsReaderRole)
	}
	created, err := env.kube.RbacV1().ClusterRoleBindings().Create(ctx, &crb, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = env.kube.RbacV1().ClusterRoleBindings().Delete(t.Context(), created.Name, metav1.DeleteOptions{})
	})
	if err := env.fw.WaitAllowed(ctx, 10*time.Second, "the apiserver to let "+sa+" get /metrics", authorizationv1.SubjectAccessReviewSpec{
		User:                  "system:serviceaccount:" + secret.Namespace + ":" + sa,
		Groups:                []string{"system:serviceaccounts"},
		NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: "/metrics", Verb: "get"},
	}); err != nil {
		t.Error(err)
	}

	var cm corev1.ConfigMap
	get("ConfigMap", "uuid-controller-dashboard", &cm)
	dashboard, err := os.ReadFile(filepath.Join(root, "deploy", "monitoring", "dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	if cm.Data["dashboard.json"] != string(dashboard) || cm.Labels["grafana_dashboard"] != "1" {
		t.Errorf("the dashboard ConfigMap does not hold dashboard.json with label grafana_dashboard=1")
	}

	// The apiserver accepts the core objects as they are.
	var docs []string
	for _, o := range objs {
		if strings.HasSuffix(o.GetAPIVersion(), "monitoring.coreos.com/v1") {
			continue
		}
		b, err := o.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, string(b))
	}
	coreFile := filepath.Join(t.TempDir(), "core.yaml")
	if err := os.WriteFile(coreFile, []byte(strings.Join(docs, "\n---\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	framework.Kubectl(t, env.cluster, "apply", "--dry-run=server", "-f", coreFile)
	t.Logf("%d objects; the apiserver accepts %d: %v", len(objs), len(core), core)
}
