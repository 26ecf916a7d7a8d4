package mqtt_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dowse-dev/dowse/discovery-handlers/mqtt"
	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
	"github.com/dowse-dev/dowse/shared/handler/handlertest"
	"github.com/dowse-dev/dowse/test/framework/procs"
	"github.com/dowse-dev/dowse/test/peers/mosquitto"
	"github.com/dowse-dev/dowse/test/peers/npmpeer"
)

const wait = 30 * time.Second

// startBinary builds dowse-mqtt-discovery as its image is (static,
// stripped, without gRPC's tracing), runs it beside a fake agent and
// returns the process and its registration.
func startBinary(t *testing.T) (*procs.Proc, *discoveryv1.RegisterDiscoveryHandlerRequest) {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "dowse-mqtt-discovery")
	build := exec.Command("go", "build", "-tags", "grpcnotrace", "-trimpath", "-ldflags=-s -w", "-o", bin, "./cmd/dowse-mqtt-discovery")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	dir := handlertest.ShortTempDir(t)
	agent := handlertest.StartAgent(t, dir)
	out := procs.NewLines()
	p, err := procs.Run("dowse-mqtt-discovery", bin, []string{"--state-dir", dir}, procs.Options{Stdout: out, Stderr: out, DieWithCaller: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.StopWithin(5 * time.Second)
		if t.Failed() {
			t.Logf("handler's output:\n%s", out)
		}
	})
	reg := agent.WaitForRegistration(t, wait)
	if reg.GetName() != mqtt.DefaultName || !reg.GetShared() {
		t.Errorf("registration %v", reg)
	}
	return p, reg
}

// waitFor reads the stream until its devices are exactly want (and cond,
// when given, holds for the message), and returns that message.
func waitFor(t *testing.T, s *handlertest.Stream, cond func(*discoveryv1.DiscoverResponse) bool, want ...string) *discoveryv1.DiscoverResponse {
	t.Helper()
	slices.Sort(want)
	deadline := time.Now().Add(wait)
	for {
		r := s.NextResponse(t, time.Until(deadline))
		got := handlertest.IDs(r.GetDevices())
		slices.Sort(got)
		if (slices.Equal(got, want) || (len(got) == 0 && len(want) == 0)) && (cond == nil || cond(r)) {
			return r
		}
		t.Logf("devices %q (skipped %v), waiting for %q", got, r.GetSkipped(), want)
	}
}

func device(r *discoveryv1.DiscoverResponse, id string) *discoveryv1.Device {
	for _, d := range r.GetDevices() {
		if d.GetId() == id {
			return d
		}
	}
	return nil
}

func skippedHas(r *discoveryv1.DiscoverResponse, reason, candidate, message string) bool {
	for _, sk := range r.GetSkipped() {
		if sk.GetReason() != reason {
			continue
		}
		for _, c := range sk.GetCandidates() {
			if c.GetCandidate() == candidate && strings.Contains(c.GetMessage(), message) {
				return true
			}
		}
	}
	return false
}

