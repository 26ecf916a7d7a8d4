package v1alpha1

import (
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ConfigurationSpec says which devices to discover and what to run for each.
type ConfigurationSpec struct {
	// DiscoveryHandler names the handler that discovers the devices and what
	// it needs to know.
	// +required
	DiscoveryHandler DiscoveryHandlerSpec `json:"discoveryHandler"`

	// Capacity is how many pods may use one device at once, across all nodes.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	Capacity int32 `json:"capacity,omitempty"`

	// Allocation says how pods are given this Configuration's devices:
	// DevicePlugin (the default) through the agents' kubelet device plugins
	// and the extended resources dowse.dev/<instance>.<namespace> and
	// dowse.dev/<configuration>.<namespace>; DRA through Dynamic Resource Allocation (a
	// DeviceClass named <configuration>.<namespace>.dowse.dev and
	// ResourceSlices of driver dowse.dev, pods asking by ResourceClaim);
	// Both offers each device both ways, for moving a cluster from one to
	// the other. With Both each way counts capacity on its own, so a device
	// can be used by up to twice its capacity at once.
	// +optional
	// +kubebuilder:default=DevicePlugin
	// +kubebuilder:validation:Enum=DevicePlugin;DRA;Both
	Allocation Allocation `json:"allocation,omitempty"`

	// BrokerSpec is the workload the controller runs for each device.
	// +optional
	BrokerSpec *BrokerSpec `json:"brokerSpec,omitempty"`

	// InstanceServiceSpec, when set, gives each Instance a Service that
	// selects its brokers.
	// +optional
	// +kubebuilder:validation:Schemaless
	// +kubebuilder:validation:Type=object
	// +kubebuilder:pruning:PreserveUnknownFields
	InstanceServiceSpec *corev1.ServiceSpec `json:"instanceServiceSpec,omitempty"`

	// ReachFromCloud makes the Instance and Configuration Services
	// reachable from the cloud side too (label dowse.dev/reach-from-cloud):
	// each gets a Service of its name and "-cloud" whose endpoints are the
	// controller replicas, which relay its connections to the brokers over
	// their nodes' links (edge nodes behind NAT included). Needs the
	// controller's --cloud-service-ports (chart: link.cloudServices).
	// +optional
	ReachFromCloud bool `json:"reachFromCloud,omitempty"`

	// ConfigurationServiceSpec, when set, gives the Configuration one Service
	// that selects all of its brokers.
	// +optional
	// +kubebuilder:validation:Schemaless
	// +kubebuilder:validation:Type=object
	// +kubebuilder:pruning:PreserveUnknownFields
	ConfigurationServiceSpec *corev1.ServiceSpec `json:"configurationServiceSpec,omitempty"`

	// DeviceTemplate, when set, gives every Instance of the Configuration a
	// Device of the same name: a twin the controller keeps in step with the
	// Instance (and deletes with it).
	// +optional
	DeviceTemplate *DeviceTemplate `json:"deviceTemplate,omitempty"`

	// BrokerProperties are added to every Instance's broker properties; a
	// device property of the same name wins.
	// +optional
	BrokerProperties map[string]string `json:"brokerProperties,omitempty"`
}

// Allocation is how pods are given a Configuration's devices.
type Allocation string

// The Allocation values.
const (
	AllocationDevicePlugin Allocation = "DevicePlugin"
	AllocationDRA          Allocation = "DRA"
	AllocationBoth         Allocation = "Both"
)

// UsesDRA says whether the Configuration's devices are offered through
// Dynamic Resource Allocation.
func (s *ConfigurationSpec) UsesDRA() bool {
	return s.Allocation == AllocationDRA || s.Allocation == AllocationBoth
}

// UsesDevicePlugins says whether the Configuration's devices are offered
// through kubelet device plugins (the default, also when Allocation is
// empty, as in objects written before the field existed).
func (s *ConfigurationSpec) UsesDevicePlugins() bool {
	return s.Allocation != AllocationDRA
}

// DiscoveryHandlerSpec selects a discovery handler and configures it.
type DiscoveryHandlerSpec struct {
	// Name of the registered discovery handler, e.g. "onvif" or "debug-echo".
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`

	// DiscoveryDetails is the handler's own settings (filters, timeouts),
	// passed to it as JSON. Each handler documents and validates its shape.
	// +optional
	DiscoveryDetails *apiextensionsv1.JSON `json:"discoveryDetails,omitempty"`

	// DiscoveryProperties are named values the agent resolves (from literals,
	// ConfigMaps or Secrets) and hands to the handler, e.g. credentials.
	// +optional
	// +listType=map
	// +listMapKey=name
	DiscoveryProperties []DiscoveryProperty `json:"discoveryProperties,omitempty"`
}

// DiscoveryProperty is one named value for the handler: a literal or a
// reference. Exactly one of value and valueFrom is set.
// +kubebuilder:validation:XValidation:rule="has(self.value) != has(self.valueFrom)",message="exactly one of value and valueFrom must be set"
type DiscoveryProperty struct {
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// +optional
	Value *string `json:"value,omitempty"`
	// +optional
	ValueFrom *DiscoveryPropertySource `json:"valueFrom,omitempty"`
}

// DiscoveryPropertySource is a reference to a ConfigMap or Secret key.
// +kubebuilder:validation:XValidation:rule="has(self.configMapKeyRef) != has(self.secretKeyRef)",message="exactly one of configMapKeyRef and secretKeyRef must be set"
type DiscoveryPropertySource struct {
	// +optional
	ConfigMapKeyRef *ObjectKeyRef `json:"configMapKeyRef,omitempty"`
	// +optional
	SecretKeyRef *ObjectKeyRef `json:"secretKeyRef,omitempty"`
}

// ObjectKeyRef names one key of a ConfigMap or Secret.
type ObjectKeyRef struct {
	// +required
	// +kubebuilder:validation:MinLength=1
	Name string `json:"name"`
	// Namespace defaults to the Configuration's namespace.
	// +optional
	Namespace string `json:"namespace,omitempty"`
	// +required
	// +kubebuilder:validation:MinLength=1
	Key string `json:"key"`
	// Optional lets discovery go on without the value when the object or key
	// is missing.
	// +optional
	Optional bool `json:"optional,omitempty"`
}

// BrokerSpec is the workload deployed next to each device: a Pod per node
// that sees it, or a Job per Instance. Exactly one is set.
// +kubebuilder:validation:XValidation:rule="!(has(self.brokerPodSpec) && has(self.brokerJobSpec))",message="brokerPodSpec and brokerJobSpec are exclusive"
type BrokerSpec struct {
	// +optional
	// +kubebuilder:validation:Schemaless
	// +kubebuilder:validation:Type=object
	// +kubebuilder:pruning:PreserveUnknownFields
	BrokerPodSpec *corev1.PodSpec `json:"brokerPodSpec,omitempty"`
	// +optional
	// +kubebuilder:validation:Schemaless
	// +kubebuilder:validation:Type=object
	// +kubebuilder:pruning:PreserveUnknownFields
	BrokerJobSpec *batchv1.JobSpec `json:"brokerJobSpec,omitempty"`
}

// Condition types on a Configuration's per-node status.
const (
	// ConditionHandlerAvailable is True while the named handler is
	// registered with the node's agent.
	ConditionHandlerAvailable = "HandlerAvailable"
	// ConditionDiscovering is True while a Discover stream is open and the
	// handler accepts the details; False with the handler's message when it
	// rejects them.
	ConditionDiscovering = "Discovering"
	// ConditionBrokersDeployed is the controller's: False with the API
	// server's message when a broker it made was refused.
	ConditionBrokersDeployed = "BrokersDeployed"
)

// ConfigurationStatus is what the agents and the controller observe.
type ConfigurationStatus struct {
	// Nodes holds each agent's view; each agent applies only its own entry.
	// +optional
	// +listType=map
	// +listMapKey=nodeName
	Nodes []ConfigurationNodeStatus `json:"nodes,omitempty"`
	// Instances counts this Configuration's Instances (written by the
	// controller).
	// +optional
	Instances int32 `json:"instances"`
	// Brokers counts its broker Pods that are Running (written by the
	// controller).
	// +optional
	Brokers int32 `json:"brokers"`
	// NodesSeeing counts the nodes in Nodes that see at least one device
	// (written by the controller, for the printer columns).
	// +optional
	// +kubebuilder:default=0
	NodesSeeing int32 `json:"nodesSeeing"`
	// NodesReady counts the nodes in Nodes whose handler is registered and
	// discovering (HandlerAvailable and Discovering True; written by the
	// controller).
	// +optional
	// +kubebuilder:default=0
	NodesReady int32 `json:"nodesReady"`
	// Conditions are the controller's, e.g. BrokersDeployed.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// ConfigurationNodeStatus is one node's discovery state for a Configuration.
type ConfigurationNodeStatus struct {
	// +required
	NodeName string `json:"nodeName"`
	// Devices is how many Instances this node holds for the Configuration:
	// the devices its handler reports, less any it had to drop.
	// +optional
	Devices int32 `json:"devices"`
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// Skipped summarises the candidates the handler looked at on this node
	// and did not report as devices, by reason (a camera that refused the
	// credentials, a host that did not answer, a server filtered out): the
	// handler's latest look, not a history.
	// +optional
	// +listType=map
	// +listMapKey=reason
	// +kubebuilder:validation:MaxItems=16
	Skipped []SkippedReason `json:"skipped,omitempty"`
}

// SkippedReason counts the candidates a handler skipped for one reason and
// names a few.
type SkippedReason struct {
	// Reason is the handler's short UpperCamelCase cause, e.g. AuthRefused.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	Reason string `json:"reason"`
	// Count is how many candidates were skipped for it.
	// +optional
	Count int32 `json:"count"`
	// Candidates are a few of them (at most 5).
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=5
	Candidates []SkippedCandidate `json:"candidates,omitempty"`
}

// SkippedCandidate is one candidate a handler skipped.
type SkippedCandidate struct {
	// Candidate is what was skipped: an address, a URL, a device path.
	// +required
	// +kubebuilder:validation:MaxLength=256
	Candidate string `json:"candidate"`
	// Message says why, in the handler's words.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	Message string `json:"message,omitempty"`
}

// Configuration asks Dowse to discover a kind of device and, optionally, to
// run a broker next to each one.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=dcfg,categories=dowse
// +kubebuilder:printcolumn:name="Handler",type=string,JSONPath=`.spec.discoveryHandler.name`
// +kubebuilder:printcolumn:name="Capacity",type=integer,JSONPath=`.spec.capacity`
// +kubebuilder:printcolumn:name="Allocation",type=string,JSONPath=`.spec.allocation`,priority=1
// +kubebuilder:printcolumn:name="Seeing",type=integer,JSONPath=`.status.nodesSeeing`,description="nodes that see at least one device"
// +kubebuilder:printcolumn:name="Ready",type=integer,JSONPath=`.status.nodesReady`,description="nodes whose handler is registered and discovering"
// +kubebuilder:printcolumn:name="Instances",type=integer,JSONPath=`.status.instances`
// +kubebuilder:printcolumn:name="Brokers",type=integer,JSONPath=`.status.brokers`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Configuration struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec ConfigurationSpec `json:"spec"`
	// +optional
	// +nullable
	Status ConfigurationStatus `json:"status,omitempty"`
}

// ConfigurationList is a list of Configurations.
// +kubebuilder:object:root=true
type ConfigurationList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Configuration `json:"items"`
}
