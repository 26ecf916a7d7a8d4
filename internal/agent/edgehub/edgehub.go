// Package edgehub is the edge end of the cloud/edge link: it dials the
// cloudhub (WebSocket or QUIC), keeps one connection up with heartbeats,
// reconnects with jittered exponential backoff, resumes where the link left
// off, and keeps a bbolt store under the agent's state directory so that
// unacknowledged messages and the last state received survive a restart.
package edgehub

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/dowse-dev/dowse/internal/backoff"
	"github.com/dowse-dev/dowse/internal/link"
	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
)

// Defaults of Config's zero values.
const (
	DefaultHeartbeat       = 10 * time.Second
	DefaultStoreMaxEntries = 10000
	DefaultStoreMaxBytes   = 64 << 20
)

// Config configures an EdgeHub. Zero values take the defaults noted.
type Config struct {
	// Node is this node's name; the cloud checks it against the certificate.
	Node string
	// Transport is "websocket" or "quic"; Server is the cloudhub's host:port
	// (a Service in front of the controller's replicas, or one of them).
	Transport, Server string
	// Servers are more addresses of the cloudhub's replicas, tried after
	// Server: the edge starts at a random one of all and goes on to the
	// next whenever its connection ends (a replica that moves it away, or
	// one that died), trying each once before it backs off.
	Servers []string
	// TLS is the client configuration, normally pki.ClientTLSConfig, whose
	// GetClientCertificate lets the caller rotate the node certificate.
	TLS *tls.Config
	// Dialer, when set, replaces the one Transport/Server/TLS would make.
	Dialer link.Dialer
	// StateDir holds the store (edge.db); normally /var/lib/dowse.
	StateDir string
	// Heartbeat interval (10s); the cloud is declared dead after twice that.
	Heartbeat time.Duration
	// MaxFrame is the largest frame accepted (link.DefaultMaxFrame).
	MaxFrame int
	// StoreMaxEntries and StoreMaxBytes bound the unacknowledged outbound
	// messages (10000 entries, 64 MiB); beyond them the oldest are dropped
	// and counted in dowse_edgehub_dropped_messages_total.
	StoreMaxEntries, StoreMaxBytes int
	// BackoffMin and BackoffMax bound the reconnect delay (500ms, 15s: an
	// edge whose uplink comes back is linked again within about 30 s, a
	// dial timing out included).
	BackoffMin, BackoffMax time.Duration
	// NoSync skips fsync on store commits (tests only: a power cut may then
	// lose recent messages).
	NoSync bool
	// OnRefused, when set, is told each time the cloud refuses the link
	// itself (not a message): PERMISSION_DENIED says the node's credentials
	// no longer do (its Node was made again, say), which new ones may cure.
	OnRefused func(code linkv1.Error_Code)
	// Reach, when set, serves the byte streams the cloud opens on the link
	// (it dials the target or says why not); without it every one is
	// refused.
	Reach link.StreamDialer
}

// OnMessage is told of each inbound sequenced message exactly once, in
// order, after the store has committed it (so Desired, Membership,
// Devices and Models already answer with it). After a restart, messages committed before it
// are not told again: read the state from the store instead. It runs on the
// connection's reader goroutine and should not block long.
type OnMessage func(ctx context.Context, env *linkv1.Envelope)

// EdgeHub is the edge end of the link.
type EdgeHub struct {
	cfg       Config
	onMessage OnMessage
	store     *store
	sess      *link.Session
	metrics   *link.Metrics
	dropped   prometheus.Counter
	// removed counts entries replaced or dropped, droppedN those dropped:
	// the difference is what coalesced.
	removed, droppedN atomic.Uint64

	// The writer (writer.go): wq hands it messages, wstop ends it, wdone
	// says it ended. reserved, adds and rems are its own.
	dialers []link.Dialer
	epoch   atomic.Uint64 // of the last session, a hint in the next Hello
	moves   *prometheus.CounterVec

	wq        chan *enqReq
	wstop     chan struct{}
	wdone     chan struct{}
	reserved  uint64
	adds      []*link.Entry
	rems      []uint64
	connected atomic.Bool

	subMu sync.Mutex
	subs  map[int]OnMessage
	subN  int

	ackMu    sync.Mutex
	ackWant  uint64
	ackKick  chan struct{}
	closeMu  sync.Mutex
	isClosed bool
}

