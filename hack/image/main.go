// Command image packs a static Go binary into an image archive, as the final
// stage of a Dockerfile describes it, without a container engine:
//
//	go run . -dockerfile ../../Dockerfile -context ../.. \
//	    -binary ../../bin/uuid-controller -tag uuid-controller:dev -o ../../bin/uuid-controller.tar
//
// The Dockerfile is the one source of truth. Its final stage must be
// FROM scratch with COPY, USER, EXPOSE and an exec-form ENTRYPOINT only; the
// binary must be a static ELF whose recorded build settings (CGO_ENABLED,
// GOOS, -trimpath, -ldflags, ...) equal the build stage's `go build`. Anything
// else is refused, so the archive holds what `docker build` would produce. The
// archive is a `docker save` tarball: `ctr -n k8s.io images import` and
// `docker load` read it.
package main

import (
	"flag"
	"fmt"
	"os"
)

func main() {
	dockerfile := flag.String("dockerfile", "Dockerfile", "the Dockerfile whose final stage describes the image")
	contextDir := flag.String("context", ".", "the Dockerfile's build context (COPY sources are relative to it)")
	binary := flag.String("binary", "", "the binary the final stage copies from its build stage, built as that stage builds it")
	tag := flag.String("tag", "", "the image's tag, e.g. uuid-controller:dev")
	out := flag.String("o", "", "the image archive to write")
	flag.Parse()
	if err := run(*dockerfile, *contextDir, *binary, *tag, *out); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run(dockerfile, contextDir, binary, tag, out string) error {
	if binary == "" || tag == "" || out == "" {
		return fmt.Errorf("-binary, -tag and -o are required")
	}
	f, err := os.Open(dockerfile)
	if err != nil {
		return err
	}
	s, err := parseDockerfile(f)
	f.Close()
	if err != nil {
		return fmt.Errorf("%s: %w", dockerfile, err)
	}
	p, err := checkBinary(binary, s.Build)
	if err != nil {
		return err
	}
	img, err := buildImage(s, contextDir, binary, p)
	if err != nil {
		return err
	}
	if err := writeImage(out, tag, img); err != nil {
		return err
	}
	// The config digest is the image ID that `ctr images ls` and
	// `docker images` show after loading; the manifest is rebuilt on import.
	id, err := img.ConfigName()
	if err != nil {
		return err
	}
	fmt.Printf("%s: %s, image ID %s (%s/%s)\n", out, tag, id, p.OS, p.Arch)
	return nil
}
