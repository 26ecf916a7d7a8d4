package modbus_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dowse-dev/dowse/mappers/mapper/mappertest"
	dmiv1beta1 "github.com/dowse-dev/dowse/proto/dmi/v1beta1"
	"github.com/dowse-dev/dowse/test/peers/mosquitto"
	"github.com/dowse-dev/dowse/test/peers/npmpeer"
)

// TestModbusMapperPublishesToMQTT: Dowse's Modbus mapper reading jsmodbus
// publishes every changed reading (registers written by mbpoll) to
// Debian's mosquitto at QoS 1, read back by mosquitto_sub on a persistent
// session. The broker is stopped mid-stream and started again: the twin
// reports every value meanwhile, and once the broker is back every
// reading reaches the subscriber, none lost, in order.
func TestModbusMapperPublishesToMQTT(t *testing.T) {
	js := npmpeer.StartModbus(t, "jsmodbus", withMemory(map[string]any{"impl": "jsmodbus", "host": "127.0.0.15"}))
	broker := mosquitto.Start(t)
	sub := broker.Subscribe(t, "plant/#", 1, "dowse-modbus-sink-test")
	pm := &dmiv1beta1.PushMethod{Mqtt: &dmiv1beta1.PushMethodMQTT{Address: broker.Addr(), Topic: "plant/js/count", Qos: 1}}
	dev := plcDevice(t, "js", js.Address, 1, mappertest.Prop{Name: "count", Visitor: map[string]any{"register": "holding", "address": 0}, PushMethod: pm})
	run := startMapper(t, []*dmiv1beta1.DeviceModel{plcModel}, dev)
	agent := run.agent

	agent.WaitReported(t, "default/js", "count", "1234", 0, wait)
	values := func() []string {
		var out []string
		for _, l := range sub.Lines() {
			rest, ok := strings.CutPrefix(l, `plant/js/count {"namespace":"default","device":"js","property":"count","value":"`)
			if !ok {
				t.Errorf("mosquitto_sub printed %q", l)
				continue
			}
			out = append(out, rest[:strings.IndexByte(rest, '"')])
		}
		return out
	}
	waitFor := func(what string, cond func() error) {
		t.Helper()
		deadline := time.Now().Add(wait)
		for {
			err := cond()
			if err == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %v", what, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitFor("the first reading at the subscriber", func() error {
		if v := values(); len(v) == 0 || v[0] != "1234" {
			return fmt.Errorf("mosquitto_sub got %q", v)
		}
		return nil
	})

	want := []string{"1234"}
	for i := 1; i <= 30; i++ {
		switch i {
		case 11:
			broker.Stop()
		case 21:
			broker.StartAgain()
		}
		v := strconv.Itoa(100 + i)
		from := agent.ReportCount()
		mbpollWrite(t, js.Address, 0, v, "-t", "4")
		agent.WaitReported(t, "default/js", "count", v, from, wait)
		want = append(want, v)
	}
	waitFor("every reading at the subscriber", func() error {
		// At least once (QoS 1 resends what the broker had not
		// acknowledged when it stopped), in order of first arrival.
		var first []string
		seen := map[string]bool{}
		for _, v := range values() {
			if !seen[v] {
				seen[v] = true
				first = append(first, v)
			}
		}
		if strings.Join(first, " ") != strings.Join(want, " ") {
			return fmt.Errorf("mosquitto_sub got %q\nwant %q", values(), want)
		}
		return nil
	})
	t.Logf("mosquitto_sub got %d messages for %d readings", len(values()), len(want))
	labels := `kind="mqtt",address="` + broker.Addr() + `"`
	if n := run.metrics.Value("dowse_mapper_sink_dropped_total", labels); n != 0 {
		t.Errorf("dropped = %v", n)
	}
	if n := run.metrics.Value("dowse_mapper_sink_errors_total", labels); n == 0 {
		t.Errorf("no failure counted while the broker was down")
	}
}
