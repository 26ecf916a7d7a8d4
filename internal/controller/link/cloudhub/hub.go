// Package cloudhub is the cloud end of the cloud/edge link: one Hub per
// cluster accepts every node's edgehub over WebSocket and QUIC at once,
// authenticates each node by its client certificate, and carries typed
// Envelopes both ways with the guarantees of package link.
package cloudhub

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	"golang.org/x/time/rate"

	"github.com/dowse-dev/dowse/internal/link"
	"github.com/dowse-dev/dowse/internal/link/pki"
	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
)

// Config configures a Hub. Zero values take the defaults noted.
type Config struct {
	// WebSocketAddr and QUICAddr are the listen addresses (TCP and UDP); an
	// empty one disables that transport, at least one must be set.
	WebSocketAddr, QUICAddr string
	// TLS is the server configuration, normally pki.ServerTLSConfig; the
	// caller owns it so that it can rotate the server certificate
	// (GetCertificate / GetConfigForClient). It must require and verify
	// client certificates.
	TLS *tls.Config
	// Heartbeat interval (10s); a silent edge is dropped after twice that.
	Heartbeat time.Duration
	// MaxFrame is the largest frame accepted (link.DefaultMaxFrame).
	MaxFrame int
	// QueueSize bounds each node's messages sent but not yet acknowledged
	// (1024); Send returns link.ErrQueueFull beyond it.
	QueueSize int
	// RateLimit and RateBurst pace each node's inbound messages (100/s,
	// burst 200); a node over it is slowed down, not disconnected.
	RateLimit float64
	RateBurst int
	// HandshakeTimeout bounds the wait for a connection's Hello (10s).
	HandshakeTimeout time.Duration
	// MaxConnections caps the connections served at once (20000); one more
	// is closed at once, logged and counted, so that a flood of edges (or
	// of anyone holding a node certificate) cannot exhaust the hub.
	MaxConnections int
	// MaxHandshakes caps, per transport, the connections accepted whose TLS
	// handshake and upgrade are not done yet (link.DefaultMaxHandshakes).
	MaxHandshakes int
	// OnConnect, when set, is called after a node's handshake, on the
	// connection's goroutine: the application may resend state the node
	// might lack (a restarted hub holds no queue from before).
	OnConnect func(ctx context.Context, node string)
	// NodeAllowed, when set, is asked after each Hello whether the node may
	// connect; false refuses it (Error PERMISSION_DENIED), an error closes
	// the connection for the edge to retry. A certificate outlives the Node
	// it names (nothing revokes it), so the controller passes "the Node
	// object exists": a node removed from the cluster is out at once.
	NodeAllowed func(ctx context.Context, node string) (bool, error)
	// Positions, when set, tells the hub how far the application got in a
	// node's stream the first time the node connects to this hub process;
	// see Positions.
	Positions Positions
	// ManualCommit acknowledges a node's messages to it only as far as the
	// application says it made them durable (Hub.Commit), instead of as
	// soon as the Handler took them: an application that batches its
	// writes (one status write per device per interval) then loses nothing
	// when it dies between taking a message and writing it. Use it with
	// Positions.
	ManualCommit bool
	// Claim, when set, makes this hub the owner of a node's session before
	// the node is welcomed, with several hubs (controller replicas) serving
	// one cluster's edges: it is called after the Hello (and NodeAllowed)
	// with the epoch the edge last had (a hint), and returns the session's
	// epoch, which the Welcome, every Inbound and the Positions of the
	// session carry. An error closes the connection (the edge retries). A
	// hub whose session another hub took is told so with Evict. See
	// package internal/controller/link/ownership.
	Claim func(ctx context.Context, node string, hint uint64) (epoch uint64, err error)
	// DrainPeriod is how long a stopping hub spends moving its edges away
	// (each is sent a Reconnect at a random moment within it) before it
	// closes what is left (5s; negative: none, the edges find out when
	// their connection drops).
	DrainPeriod time.Duration
	// CanDrain, when set, is asked when the hub stops whether another
	// replica can take its edges; false skips the drain (a lone replica's
	// edges would only be turned away until it is back).
	CanDrain func() bool
	// SendOn, when set, is asked at the handshake of a node this hub does
	// not serve, with the number of sessions it serves: true sends the edge
	// on to its next address (a Reconnect before it claims anything), for
	// a replica at its share while another has room. A node is sent on at
	// most once a minute, so that counts out of date cost one hop at most.
	SendOn func(sessions int) bool
}

