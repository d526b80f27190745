// Package crdcheck tells whether an installed CustomResourceDefinition can
// hold what a controller writes to its status: the resource and its status
// subresource are served, and the schema keeps every field of the status
// type with the values written. It reads discovery and the OpenAPI v3
// document, which every authenticated identity may read, so checking needs
// no permission on CustomResourceDefinition objects.
package crdcheck

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/klog/v2"
)

// ErrNotReady marks the failures caused by the CRD: errors.Is(err,
// ErrNotReady) holds for the errors Checker.Blocked returns.
var ErrNotReady = errors.New("the CRD cannot hold the controller's status")

// notReadyError is ErrNotReady naming the kind.
type notReadyError struct{ kind string }

func (e notReadyError) Error() string {
	return "the " + e.kind + " CRD cannot hold the controller's status"
}

func (e notReadyError) Is(target error) bool { return target == ErrNotReady }

// How often the CRD is checked: often while it is wrong, so a fix is
// noticed within seconds, rarely while it is right, since Suspect triggers
// a check at once. Checks are at least minCheckGap apart.
const (
	checkWhileWrong = 5 * time.Second
	checkWhileRight = 30 * time.Second
	minCheckGap     = time.Second
	// checkTimeout bounds one check's two reads, so a hung apiserver cannot
	// stop the checks.
	checkTimeout = 10 * time.Second
	// publishGrace is how long a check re-reads, quietly, a group version
	// that discovery serves but whose OpenAPI document does not hold the
	// kind yet (404, or no schema for it): the apiserver publishes a new
	// CRD's document a moment after it serves the resource. Past it, the
	// state is reported as any other.
	publishGrace = 5 * time.Second
	publishRetry = 250 * time.Millisecond
)

// Config is what a Checker checks.
type Config struct {
	// Discovery reads discovery and the OpenAPI document.
	Discovery discovery.DiscoveryInterfaceWithContext
	// Resource is the resource checked; Kind is its kind.
	Resource schema.GroupVersionResource
	Kind     string
	// Status is the Go type written to status; each field with a json name
	// must survive pruning with its type.
	Status reflect.Type
	// Samples are values written, by status field: the schema must accept
	// each of them.
	Samples map[string][]string
	// Fix is the remedy every problem names.
	Fix string
	// Metrics is where New registers crd_ready: 1 while the CRD fits, 0
	// while it does not or before the first check.
	Metrics prometheus.Registerer
	// SelectableField is a field path (e.g. "status.uuid") whose presence
	// among the CRD's selectable fields Selectable reports; "" for none.
	SelectableField string
	// Checked, when set, is called after every check, whether it completed
	// or not, so a caller can act on a change of Selectable at once.
	Checked func()
}

// Checker knows whether the served resource can hold what the controller
// writes, and reports it in logs, readiness and a gauge.
type Checker struct {
	cfg Config
	// fetch reads discovery and the OpenAPI document; a field so tests can
	// replace the apiserver.
	fetch func(ctx context.Context) (facts, error)
	// trigger asks Run for a check before the next periodic one.
	trigger chan struct{}
	// publishGrace is the package's; a field so tests can shorten it.
	publishGrace time.Duration
	// ready is the crd_ready gauge.
	ready prometheus.Gauge

	mu       sync.Mutex
	checked  bool     // a check has completed
	problems []string // what is wrong with the CRD; nil when it is right
	lastErr  error    // why the last check could not complete
	// selectable is whether the last completed check found
	// cfg.SelectableField among the kind's selectable fields.
	selectable bool
}

// facts is what a check reads from the apiserver.
type facts struct {
	// resources is the discovery of the group version; nil when it is not
	// served at all.
	resources *metav1.APIResourceList
	// openAPI is its OpenAPI v3 document (JSON).
	openAPI []byte
}

// New returns a Checker for cfg, its gauge registered; Run starts its
// checks.
func New(cfg Config) (*Checker, error) {
	k := &Checker{cfg: cfg, trigger: make(chan struct{}, 1), publishGrace: publishGrace}
	k.fetch = func(ctx context.Context) (facts, error) { return k.fetchFacts(ctx) }
	k.ready = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "crd_ready",
		Help: "1 while the installed " + cfg.Kind + " CRD has the status subresource and schema the controller needs; 0 while it does not or before the first check.",
	})
	if err := cfg.Metrics.Register(k.ready); err != nil {
		return nil, fmt.Errorf("registering the CRD check's gauge: %w", err)
	}
	return k, nil
}

