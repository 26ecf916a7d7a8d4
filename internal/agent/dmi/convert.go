package dmi

import (
	"maps"
	"math"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	dmiv1beta1 "github.com/dowse-dev/dowse/proto/dmi/v1beta1"
	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
)

// customized converts a Device's configData (a JSON object on the Device,
// a Struct on the link) into DMI's map of Any, as edgecore does: strings as
// google.protobuf.StringValue, booleans as BoolValue, numbers as wrappers.
//
// Departures, both on purpose: edgecore sends every JSON number as a
// FloatValue (float32, so integers above 2^24 lose digits); here a whole
// number is an Int32Value (Int64Value beyond int32), which mapper-framework
// decodes to the same JSON, and any other number a FloatValue as edgecore.
// Nested objects and lists, for which edgecore refuses the whole Device, go
// as google.protobuf.Struct / ListValue (mapper-framework skips keys it
// cannot decode, as it does today; Dowse's mapper SDK reads them). Nulls are
// left out. The result is never nil, because mapper-framework dereferences
// configData without checking.
func customized(s *structpb.Struct) *dmiv1beta1.CustomizedValue {
	out := &dmiv1beta1.CustomizedValue{Data: map[string]*anypb.Any{}}
	for k, v := range s.GetFields() {
		if a := anyOf(v); a != nil {
			out.Data[k] = a
		}
	}
	return out
}

func anyOf(v *structpb.Value) *anypb.Any {
	var m proto.Message
	switch k := v.GetKind().(type) {
	case *structpb.Value_StringValue:
		m = wrapperspb.String(k.StringValue)
	case *structpb.Value_BoolValue:
		m = wrapperspb.Bool(k.BoolValue)
	case *structpb.Value_NumberValue:
		f := k.NumberValue
		switch {
		case f == math.Trunc(f) && f >= math.MinInt32 && f <= math.MaxInt32:
			m = wrapperspb.Int32(int32(f))
		case f == math.Trunc(f) && math.Abs(f) <= 1<<53:
			m = wrapperspb.Int64(int64(f))
		default:
			m = wrapperspb.Float(float32(f))
		}
	case *structpb.Value_StructValue:
		m = k.StructValue
	case *structpb.Value_ListValue:
		m = k.ListValue
	default: // null, unset
		return nil
	}
	a, err := anypb.New(m)
	if err != nil { // only for unregistered types, which these are not
		return nil
	}
	return a
}

// toDMIDevice is the Device a mapper is given. Every message that
// mapper-framework dereferences unchecked (protocol, each property's
// desired value and visitors, configData) is set. Status asks the mapper
// to report the device's state as the Device's spec.stateReport says
// (mapper-framework's template reports states only when
// status.reportToCloud is true, every status.reportCycle milliseconds;
// edgecore 1.23 sets both from spec.stateReport), unless told not to.
func toDMIDevice(d *linkv1.EdgeDevice) *dmiv1beta1.Device {
	spec := &dmiv1beta1.DeviceSpec{
		DeviceModelReference: d.GetModel(),
		Protocol:             &dmiv1beta1.ProtocolConfig{ProtocolName: d.GetProtocolName(), ConfigData: customized(d.GetProtocolConfig())},
	}
	for _, p := range d.GetProperties() {
		vp := p.GetVisitorProtocol()
		if vp == "" {
			vp = d.GetProtocolName()
		}
		desired := &dmiv1beta1.TwinProperty{Value: p.GetDesired().GetValue(), Metadata: map[string]string{}}
		for k, v := range p.GetDesired().GetMetadata() {
			desired.Metadata[k] = v
		}
		spec.Properties = append(spec.Properties, &dmiv1beta1.DeviceProperty{
			Name:          p.GetName(),
			Desired:       desired,
			Visitors:      &dmiv1beta1.VisitorConfig{ProtocolName: vp, ConfigData: customized(p.GetVisitorConfig())},
			ReportCycle:   p.GetReportCycleMs(),
			CollectCycle:  p.GetCollectCycleMs(),
			ReportToCloud: p.GetReportToCloud(),
			PushMethod:    dmiPushMethod(p.GetPushMethod()),
		})
	}
	for _, m := range d.GetMethods() {
		spec.Methods = append(spec.Methods, &dmiv1beta1.DeviceMethod{Name: m.GetName(), Description: m.GetDescription(), PropertyNames: m.GetPropertyNames()})
	}
	return &dmiv1beta1.Device{
		Name: d.GetRef().GetName(), Namespace: d.GetRef().GetNamespace(), Spec: spec,
		Status: &dmiv1beta1.DeviceStatus{ReportToCloud: !d.GetNoStateReports(), ReportCycle: d.GetStateReportCycleMs()},
	}
}

