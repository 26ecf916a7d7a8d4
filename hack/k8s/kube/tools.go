//go:build tools

// Package kube pins the Kubernetes commands the test cluster needs: the API
// server for envtest, and the kubelet, scheduler and controller manager for
// the single real node of test/framework/cluster, and kube-proxy for its pod network. One module keeps them on one
// k8s.io/kubernetes version so they build from one shared cache.
package kube

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
