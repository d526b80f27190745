package main

import (
	"fmt"
	"io"
	"maps"
	"path"
	"runtime"
	"slices"
	"strings"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/linter"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/buildkit/frontend/dockerfile/shell"
)

// spec is what the Dockerfile's final stage says the image holds. The
// Dockerfile is the one source of truth: this tool reproduces its final stage
// and refuses any Dockerfile it could not reproduce exactly, so docker and
// `make image` cannot drift apart.
type spec struct {
	User       string
	Entrypoint []string
	Ports      []string // as EXPOSE wrote them, e.g. "8080" or "53/udp"
	// Labels as LABEL wrote them, before build arguments are expanded.
	Labels []instructions.KeyValuePair
	// Args are the final stage's ARGs (name to default, nil for none): the
	// build arguments its LABELs may use.
	Args map[string]*string

	// Copies from the build context, in Dockerfile order.
	ContextCopies []contextCopy

	// Binary is where the final stage puts the binary the build stage built.
	Binary string
	// Build is the build stage's `go build` command that produced it.
	Build buildCommand
	// Bases are the images the stages start FROM, each NAME:TAG@DIGEST as
	// the Dockerfile pins it (scratch and earlier stages left out).
	Bases []string
	// GoToolchains holds, for each base in Bases whose stage sets it with
	// ENV, the GOTOOLCHAIN the go command in that stage runs with.
	GoToolchains map[string]string
}

// buildCommand is the build stage's `go build` RUN line before build
// arguments are expanded, with the ARGs declared before it: docker expands
// them per platform (TARGETOS, TARGETARCH) and per build (--build-arg).
type buildCommand struct {
	Line   int
	Script string
	Args   map[string]*string
}

type contextCopy struct {
	Sources []string // relative to the build context
	Dest    string   // absolute path in the image
}

// goBuild is a `go build` command line from a RUN instruction.
type goBuild struct {
	Env     map[string]string // assignments before `go`, e.g. CGO_ENABLED=0
	Flags   map[string]string // build flags that end up in the binary's build info
	Output  string            // -o
	Package string
}

// parseDockerfile reads a Dockerfile whose final stage is `FROM scratch` and
// holds only ARG, LABEL, COPY, USER, EXPOSE and an exec-form ENTRYPOINT.
func parseDockerfile(r io.Reader) (*spec, error) {
	ast, err := parser.Parse(r)
	if err != nil {
		return nil, fmt.Errorf("parsing Dockerfile: %w", err)
	}
	var lintErrs []string
	lint := linter.New(&linter.Config{Warn: func(rule, _, _, msg string, _ []parser.Range) {
		lintErrs = append(lintErrs, rule+": "+msg)
	}})
	stages, metaArgs, err := instructions.Parse(ast.AST, lint)
	if err != nil {
		return nil, fmt.Errorf("parsing Dockerfile: %w", err)
	}
	if len(lintErrs) > 0 {
		return nil, fmt.Errorf("Dockerfile lint: %s", strings.Join(lintErrs, "; "))
	}
	if len(metaArgs) > 0 {
		// Build arguments are declared in the stage that uses them, where
		// docker and this tool expand them alike.
		return nil, fmt.Errorf("Dockerfile: ARG before FROM is not supported: declare build arguments in the stage that uses them")
	}
	if len(stages) == 0 {
		return nil, fmt.Errorf("Dockerfile: no FROM")
	}
	if err := checkPinned(stages); err != nil {
		return nil, err
	}
	final := stages[len(stages)-1]
	if final.BaseName != "scratch" {
		return nil, fmt.Errorf("Dockerfile: final stage is FROM %s; only FROM scratch can be reproduced without a container engine", final.BaseName)
	}
	if final.Platform != "" {
		return nil, fmt.Errorf("Dockerfile: final stage sets --platform %s; the binary's own GOOS/GOARCH decide the platform", final.Platform)
	}

	s := &spec{Args: map[string]*string{}, GoToolchains: map[string]string{}}
	earlier := map[string]bool{}
	for _, st := range stages {
		if st.BaseName != "scratch" && !earlier[st.BaseName] {
			s.Bases = append(s.Bases, st.BaseName)
			for _, cmd := range st.Commands {
				if e, ok := cmd.(*instructions.EnvCommand); ok {
					for _, kv := range e.Env {
						if kv.Key == "GOTOOLCHAIN" {
							s.GoToolchains[st.BaseName] = kv.Value
						}
					}
				}
			}
		}
		earlier[st.Name] = true
	}
	var binaryStage string
	for _, cmd := range final.Commands {
		switch c := cmd.(type) {
		case *instructions.CopyCommand:
			if c.Chown != "" || c.Chmod != "" || len(c.SourceContents) > 0 || c.Parents || len(c.ExcludePatterns) > 0 {
				return nil, fmt.Errorf("Dockerfile line %d: COPY with --chown, --chmod, --parents, --exclude or a heredoc is not supported", line(c))
			}
			if !path.IsAbs(c.DestPath) {
				return nil, fmt.Errorf("Dockerfile line %d: COPY destination %q must be absolute", line(c), c.DestPath)
			}
			if c.From == "" {
				s.ContextCopies = append(s.ContextCopies, contextCopy{Sources: c.SourcePaths, Dest: c.DestPath})
				continue
			}
			if s.Binary != "" {
				return nil, fmt.Errorf("Dockerfile line %d: a second COPY --from; the image holds one binary", line(c))
			}
			if len(c.SourcePaths) != 1 {
				return nil, fmt.Errorf("Dockerfile line %d: COPY --from must copy exactly one file, the binary", line(c))
			}
			binaryStage = c.From
			s.Binary = c.DestPath
			if strings.HasSuffix(c.DestPath, "/") {
				s.Binary = path.Join(c.DestPath, path.Base(c.SourcePaths[0]))
			}
			build, err := findGoBuild(stages[:len(stages)-1], binaryStage, c.SourcePaths[0])
			if err != nil {
				return nil, err
			}
			s.Build = *build
		case *instructions.ArgCommand:
			for _, a := range c.Args {
				s.Args[a.Key] = a.Value
			}
		case *instructions.LabelCommand:
			s.Labels = append(s.Labels, c.Labels...)
		case *instructions.UserCommand:
			s.User = c.User
		case *instructions.ExposeCommand:
			s.Ports = append(s.Ports, c.Ports...)
		case *instructions.EntrypointCommand:
			if c.PrependShell {
				return nil, fmt.Errorf("Dockerfile line %d: ENTRYPOINT must be in exec form ([\"/binary\"]): the image has no shell", line(c))
			}
			s.Entrypoint = c.CmdLine
		default:
			return nil, fmt.Errorf("Dockerfile line %d: %q in the final stage is not supported (only ARG, LABEL, COPY, USER, EXPOSE, ENTRYPOINT)", line(cmd), cmd.Name())
		}
	}
	switch {
	case s.Binary == "":
		return nil, fmt.Errorf("Dockerfile: the final stage copies no binary from a build stage (COPY --from=...)")
	case len(s.Entrypoint) == 0:
		return nil, fmt.Errorf("Dockerfile: the final stage has no ENTRYPOINT")
	case s.User == "":
		return nil, fmt.Errorf("Dockerfile: the final stage has no USER, so the image would run as root")
	}
	return s, nil
}

