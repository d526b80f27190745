package main

import (
	"os"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"sigs.k8s.io/yaml"
)

// TestServedUUIDPattern: crd.yaml declares exactly uuidPattern on
// status.uuid, so a leader under it may skip the sweep; a CRD without it
// (the article's) may not.
func TestServedUUIDPattern(t *testing.T) {
	b, err := os.ReadFile("crd.yaml")
	if err != nil {
		t.Fatal(err)
	}
	crd := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(b, &crd.Object); err != nil {
		t.Fatal(err)
	}
	if got := servedUUIDPattern(crd); got != uuidPattern {
		t.Errorf("crd.yaml's status.uuid pattern %q, want uuidPattern %q", got, uuidPattern)
	}
	unstructured.RemoveNestedField(crd.Object, "spec", "versions")
	if got := servedUUIDPattern(crd); got != "" {
		t.Errorf("pattern %q of a CRD without versions, want none", got)
	}
}

// TestLeaseRecordCRD: the record's key is the served CRD's uid and
// generation; a CRD whose status.uuid lacks crd.yaml's pattern (the
// article's, a relaxed one) gives none, so every leader sweeps under it.
func TestLeaseRecordCRD(t *testing.T) {
	crd := func(pattern string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
			"metadata": map[string]any{"name": crdName, "uid": "u1", "generation": int64(3)},
			"spec": map[string]any{"versions": []any{map[string]any{"name": "v1", "schema": map[string]any{"openAPIV3Schema": map[string]any{
				"properties": map[string]any{"status": map[string]any{"properties": map[string]any{"uuid": map[string]any{"type": "string"}}}}}}}}},
		}}
		if pattern != "" {
			versions := []any{map[string]any{"name": "v1", "schema": map[string]any{"openAPIV3Schema": map[string]any{
				"properties": map[string]any{"status": map[string]any{"properties": map[string]any{"uuid": map[string]any{"type": "string", "pattern": pattern}}}}}}}}
			_ = unstructured.SetNestedSlice(u.Object, versions, "spec", "versions")
		}
		return u
	}
	scheme := runtime.NewScheme()
	gvrs := map[schema.GroupVersionResource]string{crdGVR: "CustomResourceDefinitionList"}
	for _, tc := range []struct {
		name, pattern, want string
	}{
		{"crd.yaml's", uuidPattern, "u1/3"},
		{"no pattern", "", ""},
		{"another pattern", "^.*$", ""},
	} {
		l := leaseRecord{dyn: dynamicfake.NewSimpleDynamicClientWithCustomListKinds(scheme, gvrs, crd(tc.pattern))}
		got, err := l.CRD(t.Context())
		if got != tc.want || (err == nil) != (tc.want != "") {
			t.Errorf("%s: CRD() = %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}
}
