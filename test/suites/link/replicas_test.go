package link_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/dowse-dev/dowse/internal/agent/edgehub"
	"github.com/dowse-dev/dowse/internal/controller/link/cloudhub"
	"github.com/dowse-dev/dowse/internal/link"
	"github.com/dowse-dev/dowse/test/framework/promtest"
)

// records is an in-memory stand-in for the node records of package
// internal/controller/link/ownership (which test/suites/ownership tests on the API server):
// each claim begins a session with the next epoch and tells the hub that
// held the node to evict what it holds through the previous one.
type records struct {
	mu     sync.Mutex
	epoch  map[string]uint64
	holder map[string]*cloudhub.Hub
}

func newRecords() *records {
	return &records{epoch: map[string]uint64{}, holder: map[string]*cloudhub.Hub{}}
}

func (r *records) claimFor(h **cloudhub.Hub) func(context.Context, string, uint64) (uint64, error) {
	return func(_ context.Context, node string, _ uint64) (uint64, error) {
		r.mu.Lock()
		r.epoch[node]++
		e := r.epoch[node]
		old := r.holder[node]
		r.holder[node] = *h
		r.mu.Unlock()
		if old != nil && old != *h {
			old.Evict(node, e-1)
		}
		return e, nil
	}
}

// replicaPair is two hubs sharing one application store (the recorder, as
// Device.status is for the controller's replicas) and one set of records.
type replicaPair struct {
	a, b *hubRun
	rec  *recorder
	recs *records
}

func startPair(t *testing.T, c *cluster, logs *logBuf, drain time.Duration) *replicaPair {
	t.Helper()
	p := &replicaPair{rec: newRecorder(), recs: newRecords()}
	var ha, hb *cloudhub.Hub
	tweak := func(h **cloudhub.Hub) func(*cloudhub.Config) {
		return func(cfg *cloudhub.Config) {
			cfg.Claim = p.recs.claimFor(h)
			cfg.Positions = p.rec
			cfg.DrainPeriod = drain
			// Long enough that a loaded machine (or -race) does not take
			// a slow peer for a dead one: these tests count moves.
			cfg.Heartbeat = time.Second
		}
	}
	p.a = startHub(t, c, "127.0.0.1:0", "127.0.0.1:0", p.rec, logs, tweak(&ha))
	p.b = startHub(t, c, "127.0.0.1:0", "127.0.0.1:0", p.rec, logs, tweak(&hb))
	ha, hb = p.a.hub, p.b.hub
	return p
}

// holds reports which of the pair's hubs has node connected.
func (p *replicaPair) holds(node string) (a, b bool) {
	return slices.Contains(p.a.hub.Connected(), node), slices.Contains(p.b.hub.Connected(), node)
}

