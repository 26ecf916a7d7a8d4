#!/usr/bin/env bash
# Builds the test cluster's binaries from the Go module proxy into bin/k8s/,
# once each: no prebuilt Kubernetes or containerd release can be downloaded on
# our machines. The control plane (etcd, kube-apiserver) is what envtest needs;
# the node (kubelet, scheduler, controller manager, kube-proxy, containerd,
# its runc shim, ctr) is what test/framework/cluster needs; kubectl runs dowsectl as a plugin in
# test/suites/cli. Versions are pinned in hack/k8s/*/go.mod.
# Builds run one after another: our machines have two cores.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=$PWD/bin/k8s
mkdir -p "$OUT"
build() { # name dir package about [env...]
  local name=$1 dir=$2 pkg=$3 about=$4; shift 4
  if [ -x "$OUT/$name" ]; then return; fi
  echo "building $name from the Go module proxy into bin/k8s (first time only, about $about on two cores)" >&2
  local start=$SECONDS
  (cd "hack/k8s/$dir" && env "$@" go build -trimpath -ldflags="-s -w ${XFLAGS:-}" ${TAGS:+-tags "$TAGS"} -o "$OUT/$name.tmp" "$pkg")
  mv "$OUT/$name.tmp" "$OUT/$name"
  echo "built $name in $((SECONDS - start))s" >&2
}
# `konnectivity`: only konnectivity's (apiserver-network-proxy)
# proxy-server and proxy-agent, which the streams bench compares the egress
# through a node's link with (make bench); the tests need neither.
if [ "${1:-}" = konnectivity ]; then
  build proxy-server konnectivity sigs.k8s.io/apiserver-network-proxy/cmd/server "1 to 2 minutes" CGO_ENABLED=0
  build proxy-agent konnectivity sigs.k8s.io/apiserver-network-proxy/cmd/agent "a minute" CGO_ENABLED=0
  exit 0
fi
build etcd etcd . "30 s"
# Stamp the release version, as Kubernetes' own build does: without it every
# component (and the Node's kubeletVersion) reports v0.0.0-master.
KUBE_VERSION=$(cd hack/k8s/kube && go list -m -f '{{.Version}}' k8s.io/kubernetes)
KUBE_MINOR=$(echo "$KUBE_VERSION" | cut -d. -f2)
v=k8s.io/component-base/version
XFLAGS="-X $v.gitVersion=$KUBE_VERSION -X $v.gitMajor=1 -X $v.gitMinor=$KUBE_MINOR -X $v.gitTreeState=clean"
# The first one downloads and compiles most of Kubernetes; the others reuse it.
about="5 to 7 minutes"
for cmd in kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy; do
  XFLAGS=$XFLAGS build $cmd kube k8s.io/kubernetes/cmd/$cmd "$about"
  about="1 to 2 minutes"
done
# kubectl in a module of its own (its kustomize must not move the others'
# dependencies); Debian's kubectl is 1.20.
XFLAGS=$XFLAGS build kubectl kubectl k8s.io/kubernetes/cmd/kubectl "1 to 3 minutes"
# containerd static and without the snapshotters that need C libraries; the
# test node uses overlayfs (or native) only.
TAGS="no_btrfs no_devmapper no_zfs" build containerd containerd github.com/containerd/containerd/v2/cmd/containerd "a minute" CGO_ENABLED=0
TAGS="no_btrfs no_devmapper no_zfs" build containerd-shim-runc-v2 containerd github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 "20 s" CGO_ENABLED=0
TAGS="no_btrfs no_devmapper no_zfs" build ctr containerd github.com/containerd/containerd/v2/cmd/ctr "20 s" CGO_ENABLED=0