// openAPIPath is the OpenAPI v3 document of the group version checked.
func (k *Checker) openAPIPath() string {
	return "/openapi/v3/apis/" + k.cfg.Resource.GroupVersion().String()
}

// fetchFacts reads discovery, then the OpenAPI document.
func (k *Checker) fetchFacts(ctx context.Context) (facts, error) {
	gv := k.cfg.Resource.GroupVersion().String()
	rl, err := k.cfg.Discovery.ServerResourcesForGroupVersionWithContext(ctx, gv)
	if apierrors.IsNotFound(err) {
		return facts{}, nil
	}
	if err != nil {
		return facts{}, fmt.Errorf("discovery of %s: %w", gv, err)
	}
	// Just after a CRD change the document may lag discovery (404 or the
	// old schema) for a moment; the next check reads the new one.
	doc, err := k.cfg.Discovery.RESTClient().Get().AbsPath(k.openAPIPath()).Do(ctx).Raw()
	if err != nil {
		return facts{}, fmt.Errorf("reading %s: %w", k.openAPIPath(), err)
	}
	return facts{resources: rl, openAPI: doc}, nil
}

// Run checks the CRD at once, then periodically and whenever Suspect asks,
// until ctx is cancelled. onHeal runs when a wrong CRD has been fixed.
func (k *Checker) Run(ctx context.Context, onHeal func(context.Context)) {
	for {
		k.check(ctx, onHeal)
		if k.cfg.Checked != nil {
			k.cfg.Checked()
		}
		wait := checkWhileRight
		if k.Ready() != nil {
			wait = checkWhileWrong
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(minCheckGap):
		}
		select {
		case <-ctx.Done():
			return
		case <-k.trigger:
		case <-time.After(wait - minCheckGap):
		}
	}
}

// Suspect asks for a check soon: a status write got 404 for an object the
// cache still holds, which a missing status subresource would explain.
func (k *Checker) Suspect() {
	select {
	case k.trigger <- struct{}{}:
	default: // one is pending already
	}
}

// check reads the CRD's state and reports any change.
func (k *Checker) check(ctx context.Context, onHeal func(context.Context)) {
	logger := klog.FromContext(ctx)
	crd := k.cfg.Resource.GroupResource().String()
	f, err := k.fetchPublished(ctx)
	if err != nil {
		// What was known stands. Logged once per distinct error, not every
		// few seconds.
		k.mu.Lock()
		repeated := k.lastErr != nil && k.lastErr.Error() == err.Error()
		k.lastErr = err
		k.mu.Unlock()
		if !repeated {
			logger.Error(err, "Could not check the "+k.cfg.Kind+" CRD, will retry")
		}
		return
	}
	problems := k.problemsOf(f)
	selectable := k.declaresSelectable(f)
	k.mu.Lock()
	was, wasChecked := k.problems, k.checked
	k.checked, k.problems, k.lastErr, k.selectable = true, problems, nil, selectable
	k.mu.Unlock()

	if len(problems) == 0 {
		k.ready.Set(1)
	} else {
		k.ready.Set(0)
	}
	switch {
	case len(problems) > 0 && (!wasChecked || !slices.Equal(problems, was)):
		logger.Error(notReadyError{k.cfg.Kind}, "The installed "+k.cfg.Kind+" CRD does not fit this controller: no status can be written until it is fixed; "+k.cfg.Fix,
			"crd", crd, "problems", problems)
	case len(problems) == 0 && len(was) > 0:
		logger.Info("The "+k.cfg.Kind+" CRD has been fixed; resuming the status writes held back", "crd", crd)
		onHeal(ctx)
	case len(problems) == 0 && !wasChecked:
		logger.V(2).Info("The "+k.cfg.Kind+" CRD fits this controller", "crd", crd)
	}
}

