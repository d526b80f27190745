package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestListApplies: every line of the shipped list parses and its text
// occurs exactly once in its file, so the list cannot rot unnoticed.
func TestListApplies(t *testing.T) {
	ms, err := parseList("mutations.tsv")
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) < 25 {
		t.Errorf("%d lines, want at least 25", len(ms))
	}
	for _, m := range ms {
		b, err := os.ReadFile(filepath.Join("../..", m.File))
		if err != nil {
			t.Errorf("%s: %v", m.ID, err)
			continue
		}
		if _, err := m.apply(string(b)); err != nil {
			t.Error(err)
		}
		if _, err := os.Stat(filepath.Join("../..", m.Pkg)); err != nil {
			t.Errorf("%s: package %s: %v", m.ID, m.Pkg, err)
		}
	}
}

func TestApplyNeedsExactlyOnce(t *testing.T) {
	m := mutation{ID: "x", File: "f", Old: "a", New: "b"}
	if got, err := m.apply("xay"); err != nil || got != "xby" {
		t.Errorf("apply once: %q, %v", got, err)
	}
	for _, content := range []string{"none", "a a"} {
		if _, err := m.apply(content); err == nil {
			t.Errorf("apply on %q: no error", content)
		}
	}
}

func TestUnescape(t *testing.T) {
	if got := unescape(`a\tb\nc\\d\s`); got != "a\tb\nc\\d\\s" {
		t.Errorf("unescape: %q", got)
	}
}

func TestParseListRejects(t *testing.T) {
	for name, line := range map[string]string{
		"fields":    "id\tf\told\tnew\t./pkg",
		"id":        "ID\tf\told\tnew\t./pkg\tTestX",
		"same":      "id\tf\told\told\t./pkg\tTestX",
		"no run":    "id\tf\told\tnew\t./pkg\t",
		"bad run":   "id\tf\told\tnew\t./pkg\t(",
		"outside":   "id\t../f\told\tnew\t./pkg\tTestX",
		"bare pkg":  "id\tf\told\tnew\tpkg\tTestX",
		"empty old": "id\tf\t\tnew\t./pkg\tTestX",
	} {
		p := filepath.Join(t.TempDir(), "list.tsv")
		if err := os.WriteFile(p, []byte("# comment\n\n"+line+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := parseList(p); err == nil {
			t.Errorf("%s: %q accepted", name, line)
		}
	}
}

// TestClassify: only a failed assertion counts as caught.
func TestClassify(t *testing.T) {
	exit := errors.New("exit status 1")
	for _, c := range []struct {
		out    string
		err    error
		killed bool
		want   outcome
	}{
		{"ok  \tpkg\t0.1s\n", nil, false, passed},
		{"--- FAIL: TestX (0.00s)\n    x_test.go:1: got 1\nFAIL\n", exit, false, failed},
		{"panic: test timed out after 1s\n", exit, false, timedOut},
		{"--- FAIL: TestX (0.00s)\npanic: runtime error: nil pointer\n", exit, false, panicked},
		{"# pkg\n./x.go:1: undefined: y\nFAIL\tpkg [build failed]\n", exit, false, broken},
		{"testing: warning: no tests to run\nok\n", nil, false, noTests},
		{"", exit, true, timedOut},
		{"FAIL\tpkg 0.1s\n", exit, false, undecided},
	} {
		if got := classify(c.out, c.err, c.killed); got != c.want {
			t.Errorf("classify(%q) = %s, want %s", strings.SplitN(c.out, "\n", 2)[0], got, c.want)
		}
	}
}

func TestScratchPerCheckout(t *testing.T) {
	a, b := defaultScratch("/work/a"), defaultScratch("/work/b")
	if a == b {
		t.Errorf("two checkouts share the scratch copy %s", a)
	}
	if a != defaultScratch("/work/a") {
		t.Errorf("the scratch copy of one checkout moved: %s, then %s", a, defaultScratch("/work/a"))
	}
}

func TestSecondRunRefused(t *testing.T) {
	scratch := filepath.Join(t.TempDir(), "copy")
	unlock, err := lockScratch(scratch)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lockScratch(scratch); err == nil {
		t.Error("a second run got the scratch copy's lock while the first held it")
	}
	unlock()
	unlock2, err := lockScratch(scratch)
	if err != nil {
		t.Fatalf("after the first run let go: %v", err)
	}
	unlock2()
}

// TestBuildTags: the node tests build with -tags node, nothing else does.
func TestBuildTags(t *testing.T) {
	for pkg, want := range map[string]string{
		"./test/node": "-tags node", "test/node": "-tags node", "./test/nodes": "", "./test/e2e": "", "./": "",
	} {
		if got := strings.Join(buildTags(pkg), " "); got != want {
			t.Errorf("buildTags(%q) = %q, want %q", pkg, got, want)
		}
	}
}
