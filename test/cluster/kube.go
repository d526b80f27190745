package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// FieldManager is the server-side apply field manager Apply uses.
const FieldManager = "uuid-test"

// CRDName is the CustomResourceDefinition Start installs from crd.yaml.
const CRDName = "uuid.demo.operator"

// UuidGVR is the resource of the Uuid custom resource.
var UuidGVR = schema.GroupVersionResource{Group: "demo.operator", Version: "v1", Resource: "uuid"}

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

func writeKubeconfig(path, server string, caPEM []byte, user, token string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["test"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: caPEM}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: user, Namespace: "default"}
	cfg.CurrentContext = "test"
	return clientcmd.WriteToFile(*cfg, path)
}

func (c *Cluster) waitDefaultNamespace(ctx context.Context) error {
	cs, err := kubernetes.NewForConfig(c.shortTimeoutConfig())
	if err != nil {
		return err
	}
	return c.poll(ctx, c.apiserverProc(), time.Minute, func(ctx context.Context) error {
		_, err := cs.CoreV1().Namespaces().Get(ctx, metav1.NamespaceDefault, metav1.GetOptions{})
		return err
	})
}

func (c *Cluster) apiserverProc() *process {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.apiserver
}

// InstallCRD applies <repo root>/crd.yaml and waits until the CRD is
// Established and NamesAccepted and its resource is in discovery. Start
// calls it; a test that deleted or replaced the CRD calls it again.
// With $UUID_WATCH=full it installs crd.yaml without its selectable
// fields, as an apiserver before 1.31 serves it, so the controller runs its
// fallback: the full informer (FullWatch).
func (c *Cluster) InstallCRD(ctx context.Context) error {
	path := filepath.Join(c.repoRoot, "crd.yaml")
	if FullWatch() {
		var err error
		if path, err = c.withoutSelectableFields(path); err != nil {
			return err
		}
	}
	return c.InstallCRDFile(ctx, path)
}

// InstallCRDWithoutSelectableFields installs crd.yaml without its
// selectable fields, as an apiserver before 1.31 serves it, whatever
// $UUID_WATCH says.
func (c *Cluster) InstallCRDWithoutSelectableFields(ctx context.Context) error {
	path, err := c.withoutSelectableFields(filepath.Join(c.repoRoot, "crd.yaml"))
	if err != nil {
		return err
	}
	return c.InstallCRDFile(ctx, path)
}

// InstallCRDWithSelectableFields installs crd.yaml as it is, whatever
// $UUID_WATCH says.
func (c *Cluster) InstallCRDWithSelectableFields(ctx context.Context) error {
	return c.InstallCRDFile(ctx, filepath.Join(c.repoRoot, "crd.yaml"))
}

// FullWatch tells whether $UUID_WATCH=full asks for the controller's
// fallback, the full informer; else it runs narrowed, as crd.yaml allows.
func FullWatch() bool { return os.Getenv("UUID_WATCH") == "full" }

// withoutSelectableFields writes the CRD at path, without any version's
// selectableFields, to the cluster's directory and returns its path.
func (c *Cluster) withoutSelectableFields(path string) (string, error) {
	objs, err := ReadObjects(path)
	if err != nil {
		return "", err
	}
	if len(objs) != 1 {
		return "", fmt.Errorf("cluster: %s must hold exactly one CRD", path)
	}
	versions, _, _ := unstructured.NestedSlice(objs[0].Object, "spec", "versions")
	for _, v := range versions {
		if m, ok := v.(map[string]any); ok {
			delete(m, "selectableFields")
		}
	}
	if err := unstructured.SetNestedSlice(objs[0].Object, versions, "spec", "versions"); err != nil {
		return "", err
	}
	b, err := objs[0].MarshalJSON()
	if err != nil {
		return "", err
	}
	out := filepath.Join(c.dir, "crd-full-watch.json")
	return out, os.WriteFile(out, b, 0o644)
}

