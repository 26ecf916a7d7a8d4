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

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]int64{"8MiB": 8 << 20, "8 MiB": 8 << 20, "512KiB": 512 << 10, "1.5GiB": 3 << 29,
		"12m": 12 << 20, "4096": 4096, "0": 0, "off": 0, "": 0, "100B": 100} {
		got, err := ParseBytes(in)
		if err != nil || got != want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"lots", "-1MiB", "1TiB", "MiB"} {
		if _, err := ParseBytes(in); err == nil {
			t.Errorf("ParseBytes(%q) did not fail", in)
		}
	}
	for _, n := range []int64{DefaultMemoryLimit, 1536, 1000} {
		if got, err := ParseBytes(FormatBytes(n)); err != nil || got != n {
			t.Errorf("ParseBytes(FormatBytes(%d)) = %d, %v", n, got, err)
		}
	}
}
