package main

import (
	"bytes"
	"debug/buildinfo"
	"debug/elf"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
)

// platform is an image's OS and architecture, as GOOS/GOARCH name them.
type platform struct{ OS, Arch string }

func (p platform) String() string { return p.OS + "/" + p.Arch }

func parsePlatform(s string) (platform, error) {
	os, arch, ok := strings.Cut(s, "/")
	if !ok || os == "" || arch == "" || strings.Contains(arch, "/") {
		return platform{}, fmt.Errorf("platform %q: want OS/ARCH, e.g. linux/arm64", s)
	}
	if _, known := elfMachines[arch]; !known || os != "linux" {
		return platform{}, fmt.Errorf("platform %q: only linux on %s", s, strings.Join(slices.Sorted(maps.Keys(elfMachines)), ", "))
	}
	return platform{OS: os, Arch: arch}, nil
}

// elfMachines is the ELF machine of each GOARCH the images may hold.
var elfMachines = map[string]elf.Machine{
	"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64, "arm": elf.EM_ARM, "386": elf.EM_386,
	"ppc64le": elf.EM_PPC64, "s390x": elf.EM_S390, "riscv64": elf.EM_RISCV,
}

// binaryPlatform is the platform the kernel would run file on: linux and
// the architecture its ELF header names.
func binaryPlatform(file string) (platform, error) {
	f, err := elf.Open(file)
	if err != nil {
		return platform{}, fmt.Errorf("reading %s as ELF: %w", file, err)
	}
	defer f.Close()
	for arch, m := range elfMachines {
		if f.Machine == m {
			return platform{OS: "linux", Arch: arch}, nil
		}
	}
	return platform{}, fmt.Errorf("%s: ELF machine %s is not one this tool knows a GOARCH for", file, f.Machine)
}

// checkBinary refuses a binary that is not a static ELF, or whose recorded
// build settings differ from the Dockerfile's `go build` expanded for the
// platform its ELF header names: the image built here must hold, for each
// platform, the binary docker would build. It returns that platform.
func checkBinary(file string, build buildCommand, buildArgs map[string]string) (platform, error) {
	p, err := binaryPlatform(file)
	if err != nil {
		return platform{}, err
	}
	want, err := build.expand(p, buildArgs)
	if err != nil {
		return platform{}, err
	}
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
	// The ELF header and the build info must agree, whether or not the
	// Dockerfile names GOARCH (docker's default is the target platform).
	if got["GOOS"] != p.OS || got["GOARCH"] != p.Arch {
		diffs = append(diffs, fmt.Sprintf("ELF header says %s/%s, Go build info GOOS=%q GOARCH=%q", p.OS, p.Arch, got["GOOS"], got["GOARCH"]))
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
		diffs = slices.Compact(diffs)
		return platform{}, fmt.Errorf("%s (%s/%s) was not built as the Dockerfile builds it: %s", file, p.OS, p.Arch, strings.Join(diffs, "; "))
	}
	return p, nil
}

// checkLdflags compares the binary with the -s, -w and -X the Dockerfile
// passes, by their effect: go build leaves -ldflags out of the build info
// under -trimpath (go.dev/issue/52372). A -X value must appear in the
// binary's bytes (a stripped binary has no symbol to read it from, so the
// check is that the string is there, not which variable holds it). Other
// linker flags are refused, because their effect could not be checked.
func checkLdflags(file, ldflags string) ([]string, error) {
	var strip, noDWARF bool
	var xValues []string
	fields := strings.Fields(ldflags)
	for i := 0; i < len(fields); i++ {
		switch f := fields[i]; {
		case f == "-s":
			strip, noDWARF = true, true // the linker's -s implies -w
		case f == "-w":
			noDWARF = true
		case f == "-X" && i+1 < len(fields):
			i++
			if _, v, ok := strings.Cut(fields[i], "="); ok && v != "" {
				xValues = append(xValues, v)
			}
		default:
			return nil, fmt.Errorf("Dockerfile -ldflags %q: only -s, -w and -X importpath.name=value can be checked against the binary", ldflags)
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
	if len(xValues) > 0 {
		data, err := os.ReadFile(file)
		if err != nil {
			return nil, err
		}
		for _, v := range xValues {
			if !bytes.Contains(data, []byte(v)) {
				diffs = append(diffs, fmt.Sprintf("-X value %q not in the binary", v))
			}
		}
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
