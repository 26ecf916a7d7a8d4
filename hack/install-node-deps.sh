#!/usr/bin/env bash
# Installs what the real test node (test/framework/cluster) needs from Debian, when
# missing: runc, the OCI runtime containerd's shim starts, and for the node's
# pod network the CNI plugins (bridge, host-local, loopback), nftables (the
# rules kube-proxy writes) and iptables (the bridge plugin's masquerade).
# Everything else of the node is built from the Go module proxy by
# hack/build-k8s.sh.
set -euo pipefail
need=()
command -v runc >/dev/null || need+=(runc)
[ -x /usr/lib/cni/bridge ] || need+=(containernetworking-plugins)
command -v nft >/dev/null || [ -x /usr/sbin/nft ] || need+=(nftables)
command -v iptables >/dev/null || [ -x /usr/sbin/iptables ] || need+=(iptables)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then echo "please install: ${need[*]} (apt-get install ${need[*]})" >&2; exit 1; fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
fi
