// Command mutate is the mutation check (make mutate). For each line of the
// list it applies a deliberate breakage to a scratch copy of the
// repository, checks the copy still builds, runs the tests the line names,
// and reports the line caught only when a test assertion failed: not a
// build failure, a panic or a timeout. It exits 1 when any line is missed,
// its text is not found exactly once, or its breakage does not build.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"
)

func main() {
	var (
		root     = flag.String("root", "../..", "the repository to copy")
		list     = flag.String("list", "hack/mutate/mutations.tsv", "the list, relative to -root")
		only     = flag.String("only", "", "run only the lines whose id matches this regexp")
		skip     = flag.String("skip", "", "leave out the lines whose id matches this regexp")
		scratch  = flag.String("scratch", "", "the scratch copy (replaced at start). Default: uuid-controller-mutate-HASH in the temporary directory, HASH naming -root, so the path stays fixed (Go's build cache warm) and two checkouts never share one")
		check    = flag.Bool("check", false, "only check that every line's text occurs exactly once; run nothing")
		baseline = flag.Bool("baseline", true, "first run each named test set unbroken: it must pass, or a failure would prove nothing")
		unitTime = flag.Duration("timeout", 5*time.Minute, "go test -timeout for a line")
		e2eTime  = flag.Duration("cluster-timeout", 20*time.Minute, "go test -timeout for a line in ./test/...")
		lock     = flag.String("cluster-lock", "/tmp/cluster.lock", "flock(1) file held while a ./test/... package runs (they start clusters); empty: none")
		nodeLock = flag.String("node-lock", "/tmp/node.lock", "flock(1) file also held for ./test/node; empty: none")
		logDir   = flag.String("log-dir", "", "write each run's output to DIR/ID.log (default: the scratch's parent, uuid-controller-mutate-logs)")
	)
	flag.Parse()
	if *scratch == "" {
		*scratch = defaultScratch(*root)
	}
	unlock, err := lockScratch(*scratch)
	if err != nil {
		fatal(err)
	}
	defer unlock()
	r := runner{root: *root, scratch: *scratch, baseline: *baseline, unitTimeout: *unitTime,
		clusterTimeout: *e2eTime, clusterLock: *lock, nodeLock: *nodeLock, logDir: *logDir}
	if r.logDir == "" {
		r.logDir = *scratch + "-logs"
	}
	ms, err := parseList(filepath.Join(*root, *list))
	if err != nil {
		fatal(err)
	}
	if *only != "" {
		re, err := regexp.Compile(*only)
		if err != nil {
			fatal(fmt.Errorf("-only: %w", err))
		}
		var keep []mutation
		for _, m := range ms {
			if re.MatchString(m.ID) {
				keep = append(keep, m)
			}
		}
		ms = keep
	}
	if *skip != "" {
		re, err := regexp.Compile(*skip)
		if err != nil {
			fatal(fmt.Errorf("-skip: %w", err))
		}
		var keep []mutation
		for _, m := range ms {
			if !re.MatchString(m.ID) {
				keep = append(keep, m)
			}
		}
		ms = keep
	}
	if len(ms) == 0 {
		fatal(errors.New("no line to run"))
	}
	// Every line's text is checked before anything runs, so a rotten line
	// fails the target at once.
	var bad []error
	for _, m := range ms {
		b, err := os.ReadFile(filepath.Join(*root, m.File))
		if err == nil {
			_, err = m.apply(string(b))
		}
		if err != nil {
			bad = append(bad, err)
		}
	}
	if len(bad) > 0 {
		fatal(errors.Join(bad...))
	}
	if *check {
		fmt.Printf("%d lines, each text found exactly once\n", len(ms))
		return
	}
	os.Exit(r.run(ms))
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "mutate:", err)
	os.Exit(2)
}

type runner struct {
	root, scratch, logDir       string
	baseline                    bool
	unitTimeout, clusterTimeout time.Duration
	clusterLock, nodeLock       string
}

// outcome of one go test run.
type outcome string

const (
	passed    outcome = "passed"    // every test passed
	failed    outcome = "failed"    // an assertion failed: --- FAIL, no panic
	timedOut  outcome = "timed out" // go test's -timeout panic
	panicked  outcome = "panicked"  // a test panicked: not an assertion
	broken    outcome = "broken"    // the tests did not compile or set up
	noTests   outcome = "no tests"  // -run matched nothing
	undecided outcome = "error"     // failed with no --- FAIL line
)

