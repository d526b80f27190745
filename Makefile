# Local test cluster tooling. Other targets (build/run/deploy) may be appended.

BIN_DIR   := bin
TOOLS_DIR := hack/tools
TOOLS_MOD := $(TOOLS_DIR)/go.mod $(TOOLS_DIR)/go.sum
# -mod=mod lets a cold module cache fill itself from hack/tools/go.mod.
TOOLS_GO  := cd $(TOOLS_DIR) && GOFLAGS=-mod=mod go build

.PHONY: tools cluster e2e test

## tools: build etcd, kube-apiserver and kubectl into bin/ (skipped when up to date)
tools: $(BIN_DIR)/etcd $(BIN_DIR)/kube-apiserver $(BIN_DIR)/kubectl

$(BIN_DIR)/etcd: $(TOOLS_MOD)
	$(TOOLS_GO) -o ../../$@ go.etcd.io/etcd/server/v3

$(BIN_DIR)/kube-apiserver: $(TOOLS_MOD)
	$(TOOLS_GO) -o ../../$@ k8s.io/kubernetes/cmd/kube-apiserver

$(BIN_DIR)/kubectl: $(TOOLS_MOD)
	$(TOOLS_GO) -o ../../$@ k8s.io/kubernetes/cmd/kubectl

## cluster: run a local etcd + kube-apiserver until Ctrl-C (see hack/cluster)
cluster: tools
	go run ./hack/cluster

## e2e: end-to-end tests against a real local cluster
e2e: tools
	go test -count=1 -timeout 30m -v ./test/e2e/...

## test: the README's test command: vet, gofmt and every test in the module.
## -p 1: test/cluster, test/e2e and test/bench each start a cluster; one at a
## time keeps 2 cores from being shared three ways.
test: tools
	go vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "not gofmt-clean:"; gofmt -l $$(git ls-files '*.go'); exit 1; }
	go test -count=1 -p 1 -timeout 60m ./...

.PHONY: build run install deploy docker-build unit

## build: the controller binary
build:
	CGO_ENABLED=0 go build -o $(BIN_DIR)/uuid-controller .

## unit: unit tests only (no cluster needed)
unit:
	go vet ./...
	go test -count=1 .

## run: the controller against $KUBECONFIG or ~/.kube/config (/metrics on plain HTTP, for curl)
run:
	go run . --health-addr=127.0.0.1:8080 --metrics-addr=127.0.0.1:9090 --metrics-secure=false

## install: the CRD into the current cluster
install:
	kubectl apply -f crd.yaml

## deploy: CRD, namespace, RBAC and the Deployment
deploy: install
	kubectl apply -f deploy/namespace.yaml -f deploy/rbac.yaml -f deploy/deployment.yaml -f deploy/pdb.yaml

## docker-build: the image (needs a container engine)
docker-build:
	docker build -t uuid-controller:latest .

.PHONY: demo
## demo: local cluster + controller + examples/uuid.yaml + kubectl get id; Ctrl-C stops all
demo: tools
	go run ./hack/cluster -- hack/demo.sh

.PHONY: bench
## bench: the benchmark (test/bench): starts a local cluster, runs every case for each N, prints a Markdown table.
##        BENCH_FLAGS overrides the defaults, e.g. make bench BENCH_FLAGS="-n 1000,10000,100000 -c 16"
BENCH_FLAGS ?= -n 1000,10000
bench: tools
	go run ./test/bench $(BENCH_FLAGS)
