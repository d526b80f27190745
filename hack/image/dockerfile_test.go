package main

import (
	"os"
	"slices"
	"strings"
	"testing"
)

const buildStage = `FROM golang:1.26@sha256:0000000000000000000000000000000000000000000000000000000000000000 AS build
RUN CGO_ENABLED=0 GOOS=linux go build -trimpath -ldflags="-s -w" -o /app .
`

func TestParseDockerfile(t *testing.T) {
	s, err := parseDockerfile(strings.NewReader(buildStage + `
FROM scratch
COPY rootfs/ /
COPY --from=build /app /bin/
USER 65532:65532
EXPOSE 8080 53/udp
ENTRYPOINT ["/bin/app", "--flag"]
`))
	if err != nil {
		t.Fatal(err)
	}
	if s.User != "65532:65532" || !slices.Equal(s.Entrypoint, []string{"/bin/app", "--flag"}) ||
		!slices.Equal(slices.Sorted(slices.Values(s.Ports)), []string{"53/udp", "8080"}) || s.Binary != "/bin/app" {
		t.Errorf("final stage: %+v", s)
	}
	if len(s.ContextCopies) != 1 || !slices.Equal(s.ContextCopies[0].Sources, []string{"rootfs/"}) || s.ContextCopies[0].Dest != "/" {
		t.Errorf("context copies: %+v", s.ContextCopies)
	}
	b, err := s.Build.expand(platform{OS: "linux", Arch: "amd64"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if b.Env["CGO_ENABLED"] != "0" || b.Env["GOOS"] != "linux" || b.Flags["-trimpath"] != "true" ||
		b.Flags["-ldflags"] != "-s -w" || b.Output != "/app" || b.Package != "." || len(b.Flags) != 2 {
		t.Errorf("go build: %+v", b)
	}
}

// Build arguments expand as docker expands them: TARGETOS/TARGETARCH from
// each platform, others from -build-arg or the ARG's default, in the build
// stage's RUN and in the final stage's LABELs.
func TestParseDockerfileBuildArgs(t *testing.T) {
	s, err := parseDockerfile(strings.NewReader(`FROM --platform=$BUILDPLATFORM golang:1.26@sha256:0000000000000000000000000000000000000000000000000000000000000000 AS build
ARG TARGETOS TARGETARCH VERSION MODE=fast
RUN CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH go build -trimpath -ldflags="-s -w -X main.version=${VERSION}" -tags=$MODE -o /app .

FROM scratch
ARG VERSION
LABEL org.opencontainers.image.version=$VERSION other="fixed $UNDECLARED"
COPY --from=build /app /app
USER 1:1
ENTRYPOINT ["/app"]
`))
	if err != nil {
		t.Fatal(err)
	}
	args := map[string]string{"VERSION": "v1.2.3"}
	b, err := s.Build.expand(platform{OS: "linux", Arch: "arm64"}, args)
	if err != nil {
		t.Fatal(err)
	}
	if b.Env["GOOS"] != "linux" || b.Env["GOARCH"] != "arm64" || b.Flags["-ldflags"] != "-s -w -X main.version=v1.2.3" || b.Flags["-tags"] != "fast" {
		t.Errorf("go build for linux/arm64: env %v, flags %v", b.Env, b.Flags)
	}
	labels, err := s.labels(args)
	if err != nil {
		t.Fatal(err)
	}
	if labels["org.opencontainers.image.version"] != "v1.2.3" || labels["other"] != "fixed " {
		t.Errorf("labels %v", labels)
	}
	if err := s.checkBuildArgs(map[string]string{"VERSION": "1", "MODE": "slow"}); err != nil {
		t.Errorf("declared build arguments refused: %v", err)
	}
	if err := s.checkBuildArgs(map[string]string{"VERSON": "1"}); err == nil || !strings.Contains(err.Error(), "no ARG VERSON") {
		t.Errorf("a misspelt build argument: got %v", err)
	}
}

// Each Dockerfile here is one the tool could not reproduce exactly; it must
// say why rather than build something else.
func TestParseDockerfileRefuses(t *testing.T) {
	final := "\nFROM scratch\nCOPY --from=build /app /app\nUSER 1:1\nENTRYPOINT [\"/app\"]\n"
	tests := []struct {
		name, dockerfile, want string
	}{
		{"distroless base", buildStage + strings.Replace(final, "scratch", "gcr.io/distroless/static:nonroot@sha256:1111111111111111111111111111111111111111111111111111111111111111", 1), "only FROM scratch"},
		{"platform", buildStage + strings.Replace(final, "FROM scratch", "FROM --platform=linux/arm64 scratch", 1), "--platform"},
		{"RUN in the final stage", buildStage + final + "RUN true\n", `"RUN" in the final stage`},
		{"ENV in the final stage", buildStage + final + "ENV A=b\n", `"ENV" in the final stage`},
		{"undeclared platform in go build", strings.Replace(buildStage, "GOOS=linux", "GOOS=$TARGETOS", 1) + final, "GOOS is empty"},
		{"shell-form ENTRYPOINT", buildStage + strings.Replace(final, `["/app"]`, "/app", 1), "exec form"},
		{"no ENTRYPOINT", buildStage + strings.Replace(final, "ENTRYPOINT [\"/app\"]\n", "", 1), "no ENTRYPOINT"},
		{"no USER", buildStage + strings.Replace(final, "USER 1:1\n", "", 1), "no USER"},
		{"no binary", buildStage + strings.Replace(final, "COPY --from=build /app /app\n", "", 1), "copies no binary"},
		{"two binaries", buildStage + final + "COPY --from=build /app /app2\n", "second COPY --from"},
		{"COPY --chown", buildStage + final + "COPY --chown=1:1 a /a\n", "--chown"},
		{"relative COPY destination", buildStage + final + "COPY a a\n", "must be absolute"},
		{"unknown stage", strings.Replace(buildStage, "AS build", "AS builder", 1) + final, "names no earlier stage"},
		{"no go build", strings.SplitAfter(buildStage, "\n")[0] + "RUN true\n" + final, "no RUN go build -o /app"},
		{"go build in a pipeline", strings.Replace(buildStage, "RUN CGO_ENABLED", "RUN echo CGO_ENABLED", 1) + final, "with nothing chained"},
		{"base not pinned", strings.Replace(buildStage, "@sha256:", ":x@", 1) + final, "not pinned by digest"},
		{"cgo", strings.Replace(buildStage, "CGO_ENABLED=0", "CGO_ENABLED=1", 1) + final, "CGO_ENABLED=0 is required"},
		{"unknown build flag", strings.Replace(buildStage, "-trimpath", "-a", 1) + final, "flag -a is not supported"},
		{"chained command", strings.Replace(buildStage, " .\n", " . && strip /app\n", 1) + final, "one package expected"},
		{"build argument", "ARG V=1\n" + buildStage + final, "ARG before FROM"},
		{"lint warning", strings.Replace(buildStage, "AS build", "as build", 1) + final, "FromAsCasing"},
		{"not a Dockerfile", "", "parsing Dockerfile"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseDockerfile(strings.NewReader(tt.dockerfile))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got error %v, want one containing %q", err, tt.want)
			}
		})
	}
}

// The repository's own Dockerfiles are ones the tool accepts, with the
// properties the Deployment relies on.
func TestRepositoryDockerfiles(t *testing.T) {
	for _, tt := range []struct {
		file, user, binary string
	}{
		{"../../Dockerfile", "65532:65532", "/uuid-controller"},
		{"pause/Dockerfile", "65535:65535", "/pause"},
	} {
		f, err := os.Open(tt.file)
		if err != nil {
			t.Fatal(err)
		}
		s, err := parseDockerfile(f)
		f.Close()
		if err != nil {
			t.Fatalf("%s: %v", tt.file, err)
		}
		if s.User != tt.user || s.Binary != tt.binary || !slices.Equal(s.Entrypoint, []string{tt.binary}) {
			t.Errorf("%s: user %q, binary %q, entrypoint %q", tt.file, s.User, s.Binary, s.Entrypoint)
		}
	}
}
