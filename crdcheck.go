package main

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
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// The installed CRD decides whether the controller can work at all: the
// article's kopf CRD has no status subresource, so every status PATCH gets
// 404, which alone is indistinguishable from a deleted object, and a schema
// without a field the controller writes prunes it silently. Both are read
// from discovery and the OpenAPI v3 document, which every authenticated
// identity may read (system:discovery), so checking needs no permission on
// CustomResourceDefinition objects.

// crdFix is the remedy every CRD problem names.
const crdFix = "apply the controller's CRD: kubectl apply -f crd.yaml"

// errCRDNotReady marks the failures caused by the CRD. Objects stay queued
// through them, retried with backoff, so fixing the CRD heals every object
// with no restart and no update of the objects.
var errCRDNotReady = errors.New("the Uuid CRD cannot hold the controller's status")

// openAPIPath is the OpenAPI v3 document of the group version served.
var openAPIPath = "/openapi/v3/apis/" + uuidGVR.GroupVersion().String()

// How often the CRD is checked: often while it is wrong, so a fix is
// noticed within seconds, rarely while it is right, since a status PATCH
// answered 404 for an object still in the cache triggers a check at once.
// Checks are at least minCRDCheckGap apart, however many 404s trigger one.
const (
	crdCheckWhileWrong = 5 * time.Second
	crdCheckWhileRight = 30 * time.Second
	minCRDCheckGap     = time.Second
	// crdCheckTimeout bounds one check's two reads, so a hung apiserver
	// cannot stop the checks.
	crdCheckTimeout = 10 * time.Second
)

// crdChecker knows whether the served Uuid resource can hold what the
// controller writes, and reports it in logs, readiness and a metric.
type crdChecker struct {
	// fetch reads discovery and the OpenAPI document; a field so tests can
	// replace the apiserver.
	fetch func(ctx context.Context) (crdFacts, error)
	// ready is the uuid_controller_crd_ready gauge.
	ready prometheus.Gauge
	// onHeal runs when a wrong CRD has been fixed: objects held back since
	// are queued at once rather than at the end of their backoff.
	onHeal func(ctx context.Context)
	// trigger asks Run for a check before the next periodic one.
	trigger chan struct{}

	mu       sync.Mutex
	checked  bool     // a check has completed
	problems []string // what is wrong with the CRD; nil when it is right
	lastErr  error    // why the last check could not complete
}

// crdFacts is what a check reads from the apiserver.
type crdFacts struct {
	// resources is the discovery of demo.operator/v1; nil when the group
	// version is not served at all.
	resources *metav1.APIResourceList
	// openAPI is its OpenAPI v3 document (JSON).
	openAPI []byte
}

func newCRDChecker(dc discovery.DiscoveryInterfaceWithContext, ready prometheus.Gauge) *crdChecker {
	return &crdChecker{
		fetch:   func(ctx context.Context) (crdFacts, error) { return fetchCRDFacts(ctx, dc) },
		ready:   ready,
		onHeal:  func(context.Context) {},
		trigger: make(chan struct{}, 1),
	}
}

// fetchCRDFacts reads discovery, then the OpenAPI document.
func fetchCRDFacts(ctx context.Context, dc discovery.DiscoveryInterfaceWithContext) (crdFacts, error) {
	gv := uuidGVR.GroupVersion().String()
	rl, err := dc.ServerResourcesForGroupVersionWithContext(ctx, gv)
	if apierrors.IsNotFound(err) {
		return crdFacts{}, nil
	}
	if err != nil {
		return crdFacts{}, fmt.Errorf("discovery of %s: %w", gv, err)
	}
	// Just after a CRD change the document may lag discovery (404 or the
	// old schema) for a moment; the next check reads the new one.
	doc, err := dc.RESTClient().Get().AbsPath(openAPIPath).Do(ctx).Raw()
	if err != nil {
		return crdFacts{}, fmt.Errorf("reading %s: %w", openAPIPath, err)
	}
	return crdFacts{resources: rl, openAPI: doc}, nil
}

