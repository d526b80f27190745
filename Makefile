# Local test cluster tooling. Other targets (build/run/deploy) may be appended.

# Every build here uses the Go that go.mod names, fetched by the go command
# from the module proxy where the machine has an older one (docs/testing.md).
export GOTOOLCHAIN := go1.27.3

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

## e2e-full: the whole e2e suite with the narrowed watch's fallback, the full informer
##           (UUID_WATCH=full installs crd.yaml without its selectable field); make test
##           runs $(E2E_FULL_TESTS) that way, beside the whole suite narrowed
E2E_FULL_TESTS := ^(TestWatchMode|TestInvalidUUIDsReplaced|TestUUIDCannotBeSwapped|TestUUIDIsStable|TestObjectsCreatedWhileDown|TestExampleGetsUUID|TestAllNamespaces|TestUserCannotForgeOrKeepBadStatus|TestLeaderElection|TestSIGKILLMidBurst|TestKopfMigration)$$
.PHONY: e2e-full
e2e-full: tools
	UUID_WATCH=full go test -count=1 -timeout 30m -v ./test/e2e/...

## test: the README's test command: vet, gofmt, the vulnerability gate and every test in the module
## (test/e2e's TestAlert* run bin/prometheus), then the other modules' tests.
## -p 1: test/cluster, test/e2e and test/bench each start a cluster; one at a
## time keeps 2 cores from being shared three ways. test/gitops is a module of
## its own (kstatus stays out of go.mod), which ./... does not enter.
## node-e2e (root: it runs a kubelet node on this machine) comes last.
test: tools helm prometheus
	go vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "not gofmt-clean:"; gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(MAKE) vulncheck-test vulncheck
	go test -count=1 -p 1 -timeout 60m ./...
	UUID_WATCH=full go test -count=1 -timeout 20m -run '$(E2E_FULL_TESTS)' ./test/e2e/
	cd test/gitops && go vet ./... && go test -count=1 -timeout 10m ./...
	$(MAKE) monitoring-test
	$(MAKE) image-test
	$(MAKE) node-e2e

.PHONY: build run install deploy docker-build unit

# The version the binary reports (internal/version): git describe, and the
# commit. `make build VERSION=v0.1.0` overrides; without git both are empty and
# the binary falls back to what Go recorded.
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null)
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null)
VERSION_PKG := github.com/demo-operator/uuid-controller/internal/version
VERSION_LDFLAGS := -X $(VERSION_PKG).version=$(VERSION) -X $(VERSION_PKG).revision=$(REVISION)

## build: the controller binary, stamped with $(VERSION)
build:
	CGO_ENABLED=0 go build -ldflags "$(VERSION_LDFLAGS)" -o $(BIN_DIR)/uuid-controller .

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

## manifests: refresh the copies the kustomization and the Helm chart hold: crd.yaml in each,
##            the chart's alerts and dashboard from deploy/monitoring, and its aggregated roles
manifests:
	cp crd.yaml deploy/crd.yaml
	cp crd.yaml charts/uuid-controller/crds/uuid.demo.operator.yaml
	cp deploy/monitoring/prometheus/rules.yaml charts/uuid-controller/files/prometheus-rules.yaml
	cp deploy/monitoring/dashboard.json charts/uuid-controller/files/dashboard.json
	cp deploy/aggregate-roles/roles.yaml charts/uuid-controller/files/aggregate-roles.yaml

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
	docker build --build-arg VERSION=$(VERSION) --build-arg REVISION=$(REVISION) -t $(IMG) .

