package cluster

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestAuditEvents(t *testing.T) {
	const patch = `{"verb":"patch","user":{"username":"system:serviceaccount:uuid-system:uuid-controller"},"objectRef":{"resource":"uuid","namespace":"ns","name":"a","subresource":"status"},"responseStatus":{"code":200}}`
	for _, tc := range []struct {
		name, log string
		want      int
		wantErr   string
	}{
		{"two events", patch + "\n" + patch + "\n", 2, ""},
		{"half-written last line", patch + "\n" + `{"verb":"pat`, 1, ""},
		{"corrupt line in the middle", `{"verb":` + "\n" + patch + "\n", 0, "line 1"},
		{"empty", "", 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &Cluster{opts: Options{Audit: true}, dir: t.TempDir()}
			if err := os.WriteFile(filepath.Join(c.dir, "audit.log"), []byte(tc.log), 0o600); err != nil {
				t.Fatal(err)
			}
			evs, err := c.AuditEvents()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one mentioning %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(evs) != tc.want {
				t.Fatalf("%d events, want %d", len(evs), tc.want)
			}
			if tc.want > 0 {
				ev := evs[0]
				if ev.Verb != "patch" || ev.ObjectRef.Subresource != "status" || ev.ResponseStatus.Code != 200 ||
					ev.User.Username != "system:serviceaccount:uuid-system:uuid-controller" || ev.ObjectRef.Namespace != "ns" {
					t.Errorf("event parsed as %+v", ev)
				}
			}
		})
	}
	if _, err := (&Cluster{dir: t.TempDir()}).AuditEvents(); err == nil {
		t.Error("AuditEvents without Options.Audit gave no error")
	}
}
