package dmi

import (
	"context"
	"maps"
	"math"
	"os"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	mappersdk "github.com/dowse-dev/dowse/mappers/mapper"
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
				(pm.GetAnomalyDetection() == nil) != (want.GetAnomalyDetection() == nil) ||
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
			if v, err := twinvalue.Canonical(twinvalue.Type(p.GetType()), r.GetReported().GetValue()); err != nil || v != r.GetReported().GetValue() {
				t.Fatalf("stored %q value %v, not the canonical text of a %s: %q, %v", r.GetProperty(), r.GetReported(), p.GetType(), v, err)
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

// FuzzMapperRegister feeds arbitrary registrations to MapperRegister, as
// any process that can reach dmi.sock may send them: none panics; one
// without a protocol or an address (its socket) is refused with
// InvalidArgument and leaves nothing behind; any other is served: withData
// answers with exactly the Devices the assignment rule gives it (its name
// asked for, else its protocol unless a Device asks for it by name; only
// those whose model the node has) and their models, and the mapper is
// remembered as it registered: an agent started again on the same state
// directory restores it with the same name, protocol, versions and socket.
func FuzzMapperRegister(f *testing.F) {
	for _, r := range []*dmiv1beta1.MapperRegisterRequest{
		{WithData: true, Mapper: &dmiv1beta1.MapperInfo{Name: "generic", Protocol: "virtual", Address: []byte("/tmp/m.sock"), Version: "v1", ApiVersion: "v1beta1"}},
		{WithData: true, Mapper: &dmiv1beta1.MapperInfo{Name: "named", Protocol: "modbus", Address: []byte("unix:///tmp/n.sock")}},
		{Mapper: &dmiv1beta1.MapperInfo{Name: "opc", Protocol: "opcua", Address: []byte(" unix:/tmp/o.sock ")}},
		{Mapper: &dmiv1beta1.MapperInfo{Name: "noaddr", Protocol: "virtual", Address: []byte("unix://")}},
		{Mapper: &dmiv1beta1.MapperInfo{Name: "noproto", Address: []byte("/tmp/x.sock")}},
		// Found by this target: an address the registry file could not
		// hold as sent, and one whose path began with a space after the
		// scheme (restored without it).
		{Mapper: &dmiv1beta1.MapperInfo{Name: "latin1", Protocol: "virtual", Address: []byte("/tmp/\xff.sock")}},
		{Mapper: &dmiv1beta1.MapperInfo{Name: "spaced", Protocol: "virtual", Address: []byte("unix: /tmp/s.sock")}},
		{},
	} {
		b, _ := proto.Marshal(r)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var req dmiv1beta1.MapperRegisterRequest
		if proto.Unmarshal(b, &req) != nil {
			return
		}
		edge := newFakeEdge()
		edge.putModel(model("thermo", "virtual"))
		edge.putModel(model("plc", "modbus"))
		edge.putDevice(device("a", "thermo", "virtual", "", "1"))
		edge.putDevice(device("b", "thermo", "virtual", "named", "2"))
		edge.putDevice(device("c", "ghost", "virtual", "", "3")) // its model is not on the node
		edge.putDevice(device("d", "plc", "", "", "4"))          // its protocol is its model's
		dir := t.TempDir()
		cfg := Config{StateDir: dir, Node: "edge", ReportRate: -1, RetryMin: time.Hour, RetryMax: time.Hour}
		s, err := New(cfg, edge, nil)
		if err != nil {
			t.Fatal(err)
		}
		// Started as Start does, without its socket: the workers dial
		// sockets nobody serves and are stopped below.
		ctx, cancel := context.WithCancel(context.Background())
		s.mu.Lock()
		s.runCtx, s.log = ctx, logr.Discard()
		s.mu.Unlock()
		stop := func(s *Server) {
			s.mu.Lock()
			for _, m := range s.mappers {
				m.cancel()
			}
			s.mu.Unlock()
			s.wg.Wait()
			for _, m := range s.mappers {
				_ = m.conn.Close()
			}
		}
		defer func() { cancel(); stop(s) }()

		info := req.GetMapper()
		resp, err := s.MapperRegister(ctx, &req)
		if info.GetProtocol() == "" || mapperAddress(info) == "" {
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("a registration without a protocol or an address: %v, want InvalidArgument", err)
			}
		}
		if err != nil {
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("MapperRegister: %v", err)
			}
			if _, statErr := os.Stat(s.mappersFile()); len(s.mappers) != 0 || statErr == nil {
				t.Fatalf("a refused registration was kept (%d mappers, file: %v)", len(s.mappers), statErr)
			}
			return
		}
		if _, err := proto.Marshal(resp); err != nil {
			t.Fatalf("the answer does not marshal: %v", err)
		}
		// The assignment rule, spelled out for one mapper on the node.
		name, protocol := info.GetName(), info.GetProtocol()
		asked := name == "named"
		want := map[string]bool{}
		if req.GetWithData() {
			switch {
			case name == "named":
				want["default/b"] = true
			case !asked && protocol == "virtual":
				want["default/a"], want["default/b"] = true, true
			case !asked && protocol == "modbus":
				want["default/d"] = true
			}
		}
		got := map[string]bool{}
		for _, d := range resp.GetDeviceList() {
			got[d.GetNamespace()+"/"+d.GetName()] = true
		}
		if !maps.Equal(got, want) {
			t.Fatalf("mapper %q (%q) was handed %v, want %v", name, protocol, got, want)
		}
		models := map[string]bool{}
		for _, m := range resp.GetModelList() {
			models[m.GetName()] = true
		}
		wantModels := map[string]bool{}
		for k := range want {
			wantModels[map[string]string{"default/a": "thermo", "default/b": "thermo", "default/d": "plc"}[k]] = true
		}
		if !maps.Equal(models, wantModels) {
			t.Fatalf("mapper %q was handed models %v, want %v", name, models, wantModels)
		}

		// An agent started again restores it as it registered.
		again, err := New(cfg, edge, nil)
		if err != nil {
			t.Fatalf("an agent restarting on what this registration left: %v", err)
		}
		defer stop(again)
		m := again.mappers[name]
		if len(again.mappers) != 1 || m == nil {
			t.Fatalf("restored %d mappers, none named %q", len(again.mappers), name)
		}
		ri := m.info
		if ri.GetName() != name || ri.GetProtocol() != protocol || ri.GetVersion() != info.GetVersion() ||
			ri.GetApiVersion() != info.GetApiVersion() || mapperAddress(ri) != mapperAddress(info) {
			t.Fatalf("restored %v, registered %v", ri, info)
		}
	})
}
