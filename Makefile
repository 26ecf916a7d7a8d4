# Dowse build. The two commands a person needs: `make demo` and `make test`.
SHELL := /bin/bash
BIN := $(CURDIR)/bin
GO_TEST_FLAGS ?= -count=1 -timeout 30m
# Every binary's --version (internal/version) and the images' labels.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
# grpcnotrace leaves out gRPC's golang.org/x/net/trace (and the html/template
# it links), which no Dowse binary turns on: 2.5 MB less in each mapper.
GO_TAGS := grpcnotrace
# go_build is the one go build of Dowse's binaries, stamped with the version
# $(1).
go_build = go build -tags $(GO_TAGS) -trimpath -ldflags="-s -w -X github.com/dowse-dev/dowse/internal/version.version=$(1)"

# Dowse's binaries, listed once: every main package under a cmd/ folder
# named dowse-* or dowsectl, outside test/. go list runs on first use only
# (not for `make test-unit`), then the list is kept.
CMDS = $(eval CMDS := $(shell go list -f '{{if eq .Name "main"}}{{.ImportPath}}{{end}}' ./... | grep -E '/cmd/(dowse-|dowsectl$$)' | grep -v '/test/'))$(CMDS)
# The images: every command but dowsectl, which runs on a person's machine.
IMAGE_CMDS = $(filter-out %/dowsectl,$(CMDS))
# Built static by `make build` too, as in their images (no libc pages in
# their memory): the agent and the mappers. dowsectl too: k8s.io/cli-runtime
# links kustomize, whose plugin loader imports Go's plugin package, and with
# cgo the linker then exports every symbol (69 MB instead of 53). The rest
# keep cgo there (the udev handler's libudev source).
STATIC_CMDS = $(filter %/dowse-agent %-mapper %/dowsectl,$(CMDS))

# The files `make generate` writes, which verify-generate checks.
GENERATED := proto shared/api deploy internal/controller/brokers/zz_generated.deepcopy.go internal/controller/link/readings/openapi docs/reference

.PHONY: all build images release peers helm generate verify-generate test fuzz test-unit test-integration test-node node-deps bench soak demo k8s konnectivity deps docs clean

all: build

# Debian packages the build and tests need (protoc), installed when missing.
deps:
	@hack/install-deps.sh

build:
	@mkdir -p $(BIN)
	@echo "building Dowse's binaries into bin/ (about 3 minutes the first time, seconds after)"
	$(call go_build,$(VERSION)) -o $(BIN)/ $(filter-out $(STATIC_CMDS),$(CMDS))
	CGO_ENABLED=0 $(call go_build,$(VERSION)) -o $(BIN)/ $(STATIC_CMDS)

# Test cluster binaries built from the module proxy, once each: the control
# plane (etcd, kube-apiserver, controller manager, scheduler) and the node
# (kubelet, containerd, its runc shim, ctr) into bin/k8s/.
k8s:
	@hack/build-k8s.sh

# konnectivity's proxy-server and proxy-agent into bin/k8s/, which the
# streams bench compares the link's egress with (bench only).
konnectivity:
	@hack/build-k8s.sh konnectivity

# Helm built from the module proxy into bin/helm, once (version pinned in
# hack/helm/go.mod): the chart's tests and `make generate` use it.
helm:
	@hack/build-helm.sh

# Debian's runc for the test node, installed when missing.
node-deps:
	@hack/install-node-deps.sh

# OCI image archives bin/images/<name>.tar (ghcr.io/dowse-dev/<name>:latest,
# as deploy/ names them), made with go-containerregistry (hack/images) of every Dowse binary, built static because an image
# holds nothing but the binary, plus the pause image of the test node's pods.
images:
	@mkdir -p $(BIN)/static
	@echo "building static binaries and their images into bin/images with go-containerregistry (about 3 minutes the first time, half a minute after)"
	CGO_ENABLED=0 $(call go_build,$(VERSION)) -o $(BIN)/static/ $(IMAGE_CMDS) ./hack/images/dowse-pause
	go run ./hack/images -out $(BIN)/images -version $(VERSION) $(BIN)/static/dowse-pause $(addprefix $(BIN)/static/,$(notdir $(IMAGE_CMDS)))

