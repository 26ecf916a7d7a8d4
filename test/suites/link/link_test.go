// Integration tests of the cloud/edge link: one cloudhub and several
// edgehubs in one process over real loopback sockets, through fault
// injecting proxies.
package link_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dowse-dev/dowse/internal/agent/edgehub"
	"github.com/dowse-dev/dowse/internal/controller/link/cloudhub"
	"github.com/dowse-dev/dowse/internal/link"
	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
	"github.com/dowse-dev/dowse/test/framework/faultproxy"
	"github.com/dowse-dev/dowse/test/framework/promtest"
)

// faulty is a proxy of either kind as the fault loop sees it.
type faulty interface {
	Addr() string
	inject(r *rand.Rand) string
}

type tcpFaults struct{ *faultproxy.TCP }

func (p tcpFaults) inject(r *rand.Rand) string {
	switch k := r.IntN(10); {
	case k < 6: // cut, usually inside a frame
		p.Cut(r.IntN(300))
		time.Sleep(time.Duration(20+r.IntN(40)) * time.Millisecond)
		return "cut"
	case k < 8:
		p.Delay(time.Duration(5+r.IntN(30)) * time.Millisecond)
		time.Sleep(time.Duration(100+r.IntN(100)) * time.Millisecond)
		p.Delay(0)
		return "delay"
	default: // only heartbeats can notice
		p.Blackhole(true)
		time.Sleep(time.Duration(150+r.IntN(100)) * time.Millisecond)
		p.Blackhole(false)
		return "blackhole"
	}
}

type udpFaults struct{ *faultproxy.UDP }

func (p udpFaults) inject(r *rand.Rand) string {
	switch k := r.IntN(10); {
	case k < 4:
		p.Loss(10 + r.IntN(40))
		time.Sleep(time.Duration(100+r.IntN(100)) * time.Millisecond)
		p.Loss(0)
		return "loss"
	case k < 6:
		p.Delay(time.Duration(5+r.IntN(30)) * time.Millisecond)
		time.Sleep(time.Duration(100+r.IntN(100)) * time.Millisecond)
		p.Delay(0)
		return "delay"
	default: // drops the connection: only heartbeats can notice
		p.Blackhole(true)
		time.Sleep(time.Duration(150+r.IntN(100)) * time.Millisecond)
		p.Blackhole(false)
		return "blackhole"
	}
}

