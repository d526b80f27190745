package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/demo-operator/uuid-controller/test/cluster"
	"github.com/demo-operator/uuid-controller/test/framework"
)

// namespacedComponent is the kustomize component that installs the
// controller into one namespace with Roles only.
const namespacedComponent = "deploy/components/namespaced"

// namespacedInstall is deploy/ with the namespaced component rendered into
// an existing namespace and applied there, as a namespace admin would.
type namespacedInstall struct {
	ns   string
	objs []*unstructured.Unstructured
	dep  *appsv1.Deployment
	// user is the controller's ServiceAccount as the apiserver names it.
	user string
}

// installNamespaced renders deploy/ with the namespaced component into a
// new namespace and applies it. It fails unless what it renders is
// namespaced only: a namespace admin could apply nothing else.
func installNamespaced(ctx context.Context, t *testing.T) namespacedInstall {
	t.Helper()
	root := framework.RepoRoot(t)
	ns := env.fw.NewNamespace(ctx, t)
	objs, file := renderOverlay(t, componentOverlay(t, root, namespacedComponent, "namespace: "+ns+"\n"))
	for _, o := range objs {
		if o.GetNamespace() != ns {
			t.Errorf("the namespaced install renders %s %s in namespace %q, want only objects in %s", o.GetKind(), o.GetName(), o.GetNamespace(), ns)
		}
	}
	adminKC := namespaceAdmin(ctx, t, root, ns)
	cmd := exec.CommandContext(ctx, filepath.Join(env.cluster.BinDir(), cluster.KubectlBinary), "--kubeconfig", adminKC, "apply", "-f", file)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("apply the namespaced install into %s as its namespace admin: %v\n%s", ns, err, out)
	}
	d := deploymentOf(t, objs)
	return namespacedInstall{ns: ns, objs: objs, dep: d,
		user: "system:serviceaccount:" + ns + ":" + d.Spec.Template.Spec.ServiceAccountName}
}

// namespaceAdmin returns a kubeconfig for a namespace admin of ns: a
// ServiceAccount bound there to what the built-in ClusterRole admin
// aggregates, deploy/aggregate-roles/roles.yaml (which a cluster admin
// installs once) included. No kube-controller-manager runs here to
// aggregate them into admin, so each is bound as it would be aggregated.
func namespaceAdmin(ctx context.Context, t *testing.T, root, ns string) string {
	t.Helper()
	if err := env.cluster.Apply(ctx, filepath.Join(root, "deploy", "aggregate-roles", "roles.yaml")); err != nil {
		t.Fatal(err)
	}
	const name = "namespace-admin"
	kc, err := env.cluster.ServiceAccountKubeconfig(ctx, ns, name)
	if err != nil {
		t.Fatal(err)
	}
	for _, role := range []string{"system:aggregate-to-admin", "system:aggregate-to-edit", "system:aggregate-to-view",
		"uuid-controller-aggregate-to-admin", "uuid-controller-aggregate-to-edit", "uuid-controller-aggregate-to-view"} {
		b := &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: strings.ReplaceAll(name+"-"+role, ":", "-"), Namespace: ns},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: name}},
		}
		if _, err := env.kube.RbacV1().RoleBindings(ns).Create(ctx, b, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return kc
}

// grantIn copies the install's Role and RoleBinding for Uuid objects into
// namespace ns, as docs/install.md says to for each further namespace.
func (in namespacedInstall) grantIn(ctx context.Context, t *testing.T, ns string) {
	t.Helper()
	var copies []*unstructured.Unstructured
	for _, o := range in.objs {
		if (o.GetKind() == "Role" || o.GetKind() == "RoleBinding") && o.GetName() == "uuid-controller" {
			c := o.DeepCopy()
			c.SetNamespace(ns)
			copies = append(copies, c)
		}
	}
	if len(copies) != 2 {
		t.Fatalf("the namespaced install has %d Role/RoleBinding uuid-controller, want one of each", len(copies))
	}
	applyObjects(ctx, t, copies)
}

