package link

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/dowse-dev/dowse/internal/link/pki"
	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
)

// TestQUICTwinsAheadOfAGrowingStream: over a real QUIC connection on
// loopback, one stream's receive window grows as over WebSocket (a QUIC
// connection once kept it at DefaultStreamWindow), and twin messages sent
// while that stream carries a bulk transfer wait behind no more stream
// data than the bound on data in flight lets out, plus one data frame:
// counted as the bytes of stream data the edge read off the connection
// between the twin's enqueue and its delivery, a ratio to the bound (not
// timed).
func TestQUICTwinsAheadOfAGrowingStream(t *testing.T) {
	ca, err := pki.NewCA("quic-twins-test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := ca.IssueServer([]string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	node, err := ca.IssueNode("edge", "", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	l, err := ListenQUIC("127.0.0.1:0", pki.ServerTLSConfig(pki.Static[*tls.ClientHelloInfo](srv), ca.Pool()), ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}

	// A target that reads as fast as it can.
	sink, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sink.Close() })
	go func() {
		for {
			c, err := sink.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(io.Discard, c); _ = c.Close() }()
		}
	}()

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })

	// The edge: the QUIC server end here, serving streams, delivering twins.
	var d net.Dialer
	edge := NewStreams(func(ctx context.Context, target string) (net.Conn, error) { return d.DialContext(ctx, "tcp", target) })
	delivered := make(chan uint64, 1) // the stream data the edge had read when a twin came
	wg.Go(func() {
		_ = l.Serve(ctx, func(c Conn) {
			_ = RunConn(ctx, NewFramed(c, 0), NewSession(SessionConfig{}), &ConnConfig{Heartbeat: time.Minute, Streams: edge,
				Deliver: func(_ context.Context, env *linkv1.Envelope) error {
					if env.GetTwinReported() != nil {
						edge.mu.Lock()
						delivered <- edge.received
						edge.mu.Unlock()
					}
					return nil
				}})
		})
	})

	// The cloud: dials, opens the stream, sends twins.
	dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
	c, err := (&QUICDialer{Addr: l.Addr().String(), TLS: pki.ClientTLSConfig(pki.Static[*tls.CertificateRequestInfo](node), ca.Pool(), "127.0.0.1")}).Dial(dctx)
	dcancel()
	if err != nil {
		t.Fatal(err)
	}
	cloud := NewStreams(nil)
	cloudSess := NewSession(SessionConfig{})
	wg.Go(func() {
		_ = RunConn(ctx, NewFramed(c, 0), cloudSess, &ConnConfig{Heartbeat: time.Minute, Streams: cloud,
			Deliver: func(context.Context, *linkv1.Envelope) error { return nil }})
	})
	st, err := cloud.Open(ctx, sink.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	const total = 256 << 20
	wg.Go(func() {
		defer st.Close()
		_, _ = st.Write(make([]byte, total))
	})
	received := func() uint64 {
		edge.mu.Lock()
		defer edge.mu.Unlock()
		return edge.received
	}
	// A quiet link first (no twins): the window grows.
	waitFor(t, func() bool { return received() >= 16<<20 }, "16 MiB of the transfer to reach the edge")

	// Twins one after another while the transfer runs. The first one after
	// the quiet spell may wait behind the looser quiet bound; from then
	// on twins flow and the bound is the tight one.
	worst, worstBound, twins := 0.0, 0, 0
	for i := range 40 {
		_, bound := cloud.InFlight()
		before := received()
		if _, _, err := cloudSess.Enqueue(twinReported(0, "cam", "p", int64(i)), ""); err != nil {
			t.Fatal(err)
		}
		var at uint64
		select {
		case at = <-delivered:
		case <-time.After(10 * time.Second):
			t.Fatalf("twin %d not delivered during the transfer", i)
		}
		if _, b := cloud.InFlight(); b > bound {
			bound = b
		}
		if at >= total {
			t.Fatalf("the transfer ended before twin %d: raise its size", i)
		}
		if i == 0 {
			continue
		}
		ahead := int(at - before)
		if r := float64(ahead) / float64(bound+MaxStreamData); r > worst {
			worst, worstBound = r, bound
		}
		twins++
	}
	t.Logf("%d twins during the transfer: the most stream data ahead of one, ÷ (its bound + a frame): %.2f (bound %d)", twins, worst, worstBound)
	if worst > 1 {
		t.Fatalf("a twin waited behind %.2f times the bound on stream data in flight plus one frame (bound %d)", worst, worstBound)
	}
	edge.mu.Lock()
	growths, grown, grants := edge.growths, edge.grown, edge.grants
	edge.mu.Unlock()
	if growths == 0 {
		t.Fatalf("the stream's receive window did not grow over QUIC (%d grants)", grants)
	}
	t.Logf("the edge's window grew %d times, by %d bytes", growths, grown)
}