func newProxy(t *testing.T, transport string, hub *hubRun) faulty {
	t.Helper()
	ws, q := hub.hub.Addrs()
	if transport == link.WebSocket {
		p, err := faultproxy.NewTCP(ws.String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		return tcpFaults{p}
	}
	p, err := faultproxy.NewUDP(q.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return udpFaults{p}
}

// TestExactlyOnceAcrossFaults: three edges talk both ways with one hub while
// 100 random faults hit their links; every message reaches the other side's
// application exactly once and in order.
func TestExactlyOnceAcrossFaults(t *testing.T) {
	for _, transport := range []string{link.WebSocket, link.QUIC} {
		t.Run(transport, func(t *testing.T) {
			t.Parallel()
			c := newCluster(t)
			logs := &logBuf{}
			cloudGot, edgeGot := newRecorder(), newRecorder()
			hub := startHub(t, c, "127.0.0.1:0", "127.0.0.1:0", cloudGot, logs)
			const edges, faults = 3, 100
			type edgeT struct {
				node  string
				proxy faulty
				run   *edgeRun
			}
			var es []edgeT
			for i := range edges {
				node := fmt.Sprintf("node-%d", i)
				p := newProxy(t, transport, hub)
				d, _ := link.NewDialer(transport, p.Addr(), c.clientTLS(t, c.ca, node))
				es = append(es, edgeT{node, p, startEdge(t, node, d, t.TempDir(), edgeGot, logs, nil)})
			}

			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			faultsDone := make(chan struct{})
			var wg sync.WaitGroup
			var mu sync.Mutex
			kinds := map[string]int{}
			// Faults: spread over the edges' proxies, concurrently.
			var fwg sync.WaitGroup
			for i, e := range es {
				fwg.Add(1)
				go func() {
					defer fwg.Done()
					r := rand.New(rand.NewPCG(uint64(i), 42))
					for f := i; f < faults; f += edges {
						k := e.proxy.inject(r)
						mu.Lock()
						kinds[k]++
						mu.Unlock()
						time.Sleep(time.Duration(10+r.IntN(30)) * time.Millisecond)
					}
				}()
			}
			go func() { fwg.Wait(); close(faultsDone) }()
			sent := make([][2]int, len(es)) // per edge: edge->cloud, cloud->edge
			for i, e := range es {
				wg.Add(2)
				go func() { // edge -> cloud
					defer wg.Done()
					for n := 0; ; n++ {
						select {
						case <-faultsDone:
							sent[i][0] = n
							return
						case <-time.After(3 * time.Millisecond):
						}
						if _, err := e.run.edge.Report(dev(e.node+"-cam"), fmt.Sprintf("p%05d", n), intValue(int64(n)), time.Now()); err != nil {
							t.Error(err)
						}
					}
				}()
				go func() { // cloud -> edge
					defer wg.Done()
					for n := 0; ; n++ {
						select {
						case <-faultsDone:
							sent[i][1] = n
							return
						case <-time.After(3 * time.Millisecond):
						}
						if err := sendDesired(ctx, hub.hub, e.node, int64(n)); err != nil {
							t.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			for i, e := range es {
				waitFor(t, 20*time.Second, e.node+" edge->cloud", func() error { return exactly(cloudGot.get(e.node), sent[i][0]) })
				waitFor(t, 20*time.Second, e.node+" cloud->edge", func() error { return exactly(edgeGot.get(e.node), sent[i][1]) })
			}
			t.Logf("%s: faults %v; messages per edge (edge->cloud, cloud->edge) %v", transport, kinds, sent)
		})
	}
}

// TestEdgeRestartWhileOffline: an edge that cannot reach the cloud keeps
// what it reports in its store; restarted while still offline, it resends
// it all once the cloud is back. Values of one property coalesce while
// offline, and a full store drops the oldest and counts them.
func TestEdgeRestartWhileOffline(t *testing.T) {
	c := newCluster(t)
	logs := &logBuf{}
	cloudGot := newRecorder()
	hub := startHub(t, c, "127.0.0.1:0", "", cloudGot, logs)
	p := newProxy(t, link.WebSocket, hub).(tcpFaults)
	p.Blackhole(true)
	dir := t.TempDir()
	d, _ := link.NewDialer(link.WebSocket, p.Addr(), c.clientTLS(t, c.ca, "edge"))
	e1 := startEdge(t, "edge", d, dir, newRecorder(), logs, nil)
	for i := range 50 {
		if _, err := e1.edge.Report(dev("edge-cam"), fmt.Sprintf("p%05d", i), intValue(int64(i)), time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	// 1000 readings of one property while offline keep only the latest.
	for i := range 1000 {
		if _, err := e1.edge.Report(dev("edge-cam"), "temperature", intValue(int64(50+i)), time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	if n := e1.edge.Pending(); n != 51 {
		t.Fatalf("pending %d, want 51 (50 properties + 1 coalesced)", n)
	}
	e1.stop() // the store is closed; nothing was ever acknowledged

	e2 := startEdge(t, "edge", d, dir, newRecorder(), logs, nil)
	if n := e2.edge.Pending(); n != 51 {
		t.Fatalf("after restart pending %d, want 51", n)
	}
	p.Blackhole(false)
	want := make([]int64, 51)
	for i := range want {
		want[i] = int64(i)
	}
	want[50] = 1049
	waitFor(t, 10*time.Second, "resent after restart", func() error {
		got := cloudGot.get("edge")
		if fmt.Sprint(got) != fmt.Sprint(want) {
			return fmt.Errorf("got %d values, last %v", len(got), got[max(0, len(got)-3):])
		}
		if e2.edge.Pending() != 0 {
			return fmt.Errorf("%d still pending", e2.edge.Pending())
		}
		return nil
	})
	e2.stop()

	// A bounded store drops the oldest when full, and counts them.
	reg := prometheus.NewRegistry()
	e3, err := edgehub.New(edgehub.Config{Node: "edge2", Dialer: d, StateDir: t.TempDir(), StoreMaxEntries: 10, NoSync: true}, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	defer e3.Close()
	for i := range 25 {
		if _, err := e3.Report(dev("edge2-cam"), fmt.Sprintf("p%d", i), intValue(int64(i)), time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	if n := e3.Pending(); n != 10 {
		t.Fatalf("bounded store holds %d, want 10", n)
	}
	if n := promtest.Sum(t, reg, "dowse_edgehub_dropped_messages_total", nil); n != 15 {
		t.Fatalf("dropped %v, want 15", n)
	}
}

// TestCloudRestart: the hub stops and starts again on the same addresses;
// the edges reconnect and nothing sent is lost.
func TestCloudRestart(t *testing.T) {
	for _, transport := range []string{link.WebSocket, link.QUIC} {
		t.Run(transport, func(t *testing.T) {
			t.Parallel()
			c := newCluster(t)
			logs := &logBuf{}
			cloudGot, edgeGot := newRecorder(), newRecorder()
			hub := startHub(t, c, "127.0.0.1:0", "127.0.0.1:0", cloudGot, logs)
			ws, q := hub.hub.Addrs()
			d, _ := link.NewDialer(transport, hub.addr(transport), c.clientTLS(t, c.ca, "edge"))
			e := startEdge(t, "edge", d, t.TempDir(), edgeGot, logs, nil)
			report := func(from, to int) {
				for i := from; i < to; i++ {
					if _, err := e.edge.Report(dev("edge-cam"), fmt.Sprintf("p%05d", i), intValue(int64(i)), time.Now()); err != nil {
						t.Fatal(err)
					}
				}
			}
			report(0, 100)
			waitFor(t, 10*time.Second, "before restart", func() error { return exactly(cloudGot.get("edge"), 100) })
			for i := range 20 {
				if err := sendDesired(context.Background(), hub.hub, "edge", int64(i)); err != nil {
					t.Fatal(err)
				}
			}
			waitFor(t, 10*time.Second, "desired before restart", func() error { return exactly(edgeGot.get("edge"), 20) })

			hub.stop()
			report(100, 200) // while the cloud is down
			hub2 := startHub(t, c, ws.String(), q.String(), cloudGot, logs)
			waitFor(t, 10*time.Second, "after restart", func() error { return exactly(cloudGot.get("edge"), 200) })
			// The new hub starts a new stream; the edge takes it from the start.
			for i := 20; i < 40; i++ {
				if err := sendDesired(context.Background(), hub2.hub, "edge", int64(i)); err != nil {
					t.Fatal(err)
				}
			}
			waitFor(t, 10*time.Second, "desired after restart", func() error { return exactly(edgeGot.get("edge"), 40) })
		})
	}
}

// TestCloudRestartsMidStream: the hub is stopped five times while an edge
// streams readings. An application that keeps the stream position with its
// effect (cloudhub.Positions) gets each reading exactly once, in order,
// although the edge resends what the stopped hub had taken but not acked.
func TestCloudRestartsMidStream(t *testing.T) {
	for _, transport := range []string{link.WebSocket, link.QUIC} {
		t.Run(transport, func(t *testing.T) {
			t.Parallel()
			c := newCluster(t)
			logs := &logBuf{}
			cloudGot := newRecorder()
			positions := func(cfg *cloudhub.Config) { cfg.Positions = cloudGot }
			hub := startHub(t, c, "127.0.0.1:0", "127.0.0.1:0", cloudGot, logs, positions)
			ws, q := hub.hub.Addrs()
			d, _ := link.NewDialer(transport, hub.addr(transport), c.clientTLS(t, c.ca, "edge"))
			e := startEdge(t, "edge", d, t.TempDir(), newRecorder(), logs, func(cfg *edgehub.Config) {
				cfg.BackoffMin, cfg.BackoffMax = 20*time.Millisecond, 100*time.Millisecond
			})
			const total = 3000
			reported := make(chan error, 1)
			go func() {
				for i := range total {
					if _, err := e.edge.Report(dev("edge-cam"), fmt.Sprintf("p%05d", i), intValue(int64(i)), time.Now()); err != nil {
						reported <- err
						return
					}
					if i%2 == 0 {
						time.Sleep(time.Millisecond)
					}
				}
				reported <- nil
			}()
			for k := 1; k <= 5; k++ {
				// Stop while readings are in flight: some were taken but not
				// yet acked.
				waitFor(t, 20*time.Second, "readings flowing", func() error {
					if n := len(cloudGot.get("edge")); n < k*total/6 {
						return fmt.Errorf("%d of %d taken", n, total)
					}
					return nil
				})
				hub.stop()
				hub = startHub(t, c, ws.String(), q.String(), cloudGot, logs, positions)
				time.Sleep(50 * time.Millisecond)
			}
			if err := <-reported; err != nil {
				t.Fatal(err)
			}
			waitFor(t, 20*time.Second, "after the restarts", func() error { return exactly(cloudGot.get("edge"), total) })
			t.Logf("%d readings exactly once across 5 hub restarts; %d restarted hubs resumed at the application's position", total, cloudGot.seeds())
		})
	}
}

// TestEdgeRestartKeepsState: what the edge received (desired values, device
// membership) survives its restart, and nothing it had taken is delivered
// to it again.
func TestEdgeRestartKeepsState(t *testing.T) {
	c := newCluster(t)
	logs := &logBuf{}
	hub := startHub(t, c, "", "127.0.0.1:0", newRecorder(), logs)
	_, q := hub.hub.Addrs()
	d, _ := link.NewDialer(link.QUIC, q.String(), c.clientTLS(t, c.ca, "edge"))
	dir := t.TempDir()
	got1 := newRecorder()
	e1 := startEdge(t, "edge", d, dir, got1, logs, nil)
	for i := range 10 {
		if err := sendDesired(context.Background(), hub.hub, "edge", int64(i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := hub.hub.Send("edge", &linkv1.Envelope{Kind: &linkv1.Envelope_DeviceMembership{DeviceMembership: &linkv1.DeviceMembership{
		Node: "edge", Devices: []*linkv1.DeviceRef{dev("edge-cam"), dev("edge-plc")}}}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "first edge", func() error { return exactly(got1.get("edge"), 10) })
	waitFor(t, 10*time.Second, "membership", func() error {
		if m, _ := e1.edge.Membership(); len(m.GetDevices()) != 2 {
			return fmt.Errorf("membership %v", m)
		}
		return nil
	})
	e1.stop()

	got2 := newRecorder()
	e2 := startEdge(t, "edge", d, dir, got2, logs, nil)
	if d, err := e2.edge.Device(dev("edge-cam")); err != nil || len(d.GetProperties()) != 1 || d.GetProperties()[0].GetDesired().GetValue() != "9" {
		t.Fatalf("desired after restart: %v %v", d, err)
	}
	if m, err := e2.edge.Membership(); err != nil || len(m.GetDevices()) != 2 {
		t.Fatalf("membership after restart: %v %v", m, err)
	}
	for i := 10; i < 20; i++ {
		if err := sendDesired(context.Background(), hub.hub, "edge", int64(i)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 10*time.Second, "second edge", func() error {
		got := got2.get("edge")
		if len(got) != 10 || got[0] != 10 || got[9] != 19 {
			return fmt.Errorf("restarted edge got %v, want 10..19 only", got)
		}
		return nil
	})
}

// TestDeadPeerDetected: when the network silently drops everything, both
// ends notice within two heartbeat intervals (plus scheduling slack).
func TestDeadPeerDetected(t *testing.T) {
	for _, transport := range []string{link.WebSocket, link.QUIC} {
		t.Run(transport, func(t *testing.T) {
			c := newCluster(t)
			logs := &logBuf{}
			hub := startHub(t, c, "127.0.0.1:0", "127.0.0.1:0", newRecorder(), logs)
			p := newProxy(t, transport, hub)
			d, _ := link.NewDialer(transport, p.Addr(), c.clientTLS(t, c.ca, "edge"))
			e := startEdge(t, "edge", d, t.TempDir(), newRecorder(), logs, nil)
			waitFor(t, 15*time.Second, "connected", func() error {
				if len(hub.hub.Connected()) != 1 || !e.edge.Connected() {
					return fmt.Errorf("not connected")
				}
				return nil
			})
			switch p := p.(type) {
			case tcpFaults:
				p.Blackhole(true)
			case udpFaults:
				p.Blackhole(true)
			}
			start := time.Now()
			var hubSaw, edgeSaw time.Duration
			for (hubSaw == 0 || edgeSaw == 0) && time.Since(start) < 2*time.Second {
				if hubSaw == 0 && len(hub.hub.Connected()) == 0 {
					hubSaw = time.Since(start)
				}
				if edgeSaw == 0 && !e.edge.Connected() {
					edgeSaw = time.Since(start)
				}
				time.Sleep(2 * time.Millisecond)
			}
			t.Logf("heartbeat %s: hub noticed after %s, edge after %s", heartbeat, hubSaw, edgeSaw)
			limit := 2*heartbeat + 60*time.Millisecond
			if hubSaw == 0 || hubSaw > limit || edgeSaw == 0 || edgeSaw > limit {
				t.Fatalf("dead peer noticed after %s (hub) and %s (edge), want within %s", hubSaw, edgeSaw, limit)
			}
		})
	}
}
