package link_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dowse-dev/dowse/internal/agent/edgehub"
	"github.com/dowse-dev/dowse/internal/controller/link/cloudhub"
	"github.com/dowse-dev/dowse/internal/link"
	"github.com/dowse-dev/dowse/internal/link/pki"
	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
	"github.com/dowse-dev/dowse/test/framework/testwait"
)

const heartbeat = 50 * time.Millisecond

// logBuf collects log lines so that tests can assert on refusals.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) logger() logr.Logger {
	return funcr.New(func(prefix, args string) {
		l.mu.Lock()
		fmt.Fprintf(&l.b, "%s %s\n", prefix, args)
		l.mu.Unlock()
	}, funcr.Options{Verbosity: 0})
}

func (l *logBuf) has(s string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Contains(l.b.String(), s)
}

func (l *logBuf) String() string { l.mu.Lock(); defer l.mu.Unlock(); return l.b.String() }

type cluster struct {
	ca        *pki.CA
	serverTLS *tls.Config
}

func newCluster(t testing.TB) *cluster {
	t.Helper()
	ca, err := pki.NewCA("dowse-link-test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := ca.IssueServer([]string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return &cluster{ca: ca, serverTLS: pki.ServerTLSConfig(pki.Static[*tls.ClientHelloInfo](srv), ca.Pool())}
}

func (c *cluster) clientTLS(t testing.TB, ca *pki.CA, node string) *tls.Config {
	t.Helper()
	cert, err := ca.IssueNode(node, "", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return pki.ClientTLSConfig(pki.Static[*tls.CertificateRequestInfo](cert), c.ca.Pool(), "127.0.0.1")
}

// authz lets node N speak about devices named "N-...".
type authz struct{}

func (authz) AuthorizeDevice(_ context.Context, node string, d *linkv1.DeviceRef) error {
	if !strings.HasPrefix(d.GetName(), node+"-") {
		return errors.New("device belongs to another node")
	}
	return nil
}

// recorder keeps the int values each node's application received, in
// order. On the cloud side it is also the application's durable store: it
// keeps the stream position with each value (one lock, so one "write") and
// outlives hub restarts, which makes it a cloudhub.Positions.
type recorder struct {
	mu     sync.Mutex
	got    map[string][]int64
	at     map[string]cloudhub.Position
	seeded int // Delivered answers with a position
}

func newRecorder() *recorder {
	return &recorder{got: map[string][]int64{}, at: map[string]cloudhub.Position{}}
}

func (r *recorder) add(node string, v int64) {
	r.mu.Lock()
	r.got[node] = append(r.got[node], v)
	r.mu.Unlock()
}

func (r *recorder) take(m cloudhub.Inbound) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if rep := m.Env.GetTwinReported(); rep != nil {
		v, _ := strconv.ParseInt(rep.GetReported().GetValue(), 10, 64)
		r.got[m.Node] = append(r.got[m.Node], v)
	}
	r.at[m.Node] = m.At
}

func (r *recorder) Delivered(_ context.Context, node string) (cloudhub.Position, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.at[node].Seq > 0 {
		r.seeded++
	}
	return r.at[node], nil
}

func (r *recorder) seeds() int { r.mu.Lock(); defer r.mu.Unlock(); return r.seeded }

func (r *recorder) get(node string) []int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]int64(nil), r.got[node]...)
}

