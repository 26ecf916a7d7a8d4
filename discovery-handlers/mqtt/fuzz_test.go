package mqtt

import (
	"testing"

	"github.com/dowse-dev/dowse/internal/sparkplug"
)

// FuzzMessages feeds what could come from a broker through the handler's
// whole path: topic parsing, the Sparkplug B codec, Home Assistant configs,
// the device table with its bounds, and the list. Nothing may panic, and
// the bounds must hold.
func FuzzMessages(f *testing.F) {
	d, err := ParseDetails(`{"broker": "tcp://b:1883", "maxDevices": 4, "maxPayload": 4096, "maxMetrics": 3,
		"sparkplug": {"device": "^d", "requestRebirth": true}, "homeAssistant": {"deviceModel": "^M"}}`)
	if err != nil {
		f.Fatal(err)
	}
	f.Add("spBv1.0/G/NBIRTH/E", birth(1, metric("a", sparkplug.Int32)))
	f.Add("spBv1.0/G/DBIRTH/E/d1", birth(1, metric("a", sparkplug.Int32), metric("b", sparkplug.String)))
	f.Add("spBv1.0/G/NDEATH/E", birth(1))
	f.Add("spBv1.0/G/DDATA/E/d1", []byte{0x12, 0x05, 0x0a})
	f.Add("homeassistant/sensor/n/o/config", []byte(`{"~": "x", "stat_t": "~/s", "dev": {"ids": ["i"], "mdl": "M1"}}`))
	f.Add("homeassistant/switch/o/config", []byte(`{"cmd_t": 5, "dev": {"ids": 3}}`))
	f.Add("homeassistant/switch/o/config", []byte{})
	f.Fuzz(func(t *testing.T, topic string, payload []byte) {
		s := newState(d)
		for i := range 3 { // the same message again, and with a twist
			s.handle(topic, payload)
			if i == 1 && len(payload) > 0 {
				s.handle(topic, payload[:len(payload)/2])
			}
			devs, sk := s.list()
			if len(devs) > d.MaxDevices || len(s.devices)+len(s.filtered) > d.MaxDevices || len(s.garbage) > maxGarbage {
				t.Fatalf("%d devices, %d filtered, %d garbage: over the bounds", len(devs), len(s.filtered), len(s.garbage))
			}
			for _, dev := range devs {
				if dev.Id == "" || dev.Properties[SourceProperty] == "" {
					t.Fatalf("device %+v", dev)
				}
				if len(dev.Properties[SparkplugMetricsProperty]) > MaxMetricsText {
					t.Fatalf("metrics property of %d bytes", len(dev.Properties[SparkplugMetricsProperty]))
				}
			}
			skipped(sk)
		}
	})
}
