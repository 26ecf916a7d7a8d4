package convert

import (
	"bufio"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

func load(t *testing.T, name string) []*unstructured.Unstructured {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := utilyaml.NewYAMLOrJSONDecoder(bufio.NewReader(f), 4096)
	var out []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return out
			}
			t.Fatal(err)
		}
		out = append(out, &unstructured.Unstructured{Object: m})
	}
}

func notes(r Result) string {
	var s []string
	for _, n := range r.Notes {
		s = append(s, n.String())
	}
	return strings.Join(s, "\n")
}

func TestAkriConfigurations(t *testing.T) {
	for _, c := range []struct {
		file, handler, details string
		capacity               int32
		svcPort                int32
		notes                  []string
	}{
		{file: "akri-onvif-video-configuration.yaml", handler: "onvif", capacity: 5, svcPort: 80,
			details: `"scopes":{"action":"Include","items":["onvif://www.onvif.org/name/GreatONVIFCamera","onvif://www.onvif.org/name/AwesomeONVIFCamera"]}`},
		{file: "akri-udev-video-configuration.yaml", handler: "udev", capacity: 5, svcPort: 80,
			details: `"udevRules":["KERNEL==\"video[0-9]*\""]`},
		{file: "akri-opcua-configuration.yaml", handler: "opcua", capacity: 5, svcPort: 80,
			details: `"discoveryUrls":["opc.tcp://localhost:4840/"]`},
		{file: "akri-debug-echo-foo-configuration.yaml", handler: "debug-echo", capacity: 5, svcPort: 6052,
			details: `"descriptions":["foo0","foo1"]`, notes: []string{`"debugEcho" became "debug-echo"`}},
	} {
		r, err := Convert(load(t, c.file))
		if err != nil {
			t.Fatalf("%s: %v", c.file, err)
		}
		if len(r.Objects) != 1 {
			t.Fatalf("%s: %d objects", c.file, len(r.Objects))
		}
		cfg, ok := r.Objects[0].(*v1alpha1.Configuration)
		if !ok {
			t.Fatalf("%s: a %T", c.file, r.Objects[0])
		}
		s := cfg.Spec
		if s.DiscoveryHandler.Name != c.handler || s.Capacity != c.capacity || s.DiscoveryHandler.DiscoveryDetails == nil ||
			!strings.Contains(string(s.DiscoveryHandler.DiscoveryDetails.Raw), c.details) {
			t.Errorf("%s: handler %q capacity %d details %s", c.file, s.DiscoveryHandler.Name, s.Capacity, s.DiscoveryHandler.DiscoveryDetails)
		}
		if strings.Contains(string(s.DiscoveryHandler.DiscoveryDetails.Raw), "opcuaDiscoveryMethod") {
			t.Errorf("%s: Akri's OPC UA nesting kept: %s", c.file, s.DiscoveryHandler.DiscoveryDetails.Raw)
		}
		if s.BrokerSpec == nil || s.BrokerSpec.BrokerPodSpec == nil || len(s.BrokerSpec.BrokerPodSpec.Containers) != 1 {
			t.Fatalf("%s: broker %+v", c.file, s.BrokerSpec)
		}
		if _, ok := s.BrokerSpec.BrokerPodSpec.Containers[0].Resources.Limits[v1alpha1.BrokerResourcePlaceholder]; !ok {
			t.Errorf("%s: the slot placeholder is gone: %v", c.file, s.BrokerSpec.BrokerPodSpec.Containers[0].Resources.Limits)
		}
		if s.InstanceServiceSpec == nil || s.InstanceServiceSpec.Ports[0].Port != c.svcPort || s.ConfigurationServiceSpec == nil {
			t.Errorf("%s: Services %+v %+v", c.file, s.InstanceServiceSpec, s.ConfigurationServiceSpec)
		}
		got := notes(r)
		for _, want := range c.notes {
			if !strings.Contains(got, want) {
				t.Errorf("%s: notes lack %q:\n%s", c.file, want, got)
			}
		}
		if strings.Contains(got, "not carried over") {
			t.Errorf("%s: a sample's field was dropped:\n%s", c.file, got)
		}
	}
}

func TestAkriLeftovers(t *testing.T) {
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "akri.sh/v0", "kind": "Configuration",
		"metadata": map[string]any{"name": "x", "namespace": "plant"},
		"spec": map[string]any{"discoveryHandler": map[string]any{"name": "zeroconf", "discoveryDetails": "kind: _http._tcp"},
			"futureField": map[string]any{"a": "b"}}}}
	r, err := Convert([]*unstructured.Unstructured{u})
	if err != nil {
		t.Fatal(err)
	}
	got := notes(r)
	for _, want := range []string{"configuration/plant/x: spec.futureField.a: not carried over", `"zeroconf" is not one of Akri's built-in handlers`} {
		if !strings.Contains(got, want) {
			t.Errorf("notes lack %q:\n%s", want, got)
		}
	}
	bad := u.DeepCopy()
	_ = unstructured.SetNestedField(bad.Object, "a: [b", "spec", "discoveryHandler", "discoveryDetails")
	if _, err := Convert([]*unstructured.Unstructured{bad}); err == nil || !strings.Contains(err.Error(), "configuration/plant/x: spec.discoveryHandler.discoveryDetails") {
		t.Errorf("bad YAML details: %v", err)
	}
}

