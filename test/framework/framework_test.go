package framework

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

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

func TestLastLines(t *testing.T) {
	for _, c := range []struct {
		in   string
		n    int
		want string
	}{
		{"a\nb\nc\n", 2, "b\nc"},
		{"a\nb", 5, "a\nb"},
		{"a\nb\n", 0, ""},
	} {
		if got := LastLines(c.in, c.n); got != c.want {
			t.Errorf("LastLines(%q, %d) = %q, want %q", c.in, c.n, got, c.want)
		}
	}
}

func TestMiB(t *testing.T) {
	if got, want := MiB(3<<19), "1.5 MiB"; got != want {
		t.Errorf("MiB(3<<19) = %q, want %q", got, want)
	}
}

// TestPollKeepsTheErrorBeforeTheDeadline: the failure names why the
// condition was false, not the deadline that cut the last call short.
func TestPollKeepsTheErrorBeforeTheDeadline(t *testing.T) {
	calls := 0
	err := Poll(t.Context(), 250*time.Millisecond, "a refusal", func(ctx context.Context) error {
		calls++
		if calls == 1 {
			return errors.New("not allowed")
		}
		<-ctx.Done()
		return ctx.Err()
	})
	if err == nil || !strings.Contains(err.Error(), "(last: not allowed)") {
		t.Errorf("Poll = %v, want it to end with (last: not allowed)", err)
	}
}
