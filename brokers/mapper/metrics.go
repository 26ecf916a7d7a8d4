package mapper

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are a mapper's Prometheus metrics. A nil *Metrics records
// nothing, so tests and embedders need none.
type Metrics struct {
	reads        *prometheus.CounterVec
	writes       *prometheus.CounterVec
	readLatency  prometheus.Histogram
	writeLatency prometheus.Histogram
	reports      *prometheus.CounterVec
	registers    *prometheus.CounterVec
	connects     *prometheus.CounterVec
	devices      *prometheus.GaugeVec
}

// NewMetrics registers the metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	buckets := []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}
	m := &Metrics{
		reads: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dowse_mapper_reads_total",
			Help: "Property reads, by result (ok, error: the device or connection failed, invalid: the property's visitor or value is wrong)."}, []string{"result"}),
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dowse_mapper_writes_total",
			Help: "Desired-value writes, by result (ok, error, invalid: refused before or by the device as wrong)."}, []string{"result"}),
		readLatency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "dowse_mapper_read_duration_seconds",
			Help: "Time of one read exchange with a device (a batch counts once).", Buckets: buckets}),
		writeLatency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "dowse_mapper_write_duration_seconds",
			Help: "Time of one write to a device.", Buckets: buckets}),
		reports: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dowse_mapper_reports_total",
			Help: "Reports sent to the device manager, by kind (status, states) and result (ok, error)."}, []string{"kind", "result"}),
		registers: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dowse_mapper_registrations_total",
			Help: "MapperRegister calls, by result."}, []string{"result"}),
		connects: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dowse_mapper_connects_total",
			Help: "Device connection attempts, by result."}, []string{"result"}),
		devices: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "dowse_mapper_devices",
			Help: "Devices served, by state."}, []string{"state"}),
	}
	reg.MustRegister(m.reads, m.writes, m.readLatency, m.writeLatency, m.reports, m.registers, m.connects, m.devices)
	return m
}

func (m *Metrics) read(result string, n int) {
	if m != nil && n > 0 {
		m.reads.WithLabelValues(result).Add(float64(n))
	}
}

func (m *Metrics) readTook(d time.Duration) {
	if m != nil {
		m.readLatency.Observe(d.Seconds())
	}
}

func (m *Metrics) write(result string, d time.Duration) {
	if m != nil {
		m.writes.WithLabelValues(result).Inc()
		m.writeLatency.Observe(d.Seconds())
	}
}

func (m *Metrics) report(kind string, err error) {
	if m != nil {
		m.reports.WithLabelValues(kind, result(err)).Inc()
	}
}

func (m *Metrics) register(err error) {
	if m != nil {
		m.registers.WithLabelValues(result(err)).Inc()
	}
}

func (m *Metrics) connect(err error) {
	if m != nil {
		m.connects.WithLabelValues(result(err)).Inc()
	}
}

func (m *Metrics) state(from, to string) {
	if m == nil || from == to {
		return
	}
	if from != "" {
		m.devices.WithLabelValues(from).Dec()
	}
	if to != "" {
		m.devices.WithLabelValues(to).Inc()
	}
}

func result(err error) string {
	if err != nil {
		return "error"
	}
	return "ok"
}