.PHONY: image image-test pause-image
## image: the controller image archive bin/uuid-controller.tar, an OCI image index for
##        $(IMAGE_PLATFORMS) tagged $(IMG), built without a container engine from the
##        Dockerfile's final stage (hack/image); `docker load` gets the host's platform
IMG ?= uuid-controller:dev
IMAGE_TAR ?= $(BIN_DIR)/uuid-controller.tar
# Beside the archive: the index's SBOM (CycloneDX: each binary's Go modules)
# and its SLSA v1 provenance (in-toto), which image-push attaches to the index.
IMAGE_SBOM ?= $(IMAGE_TAR:.tar=.sbom.cdx.json)
IMAGE_PROVENANCE ?= $(IMAGE_TAR:.tar=.provenance.json)
IMAGE_PLATFORMS ?= linux/amd64,linux/arm64
# The platform `docker load` gets from the archive; empty: this machine's.
IMAGE_LOAD_PLATFORM ?=
comma := ,
# The flags must equal the Dockerfile's `go build`: hack/image checks each
# binary's recorded build settings and ELF machine against it and refuses a
# mismatch. GOOS/GOARCH come from each platform, as TARGETOS/TARGETARCH do.
IMAGE_GO_BUILD = CGO_ENABLED=0 go build -trimpath -ldflags="-s -w $(VERSION_LDFLAGS)"
# -mod=mod lets a cold module cache fill itself from hack/image/go.mod.
IMAGE_TOOL := cd hack/image && GOFLAGS=-mod=mod go run .
image:
	@set -e; for p in $(subst $(comma), ,$(IMAGE_PLATFORMS)); do \
		(set -x; GOOS=$${p%/*} GOARCH=$${p#*/} $(IMAGE_GO_BUILD) -o $(BIN_DIR)/image/$${p%/*}_$${p#*/}/uuid-controller .); \
	done
	$(IMAGE_TOOL) build -dockerfile $(abspath Dockerfile) -context $(CURDIR) -platforms $(IMAGE_PLATFORMS) \
		$(foreach p,$(subst $(comma), ,$(IMAGE_PLATFORMS)),-binary $(abspath $(BIN_DIR)/image/$(subst /,_,$(p))/uuid-controller)) \
		$(if $(IMAGE_LOAD_PLATFORM),-load-platform $(IMAGE_LOAD_PLATFORM)) \
		-build-arg VERSION=$(VERSION) -build-arg REVISION=$(REVISION) -tag $(IMG) -o $(abspath $(IMAGE_TAR)) \
		-sbom $(abspath $(IMAGE_SBOM)) -provenance $(abspath $(IMAGE_PROVENANCE))

.PHONY: image-push image-digest release-installer
## image-push: `make image`, then push the index to $(IMG), a registry tag, with
##             go-containerregistry (credentials from the docker config, as crane and ko
##             read them); prints the pushed index as REPOSITORY@sha256:..., the reference
##             to deploy. REGISTRY_CA=ca.crt trusts a registry's private CA. The SBOM and
##             the provenance are attached to the index as OCI 1.1 referrers (the
##             sha256-<digest> tag where the registry lacks the referrers API);
##             SIGNING_KEY=cosign.key (password in $$COSIGN_PASSWORD) signs the index as
##             `cosign sign --key` does, without a transparency log, and the provenance.
REGISTRY_CA ?=
REGISTRY_FLAGS = $(if $(REGISTRY_CA),-ca $(abspath $(REGISTRY_CA)))
SIGNING_KEY ?=
image-push: image
	@$(IMAGE_TOOL) push -i $(abspath $(IMAGE_TAR)) $(REGISTRY_FLAGS) -sbom $(abspath $(IMAGE_SBOM)) \
		-provenance $(abspath $(IMAGE_PROVENANCE)) $(if $(SIGNING_KEY),-key $(abspath $(SIGNING_KEY))) $(IMG)

## image-digest: print what the registry tag $(IMG) names now, as REPOSITORY@sha256:...
image-digest:
	@$(IMAGE_TOOL) digest $(REGISTRY_FLAGS) $(IMG)

## release-installer: dist/install.yaml with the image pinned by digest: the registry
##                    tag $(IMG) (pushed by make image-push) resolved to what it names now
release-installer:
	@ref=$$($(IMAGE_TOOL) digest $(REGISTRY_FLAGS) $(IMG)) && echo "$(IMG) is $$ref" && $(MAKE) --no-print-directory build-installer IMG=$$ref

## image-test: hack/image's own tests (its own module, so ./... above skips it);
##             they run `make image` and check the archive against the Dockerfile, and
##             push to and resolve from a real registry (bin/registry); TestChartPush runs
##             make chart-push with bin/helm
image-test: $(BIN_DIR)/registry $(BIN_DIR)/helm
	cd hack/image && GOFLAGS=-mod=mod go vet ./... && GOFLAGS=-mod=mod go test -count=1 -timeout 30m ./...

