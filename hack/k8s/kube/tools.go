//go:build tools

// Package kube pins the Kubernetes commands the test control plane needs.
package kube

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
)
