#!/usr/bin/env bash
# Builds the test control plane (kube-apiserver from k8s.io/kubernetes, etcd)
# from the Go module proxy into bin/k8s/, once: no prebuilt Kubernetes
# release can be downloaded on our machines. Versions are pinned in
# hack/k8s/*/go.mod.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=$PWD/bin/k8s
mkdir -p "$OUT"
build() { # name dir package
  if [ -x "$OUT/$1" ]; then return; fi
  echo "building $1 (first time only; the API server takes about 7 minutes)" >&2
  (cd "hack/k8s/$2" && go build -ldflags="-s -w" -o "$OUT/$1.tmp" "$3")
  mv "$OUT/$1.tmp" "$OUT/$1"
}
build etcd etcd .
build kube-apiserver kube k8s.io/kubernetes/cmd/kube-apiserver
