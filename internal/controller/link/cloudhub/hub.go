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
	// MaxConnections caps the connections welcomedConn at once (20000); one more
	// is closed at once, logged and counted, so that a flood of edges (or
	// of anyone holding a node certificate) cannot exhaust the hub.
	MaxConnections int
	// MaxStreamsPerNode caps the byte streams open at once on one node's
	// connection (link.DefaultMaxStreams, which is also what an edge
	// serves at most): OpenStream beyond it fails with a
	// *link.TooManyStreamsError, counted in
	// dowse_cloudhub_node_streams_refused_total{reason="bound"}.
	MaxStreamsPerNode int
	// MaxHandshakes caps, per transport, the connections accepted whose TLS
	// handshake and upgrade are not done yet (link.DefaultMaxHandshakes).
	MaxHandshakes int
	// Sessions is the session table the hub serves (NewSessions), made
	// first by an application whose parts need it before the hub exists;
	// nil: the hub makes its own from this Config. Its observers are told
	// when a node is welcomed.
	Sessions *Sessions
	// NodeUID, when set, is asked after each Hello for the UID of the Node
	// the certificate names; a node not in the cluster (inCluster false) is
	// refused (Error PERMISSION_DENIED), and so is a certificate bound to
	// another UID (the Node was deleted and made again under its name); an
	// error closes the connection for the edge to retry. A certificate
	// outlives the Node it names (nothing revokes it): this check puts a
	// node removed from the cluster out at once.
	NodeUID func(ctx context.Context, node string) (uid string, inCluster bool, err error)
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
	// Redirect, when set, is asked at the handshake of a node this hub
	// does not serve, with the number of sessions it serves: true sends the
	// edge on to its next address (a Reconnect before it claims anything),
	// for a replica at its share while another has room. A node is
	// redirected at most once a minute, so that counts out of date cost one
	// hop at most.
	Redirect func(sessions int) bool
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
	streams *nodeStreams
	hsFail  *prometheus.CounterVec

	table *Sessions

	mu               sync.Mutex
	redirected       map[string]time.Time // when each node was last redirected (Redirect)
	redirectedPruned time.Time
	ready            chan struct{}
	readyOnce        sync.Once // Start may be called again after it failed
	addrs            struct{ ws, quic net.Addr }
	live             atomic.Int64 // connections being welcomedConn
	serving          atomic.Bool
}

type nodeState struct {
	sess    *link.Session
	limiter *rate.Limiter

	mu     sync.Mutex
	cancel context.CancelCauseFunc // of the current connection
	done   chan struct{}           // closed when the current connection ends
	send   func(*linkv1.Envelope)  // queues a control frame on it
	// streams are the byte streams of the current connection.
	streams *link.Streams
	epoch   uint64 // of the current (or last) connection
	first   uint64 // epoch of the first connection of sess
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
	cfg = cfg.withDefaults()
	table := cfg.Sessions
	if table == nil {
		table = NewSessions(cfg, reg)
	}
	h := &Hub{cfg: cfg, auth: auth, handler: handler, table: table, ready: make(chan struct{}),
		metrics: link.NewMetrics(reg, "cloudhub"),
		streams: newNodeStreams(reg),
		hsFail: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "dowse", Subsystem: "cloudhub", Name: "refused_connections_total",
			Help: "Connections refused at the handshake, by reason."}, []string{"reason"}),
	}
	if reg != nil {
		reg.MustRegister(h.hsFail)
	}
	table.Observe(h.streams)
	return h, nil
}

// withDefaults is cfg with the defaults of its zero fields.
func (cfg Config) withDefaults() Config {
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
	return cfg
}

// Sessions is Sessions.Count.
func (h *Hub) Sessions() int { return h.table.Count() }

// Draining reports whether the hub is moving its edges away.
func (h *Hub) Draining() bool { return h.table.Draining() }

// Move is Sessions.Move.
func (h *Hub) Move(node string, delay time.Duration, reason string) bool {
	return h.table.Move(node, delay, reason)
}

// Evict is Sessions.Evict.
func (h *Hub) Evict(node string, through uint64) bool { return h.table.Evict(node, through) }

// Send is Sessions.Send.
func (h *Hub) Send(node string, env *linkv1.Envelope) (uint64, error) { return h.table.Send(node, env) }

// Commit is Sessions.Commit.
func (h *Hub) Commit(node string, pos Position) { h.table.Commit(node, pos) }

