package main

import (
	"debug/buildinfo"
	"debug/elf"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// platform is the binary's own GOOS/GOARCH, which the image config repeats.
type platform struct{ OS, Arch string }

// checkBinary refuses a binary that is not a static ELF, or whose recorded
// build settings differ from the Dockerfile's `go build`: the image built here
// must hold the binary docker would build.
func checkBinary(file string, want goBuild) (platform, error) {
	if err := checkStatic(file); err != nil {
		return platform{}, err
	}
	ldflagDiffs, err := checkLdflags(file, want.Flags["-ldflags"])
	if err != nil {
		return platform{}, err
	}
	info, err := buildinfo.ReadFile(file)
	if err != nil {
		return platform{}, fmt.Errorf("reading Go build info of %s: %w", file, err)
	}
	got := map[string]string{}
	for _, s := range info.Settings {
		got[s.Key] = s.Value
	}
	diffs := ldflagDiffs
	for k, v := range want.Env {
		if _, known := got[k]; known || k == "CGO_ENABLED" || k == "GOOS" || k == "GOARCH" {
			if got[k] != v {
				diffs = append(diffs, fmt.Sprintf("%s=%q, Dockerfile %q", k, got[k], v))
			}
		}
	}
	for _, k := range slices.Sorted(maps.Keys(goBuildFlags)) {
		if !goBuildFlags[k].recorded || k == "-ldflags" {
			continue
		}
		if got[k] != want.Flags[k] {
			diffs = append(diffs, fmt.Sprintf("%s %q, Dockerfile %q", k, got[k], want.Flags[k]))
		}
	}
	if got["-buildmode"] != "exe" {
		diffs = append(diffs, fmt.Sprintf("-buildmode %q, Dockerfile default \"exe\"", got["-buildmode"]))
	}
	if len(diffs) > 0 {
		slices.Sort(diffs)
		return platform{}, fmt.Errorf("%s was not built as the Dockerfile builds it: %s", file, strings.Join(diffs, "; "))
	}
	return platform{OS: got["GOOS"], Arch: got["GOARCH"]}, nil
}

// checkLdflags compares the binary with the -s and -w the Dockerfile passes,
// by their effect: go build leaves -ldflags out of the build info under
// -trimpath (go.dev/issue/52372). Other linker flags (-X, ...) are refused,
// because their effect could not be checked.
func checkLdflags(file, ldflags string) ([]string, error) {
	var strip, noDWARF bool
	for _, f := range strings.Fields(ldflags) {
		switch f {
		case "-s":
			strip, noDWARF = true, true // the linker's -s implies -w
		case "-w":
			noDWARF = true
		default:
			return nil, fmt.Errorf("Dockerfile -ldflags %q: only -s and -w can be checked against the binary", ldflags)
		}
	}
	f, err := elf.Open(file)
	if err != nil {
		return nil, fmt.Errorf("reading %s as ELF: %w", file, err)
	}
	defer f.Close()
	var diffs []string
	if hasSymtab := f.Section(".symtab") != nil; hasSymtab == strip {
		diffs = append(diffs, fmt.Sprintf("symbol table present %v, Dockerfile -ldflags %q", hasSymtab, ldflags))
	}
	if hasDWARF := f.Section(".debug_info") != nil || f.Section(".zdebug_info") != nil; hasDWARF == noDWARF {
		diffs = append(diffs, fmt.Sprintf("DWARF present %v, Dockerfile -ldflags %q", hasDWARF, ldflags))
	}
	return diffs, nil
}

// checkStatic refuses a dynamically linked ELF: FROM scratch has no loader
// and no libc.
func checkStatic(file string) error {
	f, err := elf.Open(file)
	if err != nil {
		return fmt.Errorf("reading %s as ELF: %w", file, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked (it has an ELF interpreter); build it with CGO_ENABLED=0", file)
		}
	}
	libs, err := f.ImportedLibraries()
	if err != nil {
		return fmt.Errorf("reading %s's dynamic section: %w", file, err)
	}
	if len(libs) > 0 {
		return fmt.Errorf("%s needs shared libraries %v; build it with CGO_ENABLED=0", file, libs)
	}
	return nil
}
