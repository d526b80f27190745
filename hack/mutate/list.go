package main

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// A mutation is one line of the list: a deliberate breakage and the tests
// that must catch it.
type mutation struct {
	// ID names the line in the output and in -only.
	ID string
	// File is relative to the repository's root.
	File string
	// Old must occur exactly once in File; New replaces it.
	Old, New string
	// Pkg is the test package, a directory relative to the root (its
	// module is found from there: ./hack/prometheus is a module of its own).
	Pkg string
	// Run is go test's -run regexp.
	Run string
	// Line is the line number in the list, for messages.
	Line int
}

// unescape turns the list's escapes into the text they stand for: \t a
// tab, \n a newline, \\ a backslash. Any other backslash stays as it is,
// so regexps and Go strings read naturally.
func unescape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+1 < len(s) {
			switch s[i+1] {
			case 't':
				b.WriteByte('\t')
				i++
				continue
			case 'n':
				b.WriteByte('\n')
				i++
				continue
			case '\\':
				b.WriteByte('\\')
				i++
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

var idPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9.-]*$`)

// parseList reads the list: one mutation a line, six fields separated by
// tabs (id, file, old, new, package, -run regexp); blank lines and lines
// starting with # are skipped.
func parseList(path string) ([]mutation, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []mutation
	seen := map[string]int{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if strings.TrimSpace(line) == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Split(line, "\t")
		if len(fields) != 6 {
			return nil, fmt.Errorf("%s:%d: %d tab-separated fields, want 6 (id, file, old, new, package, run)", path, n, len(fields))
		}
		m := mutation{ID: fields[0], File: fields[1], Old: unescape(fields[2]), New: unescape(fields[3]),
			Pkg: fields[4], Run: fields[5], Line: n}
		switch {
		case !idPattern.MatchString(m.ID):
			return nil, fmt.Errorf("%s:%d: id %q: use lower case letters, digits, '.' and '-'", path, n, m.ID)
		case seen[m.ID] != 0:
			return nil, fmt.Errorf("%s:%d: id %s is also on line %d", path, n, m.ID, seen[m.ID])
		case m.Old == "":
			return nil, fmt.Errorf("%s:%d: %s: empty text to replace", path, n, m.ID)
		case m.Old == m.New:
			return nil, fmt.Errorf("%s:%d: %s: the replacement is the text itself", path, n, m.ID)
		case filepath.IsAbs(m.File) || strings.HasPrefix(filepath.Clean(m.File), ".."):
			return nil, fmt.Errorf("%s:%d: %s: file %s is not inside the repository", path, n, m.ID, m.File)
		case !strings.HasPrefix(m.Pkg, "./"):
			return nil, fmt.Errorf("%s:%d: %s: package %q must start with ./", path, n, m.ID, m.Pkg)
		case m.Run == "":
			return nil, fmt.Errorf("%s:%d: %s: no -run regexp: name the tests that must catch it", path, n, m.ID)
		}
		if _, err := regexp.Compile(m.Run); err != nil {
			return nil, fmt.Errorf("%s:%d: %s: -run %q: %v", path, n, m.ID, m.Run, err)
		}
		seen[m.ID] = n
		out = append(out, m)
	}
	return out, sc.Err()
}

// apply returns content with m's text replaced, or an error unless the
// text occurs exactly once: a list whose text moved away must fail, not
// pass by testing nothing.
func (m mutation) apply(content string) (string, error) {
	switch n := strings.Count(content, m.Old); n {
	case 1:
		return strings.Replace(content, m.Old, m.New, 1), nil
	case 0:
		return "", fmt.Errorf("%s (line %d): text not found in %s: %q", m.ID, m.Line, m.File, m.Old)
	default:
		return "", fmt.Errorf("%s (line %d): text found %d times in %s, want once: %q", m.ID, m.Line, n, m.File, m.Old)
	}
}