// New opens the store under cfg.StateDir and restores the session; messages
// may be reported before Start. onMessage may be nil. reg receives the
// metrics (nil: not registered).
func New(cfg Config, onMessage OnMessage, reg prometheus.Registerer) (*EdgeHub, error) {
	if cfg.Node == "" || cfg.StateDir == "" {
		return nil, errors.New("edgehub: node and state directory are required")
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = DefaultHeartbeat
	}
	if cfg.MaxFrame <= 0 {
		cfg.MaxFrame = link.DefaultMaxFrame
	}
	if cfg.StoreMaxEntries <= 0 {
		cfg.StoreMaxEntries = DefaultStoreMaxEntries
	}
	if cfg.StoreMaxBytes <= 0 {
		cfg.StoreMaxBytes = DefaultStoreMaxBytes
	}
	if cfg.BackoffMin <= 0 {
		cfg.BackoffMin = 500 * time.Millisecond
	}
	if cfg.BackoffMax <= 0 {
		cfg.BackoffMax = 15 * time.Second
	}
	var dialers []link.Dialer
	if cfg.Dialer != nil {
		dialers = []link.Dialer{cfg.Dialer}
	} else {
		if cfg.TLS == nil {
			return nil, errors.New("edgehub: TLS config is required")
		}
		for i, addr := range append([]string{cfg.Server}, cfg.Servers...) {
			if addr == "" {
				continue
			}
			conf := cfg.TLS
			if host, _, err := net.SplitHostPort(addr); err == nil && i > 0 {
				// Each address is checked against its own name.
				conf = conf.Clone()
				conf.ServerName = host
			}
			d, err := link.NewDialer(cfg.Transport, addr, conf)
			if err != nil {
				return nil, err
			}
			dialers = append(dialers, d)
		}
		if len(dialers) == 0 {
			return nil, errors.New("edgehub: no cloudhub address")
		}
	}
	st, err := openStore(cfg.StateDir, cfg.NoSync)
	if err != nil {
		return nil, err
	}
	scfg, err := st.load()
	if err != nil {
		st.close()
		return nil, err
	}
	e := &EdgeHub{cfg: cfg, onMessage: onMessage, store: st, dialers: dialers, ackKick: make(chan struct{}, 1),
		metrics: link.NewMetrics(reg, "edgehub"),
		moves: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "dowse", Subsystem: "edgehub", Name: "moves_total",
			Help: "Connections the cloud ended with a Reconnect, by its reason (drain: the replica stops; rebalance)."}, []string{"reason"}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "dowse", Subsystem: "edgehub", Name: "dropped_messages_total",
			Help: "Outbound messages dropped, oldest first, because the edge store was full."}),
	}
	scfg.MaxEntries, scfg.MaxBytes, scfg.DropOldest = cfg.StoreMaxEntries, cfg.StoreMaxBytes, true
	scfg.Persist = e.persistLater
	e.reserved = scfg.NextSeq
	e.wq, e.wstop, e.wdone = make(chan *enqReq), make(chan struct{}), make(chan struct{})
	scfg.Acked = e.acked
	e.sess = link.NewSession(scfg)
	go e.writeLoop()
	if reg != nil {
		reg.MustRegister(e.dropped, e.moves,
			prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "dowse", Subsystem: "edgehub", Name: "coalesced_messages_total",
				Help: "Outbound messages replaced, while unsent, by a newer one of the same key (a device property's report, a device's state)."},
				func() float64 { return float64(e.Coalesced()) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "dowse", Subsystem: "edgehub", Name: "queued_messages",
				Help: "Outbound messages not yet acknowledged by the cloud (held in the store)."}, func() float64 { n, _ := e.sess.Len(); return float64(n) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "dowse", Subsystem: "edgehub", Name: "connected",
				Help: "1 while the link to the cloud is up."}, func() float64 {
				if e.connected.Load() {
					return 1
				}
				return 0
			}))
	}
	return e, nil
}

// Subscribe adds f to what is told of each inbound sequenced message once
// the store has committed it, as the OnMessage given to New is (a part
// built on the store, such as the mapper API, follows it this way without
// the hub knowing of it). It returns a function that removes f.
func (e *EdgeHub) Subscribe(f func(ctx context.Context, env *linkv1.Envelope)) (unsubscribe func()) {
	e.subMu.Lock()
	defer e.subMu.Unlock()
	if e.subs == nil {
		e.subs = map[int]OnMessage{}
	}
	e.subN++
	id := e.subN
	e.subs[id] = f
	return func() {
		e.subMu.Lock()
		delete(e.subs, id)
		e.subMu.Unlock()
	}
}

