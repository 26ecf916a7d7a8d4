package dra

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the driver's; a nil *Metrics records nothing.
type Metrics struct {
	published     prometheus.Gauge
	preparedNow   prometheus.Gauge
	prepares      *prometheus.CounterVec
	unprepares    prometheus.Counter
	publishErrors prometheus.Counter
	invalid       prometheus.Counter
	sliceWrites   *prometheus.CounterVec
}

// NewMetrics registers the driver's metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		published:     prometheus.NewGauge(prometheus.GaugeOpts{Name: "dowse_agent_dra_local_devices", Help: "Local devices this agent publishes in its node's ResourceSlices."}),
		preparedNow:   prometheus.NewGauge(prometheus.GaugeOpts{Name: "dowse_agent_dra_prepared_claims", Help: "ResourceClaims prepared on this node (checkpointed)."}),
		prepares:      prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dowse_agent_dra_prepares_total", Help: "Claims the kubelet asked to prepare, by result (prepared, again: prepared before, error)."}, []string{"result"}),
		unprepares:    prometheus.NewCounter(prometheus.CounterOpts{Name: "dowse_agent_dra_unprepares_total", Help: "Prepared claims the kubelet released."}),
		publishErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "dowse_agent_dra_publish_errors_total", Help: "Errors writing this node's ResourceSlices (retried)."}),
		invalid:       prometheus.NewCounter(prometheus.CounterOpts{Name: "dowse_agent_dra_invalid_devices_total", Help: "DRA devices left unpublished because their CDI spec could not be written."}),
		sliceWrites:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dowse_agent_dra_slice_writes_total", Help: "Writes of this node's ResourceSlices, by verb (create, update, delete)."}, []string{"verb"}),
	}
	if reg != nil {
		reg.MustRegister(m.published, m.preparedNow, m.prepares, m.unprepares, m.publishErrors, m.invalid, m.sliceWrites)
	}
	return m
}

func (m *Metrics) devices(n int) {
	if m != nil {
		m.published.Set(float64(n))
	}
}

func (m *Metrics) prepared(n int) {
	if m != nil {
		m.preparedNow.Set(float64(n))
	}
}

func (m *Metrics) prepare(result string) {
	if m != nil {
		m.prepares.WithLabelValues(result).Inc()
	}
}

func (m *Metrics) unprepare() {
	if m != nil {
		m.unprepares.Inc()
	}
}

func (m *Metrics) publishError() {
	if m != nil {
		m.publishErrors.Inc()
	}
}

func (m *Metrics) invalidDevice() {
	if m != nil {
		m.invalid.Inc()
	}
}

func (m *Metrics) sliceWrite(verb string) {
	if m != nil {
		m.sliceWrites.WithLabelValues(verb).Inc()
	}
}
