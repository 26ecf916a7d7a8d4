package mqtt

import (
	"errors"
	"os"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/dowse-dev/dowse/internal/sparkplug"
	"github.com/dowse-dev/dowse/mappers/mapper"
	"github.com/dowse-dev/dowse/shared/twinvalue"
)

func TestCommandMetric(t *testing.T) {
	for _, c := range []struct {
		dt   sparkplug.DataType
		typ  twinvalue.Type
		v    any
		kind sparkplug.ValueKind
		u    uint64
		f    float64
		err  string
	}{
		{sparkplug.Int32, twinvalue.Int, int64(-5), sparkplug.IntValue, uint64(uint32(0xFFFFFFFB)), 0, ""},
		{sparkplug.UInt8, twinvalue.Int, int64(300), 0, 0, 0, "300"},
		{sparkplug.Int64, twinvalue.Int, int64(-1), sparkplug.LongValue, ^uint64(0), 0, ""},
		{sparkplug.Double, twinvalue.Double, 2.5, sparkplug.DoubleValue, 0, 2.5, ""},
		{sparkplug.Float, twinvalue.Float, 0.5, sparkplug.FloatValue, 0, 0.5, ""},
		{sparkplug.Unknown, twinvalue.Int, int64(7), sparkplug.LongValue, 7, 0, ""},
		{sparkplug.Unknown, twinvalue.Boolean, true, sparkplug.BoolValue, 0, 0, ""},
		{sparkplug.DataSet, twinvalue.String, "x", 0, 0, 0, "not sent"},
	} {
		m, err := commandMetric("m", c.dt, c.typ, c.v)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%v %v: error %v, want %q", c.dt, c.v, err, c.err)
			}
			continue
		}
		if err != nil || m.Kind != c.kind || m.Uint != c.u || m.Float != c.f {
			t.Errorf("%v %v: %+v %v", c.dt, c.v, m, err)
		}
		// What is sent decodes to the value.
		p, err := sparkplug.Decode(sparkplug.Encode(&sparkplug.Payload{Metrics: []sparkplug.Metric{m}}), -1)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := metricValue(p.Metrics[0]); err != nil || (c.kind == sparkplug.BoolValue && got != true) {
			t.Errorf("%v %v: decoded %v %v", c.dt, c.v, got, err)
		}
	}
	if v, _ := metricValue(sparkplug.Metric{Datatype: sparkplug.Int16, Kind: sparkplug.IntValue, Uint: 0xFFFF_FFFE}); v != int64(-2) {
		t.Errorf("Int16 -2 read as %v", v)
	}
}

func TestHAValue(t *testing.T) {
	b := &mapper.Property{Name: "on", Type: twinvalue.Boolean, Data: &point{payloadOn: "ON", payloadOff: "OFF"}}
	f := &mapper.Property{Name: "t", Type: twinvalue.Double, Data: &point{field: "temperature"}}
	for _, c := range []struct {
		p       *mapper.Property
		payload string
		want    any
		err     string
	}{
		{b, "ON", true, ""}, {b, "OFF", false, ""}, {b, "true", true, ""}, {b, "maybe", nil, "BOOLEAN"},
		{f, `{"temperature": 21.5}`, 21.5, ""}, {f, `{"temperature": "22"}`, 22.0, ""}, {f, `{"humidity": 1}`, nil, "no field"},
		{f, `[1]`, nil, "not a JSON object"},
	} {
		v, err := haValue(c.p, []byte(c.payload))
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%q: %v %v, want error %q", c.payload, v, err, c.err)
			}
			continue
		}
		if err != nil || v != c.want {
			t.Errorf("%q: %v %v, want %v", c.payload, v, err, c.want)
		}
	}
}

