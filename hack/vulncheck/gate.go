package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
)

// finding is the part of a govulncheck JSON finding the gate reads.
type finding struct {
	OSV          string `json:"osv"`
	FixedVersion string `json:"fixed_version"`
	Trace        []struct {
		Module   string `json:"module"`
		Version  string `json:"version"`
		Package  string `json:"package"`
		Function string `json:"function"`
	} `json:"trace"`
}

// reached reports whether the code calls the vulnerable symbol: govulncheck
// names a function in the trace's first frame only then (an imported
// package or a required module alone is not reached).
func (f finding) reached() bool {
	return len(f.Trace) > 0 && f.Trace[0].Function != ""
}

// readAccepted reads the accepted findings file: one `ID<TAB>reason` a
// line, # comments and blank lines ignored; an entry without a reason is an
// error, since the reason is the point of accepting.
func readAccepted(r io.Reader) (map[string]string, error) {
	accepted := map[string]string{}
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		id, reason, _ := strings.Cut(line, "\t")
		if !strings.HasPrefix(id, "GO-") || strings.TrimSpace(reason) == "" {
			return nil, fmt.Errorf("line %d: want `GO-YYYY-NNNN<TAB>reason`, got %q", n, line)
		}
		accepted[id] = strings.TrimSpace(reason)
	}
	return accepted, sc.Err()
}

func readAcceptedFile(name string) (map[string]string, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	a, err := readAccepted(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return a, nil
}

// judge reads govulncheck's JSON stream and returns one problem per
// reached finding that is not accepted, or accepted although a fixed
// version exists. Unreached findings are not problems.
func judge(stream io.Reader, accepted map[string]string) (problems []string, seen map[string]bool, err error) {
	seen = map[string]bool{}
	dec := json.NewDecoder(stream)
	for {
		var msg struct {
			Finding *finding `json:"finding"`
		}
		if err := dec.Decode(&msg); err == io.EOF {
			break
		} else if err != nil {
			return nil, nil, fmt.Errorf("reading govulncheck's JSON: %w", err)
		}
		f := msg.Finding
		if f == nil || !f.reached() || seen[f.OSV] {
			continue
		}
		seen[f.OSV] = true
		at := f.Trace[0]
		where := fmt.Sprintf("%s %s (%s.%s)", at.Module, at.Version, at.Package, at.Function)
		_, ok := accepted[f.OSV]
		switch {
		case !ok && f.FixedVersion != "":
			problems = append(problems, fmt.Sprintf("%s in %s: fixed in %s; raise it", f.OSV, where, f.FixedVersion))
		case !ok:
			problems = append(problems, fmt.Sprintf("%s in %s: no fix; accept it in accepted.tsv with a reason, or stop calling it", f.OSV, where))
		case f.FixedVersion != "":
			problems = append(problems, fmt.Sprintf("%s in %s is accepted, but fixed in %s: raise it and drop the entry", f.OSV, where, f.FixedVersion))
		}
	}
	slices.Sort(problems)
	return problems, seen, nil
}

// gate runs govulncheck (tool, in JSON) over each module directory and
// fails on any reached finding that accepted does not excuse, and on an
// accepted entry that no module reaches any more.
func gate(tool []string, db string, accepted map[string]string, dirs []string, stdout io.Writer) error {
	var all []string
	seen := map[string]bool{}
	for _, dir := range dirs {
		args := append(slices.Clone(tool[1:]), "-format", "json", "-db", "file://"+db, "-C", dir, "./...")
		cmd := exec.Command(tool[0], args...)
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("govulncheck over %s: %w\n%s", dir, err, errOut.String())
		}
		problems, s, err := judge(&out, accepted)
		if err != nil {
			return fmt.Errorf("%s: %w", dir, err)
		}
		for id := range s {
			seen[id] = true
		}
		for _, p := range problems {
			all = append(all, dir+": "+p)
		}
		fmt.Fprintf(stdout, "%s: %d reached finding(s), %d not accepted\n", dir, len(s), len(problems))
	}
	for id := range accepted {
		if !seen[id] {
			all = append(all, fmt.Sprintf("%s is accepted but no module reaches it: drop the entry", id))
		}
	}
	if len(all) > 0 {
		slices.Sort(all)
		return errors.New("vulnerabilities:\n  " + strings.Join(all, "\n  "))
	}
	return nil
}

func runGate(args []string) {
	fs := flag.NewFlagSet("gate", flag.ExitOnError)
	db := fs.String("db", "", "the database folder (written by this command without `gate`)")
	acceptedFile := fs.String("accepted", "accepted.tsv", "reached findings accepted without a fix, `ID<TAB>reason` a line")
	fs.Parse(args)
	if *db == "" || fs.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: vulncheck gate -db DIR [-accepted FILE] MODULE_DIR...")
		os.Exit(2)
	}
	accepted, err := readAcceptedFile(*acceptedFile)
	if err != nil {
		fmt.Fprintln(os.Stderr, "vulncheck gate:", err)
		os.Exit(1)
	}
	if err := gate([]string{"go", "tool", "govulncheck"}, *db, accepted, fs.Args(), os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "vulncheck gate:", err)
		os.Exit(3)
	}
}