// TestEdgeMovesBetweenReplicas: an edge given both replicas' addresses is
// moved from one to the other (Hub.Move), then drained back when the
// replica it is on stops; readings it streams meanwhile arrive exactly
// once, in order, and each session has a greater epoch than the last.
func TestEdgeMovesBetweenReplicas(t *testing.T) {
	for _, transport := range []string{link.WebSocket, link.QUIC} {
		t.Run(transport, func(t *testing.T) {
			t.Parallel()
			c := newCluster(t)
			logs := &logBuf{}
			p := startPair(t, c, logs, 500*time.Millisecond)
			e := startEdge(t, "edge", nil, t.TempDir(), newRecorder(), logs, func(cfg *edgehub.Config) {
				cfg.Dialer, cfg.Transport, cfg.TLS = nil, transport, c.clientTLS(t, c.ca, "edge")
				cfg.Server, cfg.Servers = p.a.addr(transport), []string{p.b.addr(transport)}
				cfg.Heartbeat = time.Second
			})
			const total = 2000
			reported := make(chan error, 1)
			go func() {
				for i := range total {
					if _, err := e.edge.Report(dev("edge-cam"), fmt.Sprintf("p%05d", i), intValue(int64(i)), time.Now()); err != nil {
						reported <- err
						return
					}
					if i%4 == 0 {
						time.Sleep(time.Millisecond)
					}
				}
				reported <- nil
			}()
			// holder is the replica the edge is on now (it may reconnect by
			// itself: the heartbeat is short).
			holder := func() (on, other *hubRun, err error) {
				switch a, b := p.holds("edge"); {
				case a && !b:
					return p.a, p.b, nil
				case b && !a:
					return p.b, p.a, nil
				}
				return nil, nil, fmt.Errorf("the edge is not on exactly one replica")
			}
			waitFor(t, 10*time.Second, "connected", func() error { _, _, err := holder(); return err })
			waitFor(t, 10*time.Second, "readings flowing", func() error {
				if n := len(p.rec.get("edge")); n < total/4 {
					return fmt.Errorf("%d of %d taken", n, total)
				}
				return nil
			})
			var first, second *hubRun
			waitFor(t, 10*time.Second, "moved", func() error {
				if first == nil {
					on, other, err := holder()
					if err != nil {
						return err
					}
					if !on.hub.Move("edge", 0, "rebalance") {
						return fmt.Errorf("Move: the edge is not connected")
					}
					first, second = on, other
				}
				if !slices.Contains(second.hub.Connected(), "edge") || slices.Contains(first.hub.Connected(), "edge") {
					return fmt.Errorf("after Move, the edge is not on the other replica alone")
				}
				return nil
			})
			waitFor(t, 10*time.Second, "readings flowing", func() error {
				if n := len(p.rec.get("edge")); n < total/2 {
					return fmt.Errorf("%d of %d taken", n, total)
				}
				return nil
			})
			// Stopping drains: the edge is told to go before the hub stops.
			stopped := make(chan struct{})
			go func() { second.stop(); close(stopped) }()
			waitFor(t, 10*time.Second, "drained", func() error {
				if !slices.Contains(first.hub.Connected(), "edge") {
					return fmt.Errorf("the edge is not back on the first replica")
				}
				return nil
			})
			<-stopped
			if n := promtest.Sum(t, second.reg, "dowse_cloudhub_moved_sessions_total", map[string]string{"reason": "drain"}); n != 1 {
				t.Errorf("the stopped replica moved %v edges on its drain, want 1", n)
			}
			if n := promtest.Sum(t, first.reg, "dowse_cloudhub_moved_sessions_total", map[string]string{"reason": "rebalance"}); n != 1 {
				t.Errorf("the first replica moved %v edges, want 1", n)
			}
			if err := <-reported; err != nil {
				t.Fatal(err)
			}
			waitFor(t, 20*time.Second, "every reading", func() error { return exactly(p.rec.get("edge"), total) })
			p.recs.mu.Lock()
			epochs := p.recs.epoch["edge"]
			p.recs.mu.Unlock()
			if epochs < 3 {
				t.Errorf("%d sessions claimed, want at least 3 (first, moved, drained back)", epochs)
			}
		})
	}
}

// TestEvictClosesTheOlderSession: when the node's session is claimed on
// another replica, the replica that held it closes its session there and
// forgets it, and counts the takeover; a session newer than the one taken
// is not closed.
func TestEvictClosesTheOlderSession(t *testing.T) {
	c := newCluster(t)
	logs := &logBuf{}
	p := startPair(t, c, logs, -1)
	// The edge knows replica a only: evicted, it comes back to a and
	// claims again.
	d, _ := link.NewDialer(link.WebSocket, p.a.addr(link.WebSocket), c.clientTLS(t, c.ca, "edge"))
	startEdge(t, "edge", d, t.TempDir(), newRecorder(), logs, func(cfg *edgehub.Config) { cfg.Heartbeat = time.Second })
	waitFor(t, 10*time.Second, "connected", func() error {
		if a, _ := p.holds("edge"); !a {
			return fmt.Errorf("not on replica a")
		}
		return nil
	})
	p.recs.mu.Lock()
	e := p.recs.epoch["edge"]
	p.recs.mu.Unlock()
	if p.a.hub.Evict("edge", e-1) {
		t.Fatalf("Evict through %d closed the session of epoch %d", e-1, e)
	}
	if !p.a.hub.Evict("edge", e) {
		t.Fatalf("Evict through %d left the session of epoch %d", e, e)
	}
	waitFor(t, 10*time.Second, "reconnected with a new session", func() error {
		p.recs.mu.Lock()
		defer p.recs.mu.Unlock()
		if p.recs.epoch["edge"] <= e {
			return fmt.Errorf("no claim after the eviction")
		}
		if a, _ := p.holds("edge"); !a {
			return fmt.Errorf("not back on replica a")
		}
		return nil
	})
	if n := promtest.Sum(t, p.a.reg, "dowse_cloudhub_sessions_taken_over_total", nil); n != 1 {
		t.Errorf("sessions taken over: %v, want 1", n)
	}
	// The count of sessions (what SendOn is given) let go of the evicted
	// one and holds the new one.
	waitFor(t, 10*time.Second, "one session counted", func() error {
		if a, b := p.a.hub.Sessions(), p.b.hub.Sessions(); a != 1 || b != 0 {
			return fmt.Errorf("sessions counted: a %d, b %d; want 1 and 0", a, b)
		}
		if n := promtest.Sum(t, p.a.reg, "dowse_cloudhub_connected_nodes", nil); n != 1 {
			return fmt.Errorf("dowse_cloudhub_connected_nodes %v, want 1", n)
		}
		return nil
	})
}