func (r runner) run(ms []mutation) int {
	start := time.Now()
	if err := r.copyRepo(); err != nil {
		fatal(err)
	}
	if err := os.MkdirAll(r.logDir, 0o755); err != nil {
		fatal(err)
	}
	fmt.Printf("mutate: %d lines, scratch copy %s, logs in %s\n", len(ms), r.scratch, r.logDir)
	if r.baseline {
		// One unbroken run a package, of every test its lines name: a
		// package under ./test/ starts its cluster once.
		var pkgs []string
		runs := map[string][]string{}
		for _, m := range ms {
			if _, ok := runs[m.Pkg]; !ok {
				pkgs = append(pkgs, m.Pkg)
			}
			if !slices.Contains(runs[m.Pkg], m.Run) {
				runs[m.Pkg] = append(runs[m.Pkg], m.Run)
			}
		}
		for _, pkg := range pkgs {
			b := mutation{ID: "baseline" + strings.ReplaceAll(strings.Trim(pkg, "./"), "/", "-"), Pkg: pkg,
				Run: "(?:" + strings.Join(runs[pkg], ")|(?:") + ")"}
			t0 := time.Now()
			out, res := r.goTest(b, b.ID)
			if res != passed {
				fmt.Printf("baseline FAILED  %s -run %s (%s, %s): the unbroken tests must pass; log %s\n%s\n",
					pkg, b.Run, res, time.Since(t0).Round(time.Second), r.logPath(b.ID), tail(out, 30))
				return 1
			}
			fmt.Printf("baseline ok      %-28s %d test sets  %s\n", pkg, len(runs[pkg]), time.Since(t0).Round(time.Second))
		}
	}
	missed := 0
	for _, m := range ms {
		t0 := time.Now()
		verdict, detail := r.one(m)
		if verdict != "caught" {
			missed++
		}
		fmt.Printf("%-7s %-34s %-28s %6s  %s\n", verdict, m.ID, m.Pkg, time.Since(t0).Round(time.Second), detail)
	}
	fmt.Printf("mutate: %d of %d caught, %d not, in %s\n", len(ms)-missed, len(ms), missed, time.Since(start).Round(time.Second))
	if missed > 0 {
		return 1
	}
	return 0
}

// one applies m in the scratch copy, runs its tests and restores the file.
func (r runner) one(m mutation) (verdict, detail string) {
	path := filepath.Join(r.scratch, m.File)
	orig, err := os.ReadFile(path)
	if err != nil {
		return "ERROR", err.Error()
	}
	mutated, err := m.apply(string(orig))
	if err != nil {
		return "ERROR", err.Error()
	}
	if err := os.WriteFile(path, []byte(mutated), 0o644); err != nil {
		return "ERROR", err.Error()
	}
	defer os.WriteFile(path, orig, 0o644) //nolint:errcheck // checked by the next line's apply
	if strings.HasSuffix(m.File, ".go") {
		if out, err := r.goBuild(filepath.Dir(m.File), strings.HasSuffix(m.File, "_test.go")); err != nil {
			return "ERROR", "the breakage does not build (fix the line):\n" + tail(out, 15)
		}
	}
	out, res := r.goTest(m, m.ID)
	switch res {
	case failed:
		return "caught", "-run " + m.Run + ": " + firstFail(out)
	case passed:
		return "MISSED", "-run " + m.Run + " passed with the breakage"
	default:
		return "MISSED", fmt.Sprintf("-run %s %s, which is no assertion failing (log %s):\n%s", m.Run, res, r.logPath(m.ID), tail(out, 15))
	}
}

// buildTags are the go flags a package's tests build with: the node tests
// (./test/node, needing root) exist only with the tag node, as make
// node-e2e runs them.
func buildTags(pkg string) []string {
	if p := "./" + strings.TrimPrefix(filepath.ToSlash(filepath.Clean(pkg)), "./"); p == "./test/node" || strings.HasPrefix(p, "./test/node/") {
		return []string{"-tags", "node"}
	}
	return nil
}

// module returns the module root holding dir (relative to the scratch) and
// dir relative to that root, as a ./ package path.
func (r runner) module(dir string) (modRoot, pkg string) {
	d := filepath.Clean(dir)
	for {
		if _, err := os.Stat(filepath.Join(r.scratch, d, "go.mod")); err == nil {
			rel, _ := filepath.Rel(d, filepath.Clean(dir))
			return filepath.Join(r.scratch, d), "./" + filepath.ToSlash(rel)
		}
		if d == "." {
			return r.scratch, "./" + filepath.ToSlash(filepath.Clean(dir))
		}
		d = filepath.Dir(d)
	}
}

func (r runner) goEnv(modRoot string) []string {
	env := os.Environ()
	if modRoot != r.scratch {
		// The tool modules are built as the Makefile builds them.
		env = append(env, "GOFLAGS=-mod=mod -buildvcs=false")
	}
	return env
}

