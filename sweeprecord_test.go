package main

import (
	"os"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
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
