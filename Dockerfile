# syntax=docker/dockerfile:1
# The controller image. `make image` packs the same final stage without a
# container engine (hack/image), and refuses to when this file and its build
# disagree, so keep the final stage to COPY, USER, EXPOSE and ENTRYPOINT.
#
# Base images are pinned by digest, as cert-manager does. The golang digest is
# the one public Dockerfiles pin for golang:1.26.8-bookworm (linux/amd64 and
# arm64 index); it could not be pulled from here to check it.
FROM golang:1.26.8-bookworm@sha256:a688600ca24f8a4d3ca77f95b0dd40704a9fc787c826660eb7ba0b641b8b175d AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY *.go ./
# A static binary: the final image has no libc.
RUN CGO_ENABLED=0 GOOS=linux go build -trimpath -ldflags="-s -w" -o /uuid-controller .

# scratch rather than distroless: the binary is static, so it needs no libc,
# and in a pod the API server's CA comes from the ServiceAccount mount, so it
# needs no CA bundle either. scratch also has no digest to pin, and it is the
# one base this repository can reproduce without pulling anything.
FROM scratch
# /etc/passwd and /etc/group name uid 65532 "nonroot", as distroless does.
COPY hack/image/rootfs/ /
COPY --from=build /uuid-controller /uuid-controller
USER 65532:65532
EXPOSE 8080 9090
ENTRYPOINT ["/uuid-controller"]
