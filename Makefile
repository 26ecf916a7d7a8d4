# Dowse build. The two commands a person needs: `make demo` and `make test`.
SHELL := /bin/bash
BIN := $(CURDIR)/bin
GO_TEST_FLAGS ?= -count=1 -timeout 30m

.PHONY: all build generate verify-generate test test-unit test-integration bench demo k8s deps clean

all: build

# Debian packages the build and tests need (protoc), installed when missing.
deps:
	@hack/install-deps.sh

build:
	@mkdir -p $(BIN)
	go build -trimpath -ldflags="-s -w" -o $(BIN)/ ./agent/cmd/dowse-agent ./discovery-handlers/debug-echo/cmd/dowse-debug-echo-discovery

# Test control plane (kube-apiserver, etcd) built from the module proxy, once.
k8s:
	@hack/build-k8s.sh

# Regenerates protobuf Go, deepcopy and CRD YAML with the pinned tools.
generate: deps
	@hack/generate.sh

# Fails when the committed generated files differ from what `make generate` makes.
verify-generate: generate
	@if [ -n "$$(git status --porcelain -- proto shared/api deploy/crds)" ]; then \
	  git status --porcelain -- proto shared/api deploy/crds; git diff --stat -- proto shared/api deploy/crds; \
	  echo "generated files are stale: run 'make generate' and commit the result" >&2; exit 1; fi

test-unit:
	go vet ./...
	go test $(GO_TEST_FLAGS) $$(go list ./... | grep -v /test/)

test-integration: k8s build
	go test $(GO_TEST_FLAGS) ./test/...

# Everything CI runs: generated code check, unit and integration tests.
test: deps k8s build verify-generate
	go vet ./...
	go test $(GO_TEST_FLAGS) ./...

# Benchmarks: discovery latency, apply rate, idle requests, peak RSS.
bench: k8s build
	go run ./test/bench/discovery

# Local demo: control plane, agent, debug-echo handler, live Instances.
demo: k8s build
	go run ./hack/demo

clean:
	rm -rf $(BIN)