# A release into bin/release: every image for linux/amd64 and linux/arm64
# (static cross-compiled binaries; the udev handler's netlink source needs no
# cgo) as one image index each, in the OCI image layout bin/release/oci,
# tagged RELEASE_VERSION; images.txt listing them; and the chart packaged
# with helm, its version, appVersion and so its default image tag the same.
# Push with `go run ./hack/images push -registry <registry>/<owner>` and
# `bin/helm push bin/release/dowse-<version>.tgz oci://<registry>/<owner>`.
# RELEASE_VERSION is SemVer: a tag vX.Y.Z as X.Y.Z, else 0.1.0-dev.<commit>.
RELEASE_VERSION ?= $(shell hack/release-version.sh)
RELEASE_PLATFORMS ?= linux/amd64 linux/arm64
RELEASE_DIR ?= $(BIN)/release
# Every image's command by default (test/suites/release builds two).
RELEASE_CMDS ?= $(IMAGE_CMDS)
release: helm
	@echo "building release $(RELEASE_VERSION) for $(RELEASE_PLATFORMS) into $(RELEASE_DIR)"
	@rm -rf $(RELEASE_DIR) && mkdir -p $(RELEASE_DIR)
	@set -e; for p in $(RELEASE_PLATFORMS); do \
	    echo "  go build for $$p"; \
	    CGO_ENABLED=0 GOOS=$${p%/*} GOARCH=$${p#*/} $(call go_build,$(RELEASE_VERSION)) \
	      -o $(RELEASE_DIR)/bin/$${p%/*}-$${p#*/}/ $(RELEASE_CMDS); \
	  done; \
	  go run ./hack/images release -out $(RELEASE_DIR) -bindir $(RELEASE_DIR)/bin -version $(RELEASE_VERSION) \
	    -platforms "$$(echo $(RELEASE_PLATFORMS) | tr ' ' ',')" $(notdir $(RELEASE_CMDS))
	$(BIN)/helm package deploy/helm/dowse --version $(RELEASE_VERSION) --app-version $(RELEASE_VERSION) -d $(RELEASE_DIR)

# Regenerates protobuf Go, deepcopy and CRD YAML with the pinned tools, the
# reference pages under docs/reference, then the chart's crds/ and the
# manifests under deploy/ rendered from the chart.
generate: deps helm
	@hack/generate.sh
	@hack/render-deploy.sh

# Fails when the committed generated files differ from what `make generate` makes.
verify-generate: generate
	@if [ -n "$$(git status --porcelain -- $(GENERATED))" ]; then \
	  git status --porcelain -- $(GENERATED); git diff --stat -- $(GENERATED); \
	  echo "generated files are stale: run 'make generate' and commit the result" >&2; exit 1; fi

test-unit:
	go vet ./...
	go test $(GO_TEST_FLAGS) $$(go list ./... | grep -v /test/)

test-integration: k8s helm build
	go test $(GO_TEST_FLAGS) ./test/...

# The real-node tier alone (test/framework/cluster): needs root and runc; about half a
# minute once the binaries are built. `make test` runs it too, within ./...
test-node: k8s node-deps
	go test $(GO_TEST_FLAGS) -v ./test/suites/node/

# Real protocol peers built from the module proxy (go2rtc for ONVIF).
peers:
	@hack/build-go2rtc.sh

# Everything CI runs: generated code check, lint, unit and integration
# tests under the race detector, the node tier and a short fuzz run.
# PLAIN_TEST_PKGS (kept out of the -race run's list) run without it: the
# real kubelet and containerd (test/suites/node) and `make release` (test/suites/release)
# do their work in other processes, where the detector would see nothing.
PLAIN_TEST_PKGS := ./test/suites/node ./test/suites/release
test: deps node-deps k8s helm peers build verify-generate
	go vet ./...
	$(MAKE) lint
	go test $(GO_TEST_FLAGS) -race $$(go list ./... | grep -v -E '/test/suites/(node|release)$$')
	go test $(GO_TEST_FLAGS) $(PLAIN_TEST_PKGS)
	$(MAKE) fuzz FUZZTIME=10000x

# Fuzz what comes from outside, each target for FUZZTIME (make test: 10,000
# inputs each): the link's frames, derived names, Device specs into the
# edge (Check), the edge's conversion for mappers, DMI reports and mapper
# registrations into the agent, the JSON pushMethod sinks send,
# handlers' device lists, and what Modbus devices and SNMP agents answer.
# Minimizing a new input (60 s by default) would stall a short run; 1 s
# keeps it fuzzing (a failing input is kept under the package's
# testdata/fuzz).
# make test counts inputs (10000x) instead of timing the run: Go 1.26's fuzz
# coordinator can fail a timed run at its deadline with a bare "context
# deadline exceeded" and no failing input (golang/go#75804, fixed in Go
# 1.27); a count has no deadline to race.
FUZZ_TARGETS := FuzzFrameDecode:./internal/link FuzzDerivedNames:./internal/dra FuzzCheck:./internal/controller/link/twins \
  FuzzDeviceConversion:./internal/agent/dmi FuzzReports:./internal/agent/dmi FuzzMapperRegister:./internal/agent/dmi FuzzPayload:./mappers/mapper FuzzHandlerDevices:./internal/agent/discovery \
  FuzzParseMessage:./discovery-handlers/onvif/wsdiscovery FuzzDeviceAnswers:./internal/onvifclient FuzzReportShapes:./internal/controller/link/twins FuzzRequests:./internal/controller/link/linkauth FuzzDesiredBody:./internal/dowsectl/console FuzzChallenge:./internal/onvifclient FuzzStoreRecords:./internal/agent/edgehub \
  FuzzAnswers:./mappers/modbus FuzzDeviceIdentification:./discovery-handlers/modbus FuzzStreamFrames:./internal/link \
  FuzzAnswer:./discovery-handlers/snmp FuzzResponses:./mappers/snmp FuzzPacket:./discovery-handlers/mdns \
  FuzzPayload:./internal/sparkplug FuzzArray:./internal/sparkplug FuzzDataSet:./internal/sparkplug FuzzMessages:./discovery-handlers/mqtt FuzzPushes:./mappers/mqtt
