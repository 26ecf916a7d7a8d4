package mapper

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// The hand-written exposition parses with Prometheus's own parser.
func TestMetricsTextFormat(t *testing.T) {
	m := NewMetrics()
	m.read("ok", 3)
	m.read("error", 1)
	m.readTook(3 * time.Millisecond)
	m.readTook(2 * time.Second)
	m.write("ok", time.Millisecond)
	m.report("status", nil)
	m.report("states", errors.New("x"))
	m.register(nil)
	m.connect(errors.New("refused"))
	m.state("", "ok")
	m.state("ok", "offline")
	var b strings.Builder
	if _, err := m.WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(strings.NewReader(b.String()))
	if err != nil {
		t.Fatalf("%v\n%s", err, b.String())
	}
	if v := mfs["dowse_mapper_reads_total"].GetMetric(); len(v) != 2 {
		t.Errorf("reads series = %v", v)
	}
	h := mfs["dowse_mapper_read_duration_seconds"].GetMetric()[0].GetHistogram()
	if h.GetSampleCount() != 2 || h.GetBucket()[4].GetCumulativeCount() != 1 {
		t.Errorf("read latency histogram = %v", h)
	}
	if mfs["process_resident_memory_bytes"] == nil || mfs["go_goroutines"] == nil {
		t.Errorf("runtime gauges missing:\n%s", b.String())
	}
	if m.Value("dowse_mapper_reads_total", `result="ok"`) != 3 {
		t.Errorf("Value(reads ok) = %v", m.Value("dowse_mapper_reads_total", `result="ok"`))
	}
	var nilM *Metrics
	nilM.read("ok", 1) // nil-safe
}
