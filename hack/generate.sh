#!/usr/bin/env bash
# Regenerates every generated file: protobuf Go, deepcopy, CRD YAML, apply
# configurations, the readings API's OpenAPI definitions, and the reference pages under docs/reference.
# Tool versions are pinned in hack/tools/go.mod.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
TOOLBIN=$ROOT/bin/tools
mkdir -p "$TOOLBIN"
for t in google.golang.org/protobuf/cmd/protoc-gen-go google.golang.org/grpc/cmd/protoc-gen-go-grpc sigs.k8s.io/controller-tools/cmd/controller-gen k8s.io/kube-openapi/cmd/openapi-gen; do
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
# The live readings API's OpenAPI definitions (its kinds and the
# meta/v1 ones they use), which its server publishes at /openapi/v2 and
# /openapi/v3 for the API server's aggregator (kubectl explain). The API
# rule report lists the violations of apimachinery's own types; a new one
# shows as a change of the list.
"$TOOLBIN/openapi-gen" --output-dir internal/controller/link/readings/openapi \
  --output-pkg github.com/dowse-dev/dowse/internal/controller/link/readings/openapi \
  --output-file zz_generated.openapi.go --go-header-file hack/boilerplate.go.txt \
  --report-filename internal/controller/link/readings/openapi/api-rule-violations.list \
  k8s.io/apimachinery/pkg/apis/meta/v1 k8s.io/apimachinery/pkg/runtime k8s.io/apimachinery/pkg/version \
  ./shared/api/readings/v1alpha1
# The reference pages (CRD fields, dowsectl's commands, chart values), from
# the CRDs just written, dowsectl's command tree and the chart's values
# schema.
go run ./hack/docgen -out docs/reference
