package mqtt_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"

	"github.com/dowse-dev/dowse/internal/sparkplug"
	"github.com/dowse-dev/dowse/mappers/mapper"
	"github.com/dowse-dev/dowse/mappers/mapper/mappertest"
	"github.com/dowse-dev/dowse/mappers/mqtt"
	dmiv1beta1 "github.com/dowse-dev/dowse/proto/dmi/v1beta1"
	"github.com/dowse-dev/dowse/shared/twinvalue"
	"github.com/dowse-dev/dowse/test/peers/mosquitto"
	"github.com/dowse-dev/dowse/test/peers/npmpeer"
)

const wait = 20 * time.Second

var pumpModel = mappertest.NewModel("default", "pump",
	mappertest.ModelProp("temperature", "DOUBLE", "ReadOnly", "", ""),
	mappertest.ModelProp("running", "BOOLEAN", "ReadWrite", "", ""),
	mappertest.ModelProp("speed", "INT", "ReadWrite", "0", "3000"),
	mappertest.ModelProp("recipe", "STRING", "ReadOnly", "", ""),
	mappertest.ModelProp("levels", "STRING", "ReadOnly", "", ""),
	mappertest.ModelProp("valves", "STRING", "ReadOnly", "", ""),
)

var haModel = mappertest.NewModel("default", "ha",
	mappertest.ModelProp("state", "BOOLEAN", "ReadWrite", "", ""),
	mappertest.ModelProp("temperature", "DOUBLE", "ReadOnly", "", ""),
)

func prop(name string, visitor map[string]any) mappertest.Prop {
	if visitor == nil {
		visitor = map[string]any{}
	}
	return mappertest.Prop{Name: name, Visitor: visitor, CollectCycle: time.Second}
}