// fetchPublished is fetch, repeated quietly for up to publishGrace while
// the group version is served but its OpenAPI document does not hold the
// kind yet, so a CRD created just before the controller starts (or the
// check runs) is not reported for a state that heals a second later.
func (k *Checker) fetchPublished(ctx context.Context) (facts, error) {
	deadline := time.Now().Add(k.publishGrace)
	for {
		fetchCtx, cancel := context.WithTimeout(ctx, checkTimeout)
		f, err := k.fetch(fetchCtx)
		cancel()
		if !k.unpublished(f, err) || !time.Now().Before(deadline) {
			return f, err
		}
		klog.FromContext(ctx).V(2).Info("The "+k.cfg.Kind+" CRD is served but its OpenAPI document is not published yet; reading it again",
			"crd", k.cfg.Resource.GroupResource().String(), "err", err)
		select {
		case <-ctx.Done():
			return f, err
		case <-time.After(publishRetry):
		}
	}
}

// unpublished tells a read that found the group version served and its
// OpenAPI document missing (404: discovery's own 404 is no error, so only
// the document's can be) or without a schema for the kind.
func (k *Checker) unpublished(f facts, err error) bool {
	if err != nil {
		return apierrors.IsNotFound(err)
	}
	if f.resources == nil {
		return false
	}
	_, found, err := k.kindSchema(f.openAPI)
	return err == nil && !found
}

// Blocked returns an error wrapping ErrNotReady while the CRD is known to
// be wrong, and nil otherwise (also before the first check: a write then
// fails with 404 and its caller calls Suspect).
func (k *Checker) Blocked() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.problems) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s; %s", notReadyError{k.cfg.Kind}, strings.Join(k.problems, "; "), k.cfg.Fix)
}

// Selectable tells whether the served CRD declares cfg.SelectableField as
// a selectable field (x-kubernetes-selectable-fields in its OpenAPI
// document), and whether that is known: false before the first check
// completes.
func (k *Checker) Selectable() (selectable, known bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.selectable, k.checked
}

// declaresSelectable tells whether f's kind schema lists
// cfg.SelectableField among its selectable fields. The apiserver publishes
// them only where it serves them (1.31 and later, or 1.30 with the
// CustomResourceFieldSelectors gate), so an older apiserver reads as false.
func (k *Checker) declaresSelectable(f facts) bool {
	if k.cfg.SelectableField == "" || f.resources == nil {
		return false
	}
	s, found, err := k.kindSchema(f.openAPI)
	if err != nil || !found {
		return false
	}
	want := strings.TrimPrefix(k.cfg.SelectableField, ".")
	for _, sf := range s.Selectable {
		if strings.TrimPrefix(sf.FieldPath, ".") == want {
			return true
		}
	}
	return false
}

