//go:build tools

// Package helm pins the Helm used to lint, render and test the chart in
// deploy/helm/dowse: no Helm release can be downloaded on our machines, but
// helm.sh/helm/v3 builds from the module proxy. It is its own module so that
// Helm's dependencies stay out of the root go.mod.
package helm

import (
	_ "helm.sh/helm/v3/cmd/helm"
)
