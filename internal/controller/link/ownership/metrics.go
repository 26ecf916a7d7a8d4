package ownership

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the ownership metrics of one replica; a nil *Metrics counts
// nothing.
type Metrics struct {
	claims       *prometheus.CounterVec
	claimSeconds prometheus.Histogram
}

// NewMetrics makes the metrics and registers them with reg (nil: not
// registered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		claims: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "dowse", Subsystem: "cloudhub", Name: "node_claims_total",
			Help: "Claims of nodes' sessions at their handshake, by how the record was written (patch: one request; create; update: read first; kept: none, the edge returned to the session this replica holds) and result."},
			[]string{"path", "result"}),
		claimSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "dowse", Subsystem: "cloudhub", Name: "node_claim_seconds",
			Help: "Time to claim a node's session (its ownership record written, the wait for a turn included) before it is welcomed.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 14)}),
	}
	if reg != nil {
		reg.MustRegister(m.claims, m.claimSeconds)
	}
	return m
}

func (m *Metrics) claimed(path string, err error, d time.Duration) {
	if m == nil {
		return
	}
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.claims.WithLabelValues(path, result).Inc()
	if err == nil {
		m.claimSeconds.Observe(d.Seconds())
	}
}