.PHONY: cosign-verify-test
## cosign-verify-test: hack/image/cosignverify, a module of its own: pushes a signed image and
##                     verifies it with cosign's own code (v2 pkg/cosign), and that a signature by
##                     another key or an index with one layer changed fails. Not in `make test`:
##                     cosign's dependencies cost minutes of cold build (docs/testing.md)
cosign-verify-test:
	cd hack/image/cosignverify && GOFLAGS=-mod=mod go vet ./... && GOFLAGS=-mod=mod go test -count=1 -timeout 20m -v ./...

## pause-image: bin/pause.tar, the node's sandbox image (hack/image/pause) for this
##              machine's platform, tagged $(PAUSE_IMG)
PAUSE_IMG ?= registry.local/pause:3.10
pause-image:
	cd hack/image && GOOS=linux CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o $(abspath $(BIN_DIR)/pause) ./pause
	$(IMAGE_TOOL) build -dockerfile pause/Dockerfile -context . \
		-binary $(abspath $(BIN_DIR)/pause) -tag $(PAUSE_IMG) -o $(abspath $(BIN_DIR)/pause.tar)

.PHONY: helm
## helm: bin/helm, Helm v4 for the chart's tests (charts/uuid-controller), built from
##       hack/helm, a module of its own so Helm never enters go.mod (skipped when up to date)
HELM_DIR := hack/helm
$(BIN_DIR)/helm: $(HELM_DIR)/go.mod $(HELM_DIR)/go.sum
	cd $(HELM_DIR) && export CGO_ENABLED=0 GOFLAGS=-mod=mod && \
		go build -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$$(go list -m -f '{{.Version}}' helm.sh/helm/v4)" \
		-o ../../$@ helm.sh/helm/v4/cmd/helm
helm: $(BIN_DIR)/helm

.PHONY: demo
## demo: local cluster + controller + examples/uuid.yaml + kubectl get id; Ctrl-C stops all
# Built, then exec'd: `go run` exits 1 after a Ctrl-C whatever the program
# returns, and a stop the user asked for is not a failure.
demo: tools
	go build -o $(BIN_DIR)/cluster ./hack/cluster
	exec $(BIN_DIR)/cluster -- hack/demo.sh

.PHONY: bench
## bench: the benchmark (test/bench): starts a local cluster, runs every case for each N, prints a Markdown table,
##        once with the narrowed watch (crd.yaml) and once with its fallback, the full informer (UUID_WATCH=full).
##        BENCH_FLAGS overrides the defaults, e.g. make bench BENCH_FLAGS="-n 1000,10000,100000 -c 16"
BENCH_FLAGS ?= -n 10000,100000
bench: tools
	go run ./test/bench -modes narrowed,full $(BENCH_FLAGS)

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

# The node's image registry, CNCF distribution's, in a module of its own.
REGISTRY_MOD := hack/registry/go.mod hack/registry/go.sum
$(BIN_DIR)/registry: $(REGISTRY_MOD)
	cd hack/registry && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -o ../../$@ github.com/distribution/distribution/v3/cmd/registry

.PHONY: node-tools node-deps

## node-tools: build the node's binaries into bin/ (skipped when up to date)
node-tools: tools $(addprefix $(BIN_DIR)/,$(NODE_K8S) $(NODE_CONTAINERD)) $(BIN_DIR)/registry

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
##           single node on this machine runs deploy/ (and the Helm chart) as Pods, the
##           image pushed to the node's registry by make image-push and pulled by the
##           kubelet by digest. Needs root; builds the node's binaries, bin/helm, bin/prometheus
##           and the pause image, installs the Debian packages when missing.
##           NODE_RUN=REGEXP runs only those test/node tests (and not test/cluster's)
##           The tests hold flock $(NODE_LOCK): the node's bridge and iptables chains are the
##           machine's, so a second run on the machine waits for the first instead of failing.
NODE_RUN ?=
NODE_LOCK ?= /tmp/node.lock
node-e2e: node-deps node-tools helm prometheus pause-image
	go vet -tags node ./test/cluster/ ./test/node/
	$(if $(NODE_RUN),,flock $(NODE_LOCK) go test -tags node -count=1 -v -run 'TestNode' ./test/cluster/)
	flock $(NODE_LOCK) go test -tags node -count=1 -p 1 -timeout 40m -v $(if $(NODE_RUN),-run '$(NODE_RUN)') ./test/node/

