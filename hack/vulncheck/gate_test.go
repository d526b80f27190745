package main

import (
	"strings"
	"testing"
)

// TestJudge: only reached findings count; an accepted one without a fix
// passes, one with a fix or not accepted is a problem.
func TestJudge(t *testing.T) {
	stream := `{"config":{"scanner_name":"govulncheck"}}
{"osv":{"id":"GO-2099-0001"}}
{"finding":{"osv":"GO-2099-0001","trace":[{"module":"example.com/nofix","version":"v1.0.0","package":"example.com/nofix/p","function":"F"}]}}
{"finding":{"osv":"GO-2099-0002","fixed_version":"v1.2.0","trace":[{"module":"example.com/fix","version":"v1.1.0","package":"example.com/fix/p","function":"G"}]}}
{"finding":{"osv":"GO-2099-0003","fixed_version":"v2.0.0","trace":[{"module":"example.com/imported","version":"v1.0.0","package":"example.com/imported/p"}]}}
{"finding":{"osv":"GO-2099-0004","trace":[{"module":"example.com/nofix2","version":"v1.0.0","package":"example.com/nofix2/p","function":"H"}]}}
`
	for _, c := range []struct {
		name     string
		accepted map[string]string
		want     []string
	}{
		{"nothing accepted", nil, []string{
			"GO-2099-0001 in example.com/nofix v1.0.0 (example.com/nofix/p.F): no fix",
			"GO-2099-0002 in example.com/fix v1.1.0 (example.com/fix/p.G): fixed in v1.2.0; raise it",
			"GO-2099-0004 in example.com/nofix2 v1.0.0 (example.com/nofix2/p.H): no fix",
		}},
		{"the unfixed accepted", map[string]string{"GO-2099-0001": "r", "GO-2099-0004": "r"}, []string{
			"GO-2099-0002 in example.com/fix v1.1.0 (example.com/fix/p.G): fixed in v1.2.0; raise it",
		}},
		{"a fixed one accepted", map[string]string{"GO-2099-0001": "r", "GO-2099-0002": "r", "GO-2099-0004": "r"}, []string{
			"GO-2099-0002 in example.com/fix v1.1.0 (example.com/fix/p.G) is accepted, but fixed in v1.2.0",
		}},
	} {
		problems, seen, err := judge(strings.NewReader(stream), c.accepted)
		if err != nil {
			t.Fatal(err)
		}
		if len(seen) != 3 || seen["GO-2099-0003"] {
			t.Errorf("%s: reached %v, want 0001, 0002 and 0004", c.name, seen)
		}
		if len(problems) != len(c.want) {
			t.Fatalf("%s: problems %q, want %d", c.name, problems, len(c.want))
		}
		for i, w := range c.want {
			if !strings.HasPrefix(problems[i], w) {
				t.Errorf("%s: problem %d = %q, want prefix %q", c.name, i, problems[i], w)
			}
		}
	}
	if _, _, err := judge(strings.NewReader("{not json"), nil); err == nil {
		t.Error("a broken stream was read without error")
	}
}

// TestReadAccepted: entries need an ID and a reason.
func TestReadAccepted(t *testing.T) {
	got, err := readAccepted(strings.NewReader("# c\n\nGO-2099-0001\tno fix upstream\n"))
	if err != nil || got["GO-2099-0001"] != "no fix upstream" || len(got) != 1 {
		t.Errorf("got %v, %v", got, err)
	}
	for _, bad := range []string{"GO-2099-0001\n", "GO-2099-0001\t \n", "CVE-1\treason\n"} {
		if _, err := readAccepted(strings.NewReader(bad)); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	f, err := readAcceptedFile("accepted.tsv")
	if err != nil {
		t.Fatalf("the shipped accepted.tsv: %v", err)
	}
	t.Logf("accepted.tsv: %d entries", len(f))
}