func (e *EdgeHub) publish(ctx context.Context, env *linkv1.Envelope) {
	e.subMu.Lock()
	subs := make([]OnMessage, 0, len(e.subs))
	for _, f := range e.subs {
		subs = append(subs, f)
	}
	e.subMu.Unlock()
	for _, f := range subs {
		f(ctx, env)
	}
}

// acked is called under the session lock: hand the deletion to the store
// goroutine rather than sync on every ack.
func (e *EdgeHub) acked(through uint64) {
	e.ackMu.Lock()
	e.ackWant = max(e.ackWant, through)
	e.ackMu.Unlock()
	select {
	case e.ackKick <- struct{}{}:
	default:
	}
}

// ReportOption adds to a Report.
type ReportOption func(*linkv1.TwinReportedUpdate)

// WithObservedDesired names the desired value the mapper last applied.
func WithObservedDesired(v *linkv1.TwinValue) ReportOption {
	return func(r *linkv1.TwinReportedUpdate) { r.ObservedDesired = v }
}

// Report queues a property value read from a device (the text of the
// model's type, with the mapper's metadata); at is when it was read. While
// it has not been written to the cloud (offline, or queued behind others)
// a newer value of the same device property replaces it (metadata and
// observed desired value included: the newest report wins whole). It
// returns once the store has committed it.
func (e *EdgeHub) Report(device *linkv1.DeviceRef, property string, v *linkv1.TwinValue, at time.Time, opts ...ReportOption) (uint64, error) {
	r := &linkv1.TwinReportedUpdate{Device: device, Property: property, Reported: v, Time: timestamppb.New(at)}
	for _, o := range opts {
		o(r)
	}
	env := &linkv1.Envelope{Kind: &linkv1.Envelope_TwinReported{TwinReported: r}}
	return e.enqueue(env, coalesceKey(env))
}

// ReportState queues the state a mapper reports for a device (ok, online,
// offline, unhealthy, unknown, disconnected; the caller checks), with the
// mapper's registration name. While unsent, a newer state of the same
// device replaces it. It returns once the store has committed it.
func (e *EdgeHub) ReportState(device *linkv1.DeviceRef, state, mapper string, at time.Time) (uint64, error) {
	env := &linkv1.Envelope{Kind: &linkv1.Envelope_DeviceState{DeviceState: &linkv1.DeviceStateUpdate{
		Device: device, State: state, Time: timestamppb.New(at), Mapper: mapper}}}
	return e.enqueue(env, coalesceKey(env))
}

// ReportCondition queues a condition of a device (DeviceCondition), which
// replaces an unsent one of its type; it returns once stored.
func (e *EdgeHub) ReportCondition(c *linkv1.DeviceCondition) (uint64, error) {
	env := &linkv1.Envelope{Kind: &linkv1.Envelope_DeviceCondition{DeviceCondition: c}}
	return e.enqueue(env, coalesceKey(env))
}

// Send queues any sequenced message (a ProcessedAck, a membership report)
// without coalescing. env must not be modified afterwards.
func (e *EdgeHub) Send(env *linkv1.Envelope) (uint64, error) {
	if !link.Sequenced(env) {
		return 0, fmt.Errorf("edgehub: %T is not an application message", env.Kind)
	}
	return e.enqueue(env, "")
}

func (e *EdgeHub) enqueue(env *linkv1.Envelope, key string) (uint64, error) {
	env.Version = link.ProtocolVersion
	if err := link.Validate(&linkv1.Envelope{Version: env.Version, Seq: 1, Kind: env.Kind}); err != nil {
		return 0, err
	}
	seqs, err := e.submit([]*linkv1.Envelope{env}, []string{key})
	if err != nil {
		return 0, err
	}
	return seqs[0], nil
}

// ReportMany queues several reported values (TwinReportedUpdate: device,
// property, value with its metadata, time, and observed desired when known)
// and returns once all are committed, in one store transaction. Each
// coalesces as Report's do. An error refuses the ones not yet taken.
func (e *EdgeHub) ReportMany(reports []*linkv1.TwinReportedUpdate) error {
	if len(reports) == 0 {
		return nil
	}
	envs := make([]*linkv1.Envelope, len(reports))
	keys := make([]string, len(reports))
	for i, r := range reports {
		envs[i] = &linkv1.Envelope{Version: link.ProtocolVersion, Kind: &linkv1.Envelope_TwinReported{TwinReported: r}}
		if err := link.Validate(&linkv1.Envelope{Version: link.ProtocolVersion, Seq: 1, Kind: envs[i].Kind}); err != nil {
			return err
		}
		keys[i] = coalesceKey(envs[i])
	}
	_, err := e.submit(envs, keys)
	return err
}