// InstallCRDFile is InstallCRD with another CRD of the same name, e.g. the
// kopf article's: it also waits until discovery shows the status
// subresource if and only if the file's CRD has one.
func (c *Cluster) InstallCRDFile(ctx context.Context, path string) error {
	objs, err := ReadObjects(path)
	if err != nil {
		return err
	}
	if len(objs) != 1 || objs[0].GetName() != CRDName {
		return fmt.Errorf("cluster: %s must hold exactly the CRD %s", path, CRDName)
	}
	versions, _, _ := unstructured.NestedSlice(objs[0].Object, "spec", "versions")
	wantStatus := false
	for _, v := range versions {
		if m, ok := v.(map[string]any); ok && m["name"] == UuidGVR.Version {
			_, wantStatus, _ = unstructured.NestedMap(m, "subresources", "status")
		}
	}
	if err := c.Apply(ctx, path); err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(c.shortTimeoutConfig())
	if err != nil {
		return err
	}
	dc, err := discovery.NewDiscoveryClientForConfig(c.shortTimeoutConfig())
	if err != nil {
		return err
	}
	return c.poll(ctx, c.apiserverProc(), time.Minute, func(ctx context.Context) error {
		crd, err := dyn.Resource(crdGVR).Get(ctx, CRDName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, cond := range []string{"Established", "NamesAccepted"} {
			if !crdCondition(crd, cond) {
				return fmt.Errorf("CRD %s not %s yet", CRDName, cond)
			}
		}
		rl, err := dc.ServerResourcesForGroupVersion(UuidGVR.GroupVersion().String())
		if err != nil {
			return err
		}
		var served, status bool
		for _, r := range rl.APIResources {
			served = served || r.Name == UuidGVR.Resource
			status = status || r.Name == UuidGVR.Resource+"/status"
		}
		if !served {
			return fmt.Errorf("resource %s not in discovery yet", UuidGVR)
		}
		if status != wantStatus {
			return fmt.Errorf("discovery does not show %s's status subresource change yet", UuidGVR)
		}
		return nil
	})
}

// DeleteCRD deletes the Uuid CRD and waits until it is gone, which is after
// the apiserver has deleted every Uuid object.
func (c *Cluster) DeleteCRD(ctx context.Context) error {
	dyn, err := dynamic.NewForConfig(c.shortTimeoutConfig())
	if err != nil {
		return err
	}
	err = dyn.Resource(crdGVR).Delete(ctx, CRDName, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting CRD %s: %w", CRDName, err)
	}
	return c.poll(ctx, c.apiserverProc(), 2*time.Minute, func(ctx context.Context) error {
		_, err := dyn.Resource(crdGVR).Get(ctx, CRDName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		return fmt.Errorf("CRD %s still there", CRDName)
	})
}

func crdCondition(crd *unstructured.Unstructured, typ string) bool {
	conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
	for _, ci := range conds {
		m, ok := ci.(map[string]any)
		if ok && m["type"] == typ && m["status"] == "True" {
			return true
		}
	}
	return false
}

// Apply server-side applies every object in the given multi-document YAML
// (or JSON) files, in order, with field manager "uuid-test" and force.
// Namespaced objects without a namespace go to "default". A kind that is
// not yet in discovery (a CRD applied just before) is retried for up to
// 30 s.
func (c *Cluster) Apply(ctx context.Context, paths ...string) error {
	var objs []*unstructured.Unstructured
	for _, p := range paths {
		o, err := ReadObjects(p)
		if err != nil {
			return err
		}
		objs = append(objs, o...)
	}
	cfg := c.AdminConfig()
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return err
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	for _, obj := range objs {
		if err := applyOne(ctx, dyn, mapper, obj); err != nil {
			return err
		}
	}
	return nil
}

func applyOne(ctx context.Context, dyn dynamic.Interface, mapper *restmapper.DeferredDiscoveryRESTMapper, obj *unstructured.Unstructured) error {
	gvk := obj.GroupVersionKind()
	desc := fmt.Sprintf("%s %s/%s", gvk.Kind, obj.GetNamespace(), obj.GetName())
	// A CRD applied just before is served only once discovery has it.
	var m *meta.RESTMapping
	var noMatch error
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		var err error
		if m, err = mapper.RESTMapping(gvk.GroupKind(), gvk.Version); meta.IsNoMatchError(err) {
			noMatch = err
			mapper.Reset()
			return false, nil
		}
		return err == nil, err
	})
	if wait.Interrupted(err) && noMatch != nil {
		err = fmt.Errorf("%w (%w)", noMatch, err)
	}
	if err != nil {
		return fmt.Errorf("cluster: apply %s: %w", desc, err)
	}
	var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		if obj.GetNamespace() == "" {
			obj.SetNamespace(metav1.NamespaceDefault)
		}
		ri = dyn.Resource(m.Resource).Namespace(obj.GetNamespace())
	}
	if _, err := ri.Apply(ctx, obj.GetName(), obj, metav1.ApplyOptions{FieldManager: FieldManager, Force: true}); err != nil {
		return fmt.Errorf("cluster: apply %s: %w", desc, err)
	}
	return nil
}

