package mqtt

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dowse-dev/dowse/internal/sparkplug"
	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
	"github.com/dowse-dev/dowse/shared/handler/handlertest"
)

func birth(bdSeq uint64, metrics ...sparkplug.Metric) []byte {
	ms := append([]sparkplug.Metric(nil), metrics...)
	ms = append(ms, sparkplug.Metric{Name: "bdSeq", HasName: true, Datatype: sparkplug.UInt64, Kind: sparkplug.LongValue, Uint: bdSeq})
	return sparkplug.Encode(&sparkplug.Payload{Timestamp: 1, HasTimestamp: true, Seq: 0, HasSeq: true, Metrics: ms})
}

func metric(name string, t sparkplug.DataType) sparkplug.Metric {
	return sparkplug.Metric{Name: name, HasName: true, Datatype: t, Kind: sparkplug.DoubleValue}
}

func mustDetails(t *testing.T, s string) *Details {
	t.Helper()
	d, err := ParseDetails(s)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func ids(s *state) []string {
	devs, _ := s.list()
	out := handlertest.IDs(devs)
	slices.Sort(out)
	return out
}

func skips(s *state) map[string][]string {
	_, sk := s.list()
	out := map[string][]string{}
	for _, k := range sk {
		out[k.reason] = append(out[k.reason], k.candidate+": "+k.message)
	}
	return out
}

func TestSparkplugBirthsAndDeaths(t *testing.T) {
	s := newState(mustDetails(t, `{"broker": "tcp://b:1883", "sparkplug": {"device": "^(Pump|Valve)"}}`))
	s.handle("spBv1.0/Plant/NBIRTH/Line1", birth(0, metric("Node Control/Rebirth", sparkplug.Boolean)))
	s.handle("spBv1.0/Plant/DBIRTH/Line1/Pump1", birth(0, metric("Temperature", sparkplug.Double), metric("Running", sparkplug.Boolean)))
	s.handle("spBv1.0/Plant/DBIRTH/Line1/Fan1", birth(0, metric("Speed", sparkplug.Float)))
	s.handle("spBv1.0/Plant/DBIRTH/Line1/Valve1", []byte("{not protobuf"))
	if got, want := ids(s), []string{"spBv1.0/Plant/Line1", "spBv1.0/Plant/Line1/Pump1"}; !slices.Equal(got, want) {
		t.Fatalf("devices %q, want %q", got, want)
	}
	devs, _ := s.list()
	for _, d := range devs {
		if d.Id != "spBv1.0/Plant/Line1/Pump1" {
			continue
		}
		p := d.Properties
		if p[SparkplugGroupProperty] != "Plant" || p[SparkplugEdgeNodeProperty] != "Line1" || p[SparkplugDeviceProperty] != "Pump1" ||
			p[SparkplugMetricsProperty] != `{"Running":"Boolean","Temperature":"Double","bdSeq":"UInt64"}` || p[SourceProperty] != SourceSparkplug ||
			p[BrokerProperty] != "tcp://b:1883" || p[SparkplugMetricCountProperty] != "3" {
			t.Errorf("properties %v", p)
		}
	}
	sk := skips(s)
	if len(sk[SkipNoMatch]) != 1 || !strings.HasPrefix(sk[SkipNoMatch][0], "spBv1.0/Plant/Line1/Fan1: ") ||
		len(sk[SkipGarbage]) != 1 || !strings.Contains(sk[SkipGarbage][0], "not a Sparkplug B payload") {
		t.Errorf("skipped %v", sk)
	}
	// A good birth on the garbage topic clears it.
	s.handle("spBv1.0/Plant/DBIRTH/Line1/Valve1", birth(0))
	if got := ids(s); len(got) != 3 || len(skips(s)[SkipGarbage]) != 0 {
		t.Fatalf("devices %q, skipped %v", got, skips(s))
	}
	s.handle("spBv1.0/Plant/DDEATH/Line1/Pump1", sparkplug.Encode(&sparkplug.Payload{}))
	if got, want := ids(s), []string{"spBv1.0/Plant/Line1", "spBv1.0/Plant/Line1/Valve1"}; !slices.Equal(got, want) {
		t.Fatalf("after DDEATH %q, want %q", got, want)
	}
	// An older session's NDEATH (another bdSeq) is ignored; the current
	// one removes the node, its devices and the filtered ones.
	s.handle("spBv1.0/Plant/NBIRTH/Line1", birth(5))
	s.handle("spBv1.0/Plant/NDEATH/Line1", birth(4))
	if got := ids(s); len(got) != 2 {
		t.Fatalf("a stale NDEATH removed devices: %q", got)
	}
	s.handle("spBv1.0/Plant/NDEATH/Line1", birth(5))
	if got := ids(s); len(got) != 0 || len(skips(s)[SkipNoMatch]) != 0 {
		t.Fatalf("after NDEATH %q, skipped %v", got, skips(s))
	}
}

func TestSparkplugFiltersAndBounds(t *testing.T) {
	s := newState(mustDetails(t, `{"broker": "tcp://b:1883", "maxDevices": 2, "maxPayload": 100, "maxMetrics": 1,
		"sparkplug": {"groups": ["A"], "edgeNode": "^n", "devicesOnly": true}}`))
	s.handle("spBv1.0/A/NBIRTH/n1", birth(0))
	s.handle("spBv1.0/B/DBIRTH/n1/d", birth(0))
	s.handle("spBv1.0/A/DBIRTH/x1/d", birth(0))
	s.handle("spBv1.0/A/DBIRTH/n1/d1", birth(0, metric("a", sparkplug.Int8), metric("b", sparkplug.Int8)))
	s.handle("spBv1.0/A/DBIRTH/n1/d2", birth(0))
	s.handle("spBv1.0/A/DBIRTH/n1/big", birth(0, metric(strings.Repeat("x", 200), sparkplug.Int8)))
	if got, want := ids(s), []string{"spBv1.0/A/n1/d1"}; !slices.Equal(got, want) {
		t.Fatalf("devices %q, want %q", got, want)
	}
	devs, _ := s.list()
	if p := devs[0].Properties; p[SparkplugMetricsProperty] != `{"a":"Int8"}` || p[SparkplugMetricCountProperty] != "3" {
		t.Errorf("properties %v", p)
	}
	sk := skips(s)
	if len(sk[SkipOverLimit]) != 1 || len(sk[SkipNoMatch]) != 1 || len(sk[SkipGarbage]) != 1 || !strings.Contains(sk[SkipGarbage][0], "more than maxPayload") {
		t.Errorf("skipped %v", sk)
	}
}

func TestHomeAssistant(t *testing.T) {
	s := newState(mustDetails(t, `{"broker": "tcp://b:1883", "homeAssistant": {"components": ["sensor", "switch"], "deviceManufacturer": "^Acme"}}`))
	s.handle("homeassistant/sensor/plug1/temp/config", []byte(`{"~": "home/plug1", "name": "Temperature", "stat_t": "~/temp", "uniq_id": "plug1-t",
		"unit_of_meas": "°C", "dev_cla": "temperature", "dev": {"ids": "0xabc", "mf": "Acme", "mdl": "P1", "name": "Plug 1"}}`))
	s.handle("homeassistant/switch/relay/config", []byte(`{"name": "Relay", "state_topic": "r/state", "command_topic": "r/set", "payload_on": 1,
		"device": {"identifiers": ["a", "b"], "manufacturer": "Acme"}}`))
	s.handle("homeassistant/switch/other/config", []byte(`{"command_topic": "o/set", "device": {"manufacturer": "Else"}}`))
	s.handle("homeassistant/light/lamp/config", []byte(`{"command_topic": "l/set"}`))
	s.handle("homeassistant/sensor/bad/config", []byte(`[1, 2]`))
	s.handle("homeassistant/sensor/bad2/config", []byte(`{"name": {"x": 1}}`))
	if got, want := ids(s), []string{"homeassistant/sensor/plug1/temp", "homeassistant/switch/relay"}; !slices.Equal(got, want) {
		t.Fatalf("devices %q, want %q", got, want)
	}
	devs, _ := s.list()
	want := map[string]map[string]string{
		"homeassistant/sensor/plug1/temp": {HAComponentProperty: "sensor", HANodeIDProperty: "plug1", HAObjectIDProperty: "temp", HAStateTopicProperty: "home/plug1/temp",
			HAUniqueIDProperty: "plug1-t", HAUnitProperty: "°C", HADeviceIdentifiersProperty: `["0xabc"]`, HADeviceModelProperty: "P1",
			HAConfigTopicProperty: "homeassistant/sensor/plug1/temp/config", SourceProperty: SourceHomeAssistant},
		"homeassistant/switch/relay": {HAStateTopicProperty: "r/state", HACommandTopicProperty: "r/set", HAPayloadOnProperty: "1",
			HADeviceIdentifiersProperty: `["a","b"]`, HANodeIDProperty: ""},
	}
	for _, d := range devs {
		for k, v := range want[d.Id] {
			if d.Properties[k] != v {
				t.Errorf("%s: %s = %q, want %q", d.Id, k, d.Properties[k], v)
			}
		}
	}
	sk := skips(s)
	if len(sk[SkipGarbage]) != 2 || len(sk[SkipNoMatch]) != 1 {
		t.Errorf("skipped %v", sk)
	}
	// An empty config removes the entity; a garbage one replaces it.
	s.handle("homeassistant/sensor/plug1/temp/config", nil)
	s.handle("homeassistant/switch/relay/config", []byte("nope"))
	if got := ids(s); len(got) != 0 {
		t.Fatalf("devices %q, want none", got)
	}
}

func TestParseDetails(t *testing.T) {
	for _, bad := range []string{
		`{}`, `{"broker": "tcp://b"}`, `{"broker": "http://b:1"}`, `{"broker": "tcp://b:1"}`,
		`{"broker": "tcp://b:1", "sparkplug": {"groups": ["a/b"]}}`, `{"broker": "tcp://b:1", "sparkplug": {"edgeNode": "("}}`,
		`{"broker": "tcp://b:1", "homeAssistant": {"components": ["Sensor"]}}`, `{"broker": "tcp://b:1", "sparkplug": {}, "maxDevices": 100000}`,
		`{"broker": "tcp://b:1", "sparkplug": {}, "extra": 1}`,
	} {
		if _, err := ParseDetails(bad); err == nil {
			t.Errorf("%s: accepted", bad)
		}
	}
	d := mustDetails(t, `{"broker": "ssl://b:8883", "sparkplug": {"groups": ["G"], "requestRebirth": true}, "homeAssistant": {}}`)
	want := []string{"spBv1.0/G/NBIRTH/+", "spBv1.0/G/NDEATH/+", "spBv1.0/G/DBIRTH/+/+", "spBv1.0/G/DDEATH/+/+", "spBv1.0/G/NDATA/+",
		"spBv1.0/G/DDATA/+/+", "homeassistant/+/+/config", "homeassistant/+/+/+/config"}
	if got := d.topics(); !slices.Equal(got, want) {
		t.Errorf("topics %q, want %q", got, want)
	}
	if _, err := parseCredentials(d, map[string]*discoveryv1.ByteData{ClientCertProperty: {Vec: []byte("x")}}); err == nil {
		t.Error("a certificate without its key was accepted")
	}
	if _, err := parseCredentials(d, map[string]*discoveryv1.ByteData{CACertProperty: {Vec: []byte("x")}}); err == nil {
		t.Error("a CA that is not PEM was accepted")
	}
}

func TestRebirthRequested(t *testing.T) {
	s := newState(mustDetails(t, `{"broker": "tcp://b:1883", "sparkplug": {"requestRebirth": true}}`))
	s.handle("spBv1.0/G/DDATA/E/D", nil)
	s.handle("spBv1.0/G/NDATA/E", nil)
	if !slices.Equal(s.rebirth, []string{"spBv1.0/G/NCMD/E"}) {
		t.Fatalf("rebirth %q", s.rebirth)
	}
	p, err := sparkplug.Decode(rebirthPayload(time.Unix(0, 0)), -1)
	if err != nil {
		t.Fatal(err)
	}
	if m, ok := p.Metric("Node Control/Rebirth"); !ok || m.Kind != sparkplug.BoolValue || !m.Bool || m.Datatype != sparkplug.Boolean {
		t.Errorf("rebirth payload %+v", p)
	}
}

// Device-based discovery (homeassistant/device/<object_id>/config): each
// component is a device, with the shared options under its own; a
// component gone from the next config, or emptied to its platform, is
// removed; a wrong component is Garbage while the others stand; an empty
// config removes them all.
func TestHomeAssistantDeviceConfigs(t *testing.T) {
	s := newState(mustDetails(t, `{"broker": "tcp://b:1883", "homeAssistant": {"components": ["sensor", "switch"]}}`))
	topic := "homeassistant/device/plug1/config"
	s.handle(topic, []byte(`{"dev": {"ids": "0xabc", "mf": "Acme", "mdl": "P1"}, "o": {"name": "fw"}, "~": "home/plug1",
		"stat_t": "~/state", "cmps": {
			"temp": {"p": "sensor", "name": "Temperature", "unit_of_meas": "°C", "val_tpl": "{{ value_json.temp }}", "uniq_id": "plug1-t"},
			"relay": {"p": "switch", "cmd_t": "~/set", "uniq_id": "plug1-r"},
			"lamp": {"p": "light", "cmd_t": "~/lamp"},
			"bad": {"p": "Sensor!"}}}`))
	base := "homeassistant/device/plug1/"
	if got, want := ids(s), []string{base + "relay", base + "temp"}; !slices.Equal(got, want) {
		t.Fatalf("devices %q, want %q", got, want)
	}
	devs, _ := s.list()
	want := map[string]map[string]string{
		base + "temp": {HAComponentProperty: "sensor", HAComponentIDProperty: "temp", HAObjectIDProperty: "plug1", HAStateTopicProperty: "home/plug1/state",
			HAUnitProperty: "°C", HAUniqueIDProperty: "plug1-t", HADeviceIdentifiersProperty: `["0xabc"]`, HADeviceModelProperty: "P1",
			HAConfigTopicProperty: topic, SourceProperty: SourceHomeAssistant},
		base + "relay": {HAComponentProperty: "switch", HAComponentIDProperty: "relay", HAStateTopicProperty: "home/plug1/state",
			HACommandTopicProperty: "home/plug1/set", HADeviceManufacturerProperty: "Acme"},
	}
	for _, d := range devs {
		for k, v := range want[d.Id] {
			if d.Properties[k] != v {
				t.Errorf("%s: %s = %q, want %q", d.Id, k, d.Properties[k], v)
			}
		}
	}
	if sk := skips(s); len(sk[SkipGarbage]) != 1 || !strings.Contains(fmt.Sprint(sk[SkipGarbage]), "Sensor!") {
		t.Errorf("skipped %v, want the bad component as Garbage", sk)
	}

	// The relay emptied, the bad one gone, a new one: the temperature stays.
	s.handle(topic, []byte(`{"dev": {"ids": "0xabc"}, "stat_t": "home/plug1/state", "cmps": {"temp": {"p": "sensor"}, "relay": {"p": "switch"},
		"power": {"p": "sensor", "unit_of_meas": "W"}}}`))
	if got, want := ids(s), []string{base + "power"}; !slices.Equal(got, want) {
		t.Fatalf("after emptying: devices %q, want %q", got, want)
	}
	if sk := skips(s); len(sk[SkipGarbage]) != 0 {
		t.Errorf("skipped %v, want no garbage left", sk)
	}
	s.handle(topic, []byte(`{"cmps": {"power": {"p": "sensor", "stat_t": "p/state"}, "temp": {"p": "sensor", "stat_t": "t/state"}}}`))
	if got, want := ids(s), []string{base + "power", base + "temp"}; !slices.Equal(got, want) {
		t.Fatalf("devices %q, want %q", got, want)
	}
	s.handle(topic, []byte(`{"cmps": {"temp": {"p": "sensor", "stat_t": "t/state"}}}`))
	if got, want := ids(s), []string{base + "temp"}; !slices.Equal(got, want) {
		t.Fatalf("a component gone: devices %q, want %q", got, want)
	}
	// Garbage configs: all of it goes, and says why.
	for _, c := range []struct{ payload, why string }{
		{`{"dev": {}}`, "without components"},
		{`{"cmps": [1]}`, "without components"},
		{`nope`, "not a JSON object"},
	} {
		s.handle(topic, []byte(`{"cmps": {"temp": {"p": "sensor"}, "x": {"p": "sensor", "stat_t": "x"}}}`))
		s.handle(topic, []byte(c.payload))
		if got := ids(s); len(got) != 0 {
			t.Errorf("%s: devices %q, want none", c.payload, got)
		}
		if sk := skips(s); !strings.Contains(fmt.Sprint(sk[SkipGarbage]), c.why) {
			t.Errorf("%s: skipped %v, want %q", c.payload, sk, c.why)
		}
	}
	s.handle(topic, []byte(`{"cmps": {"a": {"p": "sensor", "stat_t": "a"}, "b": {"p": "switch", "cmd_t": "b"}}}`))
	if len(ids(s)) != 2 {
		t.Fatalf("devices %q", ids(s))
	}
	s.handle(topic, nil)
	if got := ids(s); len(got) != 0 || len(s.haDevices) != 0 {
		t.Fatalf("after an empty config: devices %q, %d configs tracked", got, len(s.haDevices))
	}
	if sk := skips(s); len(sk[SkipGarbage]) != 0 {
		t.Errorf("skipped %v after an empty config", sk)
	}
}
