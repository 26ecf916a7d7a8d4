package linkauth

import "github.com/prometheus/client_golang/prometheus"

// Request kinds, the "request" label of the metrics.
const (
	requestBootstrap = "bootstrap"
	requestRenew     = "renew"
)

// Metrics counts what the endpoint granted and refused.
type Metrics struct {
	issued        *prometheus.CounterVec
	refused       *prometheus.CounterVec
	failed        *prometheus.CounterVec
	tokensExpired prometheus.Counter
}

// NewMetrics registers the endpoint's metrics with reg (nil: unregistered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		issued: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dowse_linkauth_certificates_issued_total",
			Help: "Node client certificates issued, by request (bootstrap or renew).",
		}, []string{"request"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dowse_linkauth_requests_refused_total",
			Help: "Bootstrap and renew requests refused, by request and reason (unknown_token, invalid_token, expired_token, reused_token, wrong_node, bad_client_cert, node_not_allowed, malformed, rate_limited, invalid_service_account_token, service_account_not_allowed, service_account_token_not_bound, service_account_bootstrap_off).",
		}, []string{"request", "reason"}),
		failed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dowse_linkauth_requests_failed_total",
			Help: "Bootstrap and renew requests that failed on the cloud side (API server errors); the edge retries them.",
		}, []string{"request"}),
		tokensExpired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dowse_linkauth_expired_tokens_deleted_total",
			Help: "Bootstrap token Secrets deleted after their expiration.",
		}),
	}
	for _, r := range []string{requestBootstrap, requestRenew} {
		m.issued.WithLabelValues(r)
		m.failed.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.issued, m.refused, m.failed, m.tokensExpired)
	}
	return m
}