// Position is a place in a node's outbound stream.
type Position struct {
	// Stream is the node's stream id (Hello.stream_id); a node whose store
	// was wiped starts a new one.
	Stream uint64
	// Seq is the sequence of the message in that stream.
	Seq uint64
	// Epoch is the epoch of the session the message came on (Inbound's);
	// 0 without Config.Claim. Commit ignores a position of an epoch before
	// the hub's session of the node began (a session another hub took in
	// between, whose writes commit nothing here).
	Epoch uint64
}

// Positions lets a restarted hub keep exactly-once delivery. The hub holds
// its receive positions in memory; without Positions, a message the
// application took just before the hub stopped, but whose ack never
// reached the edge, is resent by the edge and handed to the application
// again. An application that stores each Inbound's Position together with
// its effect (in the same write) and answers Delivered from that store
// sees every message exactly once across hub restarts as well.
type Positions interface {
	// Delivered is the position of the last message of node the
	// application took; the zero Position when it knows of none. An error
	// closes the node's connection (the edge retries with backoff).
	Delivered(ctx context.Context, node string) (Position, error)
}

// Authorizer decides which devices a node may speak about.
//
// AuthorizeDevice is called for every inbound message that names a device,
// on the goroutine of that node's connection, before the Handler sees it;
// it must be safe for concurrent use and should answer from a cache (a slow
// answer slows that node only). A nil error allows; any error refuses the
// message: the hub acknowledges and drops it (it is not redelivered), tells
// the edge with an Error PERMISSION_DENIED naming its sequence, logs it, and
// keeps the connection. It must be deterministic for a given state: a
// refused message is never asked about again.
type Authorizer interface {
	AuthorizeDevice(ctx context.Context, node string, device *linkv1.DeviceRef) error
}

// Inbound is one sequenced message from a node.
type Inbound struct {
	Node string
	// At is where the message sits in the node's stream (At.Seq ==
	// Env.Seq); see Positions.
	At Position
	// Epoch is the epoch of the session the message came on (At.Epoch):
	// with several hubs, a newer session of the node has a greater one.
	Epoch uint64
	Env   *linkv1.Envelope
}

// Handler receives each inbound sequenced message (twin reported updates,
// processed acks) exactly once per hub process (across hub restarts too,
// with Config.Positions), in the node's order, after authorization; calls
// for one node never overlap, calls for different nodes do. A nil error marks it delivered. A *link.RefusedError refuses it
// as the Authorizer would. Any other error drops the node's connection
// without marking the message, which the edge then resends after it
// reconnects (use it for transient failures; do not return it forever).
type Handler func(ctx context.Context, m Inbound) error

// Hub is the cloud end of the link.
type Hub struct {
	cfg     Config
	auth    Authorizer
	handler Handler
	metrics *link.Metrics
	hsFail  *prometheus.CounterVec

	mu           sync.Mutex
	nodes        map[string]*nodeState
	sentOn       map[string]time.Time // when each node was last sent on (SendOn)
	sentOnPruned time.Time
	ready        chan struct{}
	readyOnce    sync.Once // Start may be called again after it failed
	addrs        struct{ ws, quic net.Addr }
	live         atomic.Int64 // connections being served
	sessions     atomic.Int64 // nodes with a live connection past the handshake (a nodeState with cancel set)
	draining     atomic.Bool
	serving      atomic.Bool
	moved        *prometheus.CounterVec
	evicted      prometheus.Counter
}

type nodeState struct {
	sess    *link.Session
	limiter *rate.Limiter

	mu     sync.Mutex
	cancel context.CancelCauseFunc // of the current connection
	done   chan struct{}           // closed when the current connection ends
	send   func(*linkv1.Envelope)  // queues a control frame on it
	epoch  uint64                  // of the current (or last) connection
	first  uint64                  // epoch of the first connection of sess
}

var (
	errReplaced = errors.New("cloudhub: a newer connection of the same node replaced this one")
	errEvicted  = errors.New("cloudhub: another replica took the node's session")
)

