package main

// The docs test: every relative link and #anchor in the repository's
// Markdown resolves, every `make` target the docs name exists, and
// docs/flags.md lists exactly the flags parseFlags registers, with their
// defaults. It lives in package main so it reads the real flag
// registration, not a copy of it.

import (
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/demo-operator/uuid-controller/internal/markdown"
)

// docSkipDirs are not the project's docs: build output and local state.
var docSkipDirs = map[string]bool{"bin": true, "dist": true, ".local": true, ".git": true, "node_modules": true}

// markdownFiles returns every *.md under root, as slash paths relative to it.
func markdownFiles(t *testing.T, root string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != root && docSkipDirs[d.Name()] {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(d.Name(), ".md") {
			rel, err := filepath.Rel(root, path)
			if err != nil {
				return err
			}
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no *.md files found")
	}
	return files
}

// loadDocs parses every Markdown file of the repository.
func loadDocs(t *testing.T) map[string]markdown.Doc {
	t.Helper()
	docs := map[string]markdown.Doc{}
	for _, f := range markdownFiles(t, ".") {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		docs[f] = markdown.Parse(f, string(src))
	}
	return docs
}

var uriSchemeRE = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)

// checkLinks returns one message per relative link or anchor in docs that
// does not resolve. Absolute URLs are not fetched.
func checkLinks(docs map[string]markdown.Doc, exists func(string) bool) []string {
	var bad []string
	for _, name := range sortedKeys(docs) {
		doc := docs[name]
		for _, l := range doc.Links {
			if uriSchemeRE.MatchString(l.Text) || strings.HasPrefix(l.Text, "//") {
				continue
			}
			where := fmt.Sprintf("%s:%d: link %q", doc.Path, l.Line, l.Text)
			target, frag, _ := strings.Cut(l.Text, "#")
			target, err := url.PathUnescape(target)
			if err != nil {
				bad = append(bad, fmt.Sprintf("%s: %v", where, err))
				continue
			}
			file := doc.Path
			if target != "" {
				if strings.HasPrefix(target, "/") { // GitHub: the repository's root
					file = strings.TrimPrefix(target, "/")
				} else {
					file = filepath.ToSlash(filepath.Join(filepath.Dir(doc.Path), target))
				}
				if file == ".." || strings.HasPrefix(file, "../") {
					bad = append(bad, where+": points outside the repository")
					continue
				}
				if !exists(file) {
					bad = append(bad, fmt.Sprintf("%s: %s does not exist", where, file))
					continue
				}
			}
			if frag == "" {
				continue
			}
			td, ok := docs[file]
			if !ok {
				bad = append(bad, fmt.Sprintf("%s: anchor #%s into %s, which is not a checked Markdown file", where, frag, file))
				continue
			}
			if frag, err = url.PathUnescape(frag); err != nil || !td.Anchors[frag] {
				bad = append(bad, fmt.Sprintf("%s: %s has no heading with anchor #%s", where, file, frag))
			}
		}
	}
	return bad
}

func TestDocsLinks(t *testing.T) {
	docs := loadDocs(t)
	for _, msg := range checkLinks(docs, func(p string) bool { _, err := os.Stat(p); return err == nil }) {
		t.Error(msg)
	}
}

// makeTargetsInCode returns the targets of every `make` command in text,
// e.g. "deploy" in `make deploy IMG=x`: the words after make up to the end
// of the command, without variable assignments and options.
func makeTargetsInCode(text string) []string {
	var targets []string
	for _, line := range strings.Split(text, "\n") {
		words := shellWords(line)
		for i := 0; i < len(words); i++ {
			if words[i] != "make" || (i > 0 && !isCommandSeparator(words[i-1]) && !strings.Contains(words[i-1], "=")) {
				continue
			}
			for i++; i < len(words) && !isCommandSeparator(words[i]); i++ {
				w := words[i]
				if strings.Contains(w, "=") || strings.HasPrefix(w, "-") {
					continue
				}
				targets = append(targets, w)
			}
		}
	}
	return targets
}

func isCommandSeparator(w string) bool {
	switch w {
	case ";", "&&", "||", "|", "&", "(", ")", "$", "sudo", "flock":
		return true
	}
	return strings.HasPrefix(w, "/") // flock's lock file: `flock /tmp/node.lock make x`
}

