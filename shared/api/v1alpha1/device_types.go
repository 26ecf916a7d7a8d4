package v1alpha1

import (
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/dowse-dev/dowse/shared/twinvalue"
)

// DeviceSpec is what a person (or the controller, from a Configuration's
// deviceTemplate) wants of a device. It has the shape of KubeEdge's
// devices.kubeedge.io/v1beta1 Device field for field, so a KubeEdge Device
// ports by changing its apiVersion. Departures:
//   - collectCycle and reportCycle also take durations ("500ms", "10s");
//     KubeEdge's integers are read as milliseconds, as its mappers do.
//   - mapperName (new) names the mapper registration that serves the
//     Device, so several mappers of one protocol can share a node.
//   - Whether each property exists in the model, takes desired values
//     (ReadWrite) and whether a desired value parses as its type within
//     minimum and maximum is checked by the controller against the
//     DeviceModel (condition Valid): a CRD rule cannot read another object.
type DeviceSpec struct {
	// DeviceModelRef names the DeviceModel (same namespace).
	// +required
	DeviceModelRef *corev1.LocalObjectReference `json:"deviceModelRef"`
	// NodeName is the node whose agent and mappers own the twin. For a
	// Device made from an Instance the controller sets it to one of the
	// nodes that see the device, and moves it when that node leaves.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	NodeName string `json:"nodeName,omitempty"`
	// MapperName, when set, is the registration name (MapperInfo.name) of
	// the mapper that should serve the Device; a Device made from a
	// Configuration asks for the Configuration's name. When no mapper of
	// that name is registered on the node, any mapper of the protocol
	// serves it.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	MapperName string `json:"mapperName,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=512
	Properties []DeviceProperty `json:"properties,omitempty"`
	// +optional
	Protocol ProtocolConfig `json:"protocol,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=64
	Methods []DeviceMethod `json:"methods,omitempty"`
	// StateReport is how the mapper reports the device's state (KubeEdge
	// 1.23's spec.stateReport).
	// +optional
	StateReport *StateReport `json:"stateReport,omitempty"`
}

// StateReport is how a mapper reports its device's state (online, offline,
// ...), handed to it in DMI's Device status as edgecore does.
type StateReport struct {
	// ReportToCloud asks the mapper to report the device's state (unset
	// means true; KubeEdge's default is false).
	// +optional
	ReportToCloud *bool `json:"reportToCloud,omitempty"`
	// ReportCycle is the time between two state reports: a duration, or
	// KubeEdge's integer milliseconds (the mapper's default when unset).
	// +optional
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 0 : self.matches('^([0-9]+([.][0-9]+)?(ns|us|ms|s|m|h))+$')",message="must be a duration such as 500ms or 10s, or integer milliseconds"
	ReportCycle *intstr.IntOrString `json:"reportCycle,omitempty"`
}

// Reports says whether the mapper should report the device's state.
func (s *StateReport) Reports() bool {
	return s == nil || s.ReportToCloud == nil || *s.ReportToCloud
}

// ProtocolConfig is how to reach the device.
type ProtocolConfig struct {
	// ProtocolName defaults to the model's protocol.
	// +optional
	ProtocolName string `json:"protocolName,omitempty"`
	// ConfigData is the protocol's own settings (addresses, unit ids,
	// security), any object; strings may name the Instance's properties as
	// ${NAME} in a deviceTemplate.
	// +optional
	// +kubebuilder:validation:Type=object
	// +kubebuilder:pruning:PreserveUnknownFields
	ConfigData *apiextensionsv1.JSON `json:"configData,omitempty"`
}

// VisitorConfig is how to reach one property (a register, a node id).
type VisitorConfig struct {
	// +optional
	ProtocolName string `json:"protocolName,omitempty"`
	// +optional
	// +kubebuilder:validation:Type=object
	// +kubebuilder:pruning:PreserveUnknownFields
	ConfigData *apiextensionsv1.JSON `json:"configData,omitempty"`
}

// DeviceProperty is one property of a device: where to find it, how often
// to read and report it, and its desired value.
type DeviceProperty struct {
	// Name is a property of the model.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	Name string `json:"name"`
	// Desired is the value the device should have (ReadWrite properties
	// only); the mapper writes it without restarting the device.
	// +optional
	Desired *TwinProperty `json:"desired,omitempty"`
	// Visitors default to the model property's.
	// +optional
	Visitors *VisitorConfig `json:"visitors,omitempty"`
	// ReportCycle is the longest time between two reports of the property
	// (a heartbeat; reports are on change otherwise): a duration, or
	// KubeEdge's integer milliseconds.
	// +optional
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 0 : self.matches('^([0-9]+([.][0-9]+)?(ns|us|ms|s|m|h))+$')",message="must be a duration such as 500ms or 10s, or integer milliseconds"
	ReportCycle *intstr.IntOrString `json:"reportCycle,omitempty"`
	// CollectCycle is the time between two reads: a duration or integer
	// milliseconds.
	// +optional
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 0 : self.matches('^([0-9]+([.][0-9]+)?(ns|us|ms|s|m|h))+$')",message="must be a duration such as 500ms or 10s, or integer milliseconds"
	CollectCycle *intstr.IntOrString `json:"collectCycle,omitempty"`
	// ReportToCloud sends the property's reported value to Device.status
	// (KubeEdge's default is false; unset here means true).
	// +optional
	ReportToCloud *bool `json:"reportToCloud,omitempty"`
	// PushMethod is where the mapper sends every reading of the property
	// besides the twin (MQTT, HTTP, databases); see PushMethod.
	// +optional
	PushMethod *PushMethod `json:"pushMethod,omitempty"`
}

// Reports says whether the property's reported value goes to the cloud.
func (p *DeviceProperty) Reports() bool { return p.ReportToCloud == nil || *p.ReportToCloud }

// DeviceMethod groups properties a caller may act on together.
type DeviceMethod struct {
	// +required
	Name string `json:"name"`
	// +optional
	Description string `json:"description,omitempty"`
	// +optional
	PropertyNames []string `json:"propertyNames,omitempty"`
}

// TwinProperty is a value as text, typed by the model, with metadata
// (mappers put "timestamp", Unix milliseconds, and "type" there).
type TwinProperty struct {
	// +required
	// +kubebuilder:validation:MaxLength=16384
	Value string `json:"value"`
	// +optional
	// +kubebuilder:validation:MaxProperties=16
	Metadata map[string]string `json:"metadata,omitempty"`
}

// Twin is one property's values as the edge last reported them.
type Twin struct {
	// +required
	// +kubebuilder:validation:MaxLength=128
	PropertyName string `json:"propertyName"`
	// Reported is the value read from the device.
	// +optional
	Reported *TwinProperty `json:"reported,omitempty"`
	// ObservedDesired is the desired value the mapper last applied.
	// +optional
	ObservedDesired *TwinProperty `json:"observedDesired,omitempty"`
}

// Device states as mappers report them (twinvalue.States).
const (
	DeviceStateOK           = twinvalue.StateOK
	DeviceStateOnline       = twinvalue.StateOnline
	DeviceStateOffline      = twinvalue.StateOffline
	DeviceStateUnhealthy    = twinvalue.StateUnhealthy
	DeviceStateUnknown      = twinvalue.StateUnknown
	DeviceStateDisconnected = twinvalue.StateDisconnected
)

// Condition types on a Device.
const (
	// ConditionDeviceValid is False when the spec does not fit its model
	// (unknown property, desired on a ReadOnly one, a value that does not
	// parse or is out of range) or the model is missing; the Device is not
	// sent to its node until it is True.
	ConditionDeviceValid = "Valid"
	// ConditionMapperConnected is True while a mapper on the node serves the
	// Device.
	ConditionMapperConnected = "MapperConnected"
	// ConditionDesiredApplied is True when every desired value has been
	// reported back as observedDesired; False with the mapper's error.
	ConditionDesiredApplied = "DesiredApplied"
	// ConditionReportsAccepted is False while the node refuses reported
	// values of some properties (not in the model, not of its type), the
	// message naming each property with why; the other properties' values
	// are taken meanwhile. Set by the node.
	ConditionReportsAccepted = "ReportsAccepted"
	// ConditionAuthenticated is False (reason AuthFailed) while the device
	// refuses its mapper's credentials, the message in the device's words;
	// the mapper then tries again with backoff, and at once when the
	// credentials change. Set by the node.
	ConditionAuthenticated = "Authenticated"
	// ConditionReportsChecked is False when the cloud dropped reported
	// values a node sent that its agent should have refused (a property
	// not in the model, a value not of its type or too large): a node that
	// lies, or an agent of another version. The message names the latest
	// such report; the other properties' values are taken. Set by the
	// controller.
	ConditionReportsChecked = "ReportsChecked"
)

// DeviceStatus is what the edge observed, written by the controller from
// its node's reports through the status subresource.
type DeviceStatus struct {
	// +optional
	// +listType=map
	// +listMapKey=propertyName
	// +kubebuilder:validation:MaxItems=512
	Twins []Twin `json:"twins,omitempty"`
	// State is the mapper's last reported state.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	State string `json:"state,omitempty"`
	// LastOnlineTime is when the device last reported an ok or online state
	// (RFC 3339, as KubeEdge writes it).
	// +optional
	LastOnlineTime *metav1.Time `json:"lastOnlineTime,omitempty"`
	// LastReportTime is when the newest reported value was read.
	// +optional
	LastReportTime *metav1.Time `json:"lastReportTime,omitempty"`
	// Differing counts the properties with a desired value whose reported
	// value differs from it, or that have none yet (for the printer
	// columns: a column's JSONPath cannot compare). Written with the rest
	// of the status (not omitted when 0: the status writer's merge patch
	// would leave an older count).
	// +optional
	// +kubebuilder:default=0
	Differing int32 `json:"differing"`
	// +optional
	ReportToCloud bool `json:"reportToCloud,omitempty"`
	// +optional
	ReportCycle int64 `json:"reportCycle,omitempty"`
	// ObservedGeneration is the spec generation the status was written for.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// ReportedPosition is where in its node's link stream the newest report
	// written here came from: the controller skips reports at or before it,
	// so a report resent after a controller restart is never applied twice.
	// +optional
	ReportedPosition *LinkPosition `json:"reportedPosition,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=16
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// LinkPosition is a message's place in a node's link stream.
type LinkPosition struct {
	// +required
	Node string `json:"node"`
	// Stream is the edge's stream id (decimal: it may not fit an int64); a
	// wiped edge store starts a new one.
	// +required
	Stream string `json:"stream"`
	// +required
	Seq int64 `json:"seq"`
	// Epoch is the node's link session that wrote it (its Lease's
	// transitions; 0 with one controller replica): a writer whose session
	// is older than the one that wrote here is fenced and writes nothing.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Epoch int64 `json:"epoch,omitempty"`
}

// Device is one device's twin: desired values in spec, reported ones in
// status.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=ddev,categories=dowse
// +kubebuilder:printcolumn:name="Model",type=string,JSONPath=`.spec.deviceModelRef.name`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.spec.nodeName`
// +kubebuilder:printcolumn:name="State",type=string,JSONPath=`.status.state`
// +kubebuilder:printcolumn:name="Differing",type=integer,JSONPath=`.status.differing`,description="properties whose reported value differs from the desired one"
// +kubebuilder:printcolumn:name="Applied",type=string,JSONPath=`.status.conditions[?(@.type=="DesiredApplied")].status`,priority=1,description="every desired value observed on the device"
// +kubebuilder:printcolumn:name="Mapper",type=string,JSONPath=`.spec.mapperName`,priority=1
// +kubebuilder:printcolumn:name="Last Report",type=date,JSONPath=`.status.lastReportTime`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Device struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec DeviceSpec `json:"spec"`
	// +optional
	Status DeviceStatus `json:"status,omitempty"`
}

