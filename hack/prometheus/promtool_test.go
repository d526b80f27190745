package monitoring

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

const (
	// promtoolTests is the promtool test file over rulesFile as shipped.
	promtoolTests = "rules_test.yaml"
	// promtool is built by make promtool from this module, as
	// bin/prometheus is.
	promtool = "../../bin/promtool"
	// e2eDir holds the live alert tests.
	e2eDir = "../../test/e2e"
)

// TestPromtoolRules runs `promtool test rules` over the shipped rules file:
// every alert's range windows, for: and thresholds, fed input series.
func TestPromtoolRules(t *testing.T) {
	if _, err := os.Stat(promtool); err != nil {
		t.Fatalf("%s is missing: run make promtool (%v)", promtool, err)
	}
	out, err := exec.Command(promtool, "test", "rules", promtoolTests).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool test rules %s: %v\n%s", promtoolTests, err, out)
	}
	if !strings.Contains(string(out), "SUCCESS") {
		t.Fatalf("promtool test rules %s passed without saying SUCCESS:\n%s", promtoolTests, out)
	}
}

// promtoolFile is the part of a promtool test file this package reads.
type promtoolFile struct {
	RuleFiles []string `json:"rule_files"`
	Tests     []struct {
		Name          string `json:"name"`
		AlertRuleTest []struct {
			EvalTime  string           `json:"eval_time"`
			Alertname string           `json:"alertname"`
			ExpAlerts []map[string]any `json:"exp_alerts"`
		} `json:"alert_rule_test"`
	} `json:"tests"`
}

// TestEveryAlertIsTested: every alert of the shipped rules file has
// promtool cases over that very file in which it fires and in which it
// does not (before its for:, or resolved), and a live test in test/e2e
// that waits for it to fire (waitFiring with its name). An alert added
// without both fails here.
func TestEveryAlertIsTested(t *testing.T) {
	var pt promtoolFile
	readYAML(t, promtoolTests, &pt)
	if len(pt.RuleFiles) != 1 || filepath.Clean(pt.RuleFiles[0]) != filepath.Clean(rulesFile) {
		t.Errorf("%s tests %v, want exactly the shipped %s", promtoolTests, pt.RuleFiles, rulesFile)
	}
	fires, quiet := map[string]bool{}, map[string]bool{}
	for _, tc := range pt.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				quiet[a.Alertname] = true
			}
		}
	}
	live := liveAlertTests(t)
	groups := loadRules(t)
	shipped := map[string]bool{}
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			shipped[r.Alert] = true
			if !fires[r.Alert] {
				t.Errorf("%s: no promtool case in %s where it fires", r.Alert, promtoolTests)
			}
			if !quiet[r.Alert] {
				t.Errorf("%s: no promtool case in %s where it does not fire", r.Alert, promtoolTests)
			}
			if !live[r.Alert] {
				t.Errorf("%s: no live test in %s fires it (waitFiring(..., %q, ...))", r.Alert, e2eDir, r.Alert)
			}
		}
	}
	for name := range fires {
		if !shipped[name] {
			t.Errorf("%s tests %s, which the rules file does not have", promtoolTests, name)
		}
	}
	if len(shipped) == 0 {
		t.Fatal("the rules file has no alert")
	}
}

// waitFiringCall is a call of test/e2e's waitFiring: the alert's name is
// its fourth argument, a string literal.
var waitFiringCall = regexp.MustCompile(`waitFiring\([^,]+,[^,]+,[^,]+,\s*"(\w+)"`)

// liveAlertTests are the alerts test/e2e's tests wait to fire.
func liveAlertTests(t *testing.T) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	err := filepath.WalkDir(e2eDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range waitFiringCall.FindAllStringSubmatch(string(b), -1) {
			names[m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(names) == 0 {
		t.Fatal(errors.New("no waitFiring call found in " + e2eDir))
	}
	return names
}

// TestLiveAlertTestsPattern: the scan finds the calls as test/e2e writes
// them, and not a name in a comment.
func TestLiveAlertTestsPattern(t *testing.T) {
	src := `a, body := waitFiring(ctx, t, prom, "UuidControllerCRDNotReady", nil, 2*time.Minute)
	waitFiring(ctx, t, prom,
		"UuidControllerDown", nil, time.Minute)
	// waitFiring fires UuidControllerNoLeader`
	var got []string
	for _, m := range waitFiringCall.FindAllStringSubmatch(src, -1) {
		got = append(got, m[1])
	}
	if strings.Join(got, " ") != "UuidControllerCRDNotReady UuidControllerDown" {
		t.Errorf("found %q", got)
	}
}