// TestMQTTMapperPeers runs the mapper against Debian's mosquitto with an
// Eclipse Tahu edge node (npm sparkplug-client) and Home Assistant topics
// written and read with mosquitto_pub and mosquitto_sub: a device's
// birth and data become reported twins (aliases of the birth resolved), a
// desired value arrives at Tahu as a DCMD of the birth's data type, a
// DDEATH, and Tahu's NDEATH when it ends its session, make the device
// offline with the reason on its twins until it is born again; a Home Assistant state (plain and a JSON field) is
// reported and a desired value reaches the command topic.
func TestMQTTMapperPeers(t *testing.T) {
	npmpeer.SparkplugModules(t)
	b := mosquitto.Start(t)
	pump := mappertest.NewDevice(t, "default", "pump", "pump", mqtt.Protocol,
		map[string]any{"broker": b.Addr(), "source": "sparkplug", "group": "Plant", "edgeNode": "Line1", "device": "Pump1"},
		prop("temperature", map[string]any{"metric": "Temperature"}), prop("running", map[string]any{"metric": "Running"}),
		prop("speed", map[string]any{"metric": "Speed"}), prop("recipe", map[string]any{"metric": "Recipe"}),
		prop("levels", map[string]any{"metric": "Levels"}), prop("valves", map[string]any{"metric": "Valves"}))
	relay := mappertest.NewDevice(t, "default", "relay", "ha", mqtt.Protocol,
		map[string]any{"broker": b.Addr(), "source": "homeassistant", "stateTopic": "relay7/state", "commandTopic": "relay7/set"},
		prop("state", nil), prop("temperature", map[string]any{"stateTopic": "relay7/attributes", "field": "temperature"}))
	dir := mappertest.ShortTempDir(t)
	agent := mappertest.Start(t, dir)
	agent.SetData([]*dmiv1beta1.DeviceModel{pumpModel, haModel}, []*dmiv1beta1.Device{pump, relay})
	mappertest.RunMapper(t, mapper.Config{Protocol: mqtt.Protocol, StateDir: dir, NewDriver: mqtt.NewDriver, Logger: testr.New(t),
		DefaultCollectCycle: time.Second, ReconnectInitial: 50 * time.Millisecond, ReconnectMax: 500 * time.Millisecond, ReregisterInterval: time.Hour})
	agent.WaitState(t, "default/pump", "ok", wait)
	agent.WaitState(t, "default/relay", "ok", wait)

	node := npmpeer.StartSparkplug(t, "tahu-line1", npmpeer.SparkplugConfig{ServerURL: b.Addr(), GroupID: "Plant", EdgeNode: "Line1",
		Devices: map[string][]npmpeer.SparkplugMetric{"Pump1": {
			{Name: "Temperature", Type: "Double", Value: 21.5, Alias: 1}, {Name: "Running", Type: "Boolean", Value: true, Alias: 2},
			{Name: "Speed", Type: "Int32", Value: 1450, Alias: 3}}}})

	t.Run("births and data become reported twins", func(t *testing.T) {
		agent.WaitReported(t, "default/pump", "temperature", "21.5", 0, wait)
		agent.WaitReported(t, "default/pump", "running", "true", 0, wait)
		agent.WaitReported(t, "default/pump", "speed", "1450", 0, wait)
		from := agent.ReportCount()
		start := time.Now()
		node.Do(t, map[string]any{"op": "ddata", "device": "Pump1", "metrics": []npmpeer.SparkplugMetric{{Name: "Temperature", Type: "Double", Value: 22.75}}})
		agent.WaitReported(t, "default/pump", "temperature", "22.75", from, wait)
		t.Logf("FIGURE: MQTT mapper: a DDATA (Tahu) reported %v after the edge node was told to publish it", time.Since(start).Round(100*time.Microsecond))
	})

	t.Run("a DataSet (Tahu) and arrays (laid out by hand) reported as JSON", func(t *testing.T) {
		from := agent.ReportCount()
		node.Do(t, map[string]any{"op": "ddata", "device": "Pump1", "metrics": []map[string]any{{"name": "Recipe", "type": "DataSet",
			"value": map[string]any{"numOfColumns": 3, "columns": []string{"step", "setpoint", "label"}, "types": []string{"Int32", "Double", "String"},
				"rows": [][]any{{1, 80.5, "heat"}, {-2, 20.25, "cool"}}}}}})
		agent.WaitReported(t, "default/pump", "recipe",
			`{"columns":["step","setpoint","label"],"types":["Int32","Double","String"],"rows":[[1,80.5,"heat"],[-2,20.25,"cool"]]}`, from, wait)
		// Tahu's sparkplug-payload 1.0.3 encodes no arrays: a DDATA laid
		// out here, through mosquitto.
		b.Publish(t, "spBv1.0/Plant/DDATA/Line1/Pump1", sparkplug.Encode(&sparkplug.Payload{Metrics: []sparkplug.Metric{
			{Name: "Levels", HasName: true, Datatype: sparkplug.Int16Array, Kind: sparkplug.BytesValue, Bytes: []byte{0xD0, 0x8A, 0x30, 0x75}},
			{Name: "Valves", HasName: true, Datatype: sparkplug.BooleanArray, Kind: sparkplug.BytesValue, Bytes: []byte{0x0C, 0x00, 0x00, 0x00, 0x34, 0xD0}},
		}}), false)
		agent.WaitReported(t, "default/pump", "levels", "[-30000,30000]", from, wait)
		agent.WaitReported(t, "default/pump", "valves", "[false,false,true,true,false,true,false,false,true,true,false,true]", from, wait)
		// A broken one is that property's error alone.
		b.Publish(t, "spBv1.0/Plant/DDATA/Line1/Pump1", sparkplug.Encode(&sparkplug.Payload{Metrics: []sparkplug.Metric{
			{Name: "Levels", HasName: true, Datatype: sparkplug.Int16Array, Kind: sparkplug.BytesValue, Bytes: []byte{1, 2, 3}}}}), false)
		tw, _ := agent.WaitTwin(t, "default/pump", "levels", from, wait, func(tw *dmiv1beta1.Twin) bool {
			return strings.Contains(tw.GetReported().GetMetadata()[twinvalue.MetaError], "not a whole number of 2-byte values")
		})
		if tw.GetReported().GetValue() != "[-30000,30000]" {
			t.Errorf("levels %q after a broken array, want the last good value", tw.GetReported().GetValue())
		}
		agent.WaitState(t, "default/pump", "ok", wait)
	})

	t.Run("a desired value is a DCMD Tahu receives", func(t *testing.T) {
		from := node.Lines()
		if _, err := agent.Mapper(t).UpdateDevice(context.Background(), &dmiv1beta1.UpdateDeviceRequest{Device: mappertest.SetDesired(pump, "speed", "1200")}); err != nil {
			t.Fatal(err)
		}
		if ms := node.WaitCommand(t, "Pump1", from, wait); len(ms) != 1 || ms[0].Name != "Speed" || ms[0].Type != "Int32" || ms[0].Value != float64(1200) {
			t.Errorf("DCMD metrics %+v, want Speed Int32 1200", ms)
		}
		// The device takes it and says so.
		rep := agent.ReportCount()
		node.Do(t, map[string]any{"op": "ddata", "device": "Pump1", "metrics": []npmpeer.SparkplugMetric{{Name: "Speed", Type: "Int32", Value: 1200}}})
		agent.WaitReported(t, "default/pump", "speed", "1200", rep, wait)
		// Out of the model's range: refused before anything is sent.
		rep = agent.ReportCount()
		if _, err := agent.Mapper(t).UpdateDevice(context.Background(), &dmiv1beta1.UpdateDeviceRequest{Device: mappertest.SetDesired(pump, "speed", "5000")}); err != nil {
			t.Fatal(err)
		}
		agent.WaitTwin(t, "default/pump", "speed", rep, wait, func(tw *dmiv1beta1.Twin) bool {
			return tw.GetReported().GetMetadata()[twinvalue.MetaDesiredError] != ""
		})
	})

	t.Run("a death certificate makes the device offline until its next birth", func(t *testing.T) {
		start := time.Now()
		node.Do(t, map[string]any{"op": "ddeath", "device": "Pump1"})
		agent.WaitState(t, "default/pump", "offline", wait)
		t.Logf("FIGURE: MQTT mapper: a DDEATH (Tahu) reported offline %v after the edge node was told to publish it", time.Since(start).Round(100*time.Microsecond))
		tw, _ := agent.WaitTwin(t, "default/pump", "temperature", 0, wait, func(tw *dmiv1beta1.Twin) bool {
			return strings.Contains(tw.GetReported().GetMetadata()[twinvalue.MetaError], "the device sent its death certificate (DDEATH)")
		})
		t.Logf("after DDEATH: %s", tw.GetReported().GetMetadata()[twinvalue.MetaError])
		start = time.Now()
		node.Do(t, map[string]any{"op": "dbirth", "device": "Pump1", "metrics": []npmpeer.SparkplugMetric{{Name: "Temperature", Type: "Double", Value: 19.25}}})
		agent.WaitState(t, "default/pump", "ok", wait)
		t.Logf("FIGURE: MQTT mapper: a DBIRTH (Tahu) reported ok again %v after the edge node was told to publish it", time.Since(start).Round(100*time.Microsecond))
		agent.WaitReported(t, "default/pump", "temperature", "19.25", 0, wait)
		assertNoReconnect(t, agent)

		// Tahu ends its session: its NDEATH makes the device offline; a
		// new session's births bring it back, and the old session's will
		// (another bdSeq), if the broker sends one late, is ignored.
		start = time.Now()
		node.Do(t, map[string]any{"op": "stop"})
		agent.WaitState(t, "default/pump", "offline", wait)
		t.Logf("FIGURE: MQTT mapper: an NDEATH (Tahu's stop) reported offline %v after the edge node was told to stop", time.Since(start).Round(100*time.Microsecond))
		agent.WaitTwin(t, "default/pump", "speed", 0, wait, func(tw *dmiv1beta1.Twin) bool {
			return strings.Contains(tw.GetReported().GetMetadata()[twinvalue.MetaError], "the edge node sent its death certificate (NDEATH)")
		})
		node.Stop()
		node = npmpeer.StartSparkplug(t, "tahu-line1-again", npmpeer.SparkplugConfig{ServerURL: b.Addr(), GroupID: "Plant", EdgeNode: "Line1",
			Devices: map[string][]npmpeer.SparkplugMetric{"Pump1": {
				{Name: "Temperature", Type: "Double", Value: 20.5, Alias: 1}, {Name: "Running", Type: "Boolean", Value: true, Alias: 2},
				{Name: "Speed", Type: "Int32", Value: 1200, Alias: 3}}}})
		agent.WaitState(t, "default/pump", "ok", wait)
		agent.WaitReported(t, "default/pump", "temperature", "20.5", 0, wait)
		assertNoReconnect(t, agent)
	})

	t.Run("Home Assistant state and command topics", func(t *testing.T) {
		sub := b.Subscribe(t, "relay7/set", 1, "")
		b.Publish(t, "relay7/state", []byte("ON"), true)
		b.Publish(t, "relay7/attributes", []byte(`{"temperature": 31.5, "linkquality": 120}`), false)
		agent.WaitReported(t, "default/relay", "state", "true", 0, wait)
		agent.WaitReported(t, "default/relay", "temperature", "31.5", 0, wait)
		if _, err := agent.Mapper(t).UpdateDevice(context.Background(), &dmiv1beta1.UpdateDeviceRequest{Device: mappertest.SetDesired(relay, "state", "false")}); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(wait)
		for sub.Count("relay7/set OFF") == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("mosquitto_sub saw %q, want relay7/set OFF", sub.Lines())
			}
			time.Sleep(20 * time.Millisecond)
		}
		b.Publish(t, "relay7/state", []byte("OFF"), true)
		agent.WaitReported(t, "default/relay", "state", "false", 0, wait)
	})
}

