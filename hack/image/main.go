// Command image builds, pushes and resolves the controller's image without
// a container engine:
//
//	go run . build -dockerfile ../../Dockerfile -context ../.. -platforms linux/amd64,linux/arm64 \
//	    -binary ../../bin/image/linux_amd64/uuid-controller -binary ../../bin/image/linux_arm64/uuid-controller \
//	    -build-arg VERSION=v0.1.0 -tag uuid-controller:dev -o ../../bin/uuid-controller.tar \
//	    -sbom ../../bin/uuid-controller.sbom.cdx.json -provenance ../../bin/uuid-controller.provenance.json
//	go run . push -i ../../bin/uuid-controller.tar -sbom ../../bin/uuid-controller.sbom.cdx.json \
//	    -provenance ../../bin/uuid-controller.provenance.json -key cosign.key registry.example/uuid-controller:v0.1.0
//	go run . digest registry.example/uuid-controller:v0.1.0
//	go run . sign -key cosign.key registry.example/charts/uuid-controller@sha256:...
//	go run . attestations -pub cosign.pub -o DIR registry.example/uuid-controller@sha256:...
//	go run . verify -pub cosign.pub registry.example/uuid-controller:v0.1.0
//
// build packs an OCI image index with one image per platform, as the final
// stage of a Dockerfile describes it. The Dockerfile is the one source of
// truth. Its final stage must be FROM scratch with ARG, LABEL, COPY, USER,
// EXPOSE and an exec-form ENTRYPOINT only; each binary must be a static ELF
// whose machine is one of the platforms and whose recorded build settings
// (CGO_ENABLED, GOOS, GOARCH, -trimpath, -ldflags, ...) equal the build
// stage's `go build` as docker would expand it for that platform (TARGETOS,
// TARGETARCH) and the build arguments. Anything else is refused, so the
// index holds what `docker buildx build --platform ...` would produce. The
// archive is an OCI image layout (`ctr images import` reads the whole index)
// and a `docker save` archive of one platform, the host's by default
// (`docker load` reads it).
//
// push uploads the index to a registry with the docker config's credentials
// and prints it by digest; digest prints what a tag names now, by digest;
// sign signs any manifest by digest (the chart `helm push` uploaded) as
// cosign does and prints the signature's tag; attestations reads back the
// SBOM and the provenance that refer to an index, checks the provenance's
// signature, and writes both to files; verify checks an image's or a chart's
// signature (the one sign or push wrote) against a public key, offline, and
// prints what it verified by digest.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime"
	"strings"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: image build|push|digest|sign|attestations|verify [flags]")
		os.Exit(2)
	}
	var err error
	switch cmd, args := os.Args[1], os.Args[2:]; cmd {
	case "build":
		err = buildCmd(args)
	case "push", "digest", "sign", "attestations", "verify":
		err = registryCmd(cmd, args)
	default:
		err = fmt.Errorf("unknown command %q: want build, push, digest, sign, attestations or verify", cmd)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

// listFlag is a flag that may be given more than once.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

// buildOptions are build's flags.
type buildOptions struct {
	dockerfile, contextDir, tag, out string
	binaries                         []string
	platforms                        []platform
	buildArgs                        map[string]string
	// loadPlatform is the platform manifest.json (docker load) holds.
	loadPlatform platform
	// sbom and provenance, when set, are the files the index's SBOM
	// (CycloneDX JSON) and unsigned SLSA provenance (in-toto) go to.
	sbom, provenance string
}

func buildCmd(args []string) error {
	fs := flag.NewFlagSet("build", flag.ContinueOnError)
	var o buildOptions
	var binaries, buildArgs listFlag
	fs.StringVar(&o.dockerfile, "dockerfile", "Dockerfile", "the Dockerfile whose final stage describes the image")
	fs.StringVar(&o.contextDir, "context", ".", "the Dockerfile's build context (COPY sources are relative to it)")
	fs.Var(&binaries, "binary", "a binary the final stage copies from its build stage, built as that stage builds it for one platform (repeat for each platform)")
	platforms := fs.String("platforms", "", "the index's platforms, e.g. linux/amd64,linux/arm64 (default: the binaries' own)")
	fs.Var(&buildArgs, "build-arg", "NAME=VALUE for a Dockerfile ARG, as docker build --build-arg (repeatable)")
	fs.StringVar(&o.tag, "tag", "", "the image's tag, e.g. uuid-controller:dev")
	fs.StringVar(&o.out, "o", "", "the image archive to write")
	fs.StringVar(&o.sbom, "sbom", "", "write the index's SBOM (CycloneDX JSON: each binary's Go modules) to this file")
	fs.StringVar(&o.provenance, "provenance", "", "write the index's SLSA v1 provenance (an in-toto statement) to this file")
	load := fs.String("load-platform", runtime.GOOS+"/"+runtime.GOARCH, "the platform `docker load` gets from the archive")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("build: unexpected arguments %q", fs.Args())
	}
	o.binaries = binaries
	o.buildArgs = map[string]string{}
	for _, a := range buildArgs {
		k, v, ok := strings.Cut(a, "=")
		if !ok || k == "" {
			return fmt.Errorf("-build-arg %q: want NAME=VALUE", a)
		}
		o.buildArgs[k] = v
	}
	if *platforms != "" {
		for _, s := range strings.Split(*platforms, ",") {
			p, err := parsePlatform(s)
			if err != nil {
				return err
			}
			o.platforms = append(o.platforms, p)
		}
	}
	var err error
	if o.loadPlatform, err = parsePlatform(*load); err != nil {
		return fmt.Errorf("-load-platform: %w", err)
	}
	return build(o)
}

