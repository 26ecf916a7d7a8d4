package cloudhub

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/dowse-dev/dowse/internal/link"
	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
)

// SessionObserver is told what becomes of the node sessions of this
// replica. The parts of an application that keep state per node (what
// was sent to it, what it reported and is not durable yet, the record of
// who owns it) register for it with Sessions.Observe, before the hub
// starts, instead of being called by name from whoever notices. Calls must
// be quick and must not call Evict or Forget.
type SessionObserver interface {
	// Connected: node's session was welcomed here. Called on the
	// connection's goroutine, before any of its messages is taken: the
	// part may resend state the node might lack (a restarted hub holds no
	// queue from before).
	Connected(ctx context.Context, node string)
	// TakenOver: node's session here was closed because another replica
	// owns the node now (Evict). What was taken of it and is not durable
	// must be dropped: the edge resends it to its new owner.
	TakenOver(node string)
	// Departed: node left the cluster (Forget); forget all of it.
	Departed(node string)
}

// Sessions is the table of the node sessions a Hub serves: each node's
// queue, receive position and live connection. It is made before the
// Hub (NewSessions, Config.Sessions) so that the parts the Hub needs
// (ownership, the status writer) can be given it, and the parts that keep
// state per node can observe it, in the order they are built.
type Sessions struct {
	cfg       Config
	mu        sync.Mutex
	nodes     map[string]*nodeState
	live      atomic.Int64 // nodes with a live connection past the handshake (a nodeState with cancel set)
	draining  atomic.Bool
	moved     *prometheus.CounterVec
	evicted   prometheus.Counter
	observers []SessionObserver
}

// NewSessions makes a session table from cfg's QueueSize, ManualCommit,
// RateLimit and RateBurst (defaults as for New); reg receives its metrics
// (nil: not registered).
func NewSessions(cfg Config, reg prometheus.Registerer) *Sessions {
	cfg = cfg.withDefaults()
	t := &Sessions{cfg: cfg, nodes: map[string]*nodeState{},
		moved: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "dowse", Subsystem: "cloudhub", Name: "moved_sessions_total",
			Help: "Edges told to reconnect elsewhere, by reason (drain: this replica is stopping; rebalance: it held more than its share)."}, []string{"reason"}),
		evicted: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "dowse", Subsystem: "cloudhub", Name: "sessions_taken_over_total",
			Help: "Sessions closed because another replica took the node (its newer session is the owner)."}),
	}
	if reg != nil {
		reg.MustRegister(t.moved, t.evicted,
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "dowse", Subsystem: "cloudhub", Name: "draining",
				Help: "1 while this replica moves its edges away before it stops."}, func() float64 {
				if t.draining.Load() {
					return 1
				}
				return 0
			}),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "dowse", Subsystem: "cloudhub", Name: "connected_nodes",
				Help: "Nodes with a live connection."}, func() float64 { return float64(t.live.Load()) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "dowse", Subsystem: "cloudhub", Name: "queued_messages",
				Help: "Messages to nodes not yet acknowledged, all nodes."}, func() float64 { q, _ := t.stats(); return float64(q) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "dowse", Subsystem: "cloudhub", Name: "max_node_queued_messages",
				Help: "The deepest node send queue."}, func() float64 { _, m := t.stats(); return float64(m) }),
		)
	}
	return t
}

// Observe registers o for the session events, in order after those
// registered before it. Call it before the hub starts.
func (t *Sessions) Observe(o ...SessionObserver) { t.observers = append(t.observers, o...) }

// connected tells the observers that node was welcomed.
func (t *Sessions) connected(ctx context.Context, node string) {
	for _, o := range t.observers {
		o.Connected(ctx, node)
	}
}

func (t *Sessions) stats() (queued, maxQueued int) {
	t.mu.Lock()
	states := make([]*nodeState, 0, len(t.nodes))
	for _, s := range t.nodes {
		states = append(states, s)
	}
	t.mu.Unlock()
	for _, s := range states {
		n, _ := s.sess.Len()
		queued += n
		maxQueued = max(maxQueued, n)
	}
	return queued, maxQueued
}

// Draining reports whether the hub serving these sessions is moving its
// edges away.
func (t *Sessions) Draining() bool { return t.draining.Load() }

func (t *Sessions) connectedStates() []*nodeState {
	t.mu.Lock()
	states := make([]*nodeState, 0, len(t.nodes))
	for _, s := range t.nodes {
		states = append(states, s)
	}
	t.mu.Unlock()
	out := states[:0]
	for _, s := range states {
		s.mu.Lock()
		if s.cancel != nil {
			out = append(out, s)
		}
		s.mu.Unlock()
	}
	return out
}

// Move tells node's edge to close its connection after delay and connect
// again at once, elsewhere if it can (a Reconnect); false when the node is
// not connected. reason ("rebalance", "drain") is counted and logged by the
// edge.
func (t *Sessions) Move(node string, delay time.Duration, reason string) bool {
	t.mu.Lock()
	st := t.nodes[node]
	t.mu.Unlock()
	return st != nil && t.move(st, delay, reason)
}