FUZZTIME ?= 2m
fuzz:
	@for t in $(FUZZ_TARGETS); do \
	  echo "go test -run='^$$' -fuzz='^$${t%%:*}$$' -fuzztime=$(FUZZTIME) $${t#*:}"; \
	  go test -run='^$$' -fuzz="^$${t%%:*}$$" -fuzztime=$(FUZZTIME) -fuzzminimizetime=1s $${t#*:} || exit 1; \
	done

# Benchmarks: discovery latency, apply rate, idle requests, peak RSS; the
# controller's broker rate and memory; device-plugin registration and
# Allocate latency on the real node (root only); the cloud/edge link's idle
# connections, throughput and latency (WebSocket and QUIC); the Modbus
# mapper's read rates, write and report latencies and memory (jsmodbus peer).
bench: k8s konnectivity build
	go run ./test/bench/discovery
	go run ./test/bench/dra
	go run ./test/bench/isolation
	go run ./test/bench/controller
	@if [ "$$(id -u)" = 0 ]; then go run ./test/bench/deviceplugin; else echo "bench/deviceplugin skipped: it runs a kubelet, which needs root"; fi
	go run ./test/bench/link
	go run ./test/bench/streams
	go run ./test/bench/replicas
	go run ./test/bench/replicas -budget
	go run ./test/bench/replicas -readings
	go run ./test/bench/mapper
	go test -run '^$$' -bench MQTTSink -benchtime 50000x ./mappers/mapper/
	go test -run '^$$' -bench . -benchtime 2s ./internal/agent/edgehub/
	go test -run '^$$' -bench . -benchtime 3000x ./test/suites/link/
	go test -run '^$$' -bench 'Twins|ModbusTwin|KubeEdgeMapperTwin' -benchtime 1x ./test/suites/e2e/
	go test -run '^$$' -bench NodeReconnects -benchtime 1x ./test/suites/nodeapi/

# The soak (test/suites/e2e TestSoak): the e2e fleet under load for
# SOAK_DURATION (make test runs it for 5 minutes) while a fault schedule
# kills each kind of Dowse process with -9, restarts the API server and
# etcd, cuts links and partitions a node; checks that nothing goes back or
# goes missing, that everything converges after each fault and that no
# process's memory, goroutines or open files keep growing. Its HTML report
# goes to SOAK_REPORT (a file, or a directory to hold soak.html; default: a
# temporary directory the log names).
# Then the soak's real-node part (test/suites/node TestSoakOnNode: the
# chart, broker Pods holding device slots, a twin pushing to a sink, each
# kind of Dowse process killed with -9 in rounds) for SOAK_DURATION too;
# make test runs one round of it.
SOAK_DURATION ?= 1h
soak: k8s build helm node-deps
	SOAK_DURATION=$(SOAK_DURATION) SOAK_REPORT=$(SOAK_REPORT) go test -count=1 -timeout 0 -v -run '^TestSoak$$' ./test/suites/e2e/
	SOAK_DURATION=$(SOAK_DURATION) go test -count=1 -timeout 0 -v -run '^TestSoakOnNode$$' ./test/suites/node/

# Local demo: a twin (a desired setpoint moves the demo's Modbus controller,
# the readings come back reported), live Instances, and on a root machine
# with runc a broker pod given its device through the device plugin and CDI.
# There Dowse runs as the Helm chart's pods on a real one-node cluster;
# elsewhere as processes beside an API server. DEMO_FLAGS=--tutorial starts
# the cluster docs/tutorials are written for and shows nothing.
demo: k8s helm build
	@hack/install-node-deps.sh || echo "runc unavailable: the demo runs without a real node"
	go run ./hack/demo $(DEMO_FLAGS)

# The documentation site (mkdocs.yml, docs/) into bin/site, built strict:
# a broken link, a warning or a page missing from the nav fails it
# (test/suites/docs runs the same build in make test).
docs:
	@hack/docs.sh bin/site

# golangci-lint (.golangci.yml), pinned in its own tools module
# (hack/tools/lint: its dependencies would clash with controller-gen's), and
# the structured-logging rules it has no linter for (hack/lint-logs.sh).
LINT := $(BIN)/tools/golangci-lint
$(LINT): hack/tools/lint/go.mod hack/tools/lint/go.sum
	@mkdir -p $(BIN)/tools
	cd hack/tools/lint && go build -o $(LINT) github.com/golangci/golangci-lint/v2/cmd/golangci-lint

.PHONY: lint
lint: $(LINT)
	$(LINT) run --allow-parallel-runners ./...
	hack/lint-logs.sh

clean:
	rm -rf $(BIN)