func registryCmd(cmd string, args []string) error {
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	archive := fs.String("i", "", "push: the image archive `make image` wrote")
	timeout := fs.Duration("timeout", 10*time.Minute, "give up after this long")
	ca := fs.String("ca", "", "a PEM CA certificate to trust besides the system's (a registry with a private CA)")
	var att attachments
	pub := fs.String("pub", "", "attestations: the PEM public key the provenance's signature must check against; verify: the key the signature must check against")
	outDir := fs.String("o", ".", "attestations: the folder to write sbom.cdx.json and provenance.json to")
	fs.StringVar(&att.sbom, "sbom", "", "push: attach this SBOM (build -sbom) to the index as an OCI 1.1 referrer")
	fs.StringVar(&att.provenance, "provenance", "", "push: attach this provenance (build -provenance) to the index as an OCI 1.1 referrer, signed with -key")
	fs.StringVar(&att.key, "key", os.Getenv("SIGNING_KEY"), "push: sign the index (as `cosign sign --key` does, no transparency log) and the provenance with this PEM private key; "+
		"a cosign key's password comes from $COSIGN_PASSWORD (default $SIGNING_KEY)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("%s: want one image reference, REGISTRY/REPOSITORY:TAG (sign: REGISTRY/REPOSITORY@sha256:...)", cmd)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	var ref string
	var err error
	switch cmd {
	case "sign":
		ref, err = signCmd(ctx, fs.Arg(0), *ca, att.key)
	case "verify":
		ref, err = verifyCmd(ctx, fs.Arg(0), *ca, *pub)
	case "attestations":
		ref, err = fetchAttestations(ctx, fs.Arg(0), *ca, *pub, *outDir)
	case "push":
		if *archive == "" {
			return errors.New("push: -i ARCHIVE is required")
		}
		ref, err = pushAndAttach(ctx, *archive, fs.Arg(0), *ca, att)
	default:
		ref, err = resolve(ctx, fs.Arg(0), *ca)
	}
	if err != nil {
		return err
	}
	// Alone on stdout, so a script can capture it.
	fmt.Println(ref)
	return nil
}