// New builds a Hub. auth and handler are required; reg receives the metrics
// (nil: not registered).
func New(cfg Config, auth Authorizer, handler Handler, reg prometheus.Registerer) (*Hub, error) {
	if cfg.WebSocketAddr == "" && cfg.QUICAddr == "" {
		return nil, errors.New("cloudhub: no listen address")
	}
	if cfg.TLS == nil || cfg.TLS.ClientAuth != tls.RequireAndVerifyClientCert {
		return nil, errors.New("cloudhub: TLS config must require and verify client certificates")
	}
	if auth == nil || handler == nil {
		return nil, errors.New("cloudhub: authorizer and handler are required")
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = 10 * time.Second
	}
	if cfg.MaxFrame <= 0 {
		cfg.MaxFrame = link.DefaultMaxFrame
	}
	if cfg.QueueSize <= 0 {
		cfg.QueueSize = 1024
	}
	if cfg.RateLimit <= 0 {
		cfg.RateLimit = 100
	}
	if cfg.RateBurst <= 0 {
		cfg.RateBurst = 200
	}
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = 10 * time.Second
	}
	if cfg.MaxConnections <= 0 {
		cfg.MaxConnections = 20000
	}
	if cfg.DrainPeriod == 0 {
		cfg.DrainPeriod = 5 * time.Second
	}
	h := &Hub{cfg: cfg, auth: auth, handler: handler, nodes: map[string]*nodeState{}, ready: make(chan struct{}),
		metrics: link.NewMetrics(reg, "cloudhub"),
		hsFail: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "dowse", Subsystem: "cloudhub", Name: "refused_connections_total",
			Help: "Connections refused at the handshake, by reason."}, []string{"reason"}),
		moved: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "dowse", Subsystem: "cloudhub", Name: "moved_sessions_total",
			Help: "Edges told to reconnect elsewhere, by reason (drain: this replica is stopping; rebalance: it held more than its share)."}, []string{"reason"}),
		evicted: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "dowse", Subsystem: "cloudhub", Name: "sessions_taken_over_total",
			Help: "Sessions closed because another replica took the node (its newer session is the owner)."}),
	}
	if reg != nil {
		reg.MustRegister(h.hsFail, h.moved, h.evicted,
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "dowse", Subsystem: "cloudhub", Name: "draining",
				Help: "1 while this replica moves its edges away before it stops."}, func() float64 {
				if h.draining.Load() {
					return 1
				}
				return 0
			}),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "dowse", Subsystem: "cloudhub", Name: "connected_nodes",
				Help: "Nodes with a live connection."}, func() float64 { return float64(h.sessions.Load()) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "dowse", Subsystem: "cloudhub", Name: "queued_messages",
				Help: "Messages to nodes not yet acknowledged, all nodes."}, func() float64 { q, _ := h.stats(); return float64(q) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "dowse", Subsystem: "cloudhub", Name: "max_node_queued_messages",
				Help: "The deepest node send queue."}, func() float64 { _, m := h.stats(); return float64(m) }),
		)
	}
	return h, nil
}

func (h *Hub) stats() (queued, maxQueued int) {
	h.mu.Lock()
	states := make([]*nodeState, 0, len(h.nodes))
	for _, s := range h.nodes {
		states = append(states, s)
	}
	h.mu.Unlock()
	for _, s := range states {
		n, _ := s.sess.Len()
		queued += n
		maxQueued = max(maxQueued, n)
	}
	return queued, maxQueued
}

