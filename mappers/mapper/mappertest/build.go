package mappertest

import (
	"strconv"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/dowse-dev/dowse/mappers/mapper"
	dmiv1beta1 "github.com/dowse-dev/dowse/proto/dmi/v1beta1"
	"github.com/dowse-dev/dowse/shared/twinvalue"
)

// Prop describes one device property for NewDevice.
type Prop struct {
	Name    string
	Visitor map[string]any
	// CollectCycle and ReportCycle travel as milliseconds.
	CollectCycle, ReportCycle time.Duration
	// Desired, when set, is the desired value (with a timestamp).
	Desired string
	// PushMethod, when set, is the property's pushMethod.
	PushMethod *dmiv1beta1.PushMethod
}

// NewDevice builds a DMI Device as a device manager sends it, packing
// configData the way mapper.EncodeConfig does.
func NewDevice(t testing.TB, namespace, name, model, protocol string, config map[string]any, props ...Prop) *dmiv1beta1.Device {
	t.Helper()
	dev, err := MakeDevice(namespace, name, model, protocol, config, props...)
	if err != nil {
		t.Fatal(err)
	}
	return dev
}

// MakeDevice is NewDevice without a test.
func MakeDevice(namespace, name, model, protocol string, config map[string]any, props ...Prop) (*dmiv1beta1.Device, error) {
	cd, err := mapper.EncodeConfig(config)
	if err != nil {
		return nil, err
	}
	dev := &dmiv1beta1.Device{Name: name, Namespace: namespace, Spec: &dmiv1beta1.DeviceSpec{
		DeviceModelReference: model,
		Protocol:             &dmiv1beta1.ProtocolConfig{ProtocolName: protocol, ConfigData: cd},
	}}
	for _, p := range props {
		v, err := mapper.EncodeConfig(p.Visitor)
		if err != nil {
			return nil, err
		}
		dp := &dmiv1beta1.DeviceProperty{Name: p.Name, Visitors: &dmiv1beta1.VisitorConfig{ProtocolName: protocol, ConfigData: v},
			CollectCycle: p.CollectCycle.Milliseconds(), ReportCycle: p.ReportCycle.Milliseconds(), ReportToCloud: true,
			PushMethod: p.PushMethod}
		if p.Desired != "" {
			dp.Desired = Desired(p.Desired)
		}
		dev.Spec.Properties = append(dev.Spec.Properties, dp)
	}
	return dev, nil
}

// Desired is a desired twin value stamped now.
func Desired(v string) *dmiv1beta1.TwinProperty {
	return &dmiv1beta1.TwinProperty{Value: v, Metadata: map[string]string{twinvalue.MetaTimestamp: strconv.FormatInt(time.Now().UnixNano(), 10)}}
}

// SetDesired returns a copy of dev with property's desired value set.
func SetDesired(dev *dmiv1beta1.Device, property, value string) *dmiv1beta1.Device {
	c := cloneDevice(dev)
	for _, p := range c.GetSpec().GetProperties() {
		if p.GetName() == property {
			p.Desired = Desired(value)
		}
	}
	return c
}

// ModelProp is a model property: type, access mode ("ReadWrite" or
// ""/"ReadOnly"), minimum and maximum ("" for none).
func ModelProp(name, typ, access, minimum, maximum string) *dmiv1beta1.ModelProperty {
	return &dmiv1beta1.ModelProperty{Name: name, Type: typ, AccessMode: access, Minimum: minimum, Maximum: maximum}
}

// NewModel builds a DMI DeviceModel.
func NewModel(namespace, name string, props ...*dmiv1beta1.ModelProperty) *dmiv1beta1.DeviceModel {
	return &dmiv1beta1.DeviceModel{Name: name, Namespace: namespace, Spec: &dmiv1beta1.DeviceModelSpec{Properties: props}}
}

func cloneDevice(d *dmiv1beta1.Device) *dmiv1beta1.Device {
	return proto.Clone(d).(*dmiv1beta1.Device)
}