// Run checks the CRD at once, then periodically and whenever Suspect asks,
// until ctx is cancelled.
func (k *crdChecker) Run(ctx context.Context) {
	for {
		k.check(ctx)
		wait := crdCheckWhileRight
		if k.Ready() != nil {
			wait = crdCheckWhileWrong
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(minCRDCheckGap):
		}
		select {
		case <-ctx.Done():
			return
		case <-k.trigger:
		case <-time.After(wait - minCRDCheckGap):
		}
	}
}

// Suspect asks for a check soon: a status write got 404 for an object the
// cache still holds, which a missing status subresource would explain.
func (k *crdChecker) Suspect() {
	select {
	case k.trigger <- struct{}{}:
	default: // one is pending already
	}
}

// check reads the CRD's state and reports any change.
func (k *crdChecker) check(ctx context.Context) {
	logger := klog.FromContext(ctx)
	fetchCtx, cancel := context.WithTimeout(ctx, crdCheckTimeout)
	facts, err := k.fetch(fetchCtx)
	cancel()
	if err != nil {
		// The apiserver is unreachable or the document lags: what was known
		// stands. Logged once per distinct error, not every few seconds.
		k.mu.Lock()
		repeated := k.lastErr != nil && k.lastErr.Error() == err.Error()
		k.lastErr = err
		k.mu.Unlock()
		if !repeated {
			logger.Error(err, "Could not check the Uuid CRD, will retry")
		}
		return
	}
	problems := crdProblems(facts)
	k.mu.Lock()
	was, wasChecked := k.problems, k.checked
	k.checked, k.problems, k.lastErr = true, problems, nil
	k.mu.Unlock()

	if len(problems) == 0 {
		k.ready.Set(1)
	} else {
		k.ready.Set(0)
	}
	switch {
	case len(problems) > 0 && (!wasChecked || !slices.Equal(problems, was)):
		logger.Error(errCRDNotReady, "The installed Uuid CRD does not fit this controller: no UUID can be assigned until it is fixed; "+crdFix,
			"crd", uuidGVR.GroupResource().String(), "problems", problems)
	case len(problems) == 0 && len(was) > 0:
		logger.Info("The Uuid CRD has been fixed; assigning UUIDs to the objects held back", "crd", uuidGVR.GroupResource().String())
		k.onHeal(ctx)
	case len(problems) == 0 && !wasChecked:
		logger.V(2).Info("The Uuid CRD fits this controller", "crd", uuidGVR.GroupResource().String())
	}
}

// Blocked returns an error wrapping errCRDNotReady while the CRD is known
// to be wrong, and nil otherwise (also before the first check: a write
// then fails with 404 and triggers one).
func (k *crdChecker) Blocked() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.problems) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s; %s", errCRDNotReady, strings.Join(k.problems, "; "), crdFix)
}