// TestMosquittoTahu runs the real dowse-mqtt-discovery binary against
// Debian's mosquitto, with Eclipse Tahu's Sparkplug B client (npm
// sparkplug-client) as edge nodes and Home Assistant discovery configs
// published retained with mosquitto_pub: births become devices with their
// metrics, the group and device filters hold, a DDEATH and an NDEATH (the
// broker's will for a node that vanished) remove them, an empty config
// removes an entity, and garbage payloads are skipped with a reason while
// the rest stays listed. It reports the time from a DBIRTH to the device
// listed and the handler's peak RSS.
func TestMosquittoTahu(t *testing.T) {
	npmpeer.SparkplugModules(t) // before anything starts: skip or fail early
	b := mosquitto.Start(t)
	sensor, relay := "homeassistant/sensor/plug1/temperature", "homeassistant/switch/relay7"
	b.Publish(t, sensor+"/config", []byte(`{"~": "home/plug1", "name": "Temperature", "stat_t": "~/temperature", "unit_of_meas": "°C",
		"dev_cla": "temperature", "uniq_id": "plug1-temp", "dev": {"ids": ["plug1"], "mf": "Acme", "mdl": "P1", "name": "Plug 1"}}`), true)
	b.Publish(t, relay+"/config", []byte(`{"name": "Relay", "state_topic": "relay7/state", "command_topic": "relay7/set",
		"payload_on": "ON", "payload_off": "OFF", "device": {"identifiers": "relay7", "manufacturer": "Acme"}}`), true)
	b.Publish(t, "homeassistant/light/lamp/config", []byte(`{"command_topic": "lamp/set"}`), true) // component not followed
	b.Publish(t, "homeassistant/sensor/broken/config", []byte(`{"name": "Broken", `), true)

	p, reg := startBinary(t)
	s := handlertest.Discover(t, reg.GetEndpoint(), &discoveryv1.DiscoverRequest{DiscoveryDetails: fmt.Sprintf(`{"broker": %q,
		"sparkplug": {"groups": ["Plant"], "device": "^(Pump|Valve)"}, "homeAssistant": {"components": ["sensor", "switch"]}}`, b.Addr())})
	// The retained configs arrive once the handler subscribed.
	r := waitFor(t, s, func(r *discoveryv1.DiscoverResponse) bool {
		return skippedHas(r, mqtt.SkipGarbage, "homeassistant/sensor/broken/config", "not a JSON object")
	}, sensor, relay)
	want := map[string]string{mqtt.HAStateTopicProperty: "home/plug1/temperature", mqtt.HAUnitProperty: "°C", mqtt.HAUniqueIDProperty: "plug1-temp",
		mqtt.HADeviceIdentifiersProperty: `["plug1"]`, mqtt.HADeviceModelProperty: "P1", mqtt.HAComponentProperty: "sensor", mqtt.HANodeIDProperty: "plug1",
		mqtt.HAObjectIDProperty: "temperature", mqtt.BrokerProperty: b.Addr(), mqtt.SourceProperty: mqtt.SourceHomeAssistant}
	for k, v := range want {
		if got := device(r, sensor).GetProperties()[k]; got != v {
			t.Errorf("%s: %s = %q, want %q", sensor, k, got, v)
		}
	}
	if p := device(r, relay).GetProperties(); p[mqtt.HACommandTopicProperty] != "relay7/set" || p[mqtt.HAStateTopicProperty] != "relay7/state" ||
		p[mqtt.HADeviceIdentifiersProperty] != `["relay7"]` || p[mqtt.HAPayloadOnProperty] != "ON" {
		t.Errorf("%s: properties %v", relay, p)
	}

	// Tahu edge nodes: one in the group followed, one in another.
	node := npmpeer.StartSparkplug(t, "tahu-line1", npmpeer.SparkplugConfig{ServerURL: b.Addr(), GroupID: "Plant", EdgeNode: "Line1",
		NodeMetrics: []npmpeer.SparkplugMetric{{Name: "Node Control/Rebirth", Type: "Boolean", Value: false}},
		Devices: map[string][]npmpeer.SparkplugMetric{
			"Pump1": {{Name: "Temperature", Type: "Double", Value: 21.5}, {Name: "Running", Type: "Boolean", Value: true}, {Name: "Speed", Type: "Int32", Value: 1450}},
			"Fan1":  {{Name: "Speed", Type: "Float", Value: 0.5}},
		}})
	npmpeer.StartSparkplug(t, "tahu-other", npmpeer.SparkplugConfig{ServerURL: b.Addr(), GroupID: "Other", EdgeNode: "Line9",
		Devices: map[string][]npmpeer.SparkplugMetric{"Pump9": {{Name: "Temperature", Type: "Double", Value: 1}}}})
	nodeID, pump, valve := "spBv1.0/Plant/Line1", "spBv1.0/Plant/Line1/Pump1", "spBv1.0/Plant/Line1/Valve1"
	r = waitFor(t, s, nil, sensor, relay, nodeID, pump)
	pp := device(r, pump).GetProperties()
	if pp[mqtt.SparkplugGroupProperty] != "Plant" || pp[mqtt.SparkplugEdgeNodeProperty] != "Line1" || pp[mqtt.SparkplugDeviceProperty] != "Pump1" ||
		pp[mqtt.SparkplugMetricsProperty] != `{"Running":"Boolean","Speed":"Int32","Temperature":"Double"}` || pp[mqtt.SparkplugMetricCountProperty] != "3" ||
		pp[mqtt.SourceProperty] != mqtt.SourceSparkplug {
		t.Errorf("%s: properties %v", pump, pp)
	}
	if np := device(r, nodeID).GetProperties(); np[mqtt.SparkplugMetricsProperty] != `{"Node Control/Rebirth":"Boolean"}` || np[mqtt.SparkplugDeviceProperty] != "" {
		t.Errorf("%s: properties %v", nodeID, np)
	}
	if !skippedHas(r, mqtt.SkipNoMatch, "spBv1.0/Plant/Line1/Fan1", "does not match sparkplug.device") {
		t.Errorf("skipped %v, want Fan1 as NoMatch", r.GetSkipped())
	}

	// A DBIRTH: the device is listed.
	born := time.Now()
	node.Do(t, map[string]any{"op": "dbirth", "device": "Valve1", "metrics": []npmpeer.SparkplugMetric{{Name: "Open", Type: "Boolean", Value: false}}})
	waitFor(t, s, nil, sensor, relay, nodeID, pump, valve)
	t.Logf("FIGURE: MQTT: a DBIRTH (Tahu) listed by the handler %v after the edge node was told to publish it", time.Since(born).Round(100*time.Microsecond))

	// Garbage on a birth topic and a config topic: skipped with a reason,
	// the rest still listed.
	b.Publish(t, "spBv1.0/Plant/DBIRTH/Line1/Valve2", []byte("\x12\x05\x0agarbage"), false)
	b.Publish(t, relay+"/config", []byte(`not json`), true)
	r = waitFor(t, s, func(r *discoveryv1.DiscoverResponse) bool {
		return skippedHas(r, mqtt.SkipGarbage, "spBv1.0/Plant/DBIRTH/Line1/Valve2", "not a Sparkplug B payload") &&
			skippedHas(r, mqtt.SkipGarbage, relay+"/config", "not a JSON object")
	}, sensor, nodeID, pump, valve)
	t.Logf("skipped: %v", r.GetSkipped())

	// A DDEATH removes its device; an empty config its entity.
	node.Do(t, map[string]any{"op": "ddeath", "device": "Pump1"})
	b.Publish(t, sensor+"/config", nil, true)
	waitFor(t, s, nil, nodeID, valve)

	// The edge node vanishes without a word: the broker publishes its will
	// (NDEATH), which removes the node and its devices.
	gone := time.Now()
	node.Stop()
	waitFor(t, s, nil)
	t.Logf("FIGURE: MQTT: an edge node's will (NDEATH) removed its devices %v after the node was stopped", time.Since(gone).Round(100*time.Microsecond))

	hwm, err := procs.PeakRSSOf(p.Pid())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("FIGURE: dowse-mqtt-discovery peak RSS: %.1f MiB", float64(hwm)/1024)
}