// dmiPushMethod is a property's pushMethod as edgecore hands it to
// mappers: KubeEdge's Device fields copied onto DMI's by name, each
// message set exactly when the Device sets it (mapper-framework tells an
// absent one from an empty one). The Secret's name goes in Dowse's own
// field (dowseSecretName), which KubeEdge's mappers skip; Dowse's mappers
// read the credentials where their Pod mounts that Secret.
func dmiPushMethod(pm *linkv1.PushMethod) *dmiv1beta1.PushMethod {
	if pm == nil {
		return nil
	}
	out := &dmiv1beta1.PushMethod{DowseSecretName: pm.GetSecretName()}
	if ad := pm.GetAnomalyDetection(); ad != nil {
		out.AnomalyDetection = &dmiv1beta1.AnomalyDetection{Data: customized(ad).GetData()}
	}
	if h := pm.GetHttp(); h != nil {
		out.Http = &dmiv1beta1.PushMethodHTTP{Hostname: h.GetHostName(), Port: h.GetPort(), Requestpath: h.GetRequestPath(), Timeout: h.GetTimeout()}
	}
	if m := pm.GetMqtt(); m != nil {
		out.Mqtt = &dmiv1beta1.PushMethodMQTT{Address: m.GetAddress(), Topic: m.GetTopic(), Qos: m.GetQos(), Retained: m.GetRetained()}
	}
	if o := pm.GetOtel(); o != nil {
		out.Otel = &dmiv1beta1.PushMethodOTEL{EndpointURL: o.GetEndpointUrl()}
	}
	db := pm.GetDbMethod()
	if db == nil {
		return out
	}
	out.DbMethod = &dmiv1beta1.DBMethod{}
	if x := db.GetInfluxdb2(); x != nil {
		e := &dmiv1beta1.DBMethodInfluxdb2{}
		if c := x.GetClientConfig(); c != nil {
			e.Influxdb2ClientConfig = &dmiv1beta1.Influxdb2ClientConfig{Url: c.GetUrl(), Org: c.GetOrg(), Bucket: c.GetBucket()}
		}
		if c := x.GetDataConfig(); c != nil {
			e.Influxdb2DataConfig = &dmiv1beta1.Influxdb2DataConfig{Measurement: c.GetMeasurement(), Tag: maps.Clone(c.GetTag()), FieldKey: c.GetFieldKey()}
		}
		out.DbMethod.Influxdb2 = e
	}
	if x := db.GetRedis(); x != nil {
		e := &dmiv1beta1.DBMethodRedis{}
		if c := x.GetClientConfig(); c != nil {
			e.RedisClientConfig = &dmiv1beta1.RedisClientConfig{Addr: c.GetAddr(), Db: c.GetDb(), Poolsize: c.GetPoolsize(), MinIdleConns: c.GetMinIdleConns()}
		}
		out.DbMethod.Redis = e
	}
	if x := db.GetTdengine(); x != nil {
		e := &dmiv1beta1.DBMethodTDEngine{}
		if c := x.GetClientConfig(); c != nil {
			e.TdEngineClientConfig = &dmiv1beta1.TDEngineClientConfig{Addr: c.GetAddr(), Dbname: c.GetDbName()}
		}
		out.DbMethod.Tdengine = e
	}
	if x := db.GetMysql(); x != nil {
		e := &dmiv1beta1.DBMethodMySQL{}
		if c := x.GetClientConfig(); c != nil {
			e.MysqlClientConfig = &dmiv1beta1.MySQLClientConfig{Addr: c.GetAddr(), Database: c.GetDatabase(), UserName: c.GetUserName()}
		}
		out.DbMethod.Mysql = e
	}
	return out
}

func toDMIModel(m *linkv1.EdgeDeviceModel) *dmiv1beta1.DeviceModel {
	spec := &dmiv1beta1.DeviceModelSpec{}
	for _, p := range m.GetProperties() {
		spec.Properties = append(spec.Properties, &dmiv1beta1.ModelProperty{
			Name: p.GetName(), Description: p.GetDescription(), Type: p.GetType(), AccessMode: p.GetAccessMode(),
			Minimum: p.GetMinimum(), Maximum: p.GetMaximum(), Unit: p.GetUnit(),
		})
	}
	return &dmiv1beta1.DeviceModel{Name: m.GetRef().GetName(), Namespace: m.GetRef().GetNamespace(), Spec: spec}
}
