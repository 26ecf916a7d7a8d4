#!/usr/bin/env bash
# Builds Helm from the Go module proxy into bin/helm, once: no Helm release
# can be downloaded on our machines. The version is pinned in
# hack/helm/go.mod and stamped into the binary as Helm's own Makefile does:
# its version (without it Helm reports only "v3.22") and the Kubernetes
# version `helm template` and `helm lint` assume (without it v1.20). A
# bin/helm built with other stamps is rebuilt (bin/helm.stamp holds them).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=$PWD/bin
mkdir -p "$OUT"
cd hack/helm
VERSION=$(go list -m -f '{{.Version}}' helm.sh/helm/v3)
K8S=$(go list -m -f '{{.Version}}' k8s.io/client-go) # v0.35.x is Kubernetes 1.35
K8S_MAJOR=$(( $(echo "$K8S" | cut -d. -f1 | tr -d v) + 1 ))
K8S_MINOR=$(echo "$K8S" | cut -d. -f2)
LDFLAGS="-s -w -X helm.sh/helm/v3/internal/version.version=$VERSION"
for p in pkg/lint/rules pkg/chartutil; do
  LDFLAGS="$LDFLAGS -X helm.sh/helm/v3/$p.k8sVersionMajor=$K8S_MAJOR -X helm.sh/helm/v3/$p.k8sVersionMinor=$K8S_MINOR"
done
if [ -x "$OUT/helm" ] && [ "$(cat "$OUT/helm.stamp" 2>/dev/null)" = "$LDFLAGS" ]; then
  exit 0
fi
echo "building helm $VERSION from the module proxy (first time only, 2 to 10 minutes)" >&2
start=$SECONDS
go build -trimpath -ldflags="$LDFLAGS" -o "$OUT/helm.tmp" helm.sh/helm/v3/cmd/helm
mv "$OUT/helm.tmp" "$OUT/helm"
echo "$LDFLAGS" >"$OUT/helm.stamp"
echo "built helm $VERSION in $((SECONDS - start))s" >&2