func (t *Sessions) move(st *nodeState, delay time.Duration, reason string) bool {
	st.mu.Lock()
	send := st.send
	st.mu.Unlock()
	if send == nil {
		return false
	}
	send(&linkv1.Envelope{Kind: &linkv1.Envelope_Reconnect{Reconnect: &linkv1.Reconnect{
		DelayMs: uint32(delay / time.Millisecond), Reason: reason}}})
	t.moved.WithLabelValues(reason).Inc()
	return true
}

// Evict closes node's session and forgets it (queue and receive position)
// when its epoch is at or below through: another hub's newer session of
// the node is the owner (see Config.Claim). It reports whether it did; the
// observers are told it was taken over (they drop what they hold of it).
func (t *Sessions) Evict(node string, through uint64) bool {
	t.mu.Lock()
	st := t.nodes[node]
	if st == nil {
		t.mu.Unlock()
		return false
	}
	st.mu.Lock()
	if st.epoch > through {
		st.mu.Unlock()
		t.mu.Unlock()
		return false
	}
	delete(t.nodes, node)
	t.mu.Unlock()
	if st.cancel != nil {
		st.cancel(errEvicted)
	}
	st.mu.Unlock()
	t.evicted.Inc()
	for _, o := range t.observers {
		o.TakenOver(node)
	}
	return true
}

func (t *Sessions) state(node string) *nodeState {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.nodes[node]
	if s == nil {
		s = &nodeState{
			sess:    link.NewSession(link.SessionConfig{MaxEntries: t.cfg.QueueSize, ManualCommit: t.cfg.ManualCommit}),
			limiter: rate.NewLimiter(rate.Limit(t.cfg.RateLimit), t.cfg.RateBurst),
		}
		t.nodes[node] = s
	}
	return s
}

// Send queues env (a Device or DeviceModel update or removal, an inventory,
// a DeviceMembership or a ProcessedAck)
// for node; it is delivered exactly once, in order, for as long as this Hub
// runs, whether the node is connected now or later. It returns
// link.ErrQueueFull when the node already has QueueSize messages
// unacknowledged (retry later, or coalesce: a slow node never slows others).
// env must not be modified afterwards.
func (t *Sessions) Send(node string, env *linkv1.Envelope) (uint64, error) {
	if !link.Sequenced(env) {
		return 0, fmt.Errorf("cloudhub: %T is not an application message", env.Kind)
	}
	if m := env.GetDeviceMembership(); m != nil && m.Node != node {
		return 0, fmt.Errorf("cloudhub: membership for node %q sent to node %q", m.Node, node)
	}
	seq, _, err := t.state(node).sess.Enqueue(env, "")
	return seq, err
}

// Commit tells a ManualCommit hub that the application has made node's
// messages through pos durable; the node is acknowledged that far and may
// forget them. Safe from any goroutine; unknown nodes are ignored.
func (t *Sessions) Commit(node string, pos Position) {
	t.mu.Lock()
	st := t.nodes[node]
	t.mu.Unlock()
	if st == nil {
		return
	}
	st.mu.Lock()
	before := pos.Epoch != 0 && pos.Epoch < st.first
	st.mu.Unlock()
	if !before {
		st.sess.Commit(pos.Stream, pos.Seq)
	}
}

// OpenStream opens a byte stream to target through node's current
// connection: ErrNoSession when this hub holds none, a
// *link.StreamResetError when the node refused it, link.ErrLinkLost when
// the connection ended meanwhile.
func (t *Sessions) OpenStream(ctx context.Context, node, target string) (*link.Stream, error) {
	t.mu.Lock()
	st := t.nodes[node]
	t.mu.Unlock()
	if st == nil {
		return nil, ErrNoSession
	}
	st.mu.Lock()
	streams := st.streams
	st.mu.Unlock()
	if streams == nil {
		return nil, ErrNoSession
	}
	return streams.Open(ctx, target)
}

// ErrNoSession: the hub holds no connection of the node.
var ErrNoSession = errors.New("cloudhub: no connection of the node here")

// Connected lists the nodes with a live connection, sorted.
func (t *Sessions) Connected() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []string
	for n, s := range t.nodes {
		s.mu.Lock()
		if s.cancel != nil {
			out = append(out, n)
		}
		s.mu.Unlock()
	}
	sort.Strings(out)
	return out
}

// IsConnected reports whether node has a live connection (a reconciler's
// check, without listing every node as Connected does).
func (t *Sessions) IsConnected(node string) bool {
	t.mu.Lock()
	st := t.nodes[node]
	t.mu.Unlock()
	if st == nil {
		return false
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.cancel != nil
}

// Count is how many nodes have a live connection (len(Connected()),
// without walking the nodes).
func (t *Sessions) Count() int { return int(t.live.Load()) }

// Forget drops a node's session (its queue and receive position), for a
// node that was deleted; a live connection of it is closed, and the
// observers are told it departed.
func (t *Sessions) Forget(node string) {
	t.mu.Lock()
	s := t.nodes[node]
	delete(t.nodes, node)
	t.mu.Unlock()
	if s != nil {
		s.mu.Lock()
		if s.cancel != nil {
			s.cancel(errors.New("cloudhub: node forgotten"))
		}
		s.mu.Unlock()
	}
	for _, o := range t.observers {
		o.Departed(node)
	}
}
