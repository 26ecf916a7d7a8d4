package propertyrefs

import (
	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// Metrics count the watches and their failures. A nil *Metrics records
// nothing.
type Metrics struct {
	watched  prometheus.Gauge
	failures *prometheus.CounterVec
}

// NewMetrics registers the metrics with reg (none when reg is nil).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		watched: prometheus.NewGauge(prometheus.GaugeOpts{Name: "dowse_agent_property_objects_watched",
			Help: "Secrets and ConfigMaps this agent watches by name because a Configuration handled here names them in discoveryProperties."}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dowse_agent_property_read_failures_total",
			Help: "Failed lists and watches of those objects, by the API server's reason (Forbidden: not granted yet)."}, []string{"reason"}),
	}
	if reg != nil {
		reg.MustRegister(m.watched, m.failures)
	}
	return m
}

func (m *Metrics) setWatched(n int) {
	if m != nil {
		m.watched.Set(float64(n))
	}
}

func (m *Metrics) failed(err error) {
	if m == nil {
		return
	}
	reason := string(apierrors.ReasonForError(err))
	if reason == "" {
		reason = "Unknown"
	}
	m.failures.WithLabelValues(reason).Inc()
}