// TestMQTTMapperLogin: against mosquitto requiring a login, a device with
// the right password is served and one with a wrong password is
// Authenticated False and offline, in the broker's words.
func TestMQTTMapperLogin(t *testing.T) {
	b := mosquitto.StartWithUsers(t, map[string]string{"dowse": "pass-1"})
	cfg := func(pass string) map[string]any {
		return map[string]any{"broker": b.Addr(), "source": "homeassistant", "stateTopic": "relay7/state", "commandTopic": "relay7/set",
			"username": "dowse", "password": pass}
	}
	right := mappertest.NewDevice(t, "default", "right", "ha", mqtt.Protocol, cfg("pass-1"), prop("state", nil))
	wrong := mappertest.NewDevice(t, "default", "wrong", "ha", mqtt.Protocol, cfg("pass-2"), prop("state", nil))
	dir := mappertest.ShortTempDir(t)
	agent := mappertest.Start(t, dir)
	agent.SetData([]*dmiv1beta1.DeviceModel{haModel}, []*dmiv1beta1.Device{right, wrong})
	mappertest.RunMapper(t, mapper.Config{Protocol: mqtt.Protocol, StateDir: dir, NewDriver: mqtt.NewDriver, Logger: testr.New(t),
		DefaultCollectCycle: time.Second, ReconnectInitial: 50 * time.Millisecond, ReconnectMax: 500 * time.Millisecond, ReregisterInterval: time.Hour})
	c := agent.WaitCondition(t, "default/wrong", "Authenticated", false, wait)
	t.Logf("Authenticated: %s: %s", c.Reason, c.Message)
	if !strings.Contains(c.Message, "refused the credentials") {
		t.Errorf("condition message %q", c.Message)
	}
	agent.WaitState(t, "default/wrong", "offline", wait)
	agent.WaitState(t, "default/right", "ok", wait)
	b.PublishAs(t, "dowse", "pass-1", "relay7/state", []byte("ON"), true)
	agent.WaitReported(t, "default/right", "state", "true", 0, wait)
}

// assertNoReconnect: a death certificate is the device's news, not the
// broker's: the device never went unhealthy (which would reconnect).
func assertNoReconnect(t *testing.T, agent *mappertest.Agent) {
	t.Helper()
	for _, s := range agent.States() {
		if s.Device == "pump" && s.State == "unhealthy" {
			t.Errorf("the pump was reported unhealthy at %v (a reconnect), want offline only", s.At)
		}
	}
}
