package nodeapi

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	offline        prometheus.Gauge
	offlineSince   prometheus.Gauge
	cuts           *prometheus.CounterVec
	offlineAnswers *prometheus.CounterVec
	upstream       *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, st *store) *metrics {
	m := &metrics{
		offline: prometheus.NewGauge(prometheus.GaugeOpts{Name: "dowse_node_api_offline",
			Help: "1 while the node's API proxy answers from its store because the API server cannot be reached."}),
		offlineSince: prometheus.NewGauge(prometheus.GaugeOpts{Name: "dowse_node_api_offline_since_seconds",
			Help: "Unix time the API server was last lost."}),
		cuts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dowse_node_api_transitions_total",
			Help: "API server lost and reached again."}, []string{"event"}),
		offlineAnswers: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dowse_node_api_offline_requests_total",
			Help: "Requests answered while offline, by verb and outcome (served from the store, held, refused)."}, []string{"verb", "outcome"}),
		upstream: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dowse_node_api_upstream_requests_total",
			Help: "Requests passed on to the API server, by verb (\"\" for discovery and other paths)."}, []string{"verb"}),
	}
	if reg == nil {
		return m
	}
	objects := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "dowse_node_api_store_objects",
		Help: "Objects kept in the node's store."}, func() float64 { n, _ := st.size(); return float64(n) })
	bytes := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "dowse_node_api_store_bytes",
		Help: "Bytes of the objects kept in the node's store."}, func() float64 { _, b := st.size(); return float64(b) })
	reg.MustRegister(m.offline, m.offlineSince, m.cuts, m.offlineAnswers, m.upstream, objects, bytes)
	return m
}
