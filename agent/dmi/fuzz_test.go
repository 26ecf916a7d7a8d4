package dmi

import (
	"context"
	"math"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	mappersdk "github.com/dowse-dev/dowse/brokers/mapper"
	dmiv1beta1 "github.com/dowse-dev/dowse/proto/dmi/v1beta1"
	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
	mapperv1 "github.com/dowse-dev/dowse/proto/mapper/v1"
	"github.com/dowse-dev/dowse/shared/twinvalue"
)

func seedDevice(f *testing.F) {
	cfg, _ := structpb.NewStruct(map[string]any{"address": "sim://1", "slaveID": 1, "ratio": 0.5, "big": 1e12, "on": true,
		"nested": map[string]any{"a": []any{1, "x", nil}}, "none": nil})
	vis, _ := structpb.NewStruct(map[string]any{"register": "HoldingRegister", "offset": 3, "scale": 0.1, "nodeId": "ns=2;s=X"})
	d := &linkv1.EdgeDevice{Ref: &linkv1.DeviceRef{Namespace: "default", Name: "d"}, Model: "m", ProtocolName: "modbus", ProtocolConfig: cfg,
		Properties: []*linkv1.EdgeDeviceProperty{
			{Name: "temp", Desired: &linkv1.TwinValue{Value: "21", Metadata: map[string]string{"type": "int"}}, VisitorConfig: vis, CollectCycleMs: 100,
				PushMethod: &linkv1.PushMethod{Mqtt: &linkv1.PushMethodMQTT{Address: "tcp://127.0.0.1:1883", Topic: "t"},
					DbMethod: &linkv1.DBMethod{Redis: &linkv1.DBMethodRedis{ClientConfig: &linkv1.RedisClientConfig{Addr: "127.0.0.1:6379"}}}}},
			{Name: "bare"},
		},
		Methods: []*linkv1.EdgeDeviceMethod{{Name: "m", PropertyNames: []string{"temp"}}}}
	b, _ := proto.Marshal(d)
	f.Add(b)
	f.Add([]byte{})
}

// FuzzDeviceConversion feeds Devices as the link could carry them into the
// conversion every mapper is handed (toDMIDevice): it never panics, sets
// every message mapper-framework dereferences unchecked, keeps each
// pushMethod part exactly when the Device sets it, and every scalar of the
// protocol and visitor configData reads back through the mapper SDK as the
// value the Device holds (numbers as edgecore's mappers would read them).
func FuzzDeviceConversion(f *testing.F) {
	seedDevice(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		var d linkv1.EdgeDevice
		if proto.Unmarshal(b, &d) != nil {
			return
		}
		out := toDMIDevice(&d)
		if _, err := proto.Marshal(out); err != nil {
			t.Fatalf("the converted Device does not marshal: %v", err)
		}
		if out.GetSpec().GetProtocol().GetConfigData() == nil || out.GetStatus() == nil {
			t.Fatal("protocol configData or status nil")
		}
		checkConfig(t, "protocol", d.GetProtocolConfig(), out.GetSpec().GetProtocol().GetConfigData())
		if len(out.GetSpec().GetProperties()) != len(d.GetProperties()) {
			t.Fatalf("%d properties from %d", len(out.GetSpec().GetProperties()), len(d.GetProperties()))
		}
		for i, p := range out.GetSpec().GetProperties() {
			in := d.GetProperties()[i]
			if p.GetDesired() == nil || p.GetDesired().GetMetadata() == nil || p.GetVisitors() == nil || p.GetVisitors().GetConfigData() == nil {
				t.Fatalf("property %d: a message mapper-framework dereferences is nil", i)
			}
			checkConfig(t, "visitor", in.GetVisitorConfig(), p.GetVisitors().GetConfigData())
			pm, want := p.GetPushMethod(), in.GetPushMethod()
			if (pm == nil) != (want == nil) || (pm.GetHttp() == nil) != (want.GetHttp() == nil) || (pm.GetMqtt() == nil) != (want.GetMqtt() == nil) ||
				(pm.GetOtel() == nil) != (want.GetOtel() == nil) || (pm.GetDbMethod() == nil) != (want.GetDbMethod() == nil) ||
				(pm.GetDbMethod().GetRedis() == nil) != (want.GetDbMethod().GetRedis() == nil) ||
				(pm.GetDbMethod().GetInfluxdb2() == nil) != (want.GetDbMethod().GetInfluxdb2() == nil) ||
				(pm.GetDbMethod().GetMysql() == nil) != (want.GetDbMethod().GetMysql() == nil) ||
				(pm.GetDbMethod().GetTdengine() == nil) != (want.GetDbMethod().GetTdengine() == nil) {
				t.Fatalf("property %d: pushMethod %v from %v", i, pm, want)
			}
		}
	})
}

