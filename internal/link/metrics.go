package link

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are a link end's counters, shared by all its connections.
type Metrics struct {
	MessagesIn, MessagesOut prometheus.Counter
	BytesIn, BytesOut       prometheus.Counter
	Resends                 prometheus.Counter
	Duplicates              prometheus.Counter
	Refused                 prometheus.Counter
	RTT                     prometheus.Histogram
	// Byte streams (Streams): open now, opened, reset, and their data
	// bytes by direction.
	StreamsOpen                   prometheus.Gauge
	StreamsOpened, StreamsReset   prometheus.Counter
	StreamBytesIn, StreamBytesOut prometheus.Counter
}

// NewMetrics registers the link metrics under dowse_<subsystem>_ on reg.
func NewMetrics(reg prometheus.Registerer, subsystem string) *Metrics {
	msgs := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "dowse", Subsystem: subsystem, Name: "link_messages_total",
		Help: "Link frames by direction (in: received, out: sent), heartbeats and acks included."}, []string{"direction"})
	bytes := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "dowse", Subsystem: subsystem, Name: "link_bytes_total",
		Help: "Link frame bytes by direction."}, []string{"direction"})
	streamBytes := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "dowse", Subsystem: subsystem, Name: "link_stream_bytes_total",
		Help: "Byte streams' data bytes by direction (in: received, out: sent)."}, []string{"direction"})
	m := &Metrics{
		MessagesIn: msgs.WithLabelValues("in"), MessagesOut: msgs.WithLabelValues("out"),
		BytesIn: bytes.WithLabelValues("in"), BytesOut: bytes.WithLabelValues("out"),
		Resends: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "dowse", Subsystem: subsystem, Name: "link_resends_total",
			Help: "Sequenced messages written again after a reconnect."}),
		Duplicates: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "dowse", Subsystem: subsystem, Name: "link_duplicates_total",
			Help: "Sequenced messages received again and dropped."}),
		Refused: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "dowse", Subsystem: subsystem, Name: "link_refused_total",
			Help: "Messages refused by the application (not the node's device, malformed content)."}),
		RTT: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "dowse", Subsystem: subsystem, Name: "link_rtt_seconds",
			Help: "Heartbeat round-trip time.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}),
		StreamsOpen: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "dowse", Subsystem: subsystem, Name: "link_streams_open",
			Help: "Byte streams open on the link now (the cloud reaching the edge)."}),
		StreamsOpened: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "dowse", Subsystem: subsystem, Name: "link_streams_opened_total",
			Help: "Byte streams opened on the link."}),
		StreamsReset: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "dowse", Subsystem: subsystem, Name: "link_streams_reset_total",
			Help: "Byte streams that ended by a reset (refused, abandoned, the link lost) rather than both ends closing."}),
		StreamBytesIn: streamBytes.WithLabelValues("in"), StreamBytesOut: streamBytes.WithLabelValues("out"),
	}
	if reg != nil {
		reg.MustRegister(msgs, bytes, m.Resends, m.Duplicates, m.Refused, m.RTT, m.StreamsOpen, m.StreamsOpened, m.StreamsReset, streamBytes)
	}
	return m
}