// shellWords splits a command line on blanks, keeping quoted strings whole
// and ; & | ( ) as words of their own, up to a # comment.
func shellWords(line string) []string {
	var words []string
	var cur strings.Builder
	var quote rune
	flush := func() {
		if cur.Len() > 0 {
			words = append(words, cur.String())
			cur.Reset()
		}
	}
	rs := []rune(line)
	for i := 0; i < len(rs); i++ {
		r := rs[i]
		switch {
		case quote != 0:
			cur.WriteRune(r)
			if r == quote {
				quote = 0
			}
		case r == '#' && cur.Len() == 0:
			flush()
			return words
		case r == '"' || r == '\'':
			quote = r
			cur.WriteRune(r)
		case unicode.IsSpace(r):
			flush()
		case strings.ContainsRune(";&|()", r):
			flush()
			if i+1 < len(rs) && (r == '&' || r == '|') && rs[i+1] == r {
				words = append(words, string([]rune{r, r}))
				i++
			} else {
				words = append(words, string(r))
			}
		default:
			cur.WriteRune(r)
		}
	}
	flush()
	return words
}

var makeRuleRE = regexp.MustCompile(`^([^\s#:=][^:=]*?)\s*::?(?:[^=]|$)`)
var makeTargetNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]*$`)

// makefileTargets returns the explicit targets of the rules in a Makefile.
func makefileTargets(src string) map[string]bool {
	targets := map[string]bool{}
	for _, line := range strings.Split(src, "\n") {
		m := makeRuleRE.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		for _, name := range strings.Fields(m[1]) {
			if makeTargetNameRE.MatchString(name) {
				targets[name] = true
			}
		}
	}
	return targets
}

// checkMakeTargets returns one message per `make X` in the docs' code
// whose X the Makefile does not define.
func checkMakeTargets(docs map[string]markdown.Doc, targets map[string]bool) []string {
	var bad []string
	for _, name := range sortedKeys(docs) {
		for _, c := range docs[name].Code {
			for _, target := range makeTargetsInCode(c.Text) {
				if !targets[target] {
					bad = append(bad, fmt.Sprintf("%s:%d: `make %s`: the Makefile has no target %q", name, c.Line, target, target))
				}
			}
		}
	}
	return bad
}

func TestDocsMakeTargets(t *testing.T) {
	src, err := os.ReadFile("Makefile")
	if err != nil {
		t.Fatal(err)
	}
	targets := makefileTargets(string(src))
	for _, want := range []string{"test", "demo", "node-e2e"} { // the parser reads this Makefile at all
		if !targets[want] {
			t.Fatalf("Makefile parsed without target %q: %v", want, sortedKeys(targets))
		}
	}
	docs := loadDocs(t)
	named := 0
	for _, d := range docs {
		for _, c := range d.Code {
			named += len(makeTargetsInCode(c.Text))
		}
	}
	if named == 0 {
		t.Fatal("found no `make` command in the docs; the scanner is broken")
	}
	for _, msg := range checkMakeTargets(docs, targets) {
		t.Error(msg)
	}
}

const flagsDoc = "docs/flags.md"

// flagsTable reads the flags table of docs/flags.md: the table whose
// header is "flag | default | meaning". A row's flag is a code span
// `--name`; its default is a code span, or empty for an empty default.
func flagsTable(doc markdown.Doc) (map[string]string, []string) {
	var errs []string
	for _, table := range doc.Tables {
		if len(table) < 2 {
			continue
		}
		header := markdown.TableCells(table[0].Text)
		if len(header) < 2 || header[0] != "flag" || header[1] != "default" {
			continue
		}
		rows := map[string]string{}
		for _, row := range table[2:] {
			cells := markdown.TableCells(row.Text)
			where := fmt.Sprintf("%s:%d", doc.Path, row.Line)
			if len(cells) < 2 {
				errs = append(errs, where+": a row needs a flag and a default")
				continue
			}
			name, ok := markdown.CodeSpan(cells[0])
			if !ok || !strings.HasPrefix(name, "--") {
				errs = append(errs, fmt.Sprintf("%s: flag cell %q is not one `--flag`", where, cells[0]))
				continue
			}
			name = strings.TrimPrefix(name, "--")
			def := ""
			if cells[1] != "" {
				if def, ok = markdown.CodeSpan(cells[1]); !ok {
					errs = append(errs, fmt.Sprintf("%s: default cell %q of --%s is not one code span", where, cells[1], name))
					continue
				}
			}
			if _, dup := rows[name]; dup {
				errs = append(errs, fmt.Sprintf("%s: --%s listed twice", where, name))
			}
			rows[name] = def
		}
		return rows, errs
	}
	return nil, append(errs, doc.Path+": no table with the header | flag | default | meaning |")
}

// registeredFlags returns the controller's flags and their defaults, as
// parseFlags registers them.
func registeredFlags(t *testing.T) (*flag.FlagSet, map[string]string) {
	t.Helper()
	fs := flag.NewFlagSet("uuid-controller", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	if _, err := parseFlags(fs, nil); err != nil {
		t.Fatalf("the default flags do not parse: %v", err)
	}
	flags := map[string]string{}
	fs.VisitAll(func(f *flag.Flag) { flags[f.Name] = f.DefValue })
	return fs, flags
}

// checkFlagsTable compares the documented flags with the registered ones.
func checkFlagsTable(documented, registered map[string]string) []string {
	var bad []string
	for _, name := range sortedKeys(registered) {
		def, ok := documented[name]
		switch {
		case !ok:
			bad = append(bad, fmt.Sprintf("%s: --%s (default %q) is registered but not in the table", flagsDoc, name, registered[name]))
		case def != registered[name]:
			bad = append(bad, fmt.Sprintf("%s: --%s: the table says default %q, the binary registers %q", flagsDoc, name, def, registered[name]))
		}
	}
	for _, name := range sortedKeys(documented) {
		if _, ok := registered[name]; !ok {
			bad = append(bad, fmt.Sprintf("%s: --%s is in the table but the binary registers no such flag", flagsDoc, name))
		}
	}
	return bad
}

func TestDocsFlagsTable(t *testing.T) {
	_, registered := registeredFlags(t)
	src, err := os.ReadFile(flagsDoc)
	if err != nil {
		t.Fatal(err)
	}
	documented, errs := flagsTable(markdown.Parse(flagsDoc, string(src)))
	for _, msg := range append(errs, checkFlagsTable(documented, registered)...) {
		t.Error(msg)
	}
}

// The docs state how long --error-after's default takes once, in
// design.md, as "about N s"; --help computes it. They must agree.
func TestDocsErrorAfterFigure(t *testing.T) {
	fs, _ := registeredFlags(t)
	m := regexp.MustCompile(`about (\S+) of backoff`).FindStringSubmatch(fs.Lookup("error-after").Usage)
	if m == nil {
		t.Fatalf("--error-after's help no longer says \"about ... of backoff\": %q", fs.Lookup("error-after").Usage)
	}
	help, err := time.ParseDuration(m[1])
	if err != nil {
		t.Fatal(err)
	}
	const page = "docs/design.md"
	src, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	figures := regexp.MustCompile("about (\\d+) s in with the default\\s+flags").FindAllStringSubmatch(string(src), -1)
	if len(figures) != 1 {
		t.Fatalf("%s states --error-after's default as \"about N s in with the default flags\" %d times, want once", page, len(figures))
	}
	if got, want := figures[0][1], strconv.Itoa(int(help.Seconds())); got != want {
		t.Errorf("%s says --error-after's default is about %s s of retrying; --help computes %s (%s s)", page, got, help, want)
	}
}

const designDoc = "docs/design.md"

// layoutPackages reads the packages design.md's layout table lists: the
// table whose header is "package | holds", one `path` a row.
func layoutPackages(doc markdown.Doc) (map[string]bool, error) {
	for _, table := range doc.Tables {
		if header := markdown.TableCells(table[0].Text); len(header) < 2 || header[0] != "package" || header[1] != "holds" {
			continue
		}
		listed := map[string]bool{}
		for _, row := range table[min(2, len(table)):] {
			name, ok := markdown.CodeSpan(markdown.TableCells(row.Text)[0])
			if !ok {
				return nil, fmt.Errorf("%s:%d: the package cell is not one code span", doc.Path, row.Line)
			}
			listed[name] = true
		}
		return listed, nil
	}
	return nil, fmt.Errorf("%s: no table with the header | package | holds |", doc.Path)
}

// internalPackages are the directories under internal/ that hold Go files.
func internalPackages(t *testing.T) map[string]bool {
	t.Helper()
	pkgs := map[string]bool{}
	err := filepath.WalkDir("internal", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(path, ".go") {
			pkgs[filepath.ToSlash(filepath.Dir(path))] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return pkgs
}

// TestDocsLayoutTable: design.md's layout table lists exactly the
// packages under internal/.
func TestDocsLayoutTable(t *testing.T) {
	src, err := os.ReadFile(designDoc)
	if err != nil {
		t.Fatal(err)
	}
	listed, err := layoutPackages(markdown.Parse(designDoc, string(src)))
	if err != nil {
		t.Fatal(err)
	}
	pkgs := internalPackages(t)
	for _, p := range sortedKeys(pkgs) {
		if !listed[p] {
			t.Errorf("%s: the layout table does not list %s", designDoc, p)
		}
	}
	for _, p := range sortedKeys(listed) {
		if !pkgs[p] {
			t.Errorf("%s: the layout table lists %s, which is no package under internal/", designDoc, p)
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
