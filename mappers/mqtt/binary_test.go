package mqtt_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/dowse-dev/dowse/internal/sparkplug"
	"github.com/dowse-dev/dowse/mappers/mapper/mappertest"
	"github.com/dowse-dev/dowse/mappers/mqtt"
	dmiv1beta1 "github.com/dowse-dev/dowse/proto/dmi/v1beta1"
	"github.com/dowse-dev/dowse/test/framework/procs"
	"github.com/dowse-dev/dowse/test/peers/mosquitto"
	"github.com/dowse-dev/dowse/test/peers/npmpeer"
)

// TestBinaryThroughput runs the real dowse-mqtt-mapper binary (built as its
// image is) serving ten Sparkplug devices of a Tahu edge node, then floods
// their DDATA from a second publisher and reports how many messages the
// mapper turned into twins per second of its CPU (goal: 10,000 on one
// core) and its peak RSS (goal: under 16 MiB). It fails only when the last
// values never arrive or the RSS passes a regression bound.
func TestBinaryThroughput(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	npmpeer.SparkplugModules(t)
	b := mosquitto.Start(t)
	bin := filepath.Join(t.TempDir(), "dowse-mqtt-mapper")
	build := exec.Command("go", "build", "-tags", "grpcnotrace", "-trimpath", "-ldflags=-s -w", "-o", bin, "./cmd/dowse-mqtt-mapper")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	const n = 10
	dir := mappertest.ShortTempDir(t)
	agent := mappertest.Start(t, dir)
	var devs []*dmiv1beta1.Device
	births := map[string][]npmpeer.SparkplugMetric{}
	for i := range n {
		id := "P" + strconv.Itoa(i)
		births[id] = []npmpeer.SparkplugMetric{{Name: "Temperature", Type: "Double", Value: 20.5, Alias: 1}, {Name: "Speed", Type: "Int32", Value: 1, Alias: 2}}
		devs = append(devs, mappertest.NewDevice(t, "default", "pump-"+strconv.Itoa(i), "pump", mqtt.Protocol,
			map[string]any{"broker": b.Addr(), "source": "sparkplug", "group": "Fleet", "edgeNode": "Hall", "device": id},
			prop("temperature", map[string]any{"metric": "Temperature"}), prop("speed", map[string]any{"metric": "Speed"})))
	}
	agent.SetData([]*dmiv1beta1.DeviceModel{pumpModel}, devs)
	p, err := procs.Run("dowse-mqtt-mapper", bin, []string{"--state-dir", dir, "--name", mqtt.Protocol}, procs.Options{DieWithCaller: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	for _, d := range devs {
		agent.WaitState(t, "default/"+d.GetName(), "ok", wait)
	}
	npmpeer.StartSparkplug(t, "tahu-hall", npmpeer.SparkplugConfig{ServerURL: b.Addr(), GroupID: "Fleet", EdgeNode: "Hall", Devices: births})
	for _, d := range devs {
		agent.WaitReported(t, "default/"+d.GetName(), "temperature", "20.5", 0, wait)
	}

	// DDATA by alias only, as a Sparkplug edge node sends once born.
	pub := paho.NewClient(paho.NewClientOptions().AddBroker(b.Addr()).SetClientID("flood"))
	if tok := pub.Connect(); !tok.WaitTimeout(wait) || tok.Error() != nil {
		t.Fatalf("publisher: %v", tok.Error())
	}
	defer pub.Disconnect(100)
	const msgs = 30000
	cpu0, err := procs.CPUTime(p.Pid())
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var last paho.Token
	for i := range msgs {
		v := 21 + float64(i)/100
		payload := sparkplug.Encode(&sparkplug.Payload{Timestamp: uint64(time.Now().UnixMilli()), HasTimestamp: true, Seq: uint64(i % 256), HasSeq: true,
			Metrics: []sparkplug.Metric{{Alias: 1, HasAlias: true, Datatype: sparkplug.Double, Kind: sparkplug.DoubleValue, Float: v}}})
		last = pub.Publish(fmt.Sprintf("spBv1.0/Fleet/DDATA/Hall/P%d", i%n), 0, false, payload)
	}
	last.WaitTimeout(wait)
	for i := msgs - n; i < msgs; i++ {
		want := strconv.FormatFloat(21+float64(i)/100, 'f', -1, 64)
		agent.WaitReported(t, fmt.Sprintf("default/pump-%d", i%n), "temperature", want, 0, 60*time.Second)
	}
	elapsed := time.Since(start)
	cpu1, err := procs.CPUTime(p.Pid())
	if err != nil {
		t.Fatal(err)
	}
	cpu := cpu1 - cpu0
	t.Logf("FIGURE: dowse-mqtt-mapper: %d DDATA messages of %d devices into twins in %v wall, %v of its CPU: %.0f messages per CPU second",
		msgs, n, elapsed.Round(time.Millisecond), cpu, float64(msgs)/cpu.Seconds())
	hwm, err := p.PeakRSS()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("FIGURE: dowse-mqtt-mapper peak RSS, %d devices under the flood: %.1f MiB", n, float64(hwm)/1024)
	if hwm > maxPeakRSS {
		t.Errorf("peak RSS %d KiB, more than the %d KiB regression bound", hwm, maxPeakRSS)
	}
}

// maxPeakRSS is the regression bound of TestBinaryThroughput, in KiB.
const maxPeakRSS = 24 * 1024

// TestPrimaryHostState runs the real dowse-mqtt-mapper binary with two
// Sparkplug devices naming one primaryHostId, against Debian's mosquitto:
// mosquitto_sub sees the retained STATE {"online":true} (one host session
// for both devices, retained for a later subscriber), and after the
// mapper is killed (SIGKILL: no word of its own) the broker's will
// {"online":false} with the birth's timestamp.
func TestPrimaryHostState(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	b := mosquitto.Start(t)
	bin := filepath.Join(t.TempDir(), "dowse-mqtt-mapper")
	build := exec.Command("go", "build", "-tags", "grpcnotrace", "-trimpath", "-ldflags=-s -w", "-o", bin, "./cmd/dowse-mqtt-mapper")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	sub := b.Subscribe(t, "spBv1.0/STATE/#", 1, "")
	dir := mappertest.ShortTempDir(t)
	agent := mappertest.Start(t, dir)
	var devs []*dmiv1beta1.Device
	for _, id := range []string{"Pump1", "Pump2"} {
		devs = append(devs, mappertest.NewDevice(t, "default", strings.ToLower(id), "pump", mqtt.Protocol,
			map[string]any{"broker": b.Addr(), "source": "sparkplug", "group": "Plant", "edgeNode": "Line1", "device": id, "primaryHostId": "dowse-host"},
			prop("temperature", map[string]any{"metric": "Temperature"})))
	}
	agent.SetData([]*dmiv1beta1.DeviceModel{pumpModel}, devs)
	p, err := procs.Run("dowse-mqtt-mapper", bin, []string{"--state-dir", dir, "--name", mqtt.Protocol}, procs.Options{DieWithCaller: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	agent.WaitState(t, "default/pump1", "ok", wait)
	agent.WaitState(t, "default/pump2", "ok", wait)
	state := func(s *mosquitto.Sub, online bool) (ts int64) {
		t.Helper()
		deadline := time.Now().Add(wait)
		for {
			for _, l := range s.Lines() {
				payload, ok := strings.CutPrefix(l, "spBv1.0/STATE/dowse-host ")
				var st struct {
					Online    bool  `json:"online"`
					Timestamp int64 `json:"timestamp"`
				}
				if ok && json.Unmarshal([]byte(payload), &st) == nil && st.Online == online && st.Timestamp > 0 {
					return st.Timestamp
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("mosquitto_sub saw %q, want STATE online %v", s.Lines(), online)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	born := state(sub, true)
	if n := sub.Count(`spBv1.0/STATE/dowse-host {"online":true`); n != 1 {
		t.Errorf("%d STATE births, want 1 (one host session for both devices): %q", n, sub.Lines())
	}
	// Retained: a subscriber that comes later sees it too.
	if late := state(b.Subscribe(t, "spBv1.0/STATE/dowse-host", 1, ""), true); late != born {
		t.Errorf("retained STATE timestamp %d, want %d", late, born)
	}
	killed := time.Now()
	p.Kill()
	if died := state(sub, false); died != born {
		t.Errorf("will timestamp %d, want the birth's %d", died, born)
	}
	t.Logf("FIGURE: MQTT mapper: the primary host's will (STATE online false) seen by mosquitto_sub %v after SIGKILL", time.Since(killed).Round(100*time.Microsecond))
}
