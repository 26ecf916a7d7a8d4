package v1alpha1

import (
	"crypto/sha256"
	"encoding/hex"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Labels the controller puts on the broker Pods, Jobs and Services it makes.
const (
	LabelConfiguration = "dowse.dev/configuration"
	LabelInstance      = "dowse.dev/instance"
	// LabelReachFromCloud ("true") on a Service with a selector gives it a
	// cloud-side Service reached over its Pods' nodes' links (see
	// Configuration.spec.reachFromCloud).
	LabelReachFromCloud = "dowse.dev/reach-from-cloud"
	LabelNode           = "dowse.dev/node"
	// LabelMapper marks a mapper Pod (value "true"), beside the labels of
	// a broker Pod.
	LabelMapper = "dowse.dev/mapper"
	// AnnotationSpecHash records the broker spec a Pod or Service was made
	// from, so a change of the Configuration rolls it.
	AnnotationSpecHash = "dowse.dev/spec-hash"
)

// LabelValue makes a name usable as a label value: names longer than the
// 63 characters a label value allows (Configuration and node names may be)
// are cut and given a hash suffix so they stay distinct.
func LabelValue(name string) string {
	if len(name) <= 63 {
		return name
	}
	sum := sha256.Sum256([]byte(name))
	return name[:46] + "-" + hex.EncodeToString(sum[:])[:16]
}

// NodeLabelPrefix starts the label each node that sees an Instance puts on
// it (NodeLabel), so that an agent can watch only its own node's Instances.
const NodeLabelPrefix = "nodes.dowse.dev/"

// NodeLabel is the label key node's agent states on every Instance whose
// status.nodes has node, with an empty value: the agent's cache selects on
// it, and so does `kubectl get instances -l nodes.dowse.dev/<node>`. A node
// name longer than the 63 characters a key's name allows is cut and given a
// hash suffix, as LabelValue does.
func NodeLabel(nodeName string) string { return NodeLabelPrefix + LabelValue(nodeName) }

// AgentFinalizer is the finalizer one node's agent keeps on a Configuration
// while it may hold Instances of it, so that deleting the Configuration
// waits for the node to release them. The controller removes it for a node
// that is gone.
func AgentFinalizer(nodeName string) string {
	name := nodeName
	if len(validation.IsQualifiedName("agent.dowse.dev/"+name)) > 0 {
		sum := sha256.Sum256([]byte(nodeName))
		name = "node-" + hex.EncodeToString(sum[:])[:32]
	}
	return "agent.dowse.dev/" + name
}