// checkPinned refuses a base image named by tag alone: a tag moves, so the
// same Dockerfile would build something else next month (cert-manager pins
// its bases by digest for the same reason).
func checkPinned(stages []instructions.Stage) error {
	earlier := map[string]bool{}
	for _, st := range stages {
		if st.BaseName != "scratch" && !earlier[st.BaseName] && !strings.Contains(st.BaseName, "@sha256:") {
			return fmt.Errorf("Dockerfile line %d: FROM %s is not pinned by digest (name:tag@sha256:...)", st.Location[0].Start.Line, st.BaseName)
		}
		earlier[st.Name] = true
	}
	return nil
}

// findGoBuild finds the RUN in the named build stage whose `go build -o`
// writes the file the final stage copies. The RUN is checked here with the
// ARGs' defaults, for linux/amd64; checkBinary expands it again for each
// binary's platform and build arguments.
func findGoBuild(stages []instructions.Stage, name, output string) (*buildCommand, error) {
	for _, st := range stages {
		if st.Name != name {
			continue
		}
		args := map[string]*string{}
		for _, cmd := range st.Commands {
			if a, ok := cmd.(*instructions.ArgCommand); ok {
				for _, kv := range a.Args {
					args[kv.Key] = kv.Value
				}
				continue
			}
			run, ok := cmd.(*instructions.RunCommand)
			if !ok || !run.PrependShell || len(run.CmdLine) != 1 || !strings.Contains(run.CmdLine[0], "go build") {
				continue
			}
			bc := &buildCommand{Line: line(run), Script: run.CmdLine[0], Args: maps.Clone(args)}
			b, err := bc.expand(platform{OS: "linux", Arch: "amd64"}, nil)
			if err != nil {
				return nil, err
			}
			if b.Output == output {
				return bc, nil
			}
		}
		return nil, fmt.Errorf("Dockerfile: stage %q has no RUN go build -o %s", name, output)
	}
	return nil, fmt.Errorf("Dockerfile: COPY --from=%s names no earlier stage", name)
}

// platformArgs are the build arguments docker sets from the target
// platform when a stage declares them (BuildKit's automatic platform ARGs).
func platformArgs(p platform) map[string]string {
	return map[string]string{
		"TARGETPLATFORM": p.OS + "/" + p.Arch, "TARGETOS": p.OS, "TARGETARCH": p.Arch, "TARGETVARIANT": "",
		"BUILDPLATFORM": runtime.GOOS + "/" + runtime.GOARCH, "BUILDOS": runtime.GOOS, "BUILDARCH": runtime.GOARCH, "BUILDVARIANT": "",
	}
}

