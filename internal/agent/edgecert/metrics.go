package edgecert

import "github.com/prometheus/client_golang/prometheus"

// Metrics shows the node's link identity: when its certificate expires and
// how bootstraps and renewals went.
type Metrics struct {
	expiry     prometheus.Gauge
	bootstraps *prometheus.CounterVec
	renewals   *prometheus.CounterVec
}

// NewMetrics registers the metrics with reg (nil: unregistered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		expiry: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "dowse_agent_link_certificate_expiry_timestamp_seconds",
			Help: "When the node's link client certificate expires (Unix time); 0 before bootstrap.",
		}),
		bootstraps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dowse_agent_link_bootstraps_total",
			Help: "Bootstrap attempts with a token, by result (success, refused, error).",
		}, []string{"result"}),
		renewals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dowse_agent_link_certificate_renewals_total",
			Help: "Certificate renewal attempts, by result (success, refused, error).",
		}, []string{"result"}),
	}
	for _, r := range []string{resultSuccess, resultRefused, resultError} {
		m.bootstraps.WithLabelValues(r)
		m.renewals.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.expiry, m.bootstraps, m.renewals)
	}
	return m
}

const (
	resultSuccess = "success"
	resultRefused = "refused"
	resultError   = "error"
)