// Ready is the readiness of the CRD: nil once a check found it right.
func (k *Checker) Ready() error {
	if err := k.Blocked(); err != nil {
		return err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.checked {
		if k.lastErr != nil {
			return fmt.Errorf("the %s CRD has not been checked yet: %w", k.cfg.Kind, k.lastErr)
		}
		return fmt.Errorf("the %s CRD has not been checked yet", k.cfg.Kind)
	}
	return nil
}

// problemsOf lists, in words a user can act on, what keeps the served
// resource from holding the controller's status; nil when nothing does.
func (k *Checker) problemsOf(f facts) []string {
	gvr := k.cfg.Resource
	if f.resources == nil {
		return []string{fmt.Sprintf("%s is not served: no CRD %s is installed", gvr.GroupVersion(), gvr.GroupResource())}
	}
	var main, status *metav1.APIResource
	for i, r := range f.resources.APIResources {
		switch r.Name {
		case gvr.Resource:
			main = &f.resources.APIResources[i]
		case gvr.Resource + "/status":
			status = &f.resources.APIResources[i]
		}
	}
	if main == nil {
		return []string{fmt.Sprintf("resource %s is not served in %s", gvr.Resource, gvr.GroupVersion())}
	}
	var problems []string
	if status == nil {
		problems = append(problems, "the CRD has no status subresource (subresources.status), so every status write is answered 404")
	} else if !slices.Contains(status.Verbs, "patch") {
		problems = append(problems, "the status subresource does not accept patch")
	}
	return append(problems, k.schemaProblems(f.openAPI)...)
}

// openAPISchema is the part of an OpenAPI v3 schema the check reads.
type openAPISchema struct {
	Type            string                    `json:"type"`
	Properties      map[string]*openAPISchema `json:"properties"`
	Enum            []any                     `json:"enum"`
	Pattern         string                    `json:"pattern"`
	MaxLength       *int                      `json:"maxLength"`
	PreserveUnknown bool                      `json:"x-kubernetes-preserve-unknown-fields"`
	GVK             []struct {
		Group, Version, Kind string
	} `json:"x-kubernetes-group-version-kind"`
	Selectable []struct {
		FieldPath string `json:"fieldPath"`
	} `json:"x-kubernetes-selectable-fields"`
}

// schemaProblems checks the kind's schema in an OpenAPI v3 document against
// every field of the status type: each must survive pruning, with the type
// written, and accept the values written.
func (k *Checker) schemaProblems(doc []byte) []string {
	kindSchema, found, err := k.kindSchema(doc)
	if err != nil {
		return []string{fmt.Sprintf("the OpenAPI document %s is not readable: %v", k.openAPIPath(), err)}
	}
	if !found {
		return []string{fmt.Sprintf("the OpenAPI document %s has no schema for kind %s", k.openAPIPath(), k.cfg.Kind)}
	}
	status := kindSchema.Properties["status"]
	if status == nil && !kindSchema.PreserveUnknown {
		return []string{"the schema has no status, so the apiserver drops all of it"}
	}
	if status == nil || (status.PreserveUnknown && status.Properties == nil) {
		return nil // kept whole, whatever it holds
	}
	var problems []string
	if status.Type != "" && status.Type != "object" {
		problems = append(problems, fmt.Sprintf("status has type %s, not object", status.Type))
	}
	for _, f := range reflect.VisibleFields(k.cfg.Status) {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" || name == "-" {
			continue
		}
		prop := status.Properties[name]
		if prop == nil {
			if !status.PreserveUnknown {
				problems = append(problems, fmt.Sprintf("the schema has no status.%s, so the apiserver drops it", name))
			}
			continue
		}
		problems = append(problems, fieldProblems("status."+name, prop, f.Type, k.cfg.Samples[name])...)
	}
	return problems
}

// kindSchema finds the kind's schema in an OpenAPI v3 document.
func (k *Checker) kindSchema(doc []byte) (*openAPISchema, bool, error) {
	var d struct {
		Components struct {
			Schemas map[string]*openAPISchema `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(doc, &d); err != nil {
		return nil, false, err
	}
	for _, s := range d.Components.Schemas {
		for _, gvk := range s.GVK {
			if gvk.Group == k.cfg.Resource.Group && gvk.Version == k.cfg.Resource.Version && gvk.Kind == k.cfg.Kind {
				return s, true, nil
			}
		}
	}
	return nil, false, nil
}

// fieldProblems checks one field's schema against the Go type written to
// it and the sample values.
func fieldProblems(path string, s *openAPISchema, t reflect.Type, samples []string) []string {
	if want := openAPIType(t); s.Type != "" && want != "" && s.Type != want {
		return []string{fmt.Sprintf("%s has type %s, the controller writes %s", path, s.Type, want)}
	}
	var problems []string
	var pattern *regexp.Regexp
	if s.Pattern != "" {
		// An ECMA pattern Go cannot compile is left to the apiserver.
		pattern, _ = regexp.Compile(s.Pattern)
	}
	for _, v := range samples {
		switch {
		case len(s.Enum) > 0 && !slices.Contains(s.Enum, any(v)):
			problems = append(problems, fmt.Sprintf("%s does not allow %q (enum %v)", path, v, s.Enum))
		case pattern != nil && !pattern.MatchString(v):
			problems = append(problems, fmt.Sprintf("%s pattern %q rejects %q", path, s.Pattern, v))
		case s.MaxLength != nil && len([]rune(v)) > *s.MaxLength:
			problems = append(problems, fmt.Sprintf("%s maxLength %d is below the %d characters the controller may write", path, *s.MaxLength, len([]rune(v))))
		}
	}
	return problems
}

// openAPIType is the OpenAPI type of values of Go type t.
func openAPIType(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "boolean"
	case reflect.Int, reflect.Int32, reflect.Int64:
		return "integer"
	case reflect.Slice:
		return "array"
	case reflect.Struct, reflect.Map, reflect.Pointer:
		return "object"
	}
	return ""
}
