package cluster

import "github.com/dowse-dev/dowse/shared/api/v1alpha1"

// OnHostNetwork puts the Pods a Configuration has the controller run (its
// broker Pods, broker Jobs and mapper Pods) on the node's network, for a
// node started without Options.PodNetwork. The samples assume a pod
// network, as real clusters have; the demo and the tests on a node without
// one call this after reading a sample.
func OnHostNetwork(cfg *v1alpha1.Configuration) {
	if b := cfg.Spec.BrokerSpec; b != nil {
		if b.BrokerPodSpec != nil {
			b.BrokerPodSpec.HostNetwork = true
		}
		if b.BrokerJobSpec != nil {
			b.BrokerJobSpec.Template.Spec.HostNetwork = true
		}
	}
	if d := cfg.Spec.DeviceTemplate; d != nil && d.MapperPodSpec != nil {
		d.MapperPodSpec.HostNetwork = true
	}
}