func TestParseDevice(t *testing.T) {
	for _, bad := range []mapper.Params{
		{}, {"broker": "tcp://b:1883"}, {"broker": "tcp://b:1883", "source": "sparkplug", "group": "G"},
		{"broker": "tcp://b:1883", "source": "sparkplug", "group": "G/x", "edgeNode": "E"}, {"broker": "tcp://b:1883", "source": "x"},
		{"broker": "tcp://b:1883", "source": "homeassistant", "qos": 2},
		{"broker": "tcp://b:1883", "source": "sparkplug", "group": "G", "edgeNode": "E", "primaryHostId": "a/b"},
		{"broker": "tcp://b:1883", "source": "homeassistant", "primaryHostId": "h"},
	} {
		if _, err := parseDevice(bad); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
	d, err := NewDriver(mapper.DeviceInfo{Protocol: mapper.Params{"broker": "tcp://b:1883", "source": "homeassistant", "stateTopic": "s"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Prepare(&mapper.Property{Name: "x", Type: twinvalue.Int, Writable: true, Visitor: mapper.Params{}}); err == nil {
		t.Error("a writable property without a command topic was accepted")
	}
}

// TestSamples: the sample model's visitors and the sample Configuration's
// protocol configData (its ${...} filled as the controller does) are what
// the mapper accepts.
func TestSamples(t *testing.T) {
	var model struct {
		Spec struct {
			Properties []struct {
				Name       string
				Type       string
				AccessMode string `json:"accessMode"`
				Visitors   struct {
					ConfigData map[string]any `json:"configData"`
				}
			}
		}
	}
	var cfg struct {
		Spec struct {
			DeviceTemplate struct {
				Protocol struct {
					ConfigData map[string]any `json:"configData"`
				}
			} `json:"deviceTemplate"`
		}
	}
	for f, v := range map[string]any{"mqtt-pump-model.yaml": &model, "mqtt-pumps.yaml": &cfg} {
		raw, err := os.ReadFile("../../samples/" + f)
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(raw, v); err != nil {
			t.Fatal(err)
		}
	}
	fill := strings.NewReplacer("${MQTT_BROKER}", "tcp://b:1883", "${MQTT_SOURCE}", "sparkplug", "${MQTT_SPARKPLUG_GROUP}", "Plant1",
		"${MQTT_SPARKPLUG_EDGE_NODE}", "Line1", "${MQTT_SPARKPLUG_DEVICE}", "Pump1")
	conf := mapper.Params{}
	for k, v := range cfg.Spec.DeviceTemplate.Protocol.ConfigData {
		if s, ok := v.(string); ok {
			v = fill.Replace(s)
		}
		conf[k] = v
	}
	d, err := NewDriver(mapper.DeviceInfo{Protocol: conf})
	if err != nil {
		t.Fatal(err)
	}
	if len(model.Spec.Properties) != 3 {
		t.Fatalf("model %+v", model)
	}
	for _, mp := range model.Spec.Properties {
		typ, err := twinvalue.ParseType(mp.Type)
		if err != nil {
			t.Fatal(err)
		}
		p := &mapper.Property{Name: mp.Name, Type: typ, Writable: mp.AccessMode == "ReadWrite", Visitor: mapper.Params(mp.Visitors.ConfigData)}
		if err := d.Prepare(p); err != nil || !p.Subscribe {
			t.Errorf("%s: %v (subscribe %v)", mp.Name, err, p.Subscribe)
		}
	}
}

// A death certificate makes the device offline (mapper.ErrDeviceOffline);
// an NDEATH of an older session (another bdSeq than the latest NBIRTH's)
// is ignored; a birth brings the values back.
func TestDeathCertificates(t *testing.T) {
	d := &Driver{cfg: deviceConfig{source: SourceSparkplug, group: "G", edgeNode: "E", device: "D"}, last: map[string]any{}}
	p := &mapper.Property{Name: "t", Type: twinvalue.Double, Data: &point{metric: "T"}}
	var got []error
	d.ps, d.sink = []*mapper.Property{p}, func(_ *mapper.Property, _ any, err error) { got = append(got, err) }
	seq := func(n uint64) []byte {
		return sparkplug.Encode(&sparkplug.Payload{Metrics: []sparkplug.Metric{{Name: "bdSeq", HasName: true, Datatype: sparkplug.UInt64, Kind: sparkplug.LongValue, Uint: n}}})
	}
	birth := sparkplug.Encode(&sparkplug.Payload{Metrics: []sparkplug.Metric{{Name: "T", HasName: true, Datatype: sparkplug.Double, Kind: sparkplug.DoubleValue, Float: 1.5}}})
	d.sparkplugMessage("spBv1.0/G/NBIRTH/E", seq(2))
	d.sparkplugMessage("spBv1.0/G/DBIRTH/E/D", birth)
	d.sparkplugMessage("spBv1.0/G/NDEATH/E", seq(1))
	if len(got) != 1 || got[0] != nil {
		t.Fatalf("after a birth and an older session's NDEATH: %v, want one value", got)
	}
	d.sparkplugMessage("spBv1.0/G/NDEATH/E", seq(2))
	if len(got) != 2 || !errors.Is(got[1], mapper.ErrDeviceOffline) || !strings.Contains(got[1].Error(), "the edge node sent its death certificate (NDEATH)") {
		t.Fatalf("after the NDEATH: %v", got)
	}
	d.sparkplugMessage("spBv1.0/G/DBIRTH/E/D", birth)
	d.sparkplugMessage("spBv1.0/G/DDEATH/E/D", nil)
	if len(got) != 4 || got[2] != nil || !errors.Is(got[3], mapper.ErrDeviceOffline) || !strings.Contains(got[3].Error(), "(DDEATH)") {
		t.Fatalf("after a birth and a DDEATH: %v", got)
	}
}

// Arrays and DataSets are reported as JSON (for a STRING property).
func TestArrayAndDataSetValues(t *testing.T) {
	for _, c := range []struct {
		m    sparkplug.Metric
		want string
		err  string
	}{
		{sparkplug.Metric{Datatype: sparkplug.Int16Array, Kind: sparkplug.BytesValue, Bytes: []byte{0xD0, 0x8A, 0x30, 0x75}}, `[-30000,30000]`, ""},
		{sparkplug.Metric{Datatype: sparkplug.BooleanArray, Kind: sparkplug.BytesValue, Bytes: []byte{3, 0, 0, 0, 0xA0}}, `[true,false,true]`, ""},
		{sparkplug.Metric{Datatype: sparkplug.StringArray, Kind: sparkplug.BytesValue, Bytes: []byte("a\x00\"b\"\x00")}, `["a","\"b\""]`, ""},
		{sparkplug.Metric{Datatype: sparkplug.FloatArray, Kind: sparkplug.BytesValue, Bytes: []byte{0, 0, 0xC0, 0x7F, 0, 0, 0xC0, 0x3F}}, `[null,1.5]`, ""},
		{sparkplug.Metric{Datatype: sparkplug.UInt64Array, Kind: sparkplug.BytesValue, Bytes: []byte{0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF}}, `[18446744073709551615]`, ""},
		{sparkplug.Metric{Datatype: sparkplug.DataSet, Kind: sparkplug.DataSetKind, Bytes: sparkplug.EncodeDataSet(&sparkplug.Table{
			Columns: []string{"step", "temp", "ok"}, Types: []sparkplug.DataType{sparkplug.Int32, sparkplug.Double, sparkplug.Boolean},
			Rows: [][]sparkplug.Cell{{{Kind: sparkplug.IntValue, Uint: 0xFFFFFFFF}, {Kind: sparkplug.DoubleValue, Float: 20.5}, {}}}})},
			`{"columns":["step","temp","ok"],"types":["Int32","Double","Boolean"],"rows":[[-1,20.5,null]]}`, ""},
		{sparkplug.Metric{Name: "a", Datatype: sparkplug.Int32Array, Kind: sparkplug.BytesValue, Bytes: []byte{1, 2}}, "", `metric "a": not a Sparkplug B payload: a Int32Array of 2 bytes`},
		{sparkplug.Metric{Name: "d", Datatype: sparkplug.DataSet, Kind: sparkplug.DataSetKind, Bytes: []byte{0x12, 0x01, 'a'}}, "", `metric "d": not a Sparkplug B payload: a DataSet of 1 columns has 0 types`},
		{sparkplug.Metric{Name: "big", Datatype: sparkplug.StringArray, Kind: sparkplug.BytesValue, Bytes: []byte(strings.Repeat("\x01\x01\x01\x01\x00", 16000))}, "", "as JSON, more than 65536"},
	} {
		v, err := metricValue(c.m)
		if c.err != "" {
			if err == nil || !mapper.IsPermanent(err) || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: %v, want a permanent error with %q", c.m.Datatype, err, c.err)
			}
			continue
		}
		if err != nil || v != c.want {
			t.Errorf("%s: %v %v, want %s", c.m.Datatype, v, err, c.want)
		}
	}
}
