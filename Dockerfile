# syntax=docker/dockerfile:1
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY *.go ./
# A static binary: the final image has no libc.
RUN CGO_ENABLED=0 GOOS=linux go build -trimpath -ldflags="-s -w" -o /uuid-controller .

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /uuid-controller /uuid-controller
USER 65532:65532
EXPOSE 8080 9090
ENTRYPOINT ["/uuid-controller"]