// goBuild builds the package in dir; with test, its tests too (compiled,
// none run).
func (r runner) goBuild(dir string, test bool) (string, error) {
	modRoot, pkg := r.module(dir)
	argv := append([]string{"build", "-o", os.DevNull}, append(buildTags(dir), pkg)...)
	if test {
		// -c: compiled, not run (a TestMain may start a cluster).
		bin := filepath.Join(r.logDir, "build-check.test")
		defer os.Remove(bin)
		argv = append([]string{"test", "-c", "-o", bin}, append(buildTags(dir), pkg)...)
	}
	cmd := exec.Command("go", argv...)
	cmd.Dir, cmd.Env = modRoot, r.goEnv(modRoot)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

var (
	noTestsLine = regexp.MustCompile(`(?m)^testing: warning: no tests to run`)
	failLine    = regexp.MustCompile(`(?m)^\s*--- FAIL: .*$`)
	panicLine   = regexp.MustCompile(`(?m)^panic: `)
	timeoutLine = regexp.MustCompile(`(?m)^panic: test timed out`)
	brokenLine  = regexp.MustCompile(`(?m)\[(build|setup) failed\]$`)
)

// goTest runs m's tests in the scratch copy (under the locks a cluster
// test takes) and classifies the result.
func (r runner) goTest(m mutation, logName string) (string, outcome) {
	modRoot, pkg := r.module(strings.TrimPrefix(m.Pkg, "./"))
	timeout := r.unitTimeout
	var argv []string
	if strings.HasPrefix(m.Pkg, "./test/") {
		timeout = r.clusterTimeout
		if r.clusterLock != "" {
			argv = append(argv, "flock", r.clusterLock)
		}
		if r.nodeLock != "" && strings.HasPrefix(m.Pkg, "./test/node") {
			argv = append(argv, "flock", r.nodeLock)
		}
	}
	argv = append(argv, "go", "test", "-count=1", "-timeout", timeout.String())
	argv = append(append(argv, buildTags(m.Pkg)...), "-run", m.Run, pkg)
	// A last resort well beyond go test's own timeout (which prints the
	// stacks): the time to compile on a cold, shared machine is not in it.
	ctx, cancel := context.WithTimeout(context.Background(), 2*timeout+30*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir, cmd.Env = modRoot, r.goEnv(modRoot)
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	err := cmd.Run()
	out := buf.String()
	_ = os.WriteFile(r.logPath(logName), []byte(strings.Join(argv, " ")+"\n"+out), 0o644)
	return out, classify(out, err, ctx.Err() != nil)
}

func classify(out string, err error, killed bool) outcome {
	switch {
	case killed || timeoutLine.MatchString(out):
		return timedOut
	case brokenLine.MatchString(out):
		return broken
	case noTestsLine.MatchString(out):
		return noTests
	case err == nil:
		return passed
	case panicLine.MatchString(out):
		return panicked
	case failLine.MatchString(out):
		return failed
	}
	return undecided
}

func (r runner) logPath(name string) string { return filepath.Join(r.logDir, name+".log") }

// firstFail is the first --- FAIL line and the three lines after it,
// which usually hold the assertion's message.
func firstFail(out string) string {
	lines := strings.Split(out, "\n")
	for i, l := range lines {
		if failLine.MatchString(l) {
			msg, n := strings.TrimSpace(l), 0
			for _, next := range lines[i+1:] {
				if s := strings.TrimSpace(next); s != "" && !strings.HasPrefix(s, "---") && n < 3 {
					msg += " | " + s
					n++
				}
			}
			if len(msg) > 400 {
				msg = msg[:400] + "..."
			}
			return msg
		}
	}
	return ""
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "    " + strings.Join(lines, "\n    ")
}

// copyRepo replaces the scratch copy with the repository's files as they
// are on disk, committed or not (git ls-files: tracked and untracked but
// not ignored), and the bin symlink the tests find their servers through.
func (r runner) copyRepo() error {
	cmd := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	cmd.Dir = r.root
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("listing the repository's files: %w", err)
	}
	if err := os.RemoveAll(r.scratch); err != nil {
		return err
	}
	for _, name := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		if name == "" {
			continue
		}
		if err := copyFile(filepath.Join(r.root, name), filepath.Join(r.scratch, name)); err != nil {
			return err
		}
	}
	if _, err := os.Lstat(filepath.Join(r.scratch, "bin")); err == nil {
		return nil // copied as listed
	}
	if target, err := os.Readlink(filepath.Join(r.root, "bin")); err == nil {
		if !filepath.IsAbs(target) {
			target = filepath.Join(r.root, target)
		}
		if abs, err := filepath.Abs(target); err == nil {
			target = abs
		}
		return os.Symlink(target, filepath.Join(r.scratch, "bin"))
	} else if abs, err := filepath.Abs(filepath.Join(r.root, "bin")); err == nil {
		if _, err := os.Stat(abs); err == nil {
			return os.Symlink(abs, filepath.Join(r.scratch, "bin"))
		}
	}
	return nil
}

func copyFile(src, dst string) error {
	fi, err := os.Lstat(src)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil // deleted in the work tree, not yet in git
		}
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	if fi.Mode()&os.ModeSymlink != 0 {
		t, err := os.Readlink(src)
		if err != nil {
			return err
		}
		return os.Symlink(t, dst)
	}
	if !fi.Mode().IsRegular() {
		return nil
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, fi.Mode().Perm())
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
