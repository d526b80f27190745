package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// vulndbOSV downloads golang.org/x/vulndb at the version vulndb.version
// pins, through the module proxy as `make vulncheck` does, and returns its
// data/osv folder.
func vulndbOSV(t *testing.T) string {
	t.Helper()
	v, err := os.ReadFile("vulndb.version")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "mod", "download", "-json", "golang.org/x/vulndb@"+strings.TrimSpace(string(v)))
	cmd.Env = append(os.Environ(), "GOFLAGS=")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go mod download golang.org/x/vulndb: %v\n%s", err, out)
	}
	var m struct{ Dir string }
	if err := json.Unmarshal(out, &m); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(m.Dir, "data", "osv")
}

// TestGovulncheckFlagsVulnerableModule builds the database from vulndb's
// OSV files and runs govulncheck with it over a module that calls
// golang.org/x/text/language.ParseAcceptLanguage: at x/text v0.3.7 it must
// report GO-2022-1059 (CVE-2022-32149) and exit 3; at v0.3.8, the fix,
// nothing.
func TestGovulncheckFlagsVulnerableModule(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "db")
	n, err := write(vulndbOSV(t), db)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("database: %d entries", n)
	tool := filepath.Join(dir, "govulncheck")
	if out, err := exec.Command("go", "build", "-o", tool, "golang.org/x/vuln/cmd/govulncheck").CombinedOutput(); err != nil {
		t.Fatalf("go build govulncheck: %v\n%s", err, out)
	}
	src := "package main\n\nimport \"golang.org/x/text/language\"\n\nfunc main() { language.ParseAcceptLanguage(\"en\") }\n"
	run := func(version string) (string, int) {
		mod := filepath.Join(dir, "x-text-"+version)
		if err := os.MkdirAll(mod, 0o755); err != nil {
			t.Fatal(err)
		}
		gomod := "module example.com/app\n\ngo 1.26\n\nrequire golang.org/x/text " + version + "\n"
		if err := os.WriteFile(filepath.Join(mod, "go.mod"), []byte(gomod), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(mod, "main.go"), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		tidy := exec.Command("go", "mod", "tidy")
		tidy.Dir, tidy.Env = mod, append(os.Environ(), "GOFLAGS=")
		if out, err := tidy.CombinedOutput(); err != nil {
			t.Fatalf("go mod tidy: %v\n%s", err, out)
		}
		cmd := exec.Command(tool, "-db", "file://"+db, "-C", mod, "./...")
		out, err := cmd.CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return string(out), code
	}
	out, code := run("v0.3.7")
	t.Logf("govulncheck, x/text v0.3.7: exit %d\n%s", code, out)
	if code != 3 || !strings.Contains(out, "GO-2022-1059") {
		t.Errorf("x/text v0.3.7: exit %d, want 3 and GO-2022-1059", code)
	}
	out, code = run("v0.3.8")
	if code != 0 || strings.Contains(out, "GO-2022-1059") {
		t.Errorf("x/text v0.3.8 (fixed): exit %d\n%s", code, out)
	}

	// The gate over the same modules: an unlisted reached finding fails it,
	// so does accepting one that has a fix, and an entry nothing reaches.
	vulnerable, fixed := filepath.Join(dir, "x-text-v0.3.7"), filepath.Join(dir, "x-text-v0.3.8")
	accept := map[string]string{"GO-2022-1059": "a reason"}
	for _, c := range []struct {
		name     string
		dir      string
		accepted map[string]string
		want     string
	}{
		{"unlisted finding", vulnerable, nil, "GO-2022-1059 in golang.org/x/text v0.3.7 (golang.org/x/text/language.ParseAcceptLanguage): fixed in v0.3.8; raise it"},
		{"accepted finding with a fix", vulnerable, accept, "GO-2022-1059 in golang.org/x/text v0.3.7 (golang.org/x/text/language.ParseAcceptLanguage) is accepted, but fixed in v0.3.8"},
		{"accepted entry nothing reaches", fixed, accept, "GO-2022-1059 is accepted but no module reaches it"},
		{"fixed module", fixed, nil, ""},
	} {
		var report strings.Builder
		err := gate([]string{tool}, db, c.accepted, []string{c.dir}, &report)
		t.Logf("gate, %s: %s%v", c.name, report.String(), err)
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("gate, %s: %v, want %q", c.name, err, c.want)
		}
	}
}
