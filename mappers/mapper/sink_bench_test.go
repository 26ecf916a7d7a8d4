package mapper

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/dowse-dev/dowse/test/peers/mosquitto"
)

// BenchmarkMQTTSink: readings through one MQTT sink at QoS 1 into Debian's
// mosquitto (default configuration: Nagle on its side, so acknowledgements
// come in bursts), from push to the broker's acknowledgement of the last.
func BenchmarkMQTTSink(b *testing.B) {
	broker := mosquitto.Start(b)
	cfg := Config{Protocol: "bench", StateDir: b.TempDir(), NewDriver: func(DeviceInfo) (Driver, error) { return nil, nil }, Logger: logr.Discard(),
		Metrics: NewMetrics(), SinkBufferMessages: 1 << 30, SinkBufferBytes: 1 << 40}
	m, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := m.sinks.acquire(ctx, sinkSpec{kind: "mqtt", address: broker.Addr()})
	p := payload("bench", "d0", "p0", "12345", "INT", time.Now())
	b.ResetTimer()
	for range b.N {
		s.push(&sinkTarget{topic: "bench/d0/p0", qos: 1}, p, "12345", 0)
	}
	for m.cfg.Metrics.Value("dowse_mapper_sink_sent_total", s.labels) < float64(b.N) {
		time.Sleep(time.Millisecond)
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
	m.sinks.stop()
}
