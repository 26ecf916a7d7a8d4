#!/usr/bin/env bash
# Regenerates every generated file: protobuf Go, deepcopy, CRD YAML, apply
# configurations, and the reference pages under docs/reference.
# Tool versions are pinned in hack/tools/go.mod.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
TOOLBIN=$ROOT/bin/tools
mkdir -p "$TOOLBIN"
for t in google.golang.org/protobuf/cmd/protoc-gen-go google.golang.org/grpc/cmd/protoc-gen-go-grpc sigs.k8s.io/controller-tools/cmd/controller-gen; do
  (cd hack/tools && go build -o "$TOOLBIN/" "$t")
done
command -v protoc >/dev/null || { echo "protoc missing: run hack/install-deps.sh (Debian protobuf-compiler)" >&2; exit 1; }

(cd proto && PATH=$TOOLBIN:$PATH protoc -I . \
  --go_out=. --go_opt=paths=source_relative \
  --go-grpc_out=. --go-grpc_opt=paths=source_relative \
  discovery/v1/discovery.proto discovery/v0/discovery.proto link/v1/link.proto dmi/v1beta1/dmi.proto dmi/v1beta1/dmi_services.proto mapper/v1/mapper.proto)

"$TOOLBIN/controller-gen" object:headerFile=hack/boilerplate.go.txt paths=./shared/api/...
"$TOOLBIN/controller-gen" object:headerFile=hack/boilerplate.go.txt paths=./internal/controller/brokers/...
"$TOOLBIN/controller-gen" crd paths=./shared/api/... output:crd:artifacts:config=deploy/crds
# Apply configurations for server-side apply; removed first, as the
# generator leaves the files of types that are gone.
rm -rf shared/api/v1alpha1/applyconfiguration
"$TOOLBIN/controller-gen" applyconfiguration paths=./shared/api/...
# The reference pages (CRD fields, dowsectl's commands, chart values), from
# the CRDs just written, dowsectl's command tree and the chart's values
# schema.
go run ./hack/docgen -out docs/reference
