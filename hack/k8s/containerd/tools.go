//go:build tools

// Package containerd pins the container runtime of the test node: containerd
// v2.4 (CDI always on, which Debian's 1.6 lacks), its runc shim, and ctr. It is
// its own module so that containerd's dependencies stay out of the root go.mod.
package containerd

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