## ---- monitoring (issue 19): Prometheus for the alert tests ----
# Prometheus has a module of its own so its dependencies never enter go.mod.
PROM_DIR := hack/prometheus
PROM_MOD := $(PROM_DIR)/go.mod $(PROM_DIR)/go.sum
MONITORING := deploy/monitoring
.PHONY: prometheus promtool monitoring-test monitoring-rules

## prometheus: bin/prometheus, the server test/e2e's TestAlert* tests run (skipped when up to date)
prometheus: $(BIN_DIR)/prometheus

# $(PROM_DIR)/build-tags: remove_all_sd leaves out the cloud service
# discoveries (AWS, Azure, GCE, ...), which no test uses; enable_kubernetes_sd
# keeps Kubernetes', which the shipped scrape config uses (test/node's
# TestShippedScrapeConfig runs it). The cost in build time: docs/testing.md.
PROM_TAGS = $(shell cat $(PROM_DIR)/build-tags)
$(BIN_DIR)/prometheus: $(PROM_MOD) $(PROM_DIR)/build-tags
	cd $(PROM_DIR) && GOFLAGS=-mod=mod go build -tags $(PROM_TAGS) -o ../../$@ github.com/prometheus/prometheus/cmd/prometheus

## promtool: bin/promtool, from the same module and tags as bin/prometheus, for
##           `promtool test rules` over the shipped rules (skipped when up to date)
promtool: $(BIN_DIR)/promtool

$(BIN_DIR)/promtool: $(PROM_MOD) $(PROM_DIR)/build-tags
	cd $(PROM_DIR) && GOFLAGS=-mod=mod go build -tags $(PROM_TAGS) -o ../../$@ github.com/prometheus/prometheus/cmd/promtool

## monitoring-test: hack/prometheus's checks of deploy/monitoring with Prometheus's own parser:
##                  the rules load, every rule and dashboard query parses and names served metrics,
##                  `promtool test rules` over the shipped rules (bin/promtool), and every alert
##                  has promtool cases and a live test in test/e2e
monitoring-test: $(BIN_DIR)/promtool
	cd $(PROM_DIR) && GOFLAGS=-mod=mod go vet ./... && GOFLAGS=-mod=mod go test -count=1 ./...

## monitoring-rules: regenerate deploy/monitoring/prometheusrule.yaml's groups from prometheus/rules.yaml,
##                   and the chart's copies (make manifests)
monitoring-rules: manifests
	{ sed '/^spec:$$/q' $(MONITORING)/prometheusrule.yaml; grep -v '^#' $(MONITORING)/prometheus/rules.yaml | sed 's/^\(.\)/  \1/'; } > $(MONITORING)/prometheusrule.yaml.tmp
	mv $(MONITORING)/prometheusrule.yaml.tmp $(MONITORING)/prometheusrule.yaml

## ---- the mutation check (issue 29) ----
.PHONY: mutate mutate-check
## mutate: apply each deliberate breakage of hack/mutate/mutations.tsv to a scratch copy of
##         the repository and run the tests it names; fails when one is not caught (a test
##         assertion failing), its text is not found exactly once, or it does not build.
##         MUTATE_ONLY=REGEXP runs the lines whose id matches, MUTATE_SKIP=REGEXP leaves
##         those out. Lines in ./test/... start a
##         cluster and take flock /tmp/cluster.lock themselves. Needs what those tests need:
##         make tools prometheus promtool helm.
MUTATE_ONLY ?=
MUTATE_SKIP ?=
mutate:
	cd hack/mutate && go vet . && go test -count=1 . && go run . -root ../.. $(if $(MUTATE_ONLY),-only '$(MUTATE_ONLY)') $(if $(MUTATE_SKIP),-skip '$(MUTATE_SKIP)')

## mutate-check: only check that every line's text occurs exactly once (seconds, no test run)
mutate-check:
	cd hack/mutate && go run . -root ../.. -check