func TestKubeEdgeObjects(t *testing.T) {
	r, err := Convert(append(load(t, "kubeedge-modbus.yaml"), load(t, "kubeedge-onvif-device.yaml")...))
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Objects) != 3 {
		t.Fatalf("%d objects", len(r.Objects))
	}
	model, ok := r.Objects[0].(*v1alpha1.DeviceModel)
	if !ok || model.Spec.Protocol != "modbus" || model.Spec.Properties[0].Type != "INT" || model.Spec.Properties[0].AccessMode != "ReadWrite" {
		t.Errorf("model %+v", r.Objects[0])
	}
	dev, ok := r.Objects[1].(*v1alpha1.Device)
	if !ok {
		t.Fatalf("a %T", r.Objects[1])
	}
	p := dev.Spec.Properties[0]
	if dev.Spec.NodeName != "edge-node" || dev.Spec.Protocol.ProtocolName != "modbus" || p.PushMethod == nil || p.Visitors == nil ||
		!strings.Contains(string(p.Visitors.ConfigData.Raw), `"register":"CoilRegister"`) || p.ReportToCloud == nil || !*p.ReportToCloud {
		t.Errorf("device %+v", dev.Spec)
	}
	got := notes(r)
	if !strings.Contains(got, "device/modbus-instance-01: status: not carried over") {
		t.Errorf("notes lack the dropped status:\n%s", got)
	}
	if strings.Contains(got, "spec") && strings.Contains(got, "not carried over: Dowse") {
		t.Errorf("a KubeEdge sample's spec field was dropped:\n%s", got)
	}
	if p.ReportCycle == nil || p.ReportCycle.String() != "10s" || !strings.Contains(got, `spec.properties[0].reportCycle: 10000000000 read as nanoseconds, as mapper-framework before v1.18 read it (since then it reads milliseconds: 116 days), and became "10s"`) {
		t.Errorf("reportCycle %v; notes:\n%s", p.ReportCycle, got)
	}
	old := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "devices.kubeedge.io/v1alpha2", "kind": "Device", "metadata": map[string]any{"name": "d"}}}
	r, err = Convert([]*unstructured.Unstructured{old})
	if err != nil || len(r.Objects) != 0 || !strings.Contains(notes(r), "not devices.kubeedge.io/v1beta1") {
		t.Errorf("a v1alpha2 Device: %v %v", err, notes(r))
	}
	unknown := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "devices.kubeedge.io/v1beta1", "kind": "DeviceModel", "metadata": map[string]any{"name": "m"},
		"spec": map[string]any{"protocol": "modbus", "firmware": "1.2"}}}
	r, err = Convert([]*unstructured.Unstructured{unknown})
	if err != nil || !strings.Contains(notes(r), "spec.firmware: not carried over") {
		t.Errorf("a field Dowse lacks: %v %s", err, notes(r))
	}
}

// TestKubeEdge123Shapes: KubeEdge 1.23's spec.stateReport is carried over
// (its integer cycle as the milliseconds mapper-framework reads since
// v1.18), the earlier status.reportToCloud/reportCycle become it, a
// DeviceStatus object is noted, not converted.
func TestKubeEdge123Shapes(t *testing.T) {
	device := func(spec, status map[string]any) *unstructured.Unstructured {
		spec["deviceModelRef"] = map[string]any{"name": "m"}
		return &unstructured.Unstructured{Object: map[string]any{"apiVersion": "devices.kubeedge.io/v1beta1", "kind": "Device",
			"metadata": map[string]any{"name": "d", "namespace": "ns"}, "spec": spec, "status": status}}
	}
	r, err := Convert([]*unstructured.Unstructured{
		device(map[string]any{"stateReport": map[string]any{"reportToCloud": true, "reportCycle": float64(5000)},
			"properties": []any{map[string]any{"name": "t", "collectCycle": float64(500)}}}, nil),
		device(map[string]any{}, map[string]any{"reportToCloud": true, "reportCycle": float64(2000), "state": "ok"}),
		device(map[string]any{}, nil),
		{Object: map[string]any{"apiVersion": "devices.kubeedge.io/v1beta1", "kind": "DeviceStatus", "metadata": map[string]any{"name": "d", "namespace": "ns"},
			"status": map[string]any{"twins": []any{map[string]any{"propertyName": "t"}}}}},
	})
	if err != nil || len(r.Objects) != 3 {
		t.Fatalf("%v, %d objects; notes:\n%s", err, len(r.Objects), notes(r))
	}
	got := notes(r)
	d0, d1, d2 := r.Objects[0].(*v1alpha1.Device), r.Objects[1].(*v1alpha1.Device), r.Objects[2].(*v1alpha1.Device)
	if sr := d0.Spec.StateReport; sr == nil || !sr.Reports() || sr.ReportCycle.String() != "5000" || d0.Spec.Properties[0].CollectCycle.String() != "500" {
		t.Errorf("1.23 Device: stateReport %+v, collectCycle %v; want both integers kept as milliseconds", sr, d0.Spec.Properties[0].CollectCycle)
	}
	if sr := d1.Spec.StateReport; sr == nil || !sr.Reports() || sr.ReportCycle.String() != "2000" ||
		!strings.Contains(got, "status.reportToCloud, status.reportCycle: became spec.stateReport") {
		t.Errorf("earlier Device: stateReport %+v; notes:\n%s", sr, got)
	}
	if d2.Spec.StateReport != nil {
		t.Errorf("a Device without state reporting got %+v", d2.Spec.StateReport)
	}
	if !strings.Contains(got, "devicestatus/ns/d: not converted: Dowse keeps") {
		t.Errorf("DeviceStatus not noted:\n%s", got)
	}
	r, err = Convert([]*unstructured.Unstructured{device(map[string]any{"stateReport": map[string]any{"reportCycle": float64(5000)}}, nil)})
	if err != nil || r.Objects[0].(*v1alpha1.Device).Spec.StateReport.Reports() || !strings.Contains(notes(r), "spec.stateReport.reportToCloud: unset, KubeEdge's default") {
		t.Errorf("stateReport without reportToCloud: %v; notes:\n%s", err, notes(r))
	}
}