// Start listens on the configured transports and serves until ctx ends.
// It returns an error when a listener cannot be opened or fails. When ctx
// ends it first drains (Config.DrainPeriod): every edge is told to
// reconnect elsewhere, at moments spread over the period, and new
// handshakes are turned away the same way; then it closes what is left.
func (h *Hub) Start(ctx context.Context) error {
	log := logr.FromContextOrDiscard(ctx).WithName("cloudhub")
	ctx = logr.NewContext(ctx, log)
	var listeners []link.Listener
	var names []string
	tlsCfg := h.verifyingTLS(log)
	if h.cfg.WebSocketAddr != "" {
		l, err := link.ListenWebSocket(h.cfg.WebSocketAddr, tlsCfg, link.ListenOptions{MaxHandshakes: h.cfg.MaxHandshakes})
		if err != nil {
			return fmt.Errorf("cloudhub websocket: %w", err)
		}
		h.addrs.ws = l.Addr()
		listeners, names = append(listeners, l), append(names, link.WebSocket)
	}
	if h.cfg.QUICAddr != "" {
		l, err := link.ListenQUIC(h.cfg.QUICAddr, tlsCfg, link.ListenOptions{MaxHandshakes: h.cfg.MaxHandshakes,
			Refused: func() { h.hsFail.WithLabelValues("handshakes-full").Inc() }})
		if err != nil {
			// Free the WebSocket address for the next Start: a listener
			// closes when its Serve's context has ended.
			done, cancel := context.WithCancel(ctx)
			cancel()
			for _, l := range listeners {
				_ = l.Serve(done, func(link.Conn) {})
			}
			return fmt.Errorf("cloudhub quic: %w", err)
		}
		h.addrs.quic = l.Addr()
		listeners, names = append(listeners, l), append(names, link.QUIC)
	}
	h.draining.Store(false)
	h.serving.Store(true)
	defer h.serving.Store(false)
	h.readyOnce.Do(func() { close(h.ready) })
	// The listeners and connections outlive ctx by the drain: a QUIC
	// listener's end closes its connections.
	lctx, lcancel := context.WithCancel(context.WithoutCancel(ctx))
	defer lcancel()
	g, gctx := errgroup.WithContext(lctx)
	g.Go(func() error {
		select {
		case <-gctx.Done():
		case <-ctx.Done():
			h.drain(ctx)
			lcancel()
		}
		return nil
	})
	// Connections end with gctx; Start returns only once they have, so that
	// a stopped hub holds no session goroutine. A transport may still hand
	// over a connection after its Serve returned: stopping turns it away.
	ac := &admitted{}
	for i, l := range listeners {
		log.Info("listening", "transport", names[i], "address", l.Addr().String())
		g.Go(func() error {
			return l.Serve(gctx, func(c link.Conn) { h.admit(gctx, ac, names[i], c) })
		})
	}
	err := g.Wait()
	ac.mu.Lock()
	ac.stopping = true
	ac.mu.Unlock()
	ac.conns.Wait()
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// admitted counts the connections being served, for Start to wait for.
type admitted struct {
	mu       sync.Mutex
	stopping bool
	conns    sync.WaitGroup
}

// admit serves c unless the hub stops or serves its maximum.
func (h *Hub) admit(ctx context.Context, ac *admitted, transport string, c link.Conn) {
	if !h.enter(ctx, ac, c) {
		return
	}
	// No defers: this frame stays under every connection's goroutine
	// (serveConn recovers nothing either; a panic ends the process), and
	// so it is kept small: the turning away is enter's.
	h.serveConn(ctx, transport, c)
	h.live.Add(-1)
	ac.conns.Done()
}

// enter counts c in unless the hub stops or serves its maximum (then c is
// closed).
//
//go:noinline
func (h *Hub) enter(ctx context.Context, ac *admitted, c link.Conn) bool {
	ac.mu.Lock()
	if ac.stopping {
		ac.mu.Unlock()
		return false
	}
	ac.conns.Add(1)
	ac.mu.Unlock()
	if n := h.live.Add(1); n > int64(h.cfg.MaxConnections) {
		h.live.Add(-1)
		ac.conns.Done()
		h.refuse(ctx, nil, "hub-full", c, "refusing connection: the hub serves its maximum of connections", "max", h.cfg.MaxConnections)
		_ = c.Close()
		return false
	}
	return true
}

// drain tells every connected edge to reconnect elsewhere, each at a random
// moment within the drain period, and waits for them to go (at most the
// period and a heartbeat more).
func (h *Hub) drain(ctx context.Context) {
	h.draining.Store(true)
	period := h.cfg.DrainPeriod
	if period < 0 || (h.cfg.CanDrain != nil && !h.cfg.CanDrain()) {
		return
	}
	log := logr.FromContextOrDiscard(ctx)
	states := h.connectedStates()
	log.Info("draining: moving every edge to another replica", "edges", len(states), "period", period)
	for _, st := range states {
		h.move(st, time.Duration(mrand.Int64N(int64(period)+1)), "drain")
	}
	deadline := time.Now().Add(period + h.cfg.Heartbeat)
	for time.Now().Before(deadline) {
		if len(h.connectedStates()) == 0 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	log.Info("drained", "left", len(h.connectedStates()))
}

// Serving is nil while the hub listens and is not draining: a readiness
// check (an edge sent to this replica now is served).
func (h *Hub) Serving() error {
	switch {
	case h.draining.Load():
		return errors.New("cloudhub: draining")
	case !h.serving.Load():
		return errors.New("cloudhub: not listening")
	}
	return nil
}

// Draining reports whether the hub is moving its edges away.
func (h *Hub) Draining() bool { return h.draining.Load() }

func (h *Hub) connectedStates() []*nodeState {
	h.mu.Lock()
	states := make([]*nodeState, 0, len(h.nodes))
	for _, s := range h.nodes {
		states = append(states, s)
	}
	h.mu.Unlock()
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
func (h *Hub) Move(node string, delay time.Duration, reason string) bool {
	h.mu.Lock()
	st := h.nodes[node]
	h.mu.Unlock()
	return st != nil && h.move(st, delay, reason)
}

func (h *Hub) move(st *nodeState, delay time.Duration, reason string) bool {
	st.mu.Lock()
	send := st.send
	st.mu.Unlock()
	if send == nil {
		return false
	}
	send(&linkv1.Envelope{Kind: &linkv1.Envelope_Reconnect{Reconnect: &linkv1.Reconnect{
		DelayMs: uint32(delay / time.Millisecond), Reason: reason}}})
	h.moved.WithLabelValues(reason).Inc()
	return true
}

// Evict closes node's session and forgets it (queue and receive position)
// when its epoch is at or below through: another hub's newer session of
// the node is the owner (see Config.Claim). It reports whether it did; the
// caller then drops what it holds of the node's session too.
func (h *Hub) Evict(node string, through uint64) bool {
	h.mu.Lock()
	st := h.nodes[node]
	if st == nil {
		h.mu.Unlock()
		return false
	}
	st.mu.Lock()
	if st.epoch > through {
		st.mu.Unlock()
		h.mu.Unlock()
		return false
	}
	delete(h.nodes, node)
	h.mu.Unlock()
	if st.cancel != nil {
		st.cancel(errEvicted)
	}
	st.mu.Unlock()
	h.evicted.Inc()
	return true
}

// Addrs are the bound listen addresses (nil for a disabled transport); they
// are valid once Ready is closed.
func (h *Hub) Addrs() (websocket, quic net.Addr) { return h.addrs.ws, h.addrs.quic }

// Ready is closed when the listeners are open.
func (h *Hub) Ready() <-chan struct{} { return h.ready }

func (h *Hub) state(node string) *nodeState {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.nodes[node]
	if s == nil {
		s = &nodeState{
			sess:    link.NewSession(link.SessionConfig{MaxEntries: h.cfg.QueueSize, ManualCommit: h.cfg.ManualCommit}),
			limiter: rate.NewLimiter(rate.Limit(h.cfg.RateLimit), h.cfg.RateBurst),
		}
		h.nodes[node] = s
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
func (h *Hub) Send(node string, env *linkv1.Envelope) (uint64, error) {
	if !link.Sequenced(env) {
		return 0, fmt.Errorf("cloudhub: %T is not an application message", env.Kind)
	}
	if m := env.GetDeviceMembership(); m != nil && m.Node != node {
		return 0, fmt.Errorf("cloudhub: membership for node %q sent to node %q", m.Node, node)
	}
	seq, _, err := h.state(node).sess.Enqueue(env, "")
	return seq, err
}

// Commit tells a ManualCommit hub that the application has made node's
// messages through pos durable; the node is acknowledged that far and may
// forget them. Safe from any goroutine; unknown nodes are ignored.
func (h *Hub) Commit(node string, pos Position) {
	h.mu.Lock()
	st := h.nodes[node]
	h.mu.Unlock()
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

// sendOn says whether node's new connection goes on to another replica
// (Config.SendOn), remembering when it last did.
func (h *Hub) sendOn(node string) bool {
	if h.cfg.SendOn == nil {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if st := h.nodes[node]; st != nil {
		st.mu.Lock()
		here := st.cancel != nil
		st.mu.Unlock()
		if here {
			return false // its session is here: the edge reconnected
		}
	}
	held := int(h.sessions.Load())
	now := time.Now()
	if t, ok := h.sentOn[node]; ok && now.Sub(t) < time.Minute {
		return false
	}
	if !h.cfg.SendOn(held) {
		return false
	}
	if now.Sub(h.sentOnPruned) >= time.Minute {
		// At most once a minute: a handshake does not walk the nodes.
		for n, t := range h.sentOn {
			if now.Sub(t) >= time.Minute {
				delete(h.sentOn, n)
			}
		}
		h.sentOnPruned = now
	}
	if h.sentOn == nil {
		h.sentOn = map[string]time.Time{}
	}
	h.sentOn[node] = now
	return true
}

// Connected lists the nodes with a live connection, sorted.
func (h *Hub) Connected() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for n, s := range h.nodes {
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
func (h *Hub) IsConnected(node string) bool {
	h.mu.Lock()
	st := h.nodes[node]
	h.mu.Unlock()
	if st == nil {
		return false
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.cancel != nil
}

// Sessions is how many nodes have a live connection (len(Connected()),
// without walking the nodes).
func (h *Hub) Sessions() int { return int(h.sessions.Load()) }

// Forget drops a node's session (its queue and receive position), for a
// node that was deleted; a live connection of it is closed.
func (h *Hub) Forget(node string) {
	h.mu.Lock()
	s := h.nodes[node]
	delete(h.nodes, node)
	h.mu.Unlock()
	if s != nil {
		s.mu.Lock()
		if s.cancel != nil {
			s.cancel(errors.New("cloudhub: node forgotten"))
		}
		s.mu.Unlock()
	}
}

// verifyingTLS is the configured TLS with the client certificate verified
// by the hub itself, against the same CAs and for client authentication, so
// that a refused certificate is logged and counted on both transports
// (quic-go tells nobody why a handshake failed). The line names the
// certificate's subject: the handshake does not know the remote address.
func (h *Hub) verifyingTLS(log logr.Logger) *tls.Config {
	out := h.cfg.TLS.Clone()
	roots := out.ClientCAs
	out.ClientAuth = tls.RequireAnyClientCert
	out.VerifyPeerCertificate = func(raw [][]byte, _ [][]*x509.Certificate) error {
		subject, err := verifyClient(raw, roots)
		if err != nil {
			h.hsFail.WithLabelValues("untrusted-certificate").Inc()
			log.Info("refusing connection: client certificate not trusted", "subject", subject, "reason", err.Error())
		}
		return err
	}
	return out
}

func verifyClient(raw [][]byte, roots *x509.CertPool) (subject string, err error) {
	if len(raw) == 0 {
		return "", errors.New("no client certificate")
	}
	certs := make([]*x509.Certificate, len(raw))
	for i, r := range raw {
		c, err := x509.ParseCertificate(r)
		if err != nil {
			return "", fmt.Errorf("client certificate %d: %w", i, err)
		}
		certs[i] = c
	}
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	_, err = certs[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	return certs[0].Subject.CommonName, err
}

func (h *Hub) refuse(ctx context.Context, conn []any, reason string, c link.Conn, msg string, kv ...any) {
	h.hsFail.WithLabelValues(reason).Inc()
	logr.FromContextOrDiscard(ctx).Info(msg, append(append([]any{"remote", c.RemoteAddr()}, conn...), kv...)...)
}

// served is a connection past its handshake, for serveConn to run.
type served struct {
	hub  *Hub
	st   *nodeState
	f    *link.Framed
	ctx  context.Context
	cfg  link.ConnConfig
	kv   []any
	log  logr.Logger
	done chan struct{}
}

// end lets go of the node's session (another connection may take it) and
// ends the connection's context.
func (s *served) end() {
	s.st.mu.Lock()
	if s.st.done == s.done {
		s.st.cancel, s.st.done, s.st.send = nil, nil, nil
		s.hub.sessions.Add(-1)
	}
	s.st.mu.Unlock()
	close(s.done)
	s.cfg.Cancel(nil)
}

// serveConn runs a connection. Its frame and RunConn's are all an idle
// connection's goroutine holds (the handshake's work is done in a
// function of its own, whose frame is gone by then), which lets the
// runtime keep that goroutine's stack small.
func (h *Hub) serveConn(ctx context.Context, transport string, c link.Conn) {
	s := h.handshake(ctx, transport, c)
	if s == nil {
		return
	}
	defer s.end()
	s.ended(link.RunConn(s.ctx, s.f, s.st.sess, &s.cfg)) //nolint:contextcheck // s.ctx is the connection's, made from ctx by handshake
}

func (s *served) ended(err error) {
	log, kv := s.log, s.kv
	switch {
	case errors.Is(err, link.ErrMalformed) || errors.Is(err, link.ErrFrameTooLarge):
		log.Info("closing connection: bad frame from node", append(kv, "reason", err.Error())...)
	case errors.Is(err, errReplaced):
		log.V(1).Info("connection replaced by a newer one", kv...)
	case errors.Is(err, errEvicted):
		log.V(1).Info("session closed: another replica took the node", kv...)
	default:
		log.V(1).Info("node disconnected", append(kv, "reason", fmt.Sprint(err))...)
	}
}

// handshake takes the Hello, claims the node's session and welcomes it;
// nil when the connection is refused or lost (then it is closed).
func (h *Hub) handshake(ctx context.Context, transport string, c link.Conn) *served {
	// The connection's log values go with each line rather than into a
	// logger of its own: a logger with values (zap's) keeps an encoder
	// buffer for its life, per connection.
	log := logr.FromContextOrDiscard(ctx)
	kv := []any{"transport", transport}
	certs := c.PeerCertificates()
	if len(certs) == 0 {
		h.refuse(ctx, kv, "no-certificate", c, "refusing connection without a client certificate")
		return nil
	}
	node, err := pki.NodeFromCert(certs[0])
	if err != nil {
		h.refuse(ctx, kv, "not-a-node", c, "refusing connection: certificate names no node", "subject", certs[0].Subject.CommonName, "reason", err.Error())
		return nil
	}
	kv = append(kv, "node", node)

	f := link.NewFramed(c, h.cfg.MaxFrame)
	timer := time.AfterFunc(h.cfg.HandshakeTimeout, func() { _ = c.Close() })
	var hello linkv1.Envelope
	_, err = f.Read(&hello)
	timer.Stop()
	switch {
	case err != nil:
		h.refuse(ctx, kv, "bad-hello", c, "refusing connection: no valid hello", "reason", err.Error())
		code := linkv1.Error_MALFORMED
		if errors.Is(err, link.ErrFrameTooLarge) {
			code = linkv1.Error_TOO_LARGE
		}
		f.WriteError(code, err.Error())
		return nil
	case hello.GetHello() == nil:
		h.refuse(ctx, kv, "bad-hello", c, "refusing connection: first frame is not a hello", "kind", fmt.Sprintf("%T", hello.Kind))
		f.WriteError(linkv1.Error_MALFORMED, "the first frame must be a hello")
		return nil
	case hello.GetHello().Node != node:
		h.refuse(ctx, kv, "node-mismatch", c, "refusing hello that claims another node", "claimed", hello.GetHello().Node)
		f.WriteError(linkv1.Error_NODE_MISMATCH, fmt.Sprintf("certificate is for node %q, hello claims %q", node, hello.GetHello().Node))
		return nil
	}
	hl := hello.GetHello()
	if h.cfg.NodeAllowed != nil {
		ok, err := h.cfg.NodeAllowed(ctx, node)
		switch {
		case err != nil:
			h.refuse(ctx, kv, "node-check-failed", c, "closing connection: could not check that the node is in the cluster", "reason", err.Error())
			return nil
		case !ok:
			h.refuse(ctx, kv, "node-not-allowed", c, "refusing node that is not in the cluster")
			f.WriteError(linkv1.Error_PERMISSION_DENIED, fmt.Sprintf("node %q is not in the cluster", node))
			return nil
		}
	}

	if h.sendOn(node) {
		h.refuse(ctx, kv, "sent-on", c, "sending a connection on: this replica holds its share and another has room")
		f.WriteFinal(&linkv1.Envelope{Kind: &linkv1.Envelope_Reconnect{Reconnect: &linkv1.Reconnect{Reason: "rebalance"}}})
		return nil
	}
	if h.draining.Load() {
		// Stopping: send the edge on before it claims anything here.
		h.refuse(ctx, kv, "draining", c, "turning a connection away: this replica is draining")
		f.WriteFinal(&linkv1.Envelope{Kind: &linkv1.Envelope_Reconnect{Reconnect: &linkv1.Reconnect{Reason: "drain"}}})
		return nil
	}

	st := h.state(node)
	cctx, cancel := context.WithCancelCause(ctx)
	done := make(chan struct{})
	st.mu.Lock()
	for st.cancel != nil {
		// The edge reconnected before we noticed its old connection died:
		// the newest wins, after the old one has let go of the session
		// (and after any other that took it while we waited).
		st.cancel(errReplaced)
		old := st.done
		st.mu.Unlock()
		<-old
		st.mu.Lock()
	}
	st.cancel, st.done, st.send = cancel, done, nil
	h.sessions.Add(1)
	st.mu.Unlock()
	s := &served{hub: h, st: st, f: f, ctx: cctx, done: done, log: log}
	s.cfg.Cancel = cancel
	ok := false
	defer func() {
		if !ok {
			s.end()
		}
	}()

	var epoch uint64
	if h.cfg.Claim != nil {
		var err error
		if epoch, err = h.cfg.Claim(cctx, node, hl.Epoch); err != nil {
			h.refuse(ctx, kv, "claim-failed", c, "closing connection: could not claim the node's session", "reason", err.Error())
			return nil
		}
		if cctx.Err() != nil {
			return nil // evicted or replaced while claiming
		}
		st.mu.Lock()
		st.epoch = epoch
		if st.first == 0 {
			st.first = epoch
		}
		st.mu.Unlock()
		kv = append(kv, "epoch", epoch)
	}
	if err := h.seedPosition(ctx, st, node, hl.StreamId); err != nil {
		h.refuse(ctx, kv, "positions-unavailable", c, "closing connection: the application's position in the node's stream is unknown", "reason", err.Error())
		return nil
	}
	st.sess.SetPeer(hl.StreamId)
	st.sess.Resume(hl.PeerStreamId, hl.Received)
	peer, _ := st.sess.Received()
	received := st.sess.AckPosition()
	if err := f.Write(&linkv1.Envelope{Kind: &linkv1.Envelope_Welcome{Welcome: &linkv1.Welcome{
		StreamId: st.sess.StreamID(), PeerStreamId: peer, Received: received,
		HeartbeatIntervalMs: uint32(h.cfg.Heartbeat / time.Millisecond), Epoch: epoch}}}); err != nil {
		log.V(1).Info("connection lost during handshake", append(kv, "err", err)...)
		return nil
	}
	log.V(1).Info("node connected", append(kv, "resumeFrom", hl.Received)...)
	if h.cfg.OnConnect != nil {
		h.cfg.OnConnect(cctx, node)
	}
	s.kv = kv
	s.cfg = link.ConnConfig{
		Heartbeat: h.cfg.Heartbeat, MaxFrame: h.cfg.MaxFrame, Limiter: st.limiter, Metrics: h.metrics,
		Cancel: cancel, LogValues: kv,
		Started: func(send func(*linkv1.Envelope)) {
			st.mu.Lock()
			if st.done == done {
				st.send = send
			}
			st.mu.Unlock()
			if h.draining.Load() {
				// Welcomed as the drain began: move on too.
				send(&linkv1.Envelope{Kind: &linkv1.Envelope_Reconnect{Reconnect: &linkv1.Reconnect{Reason: "drain"}}})
			}
		},
		Deliver: deliverer{h: h, ctx: cctx, node: node, stream: hl.StreamId, epoch: epoch}.deliver,
	}
	ok = true
	return s
}

// deliverer hands a connection's messages to the application.
type deliverer struct {
	h      *Hub
	ctx    context.Context // the connection's
	node   string
	stream uint64
	epoch  uint64
}

func (d deliverer) deliver(ctx context.Context, env *linkv1.Envelope) error {
	if err := context.Cause(d.ctx); err != nil { //nolint:contextcheck // the connection's context, not the caller's
		return err // closed: a session that is not the owner takes nothing more
	}
	return d.h.deliver(ctx, Inbound{Node: d.node, At: Position{Stream: d.stream, Seq: env.Seq, Epoch: d.epoch}, Epoch: d.epoch, Env: env})
}

// seedPosition starts a session this process has not received on yet at
// the application's position, when it is for the stream the node resumes.
func (h *Hub) seedPosition(ctx context.Context, st *nodeState, node string, stream uint64) error {
	if h.cfg.Positions == nil {
		return nil
	}
	if peer, _ := st.sess.Received(); peer != 0 {
		return nil // this process's own position is newer than any stored one
	}
	pos, err := h.cfg.Positions.Delivered(ctx, node)
	if err != nil {
		return err
	}
	if pos.Stream == stream && pos.Seq > 0 {
		st.sess.SetPeer(stream)
		st.sess.Delivered(pos.Seq)
		st.sess.Commit(stream, pos.Seq)
		logr.FromContextOrDiscard(ctx).V(1).Info("resuming the node's stream where the application left it", "node", node, "seq", pos.Seq)
	}
	return nil
}

func (h *Hub) deliver(ctx context.Context, m Inbound) error {
	node, env := m.Node, m.Env
	var devices []*linkv1.DeviceRef
	switch k := env.Kind.(type) {
	case *linkv1.Envelope_TwinReported:
		devices = append(devices, k.TwinReported.Device)
	case *linkv1.Envelope_DeviceMembership:
		if k.DeviceMembership.Node != node {
			return h.refused(ctx, node, env, fmt.Sprintf("membership names node %q", k.DeviceMembership.Node))
		}
		devices = k.DeviceMembership.Devices
	case *linkv1.Envelope_DeviceState:
		devices = append(devices, k.DeviceState.Device)
	case *linkv1.Envelope_DeviceCondition:
		devices = append(devices, k.DeviceCondition.Device)
	case *linkv1.Envelope_DeviceUpdate, *linkv1.Envelope_DeviceRemoval,
		*linkv1.Envelope_ModelUpdate, *linkv1.Envelope_ModelRemoval, *linkv1.Envelope_DeviceInventory:
		return h.refused(ctx, node, env, "devices, models and desired values come from the cloud only")
	}
	for _, d := range devices {
		if err := h.auth.AuthorizeDevice(ctx, node, d); err != nil {
			return h.refused(ctx, node, env, fmt.Sprintf("device %s/%s: %v", d.GetNamespace(), d.GetName(), err))
		}
	}
	return h.handler(ctx, m)
}

func (h *Hub) refused(ctx context.Context, node string, env *linkv1.Envelope, why string) error {
	logr.FromContextOrDiscard(ctx).Info("refusing message about a device or node not the node's", "node", node, "seq", env.Seq, "reason", why)
	return &link.RefusedError{Code: linkv1.Error_PERMISSION_DENIED, Message: why}
}