// DeviceList is a list of Devices.
// +kubebuilder:object:root=true
type DeviceList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Device `json:"items"`
}

// Property returns the Device's property called name, or nil.
func (d *Device) Property(name string) *DeviceProperty {
	for i := range d.Spec.Properties {
		if d.Spec.Properties[i].Name == name {
			return &d.Spec.Properties[i]
		}
	}
	return nil
}

// Twin returns the Device's status twin of the property called name, or nil.
func (d *Device) Twin(name string) *Twin {
	for i := range d.Status.Twins {
		if d.Status.Twins[i].PropertyName == name {
			return &d.Status.Twins[i]
		}
	}
	return nil
}

// Values returns the twin's reported and observed desired values, each
// empty when absent (and both for a nil twin).
func (t *Twin) Values() (reported, observedDesired string) {
	if t == nil {
		return "", ""
	}
	if t.Reported != nil {
		reported = t.Reported.Value
	}
	if t.ObservedDesired != nil {
		observedDesired = t.ObservedDesired.Value
	}
	return reported, observedDesired
}

// CycleDuration reads a collectCycle or reportCycle: integers are
// milliseconds (KubeEdge), strings durations; nil is zero.
func CycleDuration(c *intstr.IntOrString) (time.Duration, error) {
	if c == nil {
		return 0, nil
	}
	if c.Type == intstr.Int {
		if c.IntVal < 0 {
			return 0, fmt.Errorf("cycle %d is negative", c.IntVal)
		}
		return time.Duration(c.IntVal) * time.Millisecond, nil
	}
	if n, err := strconv.ParseInt(c.StrVal, 10, 64); err == nil {
		return time.Duration(n) * time.Millisecond, nil
	}
	d, err := time.ParseDuration(c.StrVal)
	if err != nil {
		return 0, fmt.Errorf("cycle %q: %w", c.StrVal, err)
	}
	if d < 0 {
		return 0, fmt.Errorf("cycle %q is negative", c.StrVal)
	}
	return d, nil
}

// DeviceTemplate makes a Device of every Instance of a Configuration. String
// values in protocol and visitor configData and in desired values may name
// the Instance's broker properties as ${NAME}, e.g. ${MODBUS_TCP_ADDRESS}.
type DeviceTemplate struct {
	// +required
	DeviceModelRef corev1.LocalObjectReference `json:"deviceModelRef"`
	// +optional
	Protocol ProtocolConfig `json:"protocol,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=512
	Properties []DeviceProperty `json:"properties,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=64
	Methods []DeviceMethod `json:"methods,omitempty"`
	// +optional
	StateReport *StateReport `json:"stateReport,omitempty"`
	// MapperPodSpec, when set, is a mapper the controller runs as a broker:
	// one Pod per node that owns Devices of the Configuration, with the
	// state directory mounted and the Configuration's name as its
	// registration name.
	// +optional
	// +kubebuilder:validation:Schemaless
	// +kubebuilder:validation:Type=object
	// +kubebuilder:pruning:PreserveUnknownFields
	MapperPodSpec *corev1.PodSpec `json:"mapperPodSpec,omitempty"`
}
