package framework

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

func TestNamespaceName(t *testing.T) {
	for _, test := range []string{"TestA", "TestKopfMigrationPolicy/deleting,_a_label", strings.Repeat("TestLong", 20)} {
		name := NamespaceName(test)
		if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
			t.Errorf("NamespaceName(%q) = %q: %v", test, name, errs)
		}
		if again := NamespaceName(test); again == name {
			t.Errorf("NamespaceName(%q) gave %q twice", test, name)
		}
	}
}

func TestNewUuid(t *testing.T) {
	u := NewUuid("x")
	if u.GetName() != "x" || u.GetKind() != "Uuid" || u.GroupVersionKind().GroupVersion() != UuidGVR.GroupVersion() {
		t.Errorf("NewUuid(x) = %v", u.Object)
	}
	if UUIDOf(u.Object) != "" {
		t.Errorf("a new object has a UUID: %v", u.Object)
	}
}
