package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// InstanceSpec is what discovery found: written by the agents that see the
// device, all with the same values for a shared device.
type InstanceSpec struct {
	// ConfigurationName is the Configuration (same namespace) that found it.
	// +required
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="configurationName is immutable: the Instance name is derived from it"
	ConfigurationName string `json:"configurationName"`
	// DeviceID is the handler's stable id for the device; two ids never
	// share one Instance.
	// +required
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="deviceID is immutable: the Instance name is derived from it"
	DeviceID string `json:"deviceID"`
	// Shared is true when several nodes can see the device.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="shared is immutable: the Instance name is derived from it"
	Shared bool `json:"shared"`
	// Capacity is how many pods may use the device at once.
	// +optional
	Capacity int32 `json:"capacity,omitempty"`
	// BrokerProperties are the device's properties merged over the
	// Configuration's brokerProperties; brokers get them as environment.
	// +optional
	BrokerProperties map[string]string `json:"brokerProperties,omitempty"`
	// Mounts are host paths a broker of this device needs.
	// +optional
	Mounts []Mount `json:"mounts,omitempty"`
	// DeviceSpecs are device nodes a broker of this device needs.
	// +optional
	DeviceSpecs []DeviceNode `json:"deviceSpecs,omitempty"`
}

// Mount is a host path mounted into a broker container.
type Mount struct {
	// +required
	ContainerPath string `json:"containerPath"`
	// +required
	HostPath string `json:"hostPath"`
	// +optional
	ReadOnly bool `json:"readOnly,omitempty"`
}

// DeviceNode is a device node passed into a broker container.
type DeviceNode struct {
	// +required
	ContainerPath string `json:"containerPath"`
	// +required
	HostPath string `json:"hostPath"`
	// Permissions is a combination of r, w and m.
	// +optional
	// +kubebuilder:validation:Pattern=`^[rwm]{0,3}$`
	Permissions string `json:"permissions,omitempty"`
}

// InstanceStatus is observed state; each agent applies only its own node's
// entries, under a field manager of its own.
type InstanceStatus struct {
	// Nodes that currently see the device.
	// +optional
	// +listType=map
	// +listMapKey=name
	Nodes []InstanceNode `json:"nodes,omitempty"`
	// Slots are the capacity slots that nodes hold. Each agent applies its
	// own node's entries under a field manager of its own (not the one that
	// writes spec and nodes, whose applies would otherwise drop them), and
	// without force: a second node stating another node's slot gets a
	// conflict, so two nodes can never hold one slot.
	// +optional
	// +listType=map
	// +listMapKey=id
	Slots []InstanceSlot `json:"slots,omitempty"`
	// SlotsInUse counts Slots, for the printer columns (a column's JSONPath
	// cannot count). Written by the controller, not the agents: each agent
	// owns only its own node's slots.
	// +optional
	// +kubebuilder:default=0
	SlotsInUse int32 `json:"slotsInUse"`
}

// InstanceSlot is one capacity slot held by one node.
type InstanceSlot struct {
	// ID is the slot's device id in the device plugins, "<hash>-<n>".
	// +required
	ID string `json:"id"`
	// Node holds the slot.
	// +required
	Node string `json:"node"`
	// Resource is the extended resource the slot was allocated through,
	// dowse.dev/<instance>.<namespace> or dowse.dev/<configuration>.<namespace>
	// (or a legacy name, without the namespace, that an earlier agent
	// served): on its node the slot is then unavailable through the
	// others, so they never hand out one slot twice.
	// +optional
	Resource string `json:"resource,omitempty"`
	// AllocationID names the kubelet allocation that claimed the slot.
	// +optional
	AllocationID string `json:"allocationID,omitempty"`
}

// InstanceNode is one node that sees the device.
type InstanceNode struct {
	// +required
	Name string `json:"name"`
}

// Instance is one discovered device.
//
// Instance has no status subresource on purpose: the agents write both its
// spec (what they discovered) and their own entry in status.nodes, so one
// server-side apply per node and device states both, halving the API
// server's work when thousands of devices appear at once.
// +kubebuilder:object:root=true
// +kubebuilder:resource:shortName=dins,categories=dowse
// +kubebuilder:printcolumn:name="Configuration",type=string,JSONPath=`.spec.configurationName`
// +kubebuilder:printcolumn:name="Shared",type=boolean,JSONPath=`.spec.shared`
// +kubebuilder:printcolumn:name="Nodes",type=string,JSONPath=`.status.nodes[*].name`
// +kubebuilder:printcolumn:name="In Use",type=integer,JSONPath=`.status.slotsInUse`,description="capacity slots held by pods"
// +kubebuilder:printcolumn:name="Capacity",type=integer,JSONPath=`.spec.capacity`
// +kubebuilder:printcolumn:name="Device ID",type=string,JSONPath=`.spec.deviceID`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Instance struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec InstanceSpec `json:"spec"`
	// Nullable: server-side apply leaves status null when the last node's
	// entry is removed.
	// +optional
	// +nullable
	Status InstanceStatus `json:"status,omitempty"`
}

// InstanceList is a list of Instances.
// +kubebuilder:object:root=true
type InstanceList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Instance `json:"items"`
}