type hubRun struct {
	hub    *cloudhub.Hub
	reg    *prometheus.Registry
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

func (h *hubRun) stop() { h.once.Do(func() { h.cancel(); <-h.done }) }

// addr is where the hub listens for transport.
func (h *hubRun) addr(transport string) string {
	ws, q := h.hub.Addrs()
	if transport == link.QUIC {
		return q.String()
	}
	return ws.String()
}

func startHub(t testing.TB, c *cluster, wsAddr, quicAddr string, rec *recorder, logs *logBuf, tweak ...func(*cloudhub.Config)) *hubRun {
	t.Helper()
	cfg := cloudhub.Config{
		WebSocketAddr: wsAddr, QUICAddr: quicAddr, TLS: c.serverTLS, Heartbeat: heartbeat,
		MaxFrame: 64 << 10, QueueSize: 256, RateLimit: 1e5, RateBurst: 1000,
		DrainPeriod: -1, // a test that drains says so
	}
	for _, f := range tweak {
		f(&cfg)
	}
	reg := prometheus.NewRegistry()
	hub, err := cloudhub.New(cfg, authz{}, func(_ context.Context, m cloudhub.Inbound) error {
		rec.take(m)
		return nil
	}, reg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(logr.NewContext(context.Background(), logs.logger()))
	done := make(chan error, 1)
	go func() { done <- hub.Start(ctx) }()
	select {
	case <-hub.Ready():
	case err := <-done:
		t.Fatal(err)
	}
	h := &hubRun{hub: hub, reg: reg, cancel: cancel, done: done}
	t.Cleanup(h.stop)
	return h
}

type edgeRun struct {
	edge   *edgehub.EdgeHub
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

func (e *edgeRun) stop() {
	e.once.Do(func() {
		e.cancel()
		<-e.done
	})
}

func startEdge(t testing.TB, node string, dialer link.Dialer, dir string, rec *recorder, logs *logBuf, tweak func(*edgehub.Config)) *edgeRun {
	t.Helper()
	cfg := edgehub.Config{Node: node, Dialer: dialer, StateDir: dir, Heartbeat: heartbeat,
		BackoffMin: 10 * time.Millisecond, BackoffMax: 200 * time.Millisecond, NoSync: true, MaxFrame: 64 << 10}
	if tweak != nil {
		tweak(&cfg)
	}
	e, err := edgehub.New(cfg, func(_ context.Context, env *linkv1.Envelope) {
		if v, ok := setpoint(env); ok {
			rec.add(node, v)
		}
	}, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(logr.NewContext(context.Background(), logs.logger()))
	r := &edgeRun{edge: e, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- e.Start(ctx) }()
	t.Cleanup(r.stop)
	return r
}

func intValue(v int64) *linkv1.TwinValue { return &linkv1.TwinValue{Value: strconv.FormatInt(v, 10)} }

func dev(name string) *linkv1.DeviceRef { return &linkv1.DeviceRef{Namespace: "default", Name: name} }

// desired is what the cloud sends when a desired value of a Device
// changes: the Device, desired value i of its property setpoint riding it.
func desired(node string, i int64) *linkv1.Envelope {
	return &linkv1.Envelope{Kind: &linkv1.Envelope_DeviceUpdate{DeviceUpdate: &linkv1.DeviceUpdate{Device: &linkv1.EdgeDevice{
		Ref: dev(node + "-cam"), Generation: i + 1, Model: "cam",
		Properties: []*linkv1.EdgeDeviceProperty{{Name: "setpoint", Desired: intValue(i)}}}}}}
}

// setpoint is the desired value a Device update carries (desired's).
func setpoint(env *linkv1.Envelope) (int64, bool) {
	for _, p := range env.GetDeviceUpdate().GetDevice().GetProperties() {
		if p.GetName() == "setpoint" && p.GetDesired() != nil {
			v, err := strconv.ParseInt(p.GetDesired().GetValue(), 10, 64)
			return v, err == nil
		}
	}
	return 0, false
}

// sendDesired queues value i for node, waiting while its queue is full.
func sendDesired(ctx context.Context, hub *cloudhub.Hub, node string, i int64) error {
	for {
		_, err := hub.Send(node, desired(node, i))
		if !errors.Is(err, link.ErrQueueFull) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// exactly checks got is 0..n-1, each once, in order.
func exactly(got []int64, n int) error {
	if len(got) != n {
		return fmt.Errorf("%d values, want %d", len(got), n)
	}
	for i, v := range got {
		if v != int64(i) {
			return fmt.Errorf("value %d at position %d", v, i)
		}
	}
	return nil
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, d time.Duration, what string, cond func() error) {
	t.Helper()
	testwait.For(t, d, func() error {
		if err := cond(); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		return nil
	})
}