// TestThousandBirths: a Tahu edge node publishes 1,000 DBIRTHs at once;
// the handler lists them all. It reports how long that took and the
// handler's peak RSS with 1,000 devices.
func TestThousandBirths(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	npmpeer.SparkplugModules(t)
	b := mosquitto.Start(t)
	p, reg := startBinary(t)
	s := handlertest.Discover(t, reg.GetEndpoint(), &discoveryv1.DiscoverRequest{DiscoveryDetails: fmt.Sprintf(
		`{"broker": %q, "sparkplug": {"groups": ["Fleet"], "devicesOnly": true}, "maxDevices": 2000}`, b.Addr())})
	if devs := s.Next(t, wait); len(devs) != 0 {
		t.Fatalf("devices before any birth: %v", handlertest.IDs(devs))
	}
	// The first list goes out before the subscription is made: wait for it
	// to be made, by a node born after it.
	node := npmpeer.StartSparkplug(t, "tahu-fleet", npmpeer.SparkplugConfig{ServerURL: b.Addr(), GroupID: "Fleet", EdgeNode: "Hall",
		Devices: map[string][]npmpeer.SparkplugMetric{"probe": {{Name: "x", Type: "Int32", Value: 1}}}})
	waitFor(t, s, nil, "spBv1.0/Fleet/Hall/probe")
	const n = 1000
	start := time.Now()
	node.Do(t, map[string]any{"op": "dbirths", "prefix": "d", "count": n, "metrics": []npmpeer.SparkplugMetric{
		{Name: "Temperature", Type: "Double", Value: 20.5}, {Name: "Running", Type: "Boolean", Value: true}}})
	deadline := time.Now().Add(wait)
	for {
		devs := s.Next(t, time.Until(deadline))
		if len(devs) == n+1 {
			break
		}
	}
	t.Logf("FIGURE: MQTT: %d DBIRTHs (Tahu) all listed by the handler %v after the edge node was told to publish them", n, time.Since(start).Round(time.Millisecond))
	hwm, err := procs.PeakRSSOf(p.Pid())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("FIGURE: dowse-mqtt-discovery peak RSS with %d devices: %.1f MiB", n+1, float64(hwm)/1024)
}