// start runs the binary as the install's pod would: as its ServiceAccount,
// with its arguments (the ports aside; extra appended) and its env, and
// $(VAR) in the arguments expanded from the env as the kubelet does. It
// does not wait for readiness.
func (in namespacedInstall) start(ctx context.Context, t *testing.T, extra ...string) *cluster.ControllerProcess {
	t.Helper()
	c := in.dep.Spec.Template.Spec.Containers[0]
	podEnvs := podEnv(t, in.ns, c)
	vars := map[string]string{}
	for _, e := range podEnvs {
		name, value, _ := strings.Cut(e, "=")
		vars[name] = value
	}
	var args []string
	for _, a := range c.Args {
		if strings.HasPrefix(a, "--health-addr") || strings.HasPrefix(a, "--metrics-addr") {
			continue
		}
		for name, value := range vars {
			a = strings.ReplaceAll(a, "$("+name+")", value)
		}
		args = append(args, a)
	}
	kubeconfig, err := env.cluster.ServiceAccountKubeconfig(ctx, in.ns, in.dep.Spec.Template.Spec.ServiceAccountName)
	if err != nil {
		t.Fatal(err)
	}
	return framework.LaunchController(ctx, t, cluster.ControllerOptions{Binary: env.binary, Kubeconfig: kubeconfig, Env: podEnvs}, "", append(args, extra...)...)
}

