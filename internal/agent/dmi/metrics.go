package dmi

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics of the mapper API. A nil *Metrics counts nothing.
type Metrics struct {
	received  *prometheus.CounterVec
	refused   *prometheus.CounterVec
	calls     *prometheus.CounterVec
	latency   prometheus.Histogram
	connected prometheus.Gauge
}

// Reasons a report is refused (label reason of
// dowse_dmi_reports_refused_total).
const (
	reasonUnknownDevice   = "unknown-device"
	reasonUnknownProperty = "unknown-property"
	reasonBadValue        = "bad-value"
	reasonBadState        = "bad-state"
	reasonEmpty           = "empty"
	reasonRateLimited     = "rate-limited"
	reasonStore           = "store"
	reasonNotYours        = "not-its-device"
	reasonBadCondition    = "bad-condition"
)

// NewMetrics registers the metrics with reg (nil: unregistered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		received: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "dowse", Subsystem: "dmi", Name: "reports_received_total",
			Help: "Reports mappers sent (kind twin: one per property value; kind state: one per device state; kind condition: one per device condition), refused ones included."}, []string{"kind"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "dowse", Subsystem: "dmi", Name: "reports_refused_total",
			Help: "Reports refused, by reason (unknown-device, unknown-property, bad-value, bad-state, empty, rate-limited, store, not-its-device, bad-condition)."}, []string{"kind", "reason"}),
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "dowse", Subsystem: "dmi", Name: "mapper_calls_total",
			Help: "Calls the agent made to mappers' DeviceMapperService, by method and result (ok, error)."}, []string{"method", "result"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "dowse", Subsystem: "dmi", Name: "desired_to_mapper_seconds",
			Help:    "From a Device update (desired values ride it) reaching the edge to the mapper accepting RegisterDevice or UpdateDevice.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}}),
		connected: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "dowse", Subsystem: "dmi", Name: "mappers_connected",
			Help: "Registered mappers whose last call from the agent succeeded (or that have not been called yet)."}),
	}
	for _, k := range []string{"twin", "state", "condition"} {
		m.received.WithLabelValues(k)
	}
	if reg != nil {
		reg.MustRegister(m.received, m.refused, m.calls, m.latency, m.connected)
	}
	return m
}

func (m *Metrics) receive(kind string, n int) {
	if m != nil {
		m.received.WithLabelValues(kind).Add(float64(n))
	}
}

func (m *Metrics) refuse(kind, reason string, n int) {
	if m != nil {
		m.refused.WithLabelValues(kind, reason).Add(float64(n))
	}
}

func (m *Metrics) call(method string, err error) {
	if m == nil {
		return
	}
	r := "ok"
	if err != nil {
		r = "error"
	}
	m.calls.WithLabelValues(method, r).Inc()
}

func (m *Metrics) delivered(d time.Duration) {
	if m != nil {
		m.latency.Observe(d.Seconds())
	}
}

func (m *Metrics) setConnected(n int) {
	if m != nil {
		m.connected.Set(float64(n))
	}
}