// checkConfig: each non-null scalar of in reads back through the mapper
// SDK's DecodeConfig as in holds it.
func checkConfig(t *testing.T, what string, in *structpb.Struct, out *dmiv1beta1.CustomizedValue) {
	t.Helper()
	params, err := mappersdk.DecodeConfig(out)
	if err != nil {
		t.Fatalf("%s configData does not decode in the mapper SDK: %v", what, err)
	}
	for k, v := range in.GetFields() {
		got, ok := params[k]
		switch x := v.GetKind().(type) {
		case nil, *structpb.Value_NullValue:
			if ok {
				t.Fatalf("%s %q: null became %v", what, k, got)
			}
		case *structpb.Value_StringValue:
			if got != x.StringValue {
				t.Fatalf("%s %q: %q became %v", what, k, x.StringValue, got)
			}
		case *structpb.Value_BoolValue:
			if got != x.BoolValue {
				t.Fatalf("%s %q: %v became %v", what, k, x.BoolValue, got)
			}
		case *structpb.Value_NumberValue:
			n := x.NumberValue
			switch g := got.(type) {
			case int64:
				if float64(g) != n {
					t.Fatalf("%s %q: %v became %d", what, k, n, g)
				}
			case float64:
				// A float32 on the wire (as edgecore): equal to within its
				// precision, NaN stays NaN.
				if math.IsNaN(n) != math.IsNaN(g) || (!math.IsNaN(n) && float64(float32(n)) != float64(float32(g)) && !math.IsInf(float64(float32(n)), 0)) {
					t.Fatalf("%s %q: %v became %v", what, k, n, g)
				}
			default:
				t.Fatalf("%s %q: number %v became %T %v", what, k, n, got, got)
			}
		default:
			if !ok {
				t.Fatalf("%s %q: a %T was dropped", what, k, x)
			}
		}
	}
}

// FuzzReports feeds arbitrary requests to the mapper API's report calls
// (ReportDeviceStatus, ReportDeviceStates, ReportDeviceCondition): none
// panics, every refusal is a gRPC status of the codes the API answers,
// and what is stored is only what the model allows: a known property with
// a value of its type, a state of the states, a condition a mapper sets.
func FuzzReports(f *testing.F) {
	ok := &dmiv1beta1.ReportDeviceStatusRequest{DeviceNamespace: "default", DeviceName: "a", ReportedDevice: &dmiv1beta1.DeviceStatus{Twins: []*dmiv1beta1.Twin{
		{PropertyName: "temp", Reported: &dmiv1beta1.TwinProperty{Value: "21", Metadata: map[string]string{"timestamp": "1700000000123"}}, ObservedDesired: &dmiv1beta1.TwinProperty{Value: "22"}},
		{PropertyName: "ratio", Reported: &dmiv1beta1.TwinProperty{Value: "x"}},
		{PropertyName: "ghost", Reported: &dmiv1beta1.TwinProperty{Value: "1"}},
	}}}
	b, _ := proto.Marshal(ok)
	f.Add(b, "ok", "Authenticated")
	f.Add([]byte{}, "", "")
	f.Add([]byte{0x0a, 0x01, 'a'}, "EXPLODED", "Valid")

	f.Fuzz(func(t *testing.T, b []byte, state, condType string) {
		var req dmiv1beta1.ReportDeviceStatusRequest
		if proto.Unmarshal(b, &req) != nil {
			return
		}
		edge := newFakeEdge()
		edge.putModel(model("thermo", "virtual"))
		edge.putDevice(device("a", "thermo", "virtual", "", "1"))
		s, err := New(Config{StateDir: t.TempDir(), Node: "edge", ReportRate: -1}, edge, nil)
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		allowed := map[codes.Code]bool{codes.OK: true, codes.InvalidArgument: true, codes.PermissionDenied: true}
		_, err = s.ReportDeviceStatus(ctx, &req)
		if !allowed[status.Code(err)] {
			t.Fatalf("ReportDeviceStatus: %v", err)
		}
		_, err = s.ReportDeviceStates(ctx, &dmiv1beta1.ReportDeviceStatesRequest{DeviceNamespace: req.GetDeviceNamespace(), DeviceName: req.GetDeviceName(), State: state})
		if !allowed[status.Code(err)] {
			t.Fatalf("ReportDeviceStates: %v", err)
		}
		_, err = conditions{s: s}.ReportDeviceCondition(ctx, &mapperv1.ReportDeviceConditionRequest{DeviceNamespace: req.GetDeviceNamespace(),
			DeviceName: req.GetDeviceName(), Type: condType, Message: state})
		if !allowed[status.Code(err)] {
			t.Fatalf("ReportDeviceCondition: %v", err)
		}
		mod := model("thermo", "virtual")
		edge.mu.Lock()
		defer edge.mu.Unlock()
		for _, r := range edge.reports {
			p := modelProperty(mod, r.GetProperty())
			if r.GetDevice().GetName() != "a" || p == nil {
				t.Fatalf("stored a report for %v %q", r.GetDevice(), r.GetProperty())
			}
			if _, err := twinvalue.Parse(twinvalue.Type(p.GetType()), textOf(r.GetValue())); err != nil {
				t.Fatalf("stored %q value %v, not a %s: %v", r.GetProperty(), r.GetValue(), p.GetType(), err)
			}
		}
		for _, st := range edge.states {
			if _, err := twinvalue.ParseState(st.GetState()); err != nil && st.GetMapper() != "" {
				t.Fatalf("stored state %q", st.GetState())
			}
		}
		for _, c := range edge.conditions {
			if c.GetType() != "ReportsAccepted" && !mapperConditions[c.GetType()] {
				t.Fatalf("stored condition %q", c.GetType())
			}
		}
	})
}

// textOf is a stored value as a mapper would have written it.
func textOf(v *linkv1.Value) string {
	switch k := v.GetKind().(type) {
	case *linkv1.Value_IntValue:
		s, _ := twinvalue.Format(twinvalue.Int, k.IntValue)
		return s
	case *linkv1.Value_DoubleValue:
		s, _ := twinvalue.Format(twinvalue.Double, k.DoubleValue)
		return s
	case *linkv1.Value_BoolValue:
		s, _ := twinvalue.Format(twinvalue.Boolean, k.BoolValue)
		return s
	case *linkv1.Value_StringValue:
		return k.StringValue
	case *linkv1.Value_BytesValue:
		s, _ := twinvalue.Format(twinvalue.Bytes, k.BytesValue)
		return s
	}
	return "\x00no value"
}
