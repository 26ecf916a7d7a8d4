// Package crds holds Dowse's CustomResourceDefinitions as controller-gen
// writes them (make generate), embedded so that the controller's binary
// can bring a cluster's CRDs up to date (dowse-controller apply-crds, the
// chart's pre-install and pre-upgrade hook) with exactly the definitions
// it was built with.
package crds

import "embed"

// FS holds the CRD YAML files, one per kind.
//
//go:embed *.yaml
var FS embed.FS
