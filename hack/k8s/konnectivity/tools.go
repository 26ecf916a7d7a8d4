//go:build tools

// Package konnectivity pins konnectivity (apiserver-network-proxy) for the
// streams bench's comparison: hack/build-k8s.sh builds its proxy-server
// and proxy-agent commands from the module proxy into bin/k8s, as it builds
// the test cluster's binaries.
package konnectivity

import (
	_ "sigs.k8s.io/apiserver-network-proxy/cmd/agent"
	_ "sigs.k8s.io/apiserver-network-proxy/cmd/server"
)
