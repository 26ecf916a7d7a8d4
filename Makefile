# Dowse build. `make demo` and `make test` are the two commands a person needs.
SHELL := /bin/bash
BIN := $(CURDIR)/bin
TOOLS := go tool -modfile=$(CURDIR)/hack/tools/go.mod
BINARIES := dowse-agent dowse-debug-echo-discovery

.PHONY: all build generate verify-generate test test-unit test-integration bench demo k8s clean deps

all: build

build:
	@mkdir -p $(BIN)
	go build -o $(BIN)/dowse-agent ./agent/cmd/dowse-agent
	go build -o $(BIN)/dowse-debug-echo-discovery ./discovery-handlers/debug-echo/cmd/dowse-debug-echo-discovery

# Debian packages the build and tests need (protoc for `make generate`).
deps:
	@hack/install-deps.sh

generate: deps
	cd proto && protoc -I . \
	  --plugin=protoc-gen-go=<(true) \
	  --go_out=. --go_opt=paths=source_relative \
	  --go-grpc_out=. --go-grpc_opt=paths=source_relative \
	  discovery/v1/discovery.proto discovery/v0/discovery.proto
