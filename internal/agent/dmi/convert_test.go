package dmi

import (
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
)

func TestCustomized(t *testing.T) {
	s, err := structpb.NewStruct(map[string]any{
		"address": "127.0.0.1:502", "slaveID": 1.0, "big": 5e9, "scale": 0.5, "swap": true,
		"nested": map[string]any{"a": 1.0}, "list": []any{"x"}, "none": nil,
	})
	if err != nil {
		t.Fatal(err)
	}
	cv := customized(s)
	check := func(key string, want proto.Message) {
		t.Helper()
		a := cv.Data[key]
		if a == nil {
			t.Fatalf("%s missing", key)
		}
		got, err := a.UnmarshalNew()
		if err != nil {
			t.Fatalf("%s: %v", key, err)
		}
		if !proto.Equal(got, want) {
			t.Errorf("%s: %v (%s), want %v", key, got, a.TypeUrl, want)
		}
	}
	check("address", wrapperspb.String("127.0.0.1:502"))
	check("slaveID", wrapperspb.Int32(1))
	check("big", wrapperspb.Int64(5_000_000_000))
	check("scale", wrapperspb.Float(0.5))
	check("swap", wrapperspb.Bool(true))
	check("nested", s.Fields["nested"].GetStructValue())
	check("list", s.Fields["list"].GetListValue())
	if _, ok := cv.Data["none"]; ok {
		t.Error("null sent")
	}
	if customized(nil).GetData() == nil {
		t.Error("nil configData gives a nil map (mapper-framework dereferences it)")
	}
}

// TestToDMIDevice: everything mapper-framework dereferences unchecked is set.
func TestToDMIDevice(t *testing.T) {
	d := toDMIDevice(&linkv1.EdgeDevice{
		Ref: &linkv1.DeviceRef{Namespace: "ns", Name: "d"}, Model: "m", ProtocolName: "modbus",
		Properties: []*linkv1.EdgeDeviceProperty{{Name: "p", CollectCycleMs: 500}, {Name: "q", VisitorProtocol: "other", Desired: &linkv1.TwinValue{Value: "3", Metadata: map[string]string{"type": "int"}}}},
	})
	if d.Name != "d" || d.Namespace != "ns" || d.Spec.DeviceModelReference != "m" || d.Spec.Protocol.ConfigData == nil || !d.Status.ReportToCloud {
		t.Fatalf("device %v", d)
	}
	p, q := d.Spec.Properties[0], d.Spec.Properties[1]
	if p.Desired == nil || p.Visitors == nil || p.Visitors.ConfigData == nil || p.Visitors.ProtocolName != "modbus" || p.CollectCycle != 500 {
		t.Fatalf("property p %v", p)
	}
	if q.Desired.Value != "3" || q.Desired.Metadata["type"] != "int" || q.Visitors.ProtocolName != "other" {
		t.Fatalf("property q %v", q)
	}
	if d.Status.ReportCycle != 0 {
		t.Fatalf("status %v: want the mapper's default state cycle", d.Status)
	}
	// KubeEdge 1.23's spec.stateReport, as edgecore hands it: status.
	d = toDMIDevice(&linkv1.EdgeDevice{Ref: &linkv1.DeviceRef{Namespace: "ns", Name: "d"}, NoStateReports: true, StateReportCycleMs: 30000})
	if d.Status.ReportToCloud || d.Status.ReportCycle != 30000 {
		t.Fatalf("status %v: want no state reports, cycle 30000 ms", d.Status)
	}
}

// TestAnomalyDetectionAsEdgecore: KubeEdge 1.23's pushMethod.anomalyDetection
// reaches the mapper with each value wrapped as edgecore wraps configData.
func TestAnomalyDetectionAsEdgecore(t *testing.T) {
	s, err := structpb.NewStruct(map[string]any{"service": "http://ad:8080", "window": 10})
	if err != nil {
		t.Fatal(err)
	}
	pm := dmiPushMethod(&linkv1.PushMethod{AnomalyDetection: s})
	ad := pm.GetAnomalyDetection().GetData()
	var svc wrapperspb.StringValue
	var window wrapperspb.Int32Value
	if len(ad) != 2 || ad["service"].UnmarshalTo(&svc) != nil || svc.Value != "http://ad:8080" || ad["window"].UnmarshalTo(&window) != nil || window.Value != 10 {
		t.Fatalf("anomalyDetection %v", ad)
	}
	if dmiPushMethod(&linkv1.PushMethod{Mqtt: &linkv1.PushMethodMQTT{}}).GetAnomalyDetection() != nil {
		t.Fatal("an anomalyDetection made up for a pushMethod without one")
	}
}