## ---- vulnerabilities (issue 30): govulncheck, offline ----
# The database comes from the module proxy: golang.org/x/vulndb's data/osv
# (OSV JSON files) at the version hack/vulncheck/vulndb.version pins, indexed
# into govulncheck's v1 layout by hack/vulncheck (docs/security.md).
VULN_DIR := hack/vulncheck
VULNDB_VERSION = $(shell cat $(VULN_DIR)/vulndb.version)
VULNDB_OUT := .local/vulndb
.PHONY: vulncheck vulncheck-test
## vulncheck: govulncheck over the module (and hack/image, which builds the image)
##            with the Go vulnerability database from the module proxy; exit 3 on a
##            reached finding that hack/vulncheck/accepted.tsv does not excuse (a gate
##            in make test)
vulncheck:
	@osv=$$(GOFLAGS= go mod download -json golang.org/x/vulndb@$(VULNDB_VERSION) | sed -n 's/^	"Dir": "\(.*\)",$$/\1/p')/data/osv && \
		cd $(VULN_DIR) && GOFLAGS=-mod=mod go run . -osv $$osv -out $(abspath $(VULNDB_OUT))
	cd $(VULN_DIR) && GOFLAGS=-mod=mod go run . gate -db $(abspath $(VULNDB_OUT)) -accepted accepted.tsv $(CURDIR) $(CURDIR)/hack/image

## vulncheck-test: hack/vulncheck's tests: the database built from vulndb flags
##                 golang.org/x/text v0.3.7 (GO-2022-1059) and not v0.3.8, and the
##                 gate fails on an unlisted finding and on an accepted one with a fix
vulncheck-test:
	cd $(VULN_DIR) && GOFLAGS=-mod=mod go vet ./... && GOFLAGS=-mod=mod go test -count=1 -timeout 20m ./...

## ---- the chart from a registry (issue 30) ----
.PHONY: chart-push
## chart-push: package charts/uuid-controller with its image defaulting to what the registry
##             tag $(IMG) names now, by digest (make image-push first), push it with
##             `helm push` to $(CHART_REPO) (oci://REGISTRY/PATH) as version $(CHART_VERSION),
##             sign it with SIGNING_KEY as the image is signed, and print the chart by digest.
##             Credentials: `helm registry login`; REGISTRY_CA=ca.crt as for image-push
CHART_DIR := charts/uuid-controller
CHART_REPO ?=
CHART_VERSION ?= $(shell sed -n 's/^version: //p' $(CHART_DIR)/Chart.yaml)
CHART_OUT := .local/chart
chart-push: $(BIN_DIR)/helm
	@test -n "$(CHART_REPO)" || { echo "chart-push: CHART_REPO=oci://REGISTRY/PATH is required" >&2; exit 1; }
	@set -e; ref=$$($(IMAGE_TOOL) digest $(REGISTRY_FLAGS) $(IMG)); \
	rm -rf $(CHART_OUT) && mkdir -p $(CHART_OUT) && cp -r $(CHART_DIR) $(CHART_OUT)/; \
	sed -i -e "s|^  repository: .*|  repository: $${ref%@*}|" -e "s|^  digest: \"\"|  digest: $${ref#*@}|" $(CHART_OUT)/uuid-controller/values.yaml; \
	grep -q "^  digest: $${ref#*@}" $(CHART_OUT)/uuid-controller/values.yaml || { echo "chart-push: could not set image.digest in values.yaml" >&2; exit 1; }; \
	$(BIN_DIR)/helm package --version $(CHART_VERSION) -d $(CHART_OUT) $(CHART_OUT)/uuid-controller >&2; \
	out=$$($(BIN_DIR)/helm push $(CHART_OUT)/uuid-controller-$(CHART_VERSION).tgz $(CHART_REPO) $(if $(REGISTRY_CA),--ca-file $(abspath $(REGISTRY_CA))) 2>&1) || { echo "$$out" >&2; exit 1; }; \
	echo "$$out" >&2; digest=$$(echo "$$out" | sed -n 's/^Digest: //p'); \
	test -n "$$digest" || { echo "chart-push: helm push printed no digest" >&2; exit 1; }; \
	chart=$$(echo $(CHART_REPO) | sed 's|^oci://||')/uuid-controller@$$digest; \
	$(if $(SIGNING_KEY),($(IMAGE_TOOL) sign $(REGISTRY_FLAGS) -key $(abspath $(SIGNING_KEY)) $$chart) >&2;) \
	echo "$$chart"

