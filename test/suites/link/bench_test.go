package link_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"runtime"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dowse-dev/dowse/internal/agent/edgehub"
	"github.com/dowse-dev/dowse/internal/controller/link/cloudhub"
	"github.com/dowse-dev/dowse/internal/link"
	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
)

// BenchmarkEdgeReports is what one edge delivers end to end: b.N readings
// reported, each stored in edge.db, sent, handed to the cloud application
// and acknowledged (the store emptied again). With fsync it is what a real
// agent does; without, the link and store work alone.
func BenchmarkEdgeReports(b *testing.B) {
	for _, transport := range []string{link.WebSocket, link.QUIC} {
		for _, noSync := range []bool{false, true} {
			b.Run(fmt.Sprintf("%s/%s", transport, map[bool]string{false: "fsync", true: "nosync"}[noSync]), func(b *testing.B) {
				c := newCluster(b)
				logs := &logBuf{}
				got := newRecorder()
				hub := startHub(b, c, "127.0.0.1:0", "127.0.0.1:0", got, logs, func(cfg *cloudhub.Config) {
					cfg.RateLimit, cfg.RateBurst = 1e9, 1<<30
				})
				d, _ := link.NewDialer(transport, hub.addr(transport), c.clientTLS(b, c.ca, "edge"))
				e := startEdge(b, "edge", d, b.TempDir(), newRecorder(), logs, func(cfg *edgehub.Config) {
					cfg.NoSync, cfg.StoreMaxEntries = noSync, 1<<30
				})
				waitFor(b, 15*time.Second, "connected", func() error {
					if !e.edge.Connected() {
						return fmt.Errorf("not connected")
					}
					return nil
				})
				now := time.Now()
				b.ResetTimer()
				for i := range b.N {
					if _, err := e.edge.Report(dev("edge-cam"), fmt.Sprintf("p%d", i), intValue(int64(i)), now); err != nil {
						b.Fatal(err)
					}
				}
				waitFor(b, time.Minute, "all delivered and acked", func() error {
					if n := len(got.get("edge")); n != b.N {
						return fmt.Errorf("%d of %d delivered", n, b.N)
					}
					if n := e.edge.Pending(); n != 0 {
						return fmt.Errorf("%d not acked", n)
					}
					return nil
				})
				b.StopTimer()
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "reports/s")
			})
		}
	}
}

// BenchmarkTwinRoundTripDuringBulk is a twin's round trip (a desired value
// from the cloud, its reported value back) while the node's link is idle
// and while a stream on it carries a bulk transfer from the cloud at full
// speed: the ratio is the bulk transfer's cost to twins (issue 35's goal:
// at most 2), with the transfer's throughput beside it.
func BenchmarkTwinRoundTripDuringBulk(b *testing.B) {
	for _, transport := range []string{link.WebSocket, link.QUIC} {
		b.Run(transport, func(b *testing.B) {
			c := newCluster(b)
			logs := &logBuf{}
			got := newRecorder()
			hub := startHub(b, c, "127.0.0.1:0", "127.0.0.1:0", got, logs)
			sink, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = sink.Close() })
			go func() {
				for {
					conn, err := sink.Accept()
					if err != nil {
						return
					}
					go func() { _, _ = io.Copy(io.Discard, conn); _ = conn.Close() }()
				}
			}()
			var d net.Dialer
			dl, _ := link.NewDialer(transport, hub.addr(transport), c.clientTLS(b, c.ca, "edge"))
			var e *edgehub.EdgeHub
			e, err = edgehub.New(edgehub.Config{Node: "edge", Dialer: dl, StateDir: b.TempDir(), Heartbeat: time.Second, NoSync: true,
				BackoffMin: 10 * time.Millisecond, BackoffMax: 200 * time.Millisecond,
				Reach: func(ctx context.Context, target string) (net.Conn, error) { return d.DialContext(ctx, "tcp", target) }},
				func(_ context.Context, env *linkv1.Envelope) {
					// The mapper's part: the desired value comes back reported.
					if v, ok := setpoint(env); ok {
						_, _ = e.Report(dev("edge-cam"), "setpoint", intValue(v), time.Now())
					}
				}, prometheus.NewRegistry())
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- e.Start(ctx) }()
			b.Cleanup(func() { cancel(); <-done })
			waitFor(b, 15*time.Second, "connected", func() error {
				if !hub.hub.IsConnected("edge") {
					return fmt.Errorf("not connected")
				}
				return nil
			})
			next := int64(0)
			roundTrips := func(n int) time.Duration {
				var rtts []time.Duration
				for range n {
					next++
					start := time.Now()
					if err := sendDesired(ctx, hub.hub, "edge", next); err != nil {
						b.Fatal(err)
					}
					for deadline := start.Add(30 * time.Second); ; time.Sleep(50 * time.Microsecond) {
						if r := got.get("edge"); len(r) > 0 && r[len(r)-1] == next {
							break
						}
						if time.Now().After(deadline) {
							b.Fatalf("round trip %d never came back", next)
						}
					}
					rtts = append(rtts, time.Since(start))
				}
				slices.Sort(rtts)
				return rtts[len(rtts)/2]
			}
			n := max(b.N, 20)
			roundTrips(5) // warm
			idle := roundTrips(n)

			st, err := hub.hub.OpenStream(ctx, "edge", sink.Addr().String())
			if err != nil {
				b.Fatal(err)
			}
			var sent atomic.Int64
			stop := make(chan struct{})
			bulkDone := make(chan struct{})
			go func() {
				defer close(bulkDone)
				chunk := make([]byte, 64<<10)
				for {
					select {
					case <-stop:
						return
					default:
					}
					w, err := st.Write(chunk)
					sent.Add(int64(w))
					if err != nil {
						return
					}
				}
			}()
			began := time.Now()
			time.Sleep(200 * time.Millisecond) // the transfer at full speed
			busy := roundTrips(n)
			elapsed := time.Since(began)
			close(stop)
			_ = st.Close()
			<-bulkDone
			b.ReportMetric(float64(idle.Microseconds()), "idle-µs/rtt")
			b.ReportMetric(float64(busy.Microseconds()), "bulk-µs/rtt")
			b.ReportMetric(float64(busy)/float64(idle), "bulk/idle")
			b.ReportMetric(float64(sent.Load())/(1<<20)/elapsed.Seconds(), "bulk-MiB/s")
		})
	}
}