// TestRequestRebirth: a Tahu edge node born before the handler connected
// is found once it sends data: the handler (requestRebirth) asks it with an
// NCMD "Node Control/Rebirth", which Tahu receives, and its births follow.
func TestRequestRebirth(t *testing.T) {
	npmpeer.SparkplugModules(t)
	b := mosquitto.Start(t)
	node := npmpeer.StartSparkplug(t, "tahu-early", npmpeer.SparkplugConfig{ServerURL: b.Addr(), GroupID: "Plant", EdgeNode: "Early",
		Devices: map[string][]npmpeer.SparkplugMetric{"Pump1": {{Name: "Temperature", Type: "Double", Value: 21.5}}}})
	_, reg := startBinary(t)
	s := handlertest.Discover(t, reg.GetEndpoint(), &discoveryv1.DiscoverRequest{DiscoveryDetails: fmt.Sprintf(
		`{"broker": %q, "sparkplug": {"requestRebirth": true}}`, b.Addr())})
	if devs := s.Next(t, wait); len(devs) != 0 {
		t.Fatalf("devices before any birth: %v", handlertest.IDs(devs))
	}
	// Data until the handler has subscribed and asked (its subscription
	// is not visible from here: a DDATA every 200 ms).
	from := node.Lines()
	deadline := time.Now().Add(wait)
	for {
		node.Do(t, map[string]any{"op": "ddata", "device": "Pump1", "metrics": []npmpeer.SparkplugMetric{{Name: "Temperature", Type: "Double", Value: 22}}})
		if _, _, err := node.TryLine("NCMD ", from, 200*time.Millisecond); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("Tahu received no NCMD")
		}
	}
	waitFor(t, s, nil, "spBv1.0/Plant/Early", "spBv1.0/Plant/Early/Pump1")
}