// argValues gives each declared ARG its value as docker would: the build
// argument when one is given, else the platform's value for an automatic
// platform ARG, else its default (empty without one).
func argValues(declared map[string]*string, p platform, buildArgs map[string]string) map[string]string {
	auto := platformArgs(p)
	vals := map[string]string{}
	for k, def := range declared {
		if v, ok := buildArgs[k]; ok {
			vals[k] = v
		} else if v, ok := auto[k]; ok {
			vals[k] = v
		} else if def != nil {
			vals[k] = *def
		} else {
			vals[k] = ""
		}
	}
	return vals
}

// expand is the RUN line as docker runs it for platform p with the build
// arguments given, split into a goBuild.
func (b buildCommand) expand(p platform, buildArgs map[string]string) (*goBuild, error) {
	g, err := parseGoBuild(b.Script, argValues(b.Args, p, buildArgs))
	if err != nil {
		return nil, fmt.Errorf("Dockerfile line %d: %w", b.Line, err)
	}
	return g, nil
}

// labels are the final stage's LABELs with the build arguments expanded.
func (s *spec) labels(buildArgs map[string]string) (map[string]string, error) {
	if len(s.Labels) == 0 {
		return nil, nil
	}
	env := shell.EnvsFromSlice(envSlice(argValues(s.Args, platform{}, buildArgs)))
	out := map[string]string{}
	for _, l := range s.Labels {
		v, _, err := shell.NewLex('\\').ProcessWord(l.Value, env)
		if err != nil {
			return nil, fmt.Errorf("Dockerfile LABEL %s: %w", l.Key, err)
		}
		out[l.Key] = v
	}
	return out, nil
}

// checkBuildArgs refuses a build argument that no ARG declares: docker
// only warns, and a misspelt VERSION would leave the version empty.
func (s *spec) checkBuildArgs(buildArgs map[string]string) error {
	for k := range buildArgs {
		if _, ok := s.Args[k]; !ok {
			if _, ok := s.Build.Args[k]; !ok {
				return fmt.Errorf("build argument %s: no ARG %s in the Dockerfile's build or final stage", k, k)
			}
		}
	}
	return nil
}

func envSlice(m map[string]string) []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, k+"="+m[k])
	}
	return out
}

// Build flags that take a value, and whether the binary records them. Flags
// outside this list are refused rather than ignored, so a new flag in the
// Dockerfile cannot slip past the comparison.
var goBuildFlags = map[string]struct{ value, recorded bool }{
	"-trimpath": {false, true},
	"-race":     {false, true},
	"-ldflags":  {true, true},
	"-gcflags":  {true, true},
	"-asmflags": {true, true},
	"-tags":     {true, true},
	"-o":        {true, false},
	"-mod":      {true, false},
	"-buildvcs": {true, false},
}

// parseGoBuild splits `[VAR=value ...] go build [flags] [package]` as a shell
// would, with the build arguments args set.
func parseGoBuild(cmdline string, args map[string]string) (*goBuild, error) {
	words, err := shell.NewLex('\\').ProcessWords(cmdline, shell.EnvsFromSlice(envSlice(args)))
	if err != nil {
		return nil, fmt.Errorf("splitting %q: %w", cmdline, err)
	}
	b := &goBuild{Env: map[string]string{}, Flags: map[string]string{}}
	for len(words) > 0 && strings.Contains(words[0], "=") {
		k, v, _ := strings.Cut(words[0], "=")
		b.Env[k] = v
		words = words[1:]
	}
	if len(words) < 2 || words[0] != "go" || words[1] != "build" {
		return nil, fmt.Errorf("%q: expected [VAR=value ...] go build [flags] [package], with nothing chained", cmdline)
	}
	words = words[2:]
	for len(words) > 0 && strings.HasPrefix(words[0], "-") {
		name, value, hasValue := strings.Cut(words[0], "=")
		name = "-" + strings.TrimLeft(name, "-")
		f, known := goBuildFlags[name]
		if !known {
			return nil, fmt.Errorf("%q: go build flag %s is not supported here", cmdline, name)
		}
		words = words[1:]
		switch {
		case f.value && !hasValue:
			if len(words) == 0 {
				return nil, fmt.Errorf("%q: %s needs a value", cmdline, name)
			}
			value, words = words[0], words[1:]
		case !f.value && !hasValue:
			value = "true"
		}
		if name == "-o" {
			b.Output = value
		} else if f.recorded {
			b.Flags[name] = value
		}
	}
	if len(words) > 1 {
		return nil, fmt.Errorf("%q: one package expected, got %v", cmdline, words)
	}
	if len(words) == 1 {
		b.Package = words[0]
	}
	if b.Output == "" {
		return nil, fmt.Errorf("%q: no -o", cmdline)
	}
	for _, k := range []string{"GOOS", "GOARCH"} {
		if v, set := b.Env[k]; set && v == "" {
			return nil, fmt.Errorf("%q: %s is empty; a build argument it names must be declared in the build stage (ARG TARGETOS TARGETARCH)", cmdline, k)
		}
	}
	if b.Env["CGO_ENABLED"] != "0" {
		return nil, fmt.Errorf("%q: CGO_ENABLED=0 is required: FROM scratch has no libc", cmdline)
	}
	return b, nil
}

func line(cmd instructions.Command) int {
	if loc := cmd.Location(); len(loc) > 0 {
		return loc[0].Start.Line
	}
	return 0
}