// Devices are the Devices the cloud last assigned to this node, as the
// store holds them (DeviceUpdate, DeviceRemoval and DeviceInventory
// applied), ordered by namespace and name. They survive restarts: after an
// agent restart without the cloud this is what the mappers get.
func (e *EdgeHub) Devices() ([]*linkv1.EdgeDevice, error) { return e.store.devices() }

// Models are the DeviceModels the cloud last sent this node, ordered by
// namespace and name.
func (e *EdgeHub) Models() ([]*linkv1.EdgeDeviceModel, error) { return e.store.models() }

// Device is the Device ref names (nil when the node does not hold it).
func (e *EdgeHub) Device(ref *linkv1.DeviceRef) (*linkv1.EdgeDevice, error) {
	return e.store.device(ref)
}

// Model is the DeviceModel ref names (nil when the node does not hold it).
func (e *EdgeHub) Model(ref *linkv1.DeviceRef) (*linkv1.EdgeDeviceModel, error) {
	return e.store.model(ref)
}

// Membership is the last device membership received (nil when none).
func (e *EdgeHub) Membership() (*linkv1.DeviceMembership, error) { return e.store.membership() }

// Coalesced is how many outbound messages a newer one of the same key
// replaced while unsent, since New.
func (e *EdgeHub) Coalesced() uint64 {
	r, d := e.removed.Load(), e.droppedN.Load()
	if d > r { // read between the two counts of one Enqueue
		return 0
	}
	return r - d
}

// Connected reports whether the link is up.
func (e *EdgeHub) Connected() bool { return e.connected.Load() }

// Pending is the number of outbound messages not yet acknowledged.
func (e *EdgeHub) Pending() int { n, _ := e.sess.Len(); return n }

// Close closes the store; Start does it when it returns. Idempotent.
func (e *EdgeHub) Close() error {
	e.closeMu.Lock()
	defer e.closeMu.Unlock()
	if e.isClosed {
		return nil
	}
	e.isClosed = true
	close(e.wstop)
	<-e.wdone
	return e.store.close()
}

// Start keeps the link up until ctx ends, then closes the store (so it runs
// once per EdgeHub; a restarted agent builds a new one on the same state
// directory). Connection failures, refusals included, are retried forever
// with jittered exponential backoff; only a store failure ends it early
// with an error.
func (e *EdgeHub) Start(ctx context.Context) error {
	log := logr.FromContextOrDiscard(ctx).WithName("edgehub").WithValues("node", e.cfg.Node)
	ctx = logr.NewContext(ctx, log)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	defer func() {
		cancel(nil)
		wg.Wait()
		e.Close()
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		e.ackLoop(ctx, cancel)
	}()

	// Full jitter in [d/2, d]: a fleet cut off together does not reconnect
	// in lockstep.
	reconnect := backoff.Backoff{Initial: e.cfg.BackoffMin, Max: e.cfg.BackoffMax, Jitter: 0.5}
	n := len(e.dialers)
	next := mrand.IntN(n) // spread a fleet over the addresses it is given
	round := next         // where the current round of attempts began
	for ctx.Err() == nil {
		d := e.dialers[next]
		next = (next + 1) % n
		up, err := e.connectOnce(ctx, d)
		e.connected.Store(false)
		if ctx.Err() != nil {
			break
		}
		var pe *link.PeerError
		var mv *movedError
		switch {
		case errors.As(err, &mv):
			e.moves.WithLabelValues(mv.reason).Inc()
			log.V(1).Info("the cloud moved this edge to another replica", "reason", mv.reason, "connected", up)
		case errors.As(err, &pe):
			log.Info("cloud refused the link", "code", pe.Code.String(), "reason", pe.Message)
			if e.cfg.OnRefused != nil {
				e.cfg.OnRefused(pe.Code)
			}
		case up:
			log.V(1).Info("link down", "reason", err.Error())
		default:
			log.V(1).Info("cannot reach the cloud", "reason", err.Error())
		}
		var wait time.Duration
		switch {
		case up && mv != nil:
			// Told to move by a replica that spreads its edges' moves
			// itself: go now.
			reconnect.Reset()
			round = next
		case up:
			// A session just ended (its replica died, the network
			// blinked): the first retry comes soon, on the next address.
			reconnect.Reset()
			round = next
			wait = reconnect.Next()
		case next != round:
			// Other addresses are left in this round: try the next soon.
			wait = mrand.N(e.cfg.BackoffMin/2 + 1)
		default:
			wait = reconnect.Next()
		}
		backoff.Sleep(ctx, wait)
	}
	if c := context.Cause(ctx); c != nil && !errors.Is(c, context.Canceled) {
		return c
	}
	return nil
}

