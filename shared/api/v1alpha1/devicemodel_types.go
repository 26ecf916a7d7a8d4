package v1alpha1

import (
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dowse-dev/dowse/shared/twinvalue"
)

// PropertyType is the type of a property's values. Values travel as text
// (as in KubeEdge); the type says how to read them.
// +kubebuilder:validation:Enum=INT;FLOAT;DOUBLE;STRING;BOOLEAN;BYTES
type PropertyType string

// The types, as shared/twinvalue defines them (values, parsing and the
// checks live there).
const (
	PropertyInt     = PropertyType(twinvalue.Int)
	PropertyFloat   = PropertyType(twinvalue.Float)
	PropertyDouble  = PropertyType(twinvalue.Double)
	PropertyString  = PropertyType(twinvalue.String)
	PropertyBoolean = PropertyType(twinvalue.Boolean)
	// PropertyBytes values are base64 (standard encoding).
	PropertyBytes = PropertyType(twinvalue.Bytes)
)

// Numeric says whether minimum and maximum apply to the type.
func (t PropertyType) Numeric() bool { return twinvalue.Type(t).Numeric() }

// PropertyAccessMode says whether a property may have a desired value.
// +kubebuilder:validation:Enum=ReadWrite;ReadOnly
type PropertyAccessMode string

const (
	ReadWrite = PropertyAccessMode(twinvalue.ReadWrite)
	ReadOnly  = PropertyAccessMode(twinvalue.ReadOnly)
)

// DeviceModelSpec describes a kind of device: its protocol and properties.
// It has the shape of KubeEdge's devices.kubeedge.io/v1beta1 DeviceModel,
// plus per-property default visitors and protocolConfigData, which KubeEdge
// lacks (there every Device repeats them).
type DeviceModelSpec struct {
	// Protocol the devices of this model speak, e.g. "modbus"; mappers
	// register under a protocol.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	Protocol string `json:"protocol,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=512
	Properties []ModelProperty `json:"properties,omitempty"`
	// ProtocolConfigData is the default protocol configuration of every
	// Device of the model; a Device's own configData keys win.
	// +optional
	// +kubebuilder:validation:Type=object
	// +kubebuilder:pruning:PreserveUnknownFields
	ProtocolConfigData *apiextensionsv1.JSON `json:"protocolConfigData,omitempty"`
}

// ModelProperty is one property of a device model.
// +kubebuilder:validation:XValidation:rule="!has(self.minimum) || self.type in ['INT','FLOAT','DOUBLE']",message="minimum applies to INT, FLOAT and DOUBLE only"
// +kubebuilder:validation:XValidation:rule="!has(self.maximum) || self.type in ['INT','FLOAT','DOUBLE']",message="maximum applies to INT, FLOAT and DOUBLE only"
// +kubebuilder:validation:XValidation:rule="!has(self.minimum) || (self.type == 'INT' ? self.minimum.matches('^[-+]?[0-9]+$') : self.minimum.matches('^[-+]?([0-9]+[.]?[0-9]*|[.][0-9]+)([eE][-+]?[0-9]+)?$'))",message="minimum must be a number of the property's type"
// +kubebuilder:validation:XValidation:rule="!has(self.maximum) || (self.type == 'INT' ? self.maximum.matches('^[-+]?[0-9]+$') : self.maximum.matches('^[-+]?([0-9]+[.]?[0-9]*|[.][0-9]+)([eE][-+]?[0-9]+)?$'))",message="maximum must be a number of the property's type"
// +kubebuilder:validation:XValidation:rule="!has(self.minimum) || !has(self.maximum) || double(self.minimum) <= double(self.maximum)",message="minimum must not exceed maximum"
type ModelProperty struct {
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	Name string `json:"name"`
	// +optional
	Description string `json:"description,omitempty"`
	// +required
	Type PropertyType `json:"type"`
	// AccessMode is ReadOnly unless set: only ReadWrite properties take
	// desired values.
	// +optional
	// +kubebuilder:default=ReadOnly
	AccessMode PropertyAccessMode `json:"accessMode,omitempty"`
	// Minimum and Maximum bound numeric desired values (text, as in
	// KubeEdge).
	// +optional
	// +kubebuilder:validation:MaxLength=64
	Minimum string `json:"minimum,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxLength=64
	Maximum string `json:"maximum,omitempty"`
	// +optional
	Unit string `json:"unit,omitempty"`
	// Visitors is the default way to reach the property on every Device of
	// the model (a Device's own visitors win).
	// +optional
	Visitors *VisitorConfig `json:"visitors,omitempty"`
}

// DeviceModel describes a kind of device.
// +kubebuilder:object:root=true
// +kubebuilder:resource:shortName=dmodel,categories=dowse
// +kubebuilder:printcolumn:name="Protocol",type=string,JSONPath=`.spec.protocol`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type DeviceModel struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec DeviceModelSpec `json:"spec"`
}

// DeviceModelList is a list of DeviceModels.
// +kubebuilder:object:root=true
type DeviceModelList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []DeviceModel `json:"items"`
}

// Property returns the model's property called name, or nil.
func (m *DeviceModel) Property(name string) *ModelProperty {
	for i := range m.Spec.Properties {
		if m.Spec.Properties[i].Name == name {
			return &m.Spec.Properties[i]
		}
	}
	return nil
}