// BenchmarkIdleStreams opens 1,000 streams on one edge's link (each to a
// TCP server beside the edge, one round trip each, then idle) and reports
// the memory they hold: the heap of both ends and the test's servers
// together, per stream, so an upper bound of the hub's part.
func BenchmarkIdleStreams(b *testing.B) {
	const streams = 1000
	c := newCluster(b)
	logs := &logBuf{}
	hub := startHub(b, c, "127.0.0.1:0", "", newRecorder(), logs, func(cfg *cloudhub.Config) { cfg.MaxStreamsPerNode = streams })
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = echo.Close() })
	go func() {
		for {
			conn, err := echo.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(conn, conn); _ = conn.Close() }()
		}
	}()
	var d net.Dialer
	dl, _ := link.NewDialer(link.WebSocket, hub.addr(link.WebSocket), c.clientTLS(b, c.ca, "edge"))
	startEdge(b, "edge", dl, b.TempDir(), newRecorder(), logs, func(cfg *edgehub.Config) {
		cfg.Reach = func(ctx context.Context, target string) (net.Conn, error) { return d.DialContext(ctx, "tcp", target) }
	})
	waitFor(b, 15*time.Second, "connected", func() error {
		if !hub.hub.IsConnected("edge") {
			return fmt.Errorf("not connected")
		}
		return nil
	})
	for range b.N {
		runtime.GC()
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		goroutines := runtime.NumGoroutine()
		opened := make([]*link.Stream, 0, streams)
		buf := make([]byte, 4)
		for range streams {
			st, err := hub.hub.OpenStream(context.Background(), "edge", echo.Addr().String())
			if err != nil {
				b.Fatalf("stream %d: %v", len(opened)+1, err)
			}
			if _, err := st.Write([]byte("ping")); err != nil {
				b.Fatal(err)
			}
			if _, err := io.ReadFull(st, buf); err != nil {
				b.Fatal(err)
			}
			opened = append(opened, st)
		}
		runtime.GC()
		var after runtime.MemStats
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapInuse-before.HeapInuse)/streams, "heap-B/stream")
		b.ReportMetric(float64(runtime.NumGoroutine()-goroutines)/streams, "goroutines/stream")
		for _, st := range opened {
			_ = st.Close()
		}
		waitFor(b, 30*time.Second, "streams closed", func() error {
			if n := runtime.NumGoroutine(); n > goroutines+10 {
				return fmt.Errorf("%d goroutines, %d before", n, goroutines)
			}
			return nil
		})
	}
}
