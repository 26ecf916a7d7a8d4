// Package twins keeps Devices in step with their nodes over the cloud/edge
// link: it sends each node its Devices and DeviceModels (desired values
// ride them) and writes what nodes report into Device.status, which it alone
// writes.
package twins

import (
	"encoding/json"
	"fmt"
	"maps"

	"google.golang.org/protobuf/types/known/structpb"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"

	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/shared/twinvalue"
)

// EdgeDevice is what the node is sent of d: the model's protocol, default
// protocol configuration and default visitors filled in.
func EdgeDevice(d *v1alpha1.Device, model *v1alpha1.DeviceModel) (*linkv1.EdgeDevice, error) {
	out := &linkv1.EdgeDevice{
		Ref:          &linkv1.DeviceRef{Namespace: d.Namespace, Name: d.Name},
		Generation:   d.Generation,
		Model:        d.Spec.DeviceModelRef.Name,
		Mapper:       d.Spec.MapperName,
		ProtocolName: d.Spec.Protocol.ProtocolName,
	}
	if out.ProtocolName == "" {
		out.ProtocolName = model.Spec.Protocol
	}
	cfg, err := mergeObjects(model.Spec.ProtocolConfigData, d.Spec.Protocol.ConfigData)
	if err != nil {
		return nil, fmt.Errorf("protocol configData: %w", err)
	}
	out.ProtocolConfig = cfg
	for i := range d.Spec.Properties {
		p := &d.Spec.Properties[i]
		ep := &linkv1.EdgeDeviceProperty{Name: p.Name, ReportToCloud: p.Reports()}
		if p.Desired != nil {
			ep.Desired = &linkv1.TwinValue{Value: p.Desired.Value, Metadata: maps.Clone(p.Desired.Metadata)}
		}
		visitors := p.Visitors
		if visitors == nil {
			if mp := model.Property(p.Name); mp != nil {
				visitors = mp.Visitors
			}
		}
		if visitors != nil {
			ep.VisitorProtocol = visitors.ProtocolName
			if ep.VisitorConfig, err = mergeObjects(nil, visitors.ConfigData); err != nil {
				return nil, fmt.Errorf("property %s visitors: %w", p.Name, err)
			}
		}
		collect, err := v1alpha1.CycleDuration(p.CollectCycle)
		if err != nil {
			return nil, fmt.Errorf("property %s: %w", p.Name, err)
		}
		report, err := v1alpha1.CycleDuration(p.ReportCycle)
		if err != nil {
			return nil, fmt.Errorf("property %s: %w", p.Name, err)
		}
		ep.CollectCycleMs, ep.ReportCycleMs = collect.Milliseconds(), report.Milliseconds()
		out.Properties = append(out.Properties, ep)
	}
	for _, m := range d.Spec.Methods {
		out.Methods = append(out.Methods, &linkv1.EdgeDeviceMethod{Name: m.Name, Description: m.Description, PropertyNames: m.PropertyNames})
	}
	return out, nil
}

// EdgeModel is what a node is sent of m.
func EdgeModel(m *v1alpha1.DeviceModel) *linkv1.EdgeDeviceModel {
	out := &linkv1.EdgeDeviceModel{Ref: &linkv1.DeviceRef{Namespace: m.Namespace, Name: m.Name}, Generation: m.Generation, Protocol: m.Spec.Protocol}
	for _, p := range m.Spec.Properties {
		mode := p.AccessMode
		if mode == "" {
			mode = v1alpha1.ReadOnly
		}
		out.Properties = append(out.Properties, &linkv1.EdgeModelProperty{
			Name: p.Name, Description: p.Description, Type: string(p.Type), AccessMode: string(mode),
			Minimum: p.Minimum, Maximum: p.Maximum, Unit: p.Unit,
		})
	}
	return out
}

// mergeObjects reads two JSON objects and returns over's keys laid on
// base's (one level deep), as a Struct; nil when both are empty.
func mergeObjects(base, over *apiextensionsv1.JSON) (*structpb.Struct, error) {
	m := map[string]any{}
	for _, j := range []*apiextensionsv1.JSON{base, over} {
		if j == nil || len(j.Raw) == 0 {
			continue
		}
		var o map[string]any
		if err := json.Unmarshal(j.Raw, &o); err != nil {
			return nil, fmt.Errorf("not a JSON object: %w", err)
		}
		maps.Copy(m, o)
	}
	if len(m) == 0 {
		return nil, nil
	}
	return structpb.NewStruct(m)
}

// FormatValue writes a reported value as the Device holds values: the twin
// text of its kind (twinvalue.Format). A value no twin text holds (a
// non-finite number, which agents refuse from mappers) is written as Go
// prints it.
func FormatValue(v *linkv1.Value) string {
	var t twinvalue.Type
	var x any
	switch k := v.GetKind().(type) {
	case *linkv1.Value_BoolValue:
		t, x = twinvalue.Boolean, k.BoolValue
	case *linkv1.Value_IntValue:
		t, x = twinvalue.Int, k.IntValue
	case *linkv1.Value_DoubleValue:
		t, x = twinvalue.Double, k.DoubleValue
	case *linkv1.Value_StringValue:
		t, x = twinvalue.String, k.StringValue
	case *linkv1.Value_BytesValue:
		t, x = twinvalue.Bytes, k.BytesValue
	default:
		return ""
	}
	s, err := twinvalue.Format(t, x)
	if err != nil {
		return fmt.Sprint(x)
	}
	return s
}