// saClientset is a clientset authenticated as ServiceAccount ns/name.
func saClientset(ctx context.Context, t *testing.T, ns, name string) kubernetes.Interface {
	t.Helper()
	token, err := env.cluster.ServiceAccountToken(ctx, ns, name)
	if err != nil {
		t.Fatal(err)
	}
	cfg := env.cluster.AdminConfig()
	cfg.BearerToken = token
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// rulesIn is what `kubectl auth can-i --list -n ns` prints, as its rules:
// a SelfSubjectRulesReview by cs in namespace ns, one "verb group/resource"
// string per verb and resource (resourceNames appended after a colon).
func rulesIn(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns string) []string {
	t.Helper()
	r, err := cs.AuthorizationV1().SelfSubjectRulesReviews().Create(ctx, &authorizationv1.SelfSubjectRulesReview{
		Spec: authorizationv1.SelfSubjectRulesReviewSpec{Namespace: ns}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if r.Status.Incomplete {
		t.Fatalf("SelfSubjectRulesReview in %s is incomplete: %s", ns, r.Status.EvaluationError)
	}
	var out []string
	for _, rule := range r.Status.ResourceRules {
		for _, g := range rule.APIGroups {
			for _, res := range rule.Resources {
				for _, v := range rule.Verbs {
					s := v + " " + g + "/" + res
					if len(rule.ResourceNames) > 0 {
						s += ":" + strings.Join(rule.ResourceNames, ",")
					}
					out = append(out, s)
				}
			}
		}
	}
	for _, rule := range r.Status.NonResourceRules {
		for _, u := range rule.NonResourceURLs {
			for _, v := range rule.Verbs {
				out = append(out, v+" "+u)
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// without is a less the strings in b.
func without(a, b []string) []string {
	return slices.DeleteFunc(slices.Clone(a), func(s string) bool { return slices.Contains(b, s) })
}

// auditedRequestsBy returns, from the apiserver's audit log, the requests
// on Uuid objects (and their status) that user made outside namespaces
// (a list or watch of every namespace included).
func auditedRequestsBy(t *testing.T, user string, namespaces ...string) []string {
	t.Helper()
	evs, err := env.cluster.AuditEvents()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, ev := range evs {
		if ev.User.Username == user && !slices.Contains(namespaces, ev.ObjectRef.Namespace) {
			out = append(out, fmt.Sprintf("%s %s (namespace %q) -> %d", ev.Verb, ev.RequestURI, ev.ObjectRef.Namespace, ev.ResponseStatus.Code))
		}
	}
	return out
}

// auditedRequestsIn counts the requests user made on Uuid objects in ns.
func auditedRequestsIn(t *testing.T, user, ns string) int {
	t.Helper()
	evs, err := env.cluster.AuditEvents()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, ev := range evs {
		if ev.User.Username == user && ev.ObjectRef.Namespace == ns {
			n++
		}
	}
	return n
}

// noUUIDs fails the test if any object in ns has a status.uuid.
func noUUIDs(ctx context.Context, t *testing.T, ns string) {
	t.Helper()
	list, err := env.fw.Uuids(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range list.Items {
		if id, _, _ := unstructured.NestedString(u.Object, "status", "uuid"); id != "" {
			t.Errorf("%s/%s got a UUID (%s) from a controller scoped elsewhere", ns, u.GetName(), id)
		}
	}
}

// TestNamespacedInstall: deploy/components/namespaced rendered into a
// namespace and applied there holds only namespaced objects. The
// controller run as it would be deployed, granted only its Roles, gets
// ready (its Role lets it read its own namespace), serves the objects
// there and never reads or writes another namespace's: no request of its
// ServiceAccount outside its namespace reaches the apiserver, and the
// objects elsewhere get no UUID. What it may do anywhere else is exactly
// what every authenticated user may.
func TestNamespacedInstall(t *testing.T) {
	ctx := testCtx(t)
	in := installNamespaced(ctx, t)
	other := env.fw.NewNamespace(ctx, t)
	env.fw.CreateUuids(ctx, t, other, "elsewhere", 5)
	p := in.start(ctx, t)
	if err := p.WaitReady(ctx, time.Minute); err != nil {
		t.Fatalf("the namespaced install never got ready: %v", err)
	}
	env.fw.WaitUUIDs(ctx, t, in.ns, env.fw.CreateUuids(ctx, t, in.ns, "mine", 5), time.Minute)
	if auditedRequestsIn(t, in.user, in.ns) == 0 {
		t.Fatalf("the audit log holds no request of %s in %s: it does not record the controller", in.user, in.ns)
	}
	if reqs := auditedRequestsBy(t, in.user, in.ns); len(reqs) > 0 {
		t.Errorf("%s made %d requests on Uuid objects outside %s, want none: %q", in.user, len(reqs), in.ns, reqs)
	}
	noUUIDs(ctx, t, other)

	// kubectl auth can-i --list, as the controller and as a ServiceAccount
	// granted nothing: elsewhere they may do the same.
	controller := saClientset(ctx, t, in.ns, in.dep.Spec.Template.Spec.ServiceAccountName)
	nobody := saClientset(ctx, t, in.ns, "nobody")
	base := rulesIn(ctx, t, nobody, other)
	if extra := without(rulesIn(ctx, t, controller, other), base); len(extra) > 0 {
		t.Errorf("in namespace %s, which it does not watch, the controller may %q beyond what every authenticated user may", other, extra)
	}
	want := []string{"create /events", "create coordination.k8s.io/leases", "get /namespaces",
		"get coordination.k8s.io/leases:uuid-controller", "list demo.operator/uuid", "patch /events",
		"patch demo.operator/uuid/status", "update coordination.k8s.io/leases:uuid-controller", "watch demo.operator/uuid"}
	if got := without(rulesIn(ctx, t, controller, in.ns), base); !slices.Equal(got, want) {
		t.Errorf("in its own namespace the controller may %q beyond every user, want %q", got, want)
	}
}

// TestSeveralNamespaces: one controller given --namespace=A,B and the
// namespaced Role in each serves the objects in both, reads nothing in a
// third and nothing cluster-wide, and lists each namespace on its own.
func TestSeveralNamespaces(t *testing.T) {
	ctx := testCtx(t)
	in := installNamespaced(ctx, t)
	second, third := env.fw.NewNamespace(ctx, t), env.fw.NewNamespace(ctx, t)
	in.grantIn(ctx, t, second)
	env.fw.CreateUuids(ctx, t, third, "elsewhere", 5)
	p := in.start(ctx, t, "--namespace="+in.ns+","+second)
	if err := p.WaitReady(ctx, time.Minute); err != nil {
		t.Fatalf("never ready: %v", err)
	}
	for _, ns := range []string{in.ns, second} {
		env.fw.WaitUUIDs(ctx, t, ns, env.fw.CreateUuids(ctx, t, ns, "mine", 5), time.Minute)
	}
	if reqs := auditedRequestsBy(t, in.user, in.ns, second); len(reqs) > 0 {
		t.Errorf("%s made %d requests on Uuid objects outside %s and %s, want none: %q", in.user, len(reqs), in.ns, second, reqs)
	}
	noUUIDs(ctx, t, third)
}

// TestMissingNamespace: a watched namespace that does not exist is named
// in the log (once), on uuid_controller_namespace_problem and by /readyz,
// while the others are served; once it is created, its objects get UUIDs
// without a restart and the problem clears.
func TestMissingNamespace(t *testing.T) {
	ctx := testCtx(t)
	present := env.fw.NewNamespace(ctx, t)
	missing := "missing-" + present
	missing = missing[:min(len(missing), 63)]
	p := framework.LaunchController(ctx, t, controllerAs(env.kubeconfig), present+","+missing)
	problemThenServed(ctx, t, p, present, missing, "NotFound", "Watched namespace does not exist", func() {
		if _, err := env.cluster.ServiceAccountToken(ctx, missing, "default"); err != nil { // creates the namespace
			t.Fatal(err)
		}
	})
}

// TestMissingNamespaceRolesOnly: TestMissingNamespace for the Roles-only
// install, which has no Role in a namespace that does not exist yet: the
// apiserver authorizes before it looks, so the problem shows as Forbidden,
// and the other namespace is served meanwhile. Once the namespace is
// created and granted as docs/install.md says (the Role and RoleBinding
// copied into it), its objects get UUIDs without a restart.
func TestMissingNamespaceRolesOnly(t *testing.T) {
	ctx := testCtx(t)
	in := installNamespaced(ctx, t)
	later := "later-" + in.ns
	later = later[:min(len(later), 63)]
	p := in.start(ctx, t, "--namespace="+in.ns+","+later)
	problemThenServed(ctx, t, p, in.ns, later, "Forbidden", "Watched namespace may not be read: grant the controller's Role in it", func() {
		if _, err := env.kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: later}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		in.grantIn(ctx, t, later)
	})
}

// problemThenServed checks that p, watching namespaces served and absent,
// reports absent's problem (uuid_controller_namespace_problem with reason,
// /readyz 503 naming the namespaces check, and the log line once) while
// served's objects get UUIDs; then that once fix has run, absent's objects
// get UUIDs without a restart, p is ready and the problem clears.
func problemThenServed(ctx context.Context, t *testing.T, p *cluster.ControllerProcess, served, absent, reason, line string, fix func()) {
	t.Helper()
	problem := func(l map[string]string) bool { return l["namespace"] == absent && l["reason"] == reason }
	if v := metricReachesWithin(ctx, t, p, "uuid_controller_namespace_problem", problem, 1); v != 1 {
		t.Fatalf("uuid_controller_namespace_problem{namespace=%s,reason=%s} = %v, want 1", absent, reason, v)
	}
	env.fw.WaitUUIDs(ctx, t, served, env.fw.CreateUuids(ctx, t, served, "served", 3), time.Minute)
	code, body, err := p.Readyz(ctx)
	if err != nil || code != 503 || !strings.Contains(body, "[-]namespaces failed") {
		t.Errorf("/readyz = %d %q (%v) while %s is %s, want 503 naming the namespaces check", code, body, err, absent, reason)
	}
	if n := strings.Count(p.Output(), line); n != 1 || !strings.Contains(p.Output(), `namespace="`+absent+`"`) {
		t.Errorf("the log has %d lines %q naming %s, want one:\n%s", n, line, absent, p.Output())
	}

	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = env.kube.CoreV1().Namespaces().Delete(ctx, absent, metav1.DeleteOptions{})
	})
	fix()
	env.fw.WaitUUIDs(ctx, t, absent, env.fw.CreateUuids(ctx, t, absent, "later", 3), time.Minute)
	if err := p.WaitReady(ctx, time.Minute); err != nil {
		t.Errorf("not ready once %s is fixed: %v", absent, err)
	}
	if v := metricReachesWithin(ctx, t, p, "uuid_controller_namespace_problem", problem, 0); v != 0 {
		t.Errorf("uuid_controller_namespace_problem{namespace=%s,reason=%s} = %v once fixed, want 0", absent, reason, v)
	}
	mustStayRunning(t, p)
}

// metricReachesWithin is controllerMetric, polled for up to a minute until
// it reads want (the controller's checks run on their own schedule).
func metricReachesWithin(ctx context.Context, t *testing.T, p *cluster.ControllerProcess, name string, match func(map[string]string) bool, want float64) float64 {
	t.Helper()
	var v float64
	_ = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		text, err := p.Metrics(ctx)
		if err != nil || !strings.Contains(text, "\n# TYPE "+name+" ") {
			return false, nil
		}
		v = controllerMetric(ctx, t, p, name, match)
		return v == want, nil
	})
	return v
}

// TestScopedBesideClusterWide: two namespaced installs (namespaces A and
// B, each with its own Lease there) and a cluster-wide controller run at
// once. Each object in A and B is owned twice (its scoped controller and
// the cluster-wide one race for it), yet gets exactly one UUID: the
// apiserver accepts exactly one status write per object, the others'
// precondition fails (docs/install.md#two-installs-side-by-side).
func TestScopedBesideClusterWide(t *testing.T) {
	ctx := testCtx(t)
	a, b := installNamespaced(ctx, t), installNamespaced(ctx, t)
	procs := []*cluster.ControllerProcess{a.start(ctx, t), b.start(ctx, t), framework.LaunchController(ctx, t, controllerAs(env.kubeconfig), "", "--leader-elect")}
	for _, p := range procs {
		waitLeader(ctx, t, time.Minute, p)
	}
	for _, in := range []namespacedInstall{a, b} {
		l, err := env.kube.CoordinationV1().Leases(in.ns).Get(ctx, "uuid-controller", metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" {
			t.Fatalf("Lease %s/uuid-controller has no holder (%v): the scoped install does not lead with its own Lease", in.ns, err)
		}
	}
	const n = 30
	names := map[string][]string{}
	for _, in := range []namespacedInstall{a, b} {
		names[in.ns] = env.fw.CreateUuids(ctx, t, in.ns, "shared", n)
	}
	ids := map[string]map[string]string{}
	for ns, nsNames := range names {
		ids[ns] = env.fw.WaitUUIDs(ctx, t, ns, nsNames, time.Minute)
	}
	// Stopped, none of them can write any more: what the audit log holds
	// now is every write.
	for _, p := range procs {
		if code, _ := p.Stop(); code != 0 {
			t.Errorf("exit code %d after SIGTERM, want 0", code)
		}
	}
	for _, in := range []namespacedInstall{a, b} {
		codes := auditedStatusPatchCodes(t, in.ns)
		for _, name := range names[in.ns] {
			ok := 0
			for _, c := range codes[name] {
				switch c {
				case 200:
					ok++
				case 409: // the precondition: another owner wrote first
				default:
					t.Errorf("%s/%s: a status write refused with %d (%v), want only 409s: the precondition, not the CRD's rule, refuses the second owner",
						in.ns, name, c, codes[name])
				}
			}
			if ok != 1 {
				t.Errorf("%s/%s: %d status writes accepted (%v), want exactly 1", in.ns, name, ok, codes[name])
			}
		}
		checkKept(ctx, t, in.ns, ids[in.ns], "three controllers")
		if got := auditedRequestsIn(t, in.user, map[string]string{a.ns: b.ns, b.ns: a.ns}[in.ns]); got != 0 {
			t.Errorf("the install in %s made %d requests in the other install's namespace, want none", in.ns, got)
		}
	}
}
