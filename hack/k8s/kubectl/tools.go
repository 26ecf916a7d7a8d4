//go:build tools

// Package kubectl pins kubectl on the cluster binaries' Kubernetes version.
package kubectl

import _ "k8s.io/kubernetes/cmd/kubectl"