// TestHomeAssistantDeviceDiscovery: Home Assistant's device-based
// discovery through Debian's mosquitto (retained configs written with
// mosquitto_pub): a device's components become devices of their own
// (the components followed: a light is not), a component emptied to its
// platform or gone from the next config is removed, a broken component is
// skipped while the others stay, and an empty config removes the rest.
func TestHomeAssistantDeviceDiscovery(t *testing.T) {
	b := mosquitto.Start(t)
	topic, base := "homeassistant/device/plug1/config", "homeassistant/device/plug1/"
	b.Publish(t, topic, []byte(`{"dev": {"ids": ["plug1"], "mf": "Acme", "mdl": "P1", "name": "Plug 1"}, "o": {"name": "plugfw", "sw": "1.0"},
		"~": "home/plug1", "stat_t": "~/state", "qos": 1, "cmps": {
		"temp": {"p": "sensor", "dev_cla": "temperature", "unit_of_meas": "°C", "val_tpl": "{{ value_json.temperature }}", "uniq_id": "plug1-t"},
		"relay": {"p": "switch", "cmd_t": "~/set", "uniq_id": "plug1-r"},
		"led": {"p": "light", "cmd_t": "~/led"},
		"broken": {"p": "sensor", "name": {"not": "a string"}}}}`), true)
	_, reg := startBinary(t)
	s := handlertest.Discover(t, reg.GetEndpoint(), &discoveryv1.DiscoverRequest{DiscoveryDetails: fmt.Sprintf(`{"broker": %q,
		"homeAssistant": {"components": ["sensor", "switch"]}}`, b.Addr())})
	r := waitFor(t, s, func(r *discoveryv1.DiscoverResponse) bool {
		return skippedHas(r, mqtt.SkipGarbage, base+"broken", "component broken: name: not a string")
	}, base+"relay", base+"temp")
	for id, want := range map[string]map[string]string{
		base + "temp": {mqtt.HAComponentProperty: "sensor", mqtt.HAComponentIDProperty: "temp", mqtt.HAObjectIDProperty: "plug1",
			mqtt.HAStateTopicProperty: "home/plug1/state", mqtt.HAUnitProperty: "°C", mqtt.HAValueTemplateProperty: "{{ value_json.temperature }}",
			mqtt.HADeviceIdentifiersProperty: `["plug1"]`, mqtt.HADeviceModelProperty: "P1", mqtt.HAConfigTopicProperty: topic},
		base + "relay": {mqtt.HAComponentProperty: "switch", mqtt.HAStateTopicProperty: "home/plug1/state", mqtt.HACommandTopicProperty: "home/plug1/set",
			mqtt.HADeviceManufacturerProperty: "Acme", mqtt.SourceProperty: mqtt.SourceHomeAssistant, mqtt.BrokerProperty: b.Addr()},
	} {
		for k, v := range want {
			if got := device(r, id).GetProperties()[k]; got != v {
				t.Errorf("%s: %s = %q, want %q", id, k, got, v)
			}
		}
	}

	// The relay emptied to its platform, the broken one gone, a new one.
	b.Publish(t, topic, []byte(`{"dev": {"ids": ["plug1"]}, "~": "home/plug1", "stat_t": "~/state", "cmps": {
		"temp": {"p": "sensor", "unit_of_meas": "°C"}, "relay": {"p": "switch"}, "power": {"p": "sensor", "unit_of_meas": "W", "val_tpl": "{{ value_json.power }}"}}}`), true)
	r = waitFor(t, s, func(r *discoveryv1.DiscoverResponse) bool { return len(r.GetSkipped()) == 0 }, base+"power", base+"temp")
	if p := device(r, base+"power").GetProperties(); p[mqtt.HAUnitProperty] != "W" || p[mqtt.HAStateTopicProperty] != "home/plug1/state" {
		t.Errorf("power: properties %v", p)
	}
	// The next config without the temperature: it goes.
	b.Publish(t, topic, []byte(`{"stat_t": "home/plug1/state", "cmps": {"power": {"p": "sensor"}, "energy": {"p": "sensor", "unit_of_meas": "kWh"}}}`), true)
	waitFor(t, s, nil, base+"energy")
	// An empty config removes the device's components.
	b.Publish(t, topic, nil, true)
	waitFor(t, s, nil)
}
