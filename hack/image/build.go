package main

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
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
