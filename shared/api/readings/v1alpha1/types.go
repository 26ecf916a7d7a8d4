// Package v1alpha1 is the live readings API, readings.dowse.dev/v1alpha1:
// the newest value of every property of each Device and a short recent
// history, served by the controller's replicas from memory through the
// Kubernetes API (an aggregated API, registered by an APIService), never
// stored in etcd. A DeviceReading is named and namespaced like its Device.
//
// Both ends import this package: the controller serves these types, and
// dowsectl and the console read them. They are plain JSON objects (no
// scheme registration, no deep copies): a client reads them with the
// dynamic client and runtime.DefaultUnstructuredConverter. Not a CRD:
// controller-gen skips the package.
//
// The OpenAPI definitions the server publishes (so that kubectl explain
// knows the kinds) are generated from these types by openapi-gen into
// internal/controller/link/readings/openapi (its tags are in doc.go).
//
// +kubebuilder:skip
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Names of the API.
const (
	Group    = "readings.dowse.dev"
	Version  = "v1alpha1"
	Resource = "devicereadings"
	Kind     = "DeviceReading"
	ListKind = "DeviceReadingList"
	// Singular is the resource's singular name (kubectl get devicereading).
	Singular = "devicereading"
	// ShortName is kubectl's short name (kubectl get dr).
	ShortName = "dr"
	// APIServiceName is the APIService that registers the API.
	APIServiceName = Version + "." + Group
)

// GroupVersion is readings.dowse.dev/v1alpha1.
var GroupVersion = schema.GroupVersion{Group: Group, Version: Version}

// GVR is the DeviceReadings' resource.
func GVR() schema.GroupVersionResource { return GroupVersion.WithResource(Resource) }

// Sources of a property's reading.
const (
	// SourceLive: the replica holding the node's session took it from the
	// edge; newer than Device.status may be.
	SourceLive = "live"
	// SourceStatus: no replica holds a newer value than Device.status
	// (the node is not connected, or has not reported since its session
	// began), which is shown.
	SourceStatus = "status"
)

// DeviceReading is the live view of one Device's reported values.
type DeviceReading struct {
	metav1.TypeMeta `json:",inline"`
	// Standard object's metadata: the Device's name, namespace, uid,
	// labels and creation time; its resourceVersion is the newest read
	// time of its values in Unix microseconds.
	metav1.ObjectMeta `json:"metadata,omitempty"`
	// Node is the Device's node (spec.nodeName).
	Node string `json:"node,omitempty"`
	// Replica is the controller replica holding the node's session, whose
	// memory the live values come from; empty when none does.
	Replica string `json:"replica,omitempty"`
	// State is the device's state as its mapper last reported it.
	State string `json:"state,omitempty"`
	// Properties are the Device's reported properties, by name.
	// +listType=map
	// +listMapKey=name
	Properties []PropertyReading `json:"properties,omitempty"`
}

// PropertyReading is one property's newest value and recent history.
type PropertyReading struct {
	// Name is the property's name (the DeviceModel's).
	Name string `json:"name"`
	// Value is the newest reported value.
	Value string `json:"value"`
	// Time is when it was read (the mapper's timestamp, else when the
	// replica took it).
	Time metav1.MicroTime `json:"time"`
	// Source is SourceLive or SourceStatus.
	Source string `json:"source"`
	// History holds the values before Value, oldest first (live only).
	// +listType=atomic
	History []Sample `json:"history,omitempty"`
}

// Sample is a value read at a time.
type Sample struct {
	// Value is the value as reported.
	Value string `json:"value"`
	// Time is when it was read.
	Time metav1.MicroTime `json:"time"`
}

// DeviceReadingList is a list of DeviceReadings.
type DeviceReadingList struct {
	metav1.TypeMeta `json:",inline"`
	// Standard list metadata: its resourceVersion is when the list was
	// made (Unix microseconds), for a watch to replay from.
	metav1.ListMeta `json:"metadata,omitempty"`
	// +listType=atomic
	Items []DeviceReading `json:"items"`
}

// Newest is the newest time among r's properties (zero when none).
func (r *DeviceReading) Newest() metav1.MicroTime {
	var t metav1.MicroTime
	for _, p := range r.Properties {
		if p.Time.After(t.Time) {
			t = p.Time
		}
	}
	return t
}

// Property returns r's reading of name, or nil.
func (r *DeviceReading) Property(name string) *PropertyReading {
	for i := range r.Properties {
		if r.Properties[i].Name == name {
			return &r.Properties[i]
		}
	}
	return nil
}
