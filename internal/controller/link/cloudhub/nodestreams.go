package cloudhub

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dowse-dev/dowse/internal/link"
)

// nodeStreams are the byte stream metrics per node (label node) of the
// sessions this replica holds: what the link end's dowse_cloudhub_link_stream*
// count for all nodes together. A node's series go when its session leaves
// this replica (taken over, departed).
type nodeStreams struct {
	open                   *prometheus.GaugeVec
	opened, reset, refused *prometheus.CounterVec
	bytes                  *prometheus.CounterVec
}

func newNodeStreams(reg prometheus.Registerer) *nodeStreams {
	n := &nodeStreams{
		open: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "dowse", Subsystem: "cloudhub", Name: "node_streams_open",
			Help: "Byte streams open now on each node's link held here (kubectl logs, exec, port-forward, cloud-side Services)."}, []string{"node"}),
		opened: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "dowse", Subsystem: "cloudhub", Name: "node_streams_opened_total",
			Help: "Byte streams opened on each node's link held here."}, []string{"node"}),
		reset: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "dowse", Subsystem: "cloudhub", Name: "node_streams_reset_total",
			Help: "Byte streams of each node that ended by a reset (refused by the edge, abandoned, the link lost) rather than both ends closing."}, []string{"node"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "dowse", Subsystem: "cloudhub", Name: "node_streams_refused_total",
			Help: "Byte streams to each node refused, by reason: bound (the node had --max-streams-per-node open), edge (the edge refused: a target it does not serve, a failed dial, its own bound)."}, []string{"node", "reason"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "dowse", Subsystem: "cloudhub", Name: "node_stream_bytes_total",
			Help: "Byte streams' data bytes of each node, by direction (in: from the edge, out: to it)."}, []string{"node", "direction"}),
	}
	if reg != nil {
		reg.MustRegister(n.open, n.opened, n.reset, n.refused, n.bytes)
	}
	return n
}

// of is node's counters.
func (n *nodeStreams) of(node string) *link.StreamCounters {
	return &link.StreamCounters{
		Open: n.open.WithLabelValues(node), Opened: n.opened.WithLabelValues(node), Reset: n.reset.WithLabelValues(node),
		RefusedBound: n.refused.WithLabelValues(node, "bound"), RefusedPeer: n.refused.WithLabelValues(node, "edge"),
		BytesIn: n.bytes.WithLabelValues(node, "in"), BytesOut: n.bytes.WithLabelValues(node, "out"),
	}
}

// forget drops node's series (its session left this replica; streams
// still ending count in series no longer exported).
func (n *nodeStreams) forget(node string) {
	l := prometheus.Labels{"node": node}
	n.open.DeletePartialMatch(l)
	n.opened.DeletePartialMatch(l)
	n.reset.DeletePartialMatch(l)
	n.refused.DeletePartialMatch(l)
	n.bytes.DeletePartialMatch(l)
}

// The session events (SessionObserver): a node's series live while this
// replica holds its session.
func (n *nodeStreams) Connected(context.Context, string) {}
func (n *nodeStreams) TakenOver(node string)             { n.forget(node) }
func (n *nodeStreams) Departed(node string)              { n.forget(node) }