// movedError ends a connection the cloud asked to move (a Reconnect).
type movedError struct{ reason string }

func (m *movedError) Error() string {
	return "the cloud asked this edge to reconnect (" + m.reason + ")"
}

func (e *EdgeHub) ackLoop(ctx context.Context, fail context.CancelCauseFunc) {
	var done uint64
	for {
		select {
		case <-ctx.Done():
		case <-e.ackKick:
		}
		e.ackMu.Lock()
		want := e.ackWant
		e.ackMu.Unlock()
		if want > done {
			if err := e.store.markAcked(want); err != nil {
				fail(fmt.Errorf("edge store: %w", err))
				return
			}
			done = want
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// connectOnce dials, shakes hands and runs one connection; up reports
// whether the handshake completed.
func (e *EdgeHub) connectOnce(ctx context.Context, dialer link.Dialer) (up bool, err error) {
	// A handshake slower than a few heartbeats is as good as a dead peer.
	handshake := max(4*e.cfg.Heartbeat, time.Second)
	dctx, cancel := context.WithTimeout(ctx, handshake)
	c, err := dialer.Dial(dctx)
	cancel()
	if err != nil {
		return false, err
	}
	f := link.NewFramed(c, e.cfg.MaxFrame)
	timer := time.AfterFunc(handshake, func() { _ = c.Close() })
	peer, received := e.sess.Received()
	err = f.Write(&linkv1.Envelope{Kind: &linkv1.Envelope_Hello{Hello: &linkv1.Hello{
		Node: e.cfg.Node, StreamId: e.sess.StreamID(), PeerStreamId: peer, Received: received, Epoch: e.epoch.Load()}}})
	var w linkv1.Envelope
	if err == nil {
		_, err = f.Read(&w)
	}
	timer.Stop()
	switch {
	case err != nil:
	case w.GetError() != nil:
		err = &link.PeerError{Code: w.GetError().Code, Message: w.GetError().Message}
	case w.GetReconnect() != nil:
		err = &movedError{reason: w.GetReconnect().Reason}
	case w.GetWelcome() == nil:
		err = fmt.Errorf("%w: expected welcome, got %T", link.ErrMalformed, w.Kind)
	}
	if err != nil {
		_ = c.Close()
		return false, err
	}
	wl := w.GetWelcome()
	e.epoch.Store(wl.Epoch)
	e.sess.SetPeer(wl.StreamId)
	e.sess.Resume(wl.PeerStreamId, wl.Received)
	e.connected.Store(true)
	logr.FromContextOrDiscard(ctx).V(1).Info("link up", "resumeFrom", wl.Received, "pending", e.Pending(), "epoch", wl.Epoch)
	cctx, ccancel := context.WithCancelCause(ctx)
	defer ccancel(nil)
	var moveTimer *time.Timer
	defer func() {
		if moveTimer != nil {
			moveTimer.Stop()
		}
	}()
	var streams *link.Streams
	if e.cfg.Reach != nil {
		streams = link.NewStreams(e.cfg.Reach)
	}
	err = link.RunConn(cctx, f, e.sess, &link.ConnConfig{
		Heartbeat: e.cfg.Heartbeat, MaxFrame: e.cfg.MaxFrame, Metrics: e.metrics, Streams: streams,
		OnReconnect: func(r *linkv1.Reconnect) {
			if moveTimer == nil {
				mv := &movedError{reason: r.Reason}
				moveTimer = time.AfterFunc(time.Duration(r.DelayMs)*time.Millisecond, func() { ccancel(mv) })
			}
		},
		Deliver: func(ctx context.Context, env *linkv1.Envelope) error {
			peer, _ := e.sess.Received()
			if err := e.store.received(peer, env); err != nil {
				return fmt.Errorf("edge store: %w", err)
			}
			if e.onMessage != nil {
				e.onMessage(ctx, env)
			}
			e.publish(ctx, env)
			return nil
		},
	})
	return true, err
}
