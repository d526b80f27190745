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
## time keeps 2 cores from being shared three ways. test/gitops is a module of
## its own (kstatus stays out of go.mod), which ./... does not enter.
## node-e2e (root: it runs a kubelet node on this machine) comes last.
test: tools
	go vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "not gofmt-clean:"; gofmt -l $$(git ls-files '*.go'); exit 1; }
	go test -count=1 -p 1 -timeout 60m ./...
	cd test/gitops && go vet ./... && go test -count=1 -timeout 10m ./...
	$(MAKE) image-test
	$(MAKE) node-e2e

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

KUBECTL ?= kubectl
.PHONY: manifests build-installer

## manifests: refresh deploy/crd.yaml, the kustomization's copy of crd.yaml
manifests:
	cp crd.yaml deploy/crd.yaml

## deploy: kubectl apply -k deploy/ (CRD, namespace, RBAC, Deployment, PDB) with the image $(IMG)
deploy: manifests
	hack/kustomize-overlay.sh .local/deploy $(IMG)
	$(KUBECTL) apply -k .local/deploy

## build-installer: dist/install.yaml, the same objects in one file for a release, image $(IMG)
build-installer: manifests $(BIN_DIR)/kubectl
	hack/kustomize-overlay.sh .local/installer $(IMG)
	@mkdir -p dist
	$(BIN_DIR)/kubectl kustomize .local/installer > dist/install.yaml

## docker-build: the image with docker; `make image` builds the same without one
docker-build:
	docker build -t $(IMG) .

.PHONY: image image-test pause-image
## image: the controller image archive bin/uuid-controller.tar, tagged $(IMG), built
##        without a container engine from the Dockerfile's final stage (hack/image)
IMG ?= uuid-controller:dev
IMAGE_TAR ?= $(BIN_DIR)/uuid-controller.tar
# The flags must equal the Dockerfile's `go build`: hack/image checks the
# binary's recorded build settings against it and refuses a mismatch.
IMAGE_GO_BUILD := CGO_ENABLED=0 GOOS=linux go build -trimpath -ldflags="-s -w"
# -mod=mod lets a cold module cache fill itself from hack/image/go.mod.
IMAGE_TOOL := cd hack/image && GOFLAGS=-mod=mod go run .
image:
	$(IMAGE_GO_BUILD) -o $(BIN_DIR)/uuid-controller .
	$(IMAGE_TOOL) -dockerfile $(abspath Dockerfile) -context $(CURDIR) \
		-binary $(abspath $(BIN_DIR)/uuid-controller) -tag $(IMG) -o $(abspath $(IMAGE_TAR))

## image-test: hack/image's own tests (its own module, so ./... above skips it);
##             they run `make image` and check the archive against the Dockerfile
image-test:
	cd hack/image && GOFLAGS=-mod=mod go vet ./... && GOFLAGS=-mod=mod go test -count=1 ./...

## pause-image: bin/pause.tar, the node's sandbox image (hack/image/pause), tagged $(PAUSE_IMG)
PAUSE_IMG ?= registry.local/pause:3.10
pause-image:
	cd hack/image && $(IMAGE_GO_BUILD) -o $(abspath $(BIN_DIR)/pause) ./pause
	$(IMAGE_TOOL) -dockerfile pause/Dockerfile -context . \
		-binary $(abspath $(BIN_DIR)/pause) -tag $(PAUSE_IMG) -o $(abspath $(BIN_DIR)/pause.tar)

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

## ---- node (issue 11): a real single-node Kubernetes for test/node ----
# The node's Kubernetes parts, v1.37.2 like the servers above. Without the
# version ldflags they report v0.0.0-master.
NODE_K8S      := kube-controller-manager kube-scheduler kubelet kube-proxy
K8S_LDFLAGS   := -X k8s.io/component-base/version.gitVersion=v1.37.2 -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=37
# containerd has a module of its own so its dependencies cannot move kubernetes' pins.
CONTAINERD_DIR := hack/containerd
CONTAINERD_MOD := $(CONTAINERD_DIR)/go.mod $(CONTAINERD_DIR)/go.sum
CONTAINERD_GO  := cd $(CONTAINERD_DIR) && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -tags "no_btrfs no_devmapper"
NODE_CONTAINERD := containerd containerd-shim-runc-v2 ctr
# Debian packages the node needs from the machine (runc, CNI plugins in /usr/lib/cni, iptables, conntrack).
NODE_DEBS     := runc containernetworking-plugins iptables nftables conntrack

.PHONY: node-tools node-deps

## node-tools: build the node's binaries into bin/ (skipped when up to date)
node-tools: tools $(addprefix $(BIN_DIR)/,$(NODE_K8S) $(NODE_CONTAINERD))

$(addprefix $(BIN_DIR)/,$(NODE_K8S)): $(TOOLS_MOD)
	$(TOOLS_GO) -ldflags "$(K8S_LDFLAGS)" -o ../../$@ k8s.io/kubernetes/cmd/$(@F)

$(addprefix $(BIN_DIR)/,$(NODE_CONTAINERD)): $(CONTAINERD_MOD)
	$(CONTAINERD_GO) -o ../../$@ github.com/containerd/containerd/v2/cmd/$(@F)

## node-deps: install the node's Debian packages when one is missing (apt-get update once)
node-deps:
	@missing=$$(for p in $(NODE_DEBS); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing:" $$missing; \
		apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y $$missing; \
	fi

.PHONY: node-e2e
## node-e2e: the node tests (test/node, and test/cluster's node network test): a real
##           single node on this machine runs deploy/ as Pods. Needs root; builds the
##           node's binaries and both images, installs the Debian packages when missing.
node-e2e: node-deps node-tools image pause-image
	go vet -tags node ./test/cluster/ ./test/node/
	go test -tags node -count=1 -v -run 'TestNode' ./test/cluster/
	go test -tags node -count=1 -p 1 -timeout 40m -v ./test/node/
