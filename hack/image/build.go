package main

import (
	"bufio"
	"debug/buildinfo"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
)

// build checks each binary against the Dockerfile, packs one image per
// platform into an index and writes the archive.
func build(o buildOptions) error {
	if len(o.binaries) == 0 || o.tag == "" || o.out == "" {
		return errors.New("build: -binary, -tag and -o are required")
	}
	f, err := os.Open(o.dockerfile)
	if err != nil {
		return err
	}
	s, err := parseDockerfile(f)
	f.Close()
	if err != nil {
		return fmt.Errorf("%s: %w", o.dockerfile, err)
	}
	if err := s.checkBuildArgs(o.buildArgs); err != nil {
		return err
	}
	toolchain, err := pinnedToolchain(o.contextDir)
	if err != nil {
		return err
	}
	if err := checkBaseToolchain(s, toolchain); err != nil {
		return err
	}
	labels, err := s.labels(o.buildArgs)
	if err != nil {
		return err
	}
	byPlatform := map[platform]string{}
	var imgs []platformImage
	for _, b := range o.binaries {
		p, err := checkBinary(b, s.Build, o.buildArgs)
		if err != nil {
			return err
		}
		if err := checkGoVersion(b, toolchain); err != nil {
			return err
		}
		if prev, dup := byPlatform[p]; dup {
			return fmt.Errorf("%s and %s are both %s binaries; give one per platform", prev, b, p)
		}
		if len(o.platforms) > 0 && !slices.Contains(o.platforms, p) {
			return fmt.Errorf("%s is a %s binary, not one of -platforms %s", b, p, platformList(o.platforms))
		}
		byPlatform[p] = b
		img, err := buildImage(s, o.contextDir, b, p, labels)
		if err != nil {
			return err
		}
		imgs = append(imgs, platformImage{p: p, img: img})
	}
	for _, p := range o.platforms {
		if _, ok := byPlatform[p]; !ok {
			return fmt.Errorf("no -binary for platform %s, one of -platforms %s", p, platformList(o.platforms))
		}
	}
	if len(o.platforms) > 0 { // the index lists platforms in -platforms order
		slices.SortStableFunc(imgs, func(a, b platformImage) int {
			return slices.Index(o.platforms, a.p) - slices.Index(o.platforms, b.p)
		})
	}
	if _, ok := byPlatform[o.loadPlatform]; !ok {
		return fmt.Errorf("-load-platform %s: the index has no image for it; name one of its platforms", o.loadPlatform)
	}
	idx := buildIndex(imgs)
	if err := writeArchive(o.out, o.tag, idx, o.loadPlatform); err != nil {
		return err
	}
	d, err := idx.Digest()
	if err != nil {
		return err
	}
	var bins []imageBinary
	for _, pi := range imgs {
		d, err := pi.img.Digest()
		if err != nil {
			return err
		}
		bins = append(bins, imageBinary{p: pi.p, file: byPlatform[pi.p], image: d})
	}
	repository := o.tag
	if t, err := name.NewTag(o.tag, name.WeakValidation); err == nil {
		repository = t.Context().Name()
	}
	if o.sbom != "" {
		b, err := buildSBOM(repository, d, bins)
		if err != nil {
			return err
		}
		if err := os.WriteFile(o.sbom, b, 0o644); err != nil {
			return err
		}
	}
	if o.provenance != "" {
		b, err := buildProvenance(provenanceInputs{repository: repository, dockerfile: o.dockerfile, index: d, bins: bins,
			s: s, buildArgs: o.buildArgs, toolchain: toolchain})
		if err != nil {
			return err
		}
		if err := os.WriteFile(o.provenance, b, 0o644); err != nil {
			return err
		}
	}
	var ids []string
	for _, pi := range imgs {
		// The config digest is the image ID `docker images` shows after
		// docker load; containerd and registries name the index by d.
		id, err := pi.img.ConfigName()
		if err != nil {
			return err
		}
		ids = append(ids, fmt.Sprintf("%s image ID %s", pi.p, id))
	}
	fmt.Printf("%s: %s, index %s (%s)\n", o.out, o.tag, d, strings.Join(ids, ", "))
	return nil
}

func platformList(ps []platform) string {
	var s []string
	for _, p := range ps {
		s = append(s, p.String())
	}
	return strings.Join(s, ",")
}

// pinnedToolchain is the Go version the build context's go.mod pins: its
// toolchain line, else its go line when that names a release (go 1.26.8).
// The binaries must be built with exactly that Go, so the image holds what
// the pinned toolchain compiles, not whatever Go the build machine has.
func pinnedToolchain(contextDir string) (string, error) {
	file := filepath.Join(contextDir, "go.mod")
	f, err := os.Open(file)
	if err != nil {
		return "", fmt.Errorf("the build context's go.mod pins the Go toolchain: %w", err)
	}
	defer f.Close()
	var goLine string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) != 2 {
			continue
		}
		switch fields[0] {
		case "toolchain":
			return fields[1], nil
		case "go":
			goLine = fields[1]
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	if strings.Count(goLine, ".") == 2 {
		return "go" + goLine, nil
	}
	return "", fmt.Errorf("%s names no toolchain (a line `toolchain go1.X.Y`): the image's Go version must be pinned", file)
}

// checkGoVersion refuses a binary built with another Go than the pinned one.
func checkGoVersion(file, toolchain string) error {
	info, err := buildinfo.ReadFile(file)
	if err != nil {
		return fmt.Errorf("reading Go build info of %s: %w", file, err)
	}
	if info.GoVersion != toolchain {
		return fmt.Errorf("%s was built with %s, but go.mod pins toolchain %s: build it with that Go (GOTOOLCHAIN=%s)", file, info.GoVersion, toolchain, toolchain)
	}
	return nil
}

// checkBaseToolchain refuses a Dockerfile whose golang build stage would
// compile with another Go release than go.mod's toolchain: docker and make
// image would build different binaries. The stage compiles with its image's
// Go, or with the toolchain its ENV GOTOOLCHAIN names, which the go command
// fetches from the module proxy and verifies against the checksum database:
// that ENV must then name go.mod's toolchain exactly.
func checkBaseToolchain(s *spec, toolchain string) error {
	version := strings.TrimPrefix(toolchain, "go")
	for _, b := range s.Bases {
		ref, _, _ := strings.Cut(b, "@")
		repo, tag, ok := strings.Cut(ref, ":")
		if !ok || (repo != "golang" && repo != "docker.io/library/golang") {
			continue
		}
		if env, set := s.GoToolchains[b]; set {
			if env != toolchain {
				return fmt.Errorf("Dockerfile: the stage FROM %s sets GOTOOLCHAIN=%s, but go.mod pins toolchain %s", b, env, toolchain)
			}
			continue
		}
		if tag != version && !strings.HasPrefix(tag, version+"-") {
			return fmt.Errorf("Dockerfile: FROM %s builds with Go %s, but go.mod pins toolchain %s (set ENV GOTOOLCHAIN=%s in that stage, or use its image)", b, tag, toolchain, toolchain)
		}
	}
	return nil
}
