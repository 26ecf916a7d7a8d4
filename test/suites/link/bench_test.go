package link_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/dowse-dev/dowse/internal/agent/edgehub"
	"github.com/dowse-dev/dowse/internal/controller/link/cloudhub"
	"github.com/dowse-dev/dowse/internal/link"
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