// ReadObjects decodes the objects in a YAML or JSON manifest file, skipping
// empty documents.
func ReadObjects(path string) ([]*unstructured.Unstructured, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	defer f.Close()
	dec := utilyaml.NewYAMLOrJSONDecoder(f, 4096)
	var objs []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			return objs, nil
		} else if err != nil {
			return nil, fmt.Errorf("cluster: parse %s: %w", path, err)
		}
		if len(m) == 0 { // empty document, e.g. a trailing ---
			continue
		}
		obj := &unstructured.Unstructured{Object: m}
		if obj.GetKind() == "" || obj.GetAPIVersion() == "" || obj.GetName() == "" {
			return nil, fmt.Errorf("cluster: %s: object without apiVersion, kind or metadata.name", path)
		}
		objs = append(objs, obj)
	}
}

// ServiceAccountKubeconfig makes sure the namespace and ServiceAccount
// exist, gets a 24 h token for it through the TokenRequest API and writes a
// kubeconfig using that token. It returns the file's path. The token stays
// valid across RestartAPIServer.
func (c *Cluster) ServiceAccountKubeconfig(ctx context.Context, namespace, name string) (string, error) {
	token, err := c.ServiceAccountToken(ctx, namespace, name)
	if err != nil {
		return "", err
	}
	path := filepath.Join(c.dir, "kubeconfigs", fmt.Sprintf("sa-%s-%s.kubeconfig", namespace, name))
	user := fmt.Sprintf("system:serviceaccount:%s:%s", namespace, name)
	if err := writeKubeconfig(path, c.url, c.caPEM, user, token); err != nil {
		return "", err
	}
	return path, nil
}

// ServiceAccountToken makes sure the namespace and ServiceAccount exist and
// returns a 24 h token for it from the TokenRequest API.
func (c *Cluster) ServiceAccountToken(ctx context.Context, namespace, name string) (string, error) {
	cs, err := kubernetes.NewForConfig(c.AdminConfig())
	if err != nil {
		return "", err
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", fmt.Errorf("cluster: create namespace %s: %w", namespace, err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
	if _, err := cs.CoreV1().ServiceAccounts(namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", fmt.Errorf("cluster: create serviceaccount %s/%s: %w", namespace, name, err)
	}
	expiry := int64((24 * time.Hour).Seconds())
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry}}
	tr, err = cs.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, tr, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("cluster: token for serviceaccount %s/%s: %w", namespace, name, err)
	}
	return tr.Status.Token, nil
}

// Kubectl runs bin/kubectl as the admin, in the repo root (so relative
// paths name the repo's files, as in a user's checkout), and returns its
// combined output and its error (an *exec.ExitError for a non-zero exit).
func (c *Cluster) Kubectl(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(c.binDir, KubectlBinary), args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+c.adminKC)
	cmd.Dir = c.repoRoot
	out, err := cmd.CombinedOutput()
	return string(out), err
}