// Ready is the readiness of the CRD: nil once a check found it right.
func (k *crdChecker) Ready() error {
	if err := k.Blocked(); err != nil {
		return err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.checked {
		if k.lastErr != nil {
			return fmt.Errorf("the Uuid CRD has not been checked yet: %w", k.lastErr)
		}
		return errors.New("the Uuid CRD has not been checked yet")
	}
	return nil
}

// crdProblems lists, in words a user can act on, what keeps the served
// resource from holding the controller's status; nil when nothing does.
func crdProblems(f crdFacts) []string {
	if f.resources == nil {
		return []string{fmt.Sprintf("%s is not served: no CRD %s is installed", uuidGVR.GroupVersion(), uuidGVR.GroupResource())}
	}
	var main, status *metav1.APIResource
	for i, r := range f.resources.APIResources {
		switch r.Name {
		case uuidGVR.Resource:
			main = &f.resources.APIResources[i]
		case uuidGVR.Resource + "/status":
			status = &f.resources.APIResources[i]
		}
	}
	if main == nil {
		return []string{fmt.Sprintf("resource %s is not served in %s", uuidGVR.Resource, uuidGVR.GroupVersion())}
	}
	var problems []string
	if status == nil {
		problems = append(problems, "the CRD has no status subresource (subresources.status), so every status write is answered 404")
	} else if !slices.Contains(status.Verbs, "patch") {
		problems = append(problems, "the status subresource does not accept patch")
	}
	return append(problems, schemaProblems(f.openAPI)...)
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
}

// statusSamples are values the controller writes, per status field: the
// schema must accept each of them.
var statusSamples = map[string][]string{
	"state":   {StateOk, StateError},
	"message": {MessageAssigned, strings.Repeat("x", maxMessageLen)},
	"uuid":    {"0b6f2a8e-5d4c-4f3b-9a1e-7c2d8e6f4a10"},
}

// schemaProblems checks the Uuid schema in an OpenAPI v3 document against
// every field of Status: each must survive pruning, with the type the
// controller writes, and accept the values it writes.
func schemaProblems(doc []byte) []string {
	var d struct {
		Components struct {
			Schemas map[string]*openAPISchema `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(doc, &d); err != nil {
		return []string{fmt.Sprintf("the OpenAPI document %s is not readable: %v", openAPIPath, err)}
	}
	var uuidSchema *openAPISchema
	for _, s := range d.Components.Schemas {
		for _, gvk := range s.GVK {
			if gvk.Group == uuidGVR.Group && gvk.Version == uuidGVR.Version && gvk.Kind == uuidKind {
				uuidSchema = s
			}
		}
	}
	if uuidSchema == nil {
		return []string{fmt.Sprintf("the OpenAPI document %s has no schema for kind %s", openAPIPath, uuidKind)}
	}
	status := uuidSchema.Properties["status"]
	if status == nil && !uuidSchema.PreserveUnknown {
		return []string{"the schema has no status, so the apiserver drops all of it"}
	}
	if status == nil || (status.PreserveUnknown && status.Properties == nil) {
		return nil // kept whole, whatever it holds
	}
	var problems []string
	if status.Type != "" && status.Type != "object" {
		problems = append(problems, fmt.Sprintf("status has type %s, not object", status.Type))
	}
	for _, f := range reflect.VisibleFields(reflect.TypeFor[Status]()) {
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
		problems = append(problems, fieldProblems("status."+name, prop, f.Type, statusSamples[name])...)
	}
	return problems
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

// useCRDChecker makes c hold its writes back while k knows the CRD is wrong,
// ask k for a check on a 404 the cache cannot explain, and queue every
// object still needing work once k sees the CRD fixed.
func (c *Controller) useCRDChecker(k *crdChecker) {
	c.crd = k
	k.onHeal = c.requeueUnfinished
}

// crdBlocked is the CRD's problem, if one is known.
func (c *Controller) crdBlocked() error {
	if c.crd == nil {
		return nil
	}
	return c.crd.Blocked()
}

// waitsForCRD tells handleErr that err may be the CRD's doing, so the key
// must stay queued: a write held back for a known CRD problem, or a 404
// for an object the cache still holds (a missing status subresource, or a
// deletion the informer has yet to deliver; the retry tells them apart).
func (c *Controller) waitsForCRD(ctx context.Context, key cache.ObjectName, err error) bool {
	logger := klog.FromContext(ctx)
	if errors.Is(err, errCRDNotReady) {
		// The checker has logged the problem and its fix once; a line per
		// object and retry would bury it.
		logger.V(4).Info("Holding back the status write until the CRD is fixed", "object", klog.KRef(key.Namespace, key.Name))
		return true
	}
	if !apierrors.IsNotFound(err) {
		return false
	}
	if _, cacheErr := c.get(key); cacheErr != nil {
		return false // gone from the cache too: deleted
	}
	logger.V(2).Info("Status write answered 404 for an object still in the cache; checking the CRD", "object", klog.KRef(key.Namespace, key.Name))
	if c.crd != nil {
		c.crd.Suspect()
	}
	return true
}

// requeueUnfinished queues every cached object that still needs work.
func (c *Controller) requeueUnfinished(ctx context.Context) {
	logger := klog.FromContext(ctx)
	for _, obj := range c.store.List() {
		if u, ok := obj.(*cachedUUID); ok && c.needsWork(logger, u) {
			// The attempts held back for the CRD were no failure of the
			// object's: its backoff and its count towards ErrorAfter start
			// again.
			key := cache.MetaObjectToName(u)
			c.queue.Forget(key)
			c.queue.Add(key)
		}
	}
}