## ---- older Kubernetes minors (issue 42): the core e2e tests against each ----
# Each minor's etcd, kube-apiserver and kubectl come from hack/tools-<minor>, a
# module of its own (its k8s.io/kubernetes pin is the newest patch the module
# proxy serves; docs/install.md has the table), into bin/v<minor>/. The e2e
# framework takes that directory from KUBE_TEST_BIN_DIR (test/cluster).
# Not in `make test`: one cold apiserver costs minutes (docs/testing.md).
TEST_VERSIONS ?= 1.36 1.35 1.34
# The tests that cover what moved between minors: assignment and one write,
# both watch modes and the switch, the CRD check, the CEL transition rule, the
# kopf migration's admission policy, leader election, metrics authn/authz,
# the Roles-only install.
VERSIONS_TESTS := ^(TestExampleGetsUUID|TestAllNamespaces|TestUUIDIsStable|TestWatchMode|TestWatchFollowsTheCRD|TestUUIDCannotBeSwapped|TestCRDWithoutStatusSubresource|TestCRDReplacedByArticles|TestCRDSchemaPrunesUUID|TestKopfMigration|TestKopfMigrationPolicy|TestLeaderElection|TestMetricsAuth|TestMetricsWithoutReviewPermission|TestNamespacedInstall|TestMissingNamespaceRolesOnly|TestInstallManifests)$$
# The same with the narrowed watch's fallback, the full informer (UUID_WATCH=full).
VERSIONS_FULL_TESTS := ^(TestExampleGetsUUID|TestAllNamespaces|TestUUIDIsStable|TestWatchMode|TestUUIDCannotBeSwapped|TestKopfMigration|TestLeaderElection)$$
# The kubernetes version a minor's module pins, e.g. 1.34.4 (version ldflags,
# so the apiserver's /version and kubectl version say it rather than v0.0.0-master).
k8s_patch = $(shell sed -n 's/^	k8s.io\/kubernetes v\([0-9.]*\).*/\1/p' hack/tools-$(1)/go.mod)
k8s_ldflags = -X k8s.io/component-base/version.gitVersion=v$(call k8s_patch,$(1)) -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(word 2,$(subst ., ,$(1)))

define MINOR_TOOLS
$(BIN_DIR)/v$(1)/kube-apiserver $(BIN_DIR)/v$(1)/kubectl: hack/tools-$(1)/go.mod hack/tools-$(1)/go.sum
	cd hack/tools-$(1) && GOFLAGS=-mod=mod go build -ldflags "$$(call k8s_ldflags,$(1))" -o ../../$$@ k8s.io/kubernetes/cmd/$$(@F)

# etcd: the version the minor's kubernetes pins; a link to bin/etcd when it is hack/tools' own.
$(BIN_DIR)/v$(1)/etcd: hack/tools-$(1)/go.mod hack/tools-$(1)/go.sum $(TOOLS_MOD)
	@mkdir -p $$(@D); rm -f $$@
	@v=$$$$(cd hack/tools-$(1) && go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3); \
	cur=$$$$(cd $(TOOLS_DIR) && go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3); \
	if [ "$$$$v" = "$$$$cur" ]; then echo "etcd $$$$v: bin/etcd's"; ln -s ../etcd $$@; \
	else echo "etcd $$$$v (bin/etcd is $$$$cur)"; cd hack/tools-$(1) && GOFLAGS=-mod=mod go build -o ../../$$@ go.etcd.io/etcd/server/v3; fi

.PHONY: tools-$(1) test-version-$(1)
## tools-<minor>: bin/v<minor>/{etcd,kube-apiserver,kubectl} (skipped when up to date)
tools-$(1): $(BIN_DIR)/v$(1)/etcd $(BIN_DIR)/v$(1)/kube-apiserver $(BIN_DIR)/v$(1)/kubectl

## test-version-<minor>: the core e2e tests against that minor, narrowed and full watch
test-version-$(1): tools-$(1)
	KUBE_TEST_BIN_DIR=$(abspath $(BIN_DIR)/v$(1)) go test -count=1 -timeout 30m -v -run '$$(VERSIONS_TESTS)' ./test/e2e/
	KUBE_TEST_BIN_DIR=$(abspath $(BIN_DIR)/v$(1)) UUID_WATCH=full go test -count=1 -timeout 20m -v -run '$$(VERSIONS_FULL_TESTS)' ./test/e2e/
endef
$(foreach v,$(TEST_VERSIONS),$(eval $(call MINOR_TOOLS,$(v))))

.PHONY: test-versions
## test-versions: test-version-<minor> for each of $(TEST_VERSIONS) (not in make test)
test-versions: $(addprefix test-version-,$(TEST_VERSIONS))