// Connected is Sessions.Connected.
func (h *Hub) Connected() []string { return h.table.Connected() }

// OpenStream opens a byte stream to target through node's connection here
// (see Sessions.OpenStream).
func (h *Hub) OpenStream(ctx context.Context, node, target string) (*link.Stream, error) {
	return h.table.OpenStream(ctx, node, target)
}

// IsConnected is Sessions.IsConnected.
func (h *Hub) IsConnected(node string) bool { return h.table.IsConnected(node) }

// Forget is Sessions.Forget.
func (h *Hub) Forget(node string) { h.table.Forget(node) }

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
		l, err := link.ListenWebSocket(h.cfg.WebSocketAddr, tlsCfg, link.ListenOptions{MaxHandshakes: h.cfg.MaxHandshakes,
			Refused: func(reason string) { h.hsFail.WithLabelValues(reason).Inc() }})
		if err != nil {
			return fmt.Errorf("cloudhub websocket: %w", err)
		}
		h.addrs.ws = l.Addr()
		listeners, names = append(listeners, l), append(names, link.WebSocket)
	}
	if h.cfg.QUICAddr != "" {
		l, err := link.ListenQUIC(h.cfg.QUICAddr, tlsCfg, link.ListenOptions{MaxHandshakes: h.cfg.MaxHandshakes,
			Refused: func(reason string) { h.hsFail.WithLabelValues(reason).Inc() }})
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
	h.table.draining.Store(false)
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

// admitted counts the connections being welcomedConn, for Start to wait for.
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
	h.table.draining.Store(true)
	period := h.cfg.DrainPeriod
	if period < 0 || (h.cfg.CanDrain != nil && !h.cfg.CanDrain()) {
		return
	}
	log := logr.FromContextOrDiscard(ctx)
	states := h.table.connectedStates()
	log.Info("draining: moving every edge to another replica", "edges", len(states), "period", period)
	for _, st := range states {
		h.table.move(st, time.Duration(mrand.Int64N(int64(period)+1)), "drain")
	}
	deadline := time.Now().Add(period + h.cfg.Heartbeat)
	for time.Now().Before(deadline) {
		if len(h.table.connectedStates()) == 0 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	log.Info("drained", "left", len(h.table.connectedStates()))
}

// Serving is nil while the hub listens and is not draining: a readiness
// check (an edge sent to this replica now is welcomedConn).
func (h *Hub) Serving() error {
	switch {
	case h.table.draining.Load():
		return errors.New("cloudhub: draining")
	case !h.serving.Load():
		return errors.New("cloudhub: not listening")
	}
	return nil
}

// Addrs are the bound listen addresses (nil for a disabled transport); they
// are valid once Ready is closed.
func (h *Hub) Addrs() (websocket, quic net.Addr) { return h.addrs.ws, h.addrs.quic }

// Ready is closed when the listeners are open.
func (h *Hub) Ready() <-chan struct{} { return h.ready }

// redirect says whether node's new connection goes on to another replica
// (Config.Redirect), remembering when it last did.
func (h *Hub) redirect(node string) bool {
	if h.cfg.Redirect == nil {
		return false
	}
	if h.table.IsConnected(node) {
		return false // its session is here: the edge reconnected
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	held := h.table.Count()
	now := time.Now()
	if t, ok := h.redirected[node]; ok && now.Sub(t) < time.Minute {
		return false
	}
	if !h.cfg.Redirect(held) {
		return false
	}
	if now.Sub(h.redirectedPruned) >= time.Minute {
		// At most once a minute: a handshake does not walk the nodes.
		for n, t := range h.redirected {
			if now.Sub(t) >= time.Minute {
				delete(h.redirected, n)
			}
		}
		h.redirectedPruned = now
	}
	if h.redirected == nil {
		h.redirected = map[string]time.Time{}
	}
	h.redirected[node] = now
	return true
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

// welcomedConn is a connection past its handshake, for serveConn to run.
type welcomedConn struct {
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
func (s *welcomedConn) end() {
	s.st.mu.Lock()
	if s.st.done == s.done {
		s.st.cancel, s.st.done, s.st.send, s.st.streams = nil, nil, nil, nil
		s.hub.table.live.Add(-1)
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

func (s *welcomedConn) ended(err error) {
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
// nil when the connection is refused or lost (then it is closed). Its
// steps: who the certificate names, the Hello, whether the node may be
// served here, taking the node's session from any older connection,
// claiming it, and the Welcome.
func (h *Hub) handshake(ctx context.Context, transport string, c link.Conn) *welcomedConn {
	// The connection's log values go with each line rather than into a
	// logger of its own: a logger with values (zap's) keeps an encoder
	// buffer for its life, per connection.
	kv := []any{"transport", transport}
	node, ok := h.certifiedNode(ctx, kv, c)
	if !ok {
		return nil
	}
	kv = append(kv, "node", node)
	f := link.NewFramed(c, h.cfg.MaxFrame)
	hl := h.readHello(ctx, kv, c, f, node)
	if hl == nil || !h.servesHere(ctx, kv, c, f, node, pki.NodeUIDFromCert(c.PeerCertificates()[0])) {
		return nil
	}
	s := h.takeSession(ctx, node, f)
	welcomed := false
	defer func() {
		if !welcomed {
			s.end()
		}
	}()
	epoch, ok := h.claim(ctx, kv, c, s, node, hl.Epoch)
	if !ok {
		return nil
	}
	if epoch != 0 {
		kv = append(kv, "epoch", epoch)
	}
	if !h.welcome(ctx, kv, c, s, node, hl, epoch) {
		return nil
	}
	h.table.connected(s.ctx, node) //nolint:contextcheck // the session's context: what observers start lives as long as the session, not the handshake
	s.prepare(kv, node, hl.StreamId, epoch)
	welcomed = true
	return s
}

// certifiedNode is the node the client certificate names.
func (h *Hub) certifiedNode(ctx context.Context, kv []any, c link.Conn) (string, bool) {
	certs := c.PeerCertificates()
	if len(certs) == 0 {
		h.refuse(ctx, kv, "no-certificate", c, "refusing connection without a client certificate")
		return "", false
	}
	node, err := pki.NodeFromCert(certs[0])
	if err != nil {
		h.refuse(ctx, kv, "not-a-node", c, "refusing connection: certificate names no node", "subject", certs[0].Subject.CommonName, "reason", err.Error())
		return "", false
	}
	return node, true
}

// readHello reads the first frame, within the handshake timeout: a Hello
// from node; nil (the edge told why) otherwise.
func (h *Hub) readHello(ctx context.Context, kv []any, c link.Conn, f *link.Framed, node string) *linkv1.Hello {
	timer := time.AfterFunc(h.cfg.HandshakeTimeout, func() { _ = c.Close() })
	var hello linkv1.Envelope
	_, err := f.Read(&hello)
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
	return hello.GetHello()
}

// servesHere says whether this hub serves node now: the node is in the
// cluster and its certificate is bound to no other Node of its name
// (Config.NodeUID; certUID "" is a certificate issued unbound), and the hub
// neither redirects it (Config.Redirect) nor drains. A node turned away is
// told to reconnect elsewhere before it claims anything here.
func (h *Hub) servesHere(ctx context.Context, kv []any, c link.Conn, f *link.Framed, node, certUID string) bool {
	if h.cfg.NodeUID != nil {
		uid, ok, err := h.cfg.NodeUID(ctx, node)
		switch {
		case err != nil:
			h.refuse(ctx, kv, "node-check-failed", c, "closing connection: could not check that the node is in the cluster", "reason", err.Error())
			return false
		case !ok:
			h.refuse(ctx, kv, "node-not-allowed", c, "refusing node that is not in the cluster")
			f.WriteError(linkv1.Error_PERMISSION_DENIED, fmt.Sprintf("node %q is not in the cluster", node))
			return false
		case certUID != "" && certUID != uid:
			h.refuse(ctx, kv, "node-replaced", c, "refusing a certificate issued to an earlier Node of this name", "certificateUID", certUID, "nodeUID", uid)
			f.WriteError(linkv1.Error_PERMISSION_DENIED, fmt.Sprintf("this certificate was issued to an earlier Node named %q (UID %s), deleted since; bootstrap the node again", node, certUID))
			return false
		}
	}
	if h.redirect(node) {
		h.refuse(ctx, kv, "sent-on", c, "sending a connection on: this replica holds its share and another has room")
		f.WriteFinal(&linkv1.Envelope{Kind: &linkv1.Envelope_Reconnect{Reconnect: &linkv1.Reconnect{Reason: "rebalance"}}})
		return false
	}
	if h.table.draining.Load() {
		// Stopping: send the edge on before it claims anything here.
		h.refuse(ctx, kv, "draining", c, "turning a connection away: this replica is draining")
		f.WriteFinal(&linkv1.Envelope{Kind: &linkv1.Envelope_Reconnect{Reconnect: &linkv1.Reconnect{Reason: "drain"}}})
		return false
	}
	return true
}

// takeSession makes this connection the one of node's session, after any
// older one has let go of it. The caller ends it (end) unless it runs.
func (h *Hub) takeSession(ctx context.Context, node string, f *link.Framed) *welcomedConn {
	st := h.table.state(node)
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
	h.table.live.Add(1)
	st.mu.Unlock()
	s := &welcomedConn{hub: h, st: st, f: f, ctx: cctx, done: done, log: logr.FromContextOrDiscard(ctx)}
	s.cfg.Cancel = cancel
	return s
}

// claim makes this hub the owner of node's session (Config.Claim) and
// returns the session's epoch (0 without Claim).
func (h *Hub) claim(ctx context.Context, kv []any, c link.Conn, s *welcomedConn, node string, hint uint64) (uint64, bool) {
	if h.cfg.Claim == nil {
		return 0, true
	}
	epoch, err := h.cfg.Claim(s.ctx, node, hint) //nolint:contextcheck // the session's context: a claim ends with the session, not with the handshake's deadline
	if err != nil {
		h.refuse(ctx, kv, "claim-failed", c, "closing connection: could not claim the node's session", "reason", err.Error())
		return 0, false
	}
	if s.ctx.Err() != nil {
		return 0, false // evicted or replaced while claiming
	}
	st := s.st
	st.mu.Lock()
	st.epoch = epoch
	if st.first == 0 {
		st.first = epoch
	}
	st.mu.Unlock()
	return epoch, true
}

// welcome resumes node's streams where both ends left them and sends the
// Welcome.
func (h *Hub) welcome(ctx context.Context, kv []any, c link.Conn, s *welcomedConn, node string, hl *linkv1.Hello, epoch uint64) bool {
	st := s.st
	if err := h.seedPosition(ctx, st, node, hl.StreamId); err != nil {
		h.refuse(ctx, kv, "positions-unavailable", c, "closing connection: the application's position in the node's stream is unknown", "reason", err.Error())
		return false
	}
	st.sess.SetPeer(hl.StreamId)
	st.sess.Resume(hl.PeerStreamId, hl.Received)
	peer, _ := st.sess.Received()
	received := st.sess.AckPosition()
	if err := s.f.Write(&linkv1.Envelope{Kind: &linkv1.Envelope_Welcome{Welcome: &linkv1.Welcome{
		StreamId: st.sess.StreamID(), PeerStreamId: peer, Received: received,
		HeartbeatIntervalMs: uint32(h.cfg.Heartbeat / time.Millisecond), Epoch: epoch}}}); err != nil {
		s.log.V(1).Info("connection lost during handshake", append(kv, "err", err)...)
		return false
	}
	s.log.V(1).Info("node connected", append(kv, "resumeFrom", hl.Received)...)
	return true
}

// prepare sets up the welcomed connection for serveConn to run.
func (s *welcomedConn) prepare(kv []any, node string, stream, epoch uint64) {
	h, st, done := s.hub, s.st, s.done
	s.kv = kv
	streams := link.NewStreams(nil) // the cloud opens streams, it serves none
	streams.SetLimit(h.cfg.MaxStreamsPerNode)
	streams.SetCounters(h.streams.of(node))
	s.cfg = link.ConnConfig{
		Heartbeat: h.cfg.Heartbeat, MaxFrame: h.cfg.MaxFrame, Limiter: st.limiter, Metrics: h.metrics,
		Cancel: s.cfg.Cancel, LogValues: kv, Streams: streams,
		Started: func(send func(*linkv1.Envelope)) {
			st.mu.Lock()
			if st.done == done {
				st.send, st.streams = send, streams
			}
			st.mu.Unlock()
			if h.table.draining.Load() {
				// Welcomed as the drain began: move on too.
				send(&linkv1.Envelope{Kind: &linkv1.Envelope_Reconnect{Reconnect: &linkv1.Reconnect{Reason: "drain"}}})
			}
		},
		Deliver: deliverer{h: h, ctx: s.ctx, node: node, stream: stream, epoch: epoch}.deliver,
	}
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
