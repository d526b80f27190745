# syntax=docker/dockerfile:1
# The controller image, for linux/amd64 and linux/arm64:
#   docker buildx build --platform linux/amd64,linux/arm64 \
#     --build-arg VERSION=$(git describe --tags --always --dirty) --build-arg REVISION=$(git rev-parse HEAD) .
# `make image` packs the same final stage without a container engine
# (hack/image), and refuses to when this file and its build disagree, so keep
# the final stage to ARG, LABEL, COPY, USER, EXPOSE and ENTRYPOINT.
#
# The build stage runs on the build machine's platform and cross-compiles
# (CGO_ENABLED=0) for the target's, so no emulator is needed.
#
# Base images are pinned by digest, as cert-manager does. The golang digest is
# the one public Dockerfiles pin for golang:1.26.8-bookworm; no registry is
# reachable from here to check it, nor to learn a golang:1.27.3 digest. So the
# stage keeps that image and compiles with go.mod's Go, which GOTOOLCHAIN makes
# the go command fetch from the module proxy and check against the checksum
# database (hack/image refuses any other GOTOOLCHAIN than go.mod's).
FROM --platform=$BUILDPLATFORM golang:1.26.8-bookworm@sha256:a688600ca24f8a4d3ca77f95b0dd40704a9fc787c826660eb7ba0b641b8b175d AS build
ENV GOTOOLCHAIN=go1.27.3
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY *.go ./
COPY internal/ internal/
# TARGETOS/TARGETARCH: set by buildx for each --platform. VERSION and
# REVISION: --build-arg, as `make image` passes them (git describe, the commit).
ARG TARGETOS TARGETARCH VERSION REVISION
# A static binary: the final image has no libc.
RUN CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH go build -trimpath -ldflags="-s -w -X github.com/demo-operator/uuid-controller/internal/version.version=${VERSION} -X github.com/demo-operator/uuid-controller/internal/version.revision=${REVISION}" -o /uuid-controller .

# scratch rather than distroless: the binary is static, so it needs no libc,
# and in a pod the API server's CA comes from the ServiceAccount mount, so it
# needs no CA bundle either. scratch also has no digest to pin, and it is the
# one base this repository can reproduce without pulling anything.
FROM scratch
ARG VERSION REVISION
LABEL org.opencontainers.image.version=$VERSION \
      org.opencontainers.image.revision=$REVISION \
      org.opencontainers.image.source=https://github.com/demo-operator/uuid-controller
# /etc/passwd and /etc/group name uid 65532 "nonroot", as distroless does.
COPY hack/image/rootfs/ /
COPY --from=build /uuid-controller /uuid-controller
USER 65532:65532
EXPOSE 8080 9090
ENTRYPOINT ["/uuid-controller"]
