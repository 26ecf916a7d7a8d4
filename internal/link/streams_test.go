package link

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
)

// streamPair is a cloud and an edge connection over a pipe, each with its
// streams; the edge dials real TCP on loopback.
type streamPair struct {
	cloud, edge         *Streams
	cloudSess, edgeSess *Session
	cloudConn, edgeConn net.Conn
	cloudMetrics        *Metrics
	delivered           chan *linkv1.Envelope
	done                chan error
}

func startStreams(t *testing.T) *streamPair {
	t.Helper()
	var d net.Dialer
	p := &streamPair{
		cloud: NewStreams(nil),
		edge: NewStreams(func(ctx context.Context, target string) (net.Conn, error) {
			return d.DialContext(ctx, "tcp", target)
		}),
		cloudSess: NewSession(SessionConfig{}),
		edgeSess:  NewSession(SessionConfig{}),
		delivered: make(chan *linkv1.Envelope, 1024),
		done:      make(chan error, 2),
	}
	p.cloudMetrics = NewMetrics(prometheus.NewRegistry(), "test")
	p.cloudConn, p.edgeConn = net.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	deliver := func(_ context.Context, env *linkv1.Envelope) error {
		p.delivered <- env
		return nil
	}
	go func() {
		p.done <- RunConn(ctx, NewFramed(pipeConn{p.cloudConn}, 0), p.cloudSess, &ConnConfig{Heartbeat: time.Minute, Deliver: deliver, Streams: p.cloud, Metrics: p.cloudMetrics})
	}()
	go func() {
		p.done <- RunConn(ctx, NewFramed(pipeConn{p.edgeConn}, 0), p.edgeSess, &ConnConfig{Heartbeat: time.Minute, Deliver: deliver, Streams: p.edge})
	}()
	t.Cleanup(func() {
		cancel()
		<-p.done
		<-p.done
	})
	return p
}

// echoServer echoes each connection on loopback and closes its side after
// the peer's end of stream; conns gets each accepted connection.
func echoServer(t *testing.T) (addr string, conns chan net.Conn) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	conns = make(chan net.Conn, 16)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns <- c
			go func() {
				_, _ = io.Copy(c, c)
				_ = c.(*net.TCPConn).CloseWrite()
			}()
		}
	}()
	return l.Addr().String(), conns
}

func randomBytes(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// roundTrip sends data through st to an echo server and reads it back to
// the end of stream.
func roundTrip(t *testing.T, st *Stream, data []byte) {
	t.Helper()
	errs := make(chan error, 1)
	go func() {
		_, err := st.Write(data)
		if err == nil {
			err = st.CloseWrite()
		}
		errs <- err
	}()
	got, err := io.ReadAll(st)
	if err != nil {
		t.Fatalf("stream %d: reading back: %v", st.ID(), err)
	}
	if err := <-errs; err != nil {
		t.Fatalf("stream %d: writing: %v", st.ID(), err)
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("stream %d: %d bytes back, want the %d sent", st.ID(), len(got), len(data))
	}
	_ = st.Close()
}

// TestStreamsCarryBytesBothWays: streams the cloud opens reach a TCP
// server through the edge, several at once, each byte back in order, the
// end of stream passed on both ways; then both sides forget them.
func TestStreamsCarryBytesBothWays(t *testing.T) {
	p := startStreams(t)
	addr, _ := echoServer(t)
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			st, err := p.cloud.Open(t.Context(), addr)
			if err != nil {
				t.Error(err)
				return
			}
			roundTrip(t, st, randomBytes(t, (i+1)*700<<10))
		})
	}
	wg.Wait()
	waitFor(t, func() bool { return p.cloud.Len() == 0 && p.edge.Len() == 0 }, "streams forgotten after both ends closed")
	m := p.cloudMetrics
	sent := float64((1 + 2 + 3 + 4) * 700 << 10)
	if opened, open, reset, out, in := testutil.ToFloat64(m.StreamsOpened), testutil.ToFloat64(m.StreamsOpen), testutil.ToFloat64(m.StreamsReset),
		testutil.ToFloat64(m.StreamBytesOut), testutil.ToFloat64(m.StreamBytesIn); opened != 4 || open != 0 || reset != 0 || out != sent || in != sent {
		t.Errorf("metrics: %v opened, %v open, %v reset, %v bytes out, %v in; want 4, 0, 0, %v, %v", opened, open, reset, out, in, sent, sent)
	}
}

// TestStreamOpenRefused: a target the edge cannot dial resets the stream
// with the dial's error; a side without a dialer refuses every open.
func TestStreamOpenRefused(t *testing.T) {
	p := startStreams(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	_ = l.Close()
	_, err = p.cloud.Open(t.Context(), closed)
	var reset *StreamResetError
	if !errors.As(err, &reset) || !strings.Contains(reset.Reason, "dial "+closed) {
		t.Fatalf("opening a closed port: %v, want a reset naming the dial", err)
	}
	_, err = p.edge.Open(t.Context(), closed)
	if !errors.As(err, &reset) || !strings.Contains(reset.Reason, "serves none") {
		t.Fatalf("the edge opening towards the cloud: %v, want a refusal", err)
	}
	// The link goes on.
	addr, _ := echoServer(t)
	st, err := p.cloud.Open(t.Context(), addr)
	if err != nil {
		t.Fatal(err)
	}
	roundTrip(t, st, []byte("still here"))
}

// TestStreamsBoundAndCounters: an open beyond the bound fails with a
// *TooManyStreamsError naming it, counted as refused at the bound, and an
// open the peer refuses is counted as the peer's refusal; the counters
// follow opened, open, reset and the bytes each way.
func TestStreamsBoundAndCounters(t *testing.T) {
	p := startStreams(t)
	reg := prometheus.NewRegistry()
	refused := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "refused"}, []string{"reason"})
	moved := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "bytes"}, []string{"direction"})
	c := &StreamCounters{Open: prometheus.NewGauge(prometheus.GaugeOpts{Name: "open"}),
		Opened: prometheus.NewCounter(prometheus.CounterOpts{Name: "opened"}), Reset: prometheus.NewCounter(prometheus.CounterOpts{Name: "reset"}),
		RefusedBound: refused.WithLabelValues("bound"), RefusedPeer: refused.WithLabelValues("peer"),
		BytesIn: moved.WithLabelValues("in"), BytesOut: moved.WithLabelValues("out")}
	reg.MustRegister(c.Open, c.Opened, c.Reset, refused, moved)
	p.cloud.SetCounters(c)
	p.cloud.SetLimit(2)
	addr, _ := echoServer(t)
	var held []*Stream
	for range 2 {
		st, err := p.cloud.Open(t.Context(), addr)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, st)
	}
	_, err := p.cloud.Open(t.Context(), addr)
	var bound *TooManyStreamsError
	if !errors.As(err, &bound) || !errors.Is(err, ErrTooManyStreams) || bound.Limit != 2 || !strings.Contains(err.Error(), "2 open") {
		t.Fatalf("a third stream with a bound of 2: %v", err)
	}
	if open, opened, atBound := testutil.ToFloat64(c.Open), testutil.ToFloat64(c.Opened), testutil.ToFloat64(c.RefusedBound); open != 2 || opened != 2 || atBound != 1 {
		t.Fatalf("counters: %v open, %v opened, %v refused at the bound; want 2, 2, 1", open, opened, atBound)
	}
	for _, st := range held {
		roundTrip(t, st, []byte("twelve bytes"))
	}
	waitFor(t, func() bool { return p.cloud.Len() == 0 }, "streams forgotten")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	_ = l.Close()
	if _, err := p.cloud.Open(t.Context(), closed); err == nil {
		t.Fatal("a stream to a closed port opened")
	}
	if open, opened, reset, peer, in, out := testutil.ToFloat64(c.Open), testutil.ToFloat64(c.Opened), testutil.ToFloat64(c.Reset),
		testutil.ToFloat64(c.RefusedPeer), testutil.ToFloat64(c.BytesIn), testutil.ToFloat64(c.BytesOut); open != 0 || opened != 3 || reset != 1 || peer != 1 || in != 24 || out != 24 {
		t.Errorf("counters: %v open, %v opened, %v reset, %v refused by the peer, %v bytes in, %v out; want 0, 3, 1, 1, 24, 24", open, opened, reset, peer, in, out)
	}
}

// TestStreamsEndWithTheLink: a cut ends every stream at both ends with
// ErrLinkLost (the edge closes its dial), never a hang, and no stream
// opens on the ended connection.
func TestStreamsEndWithTheLink(t *testing.T) {
	p := startStreams(t)
	addr, conns := echoServer(t)
	st, err := p.cloud.Open(t.Context(), addr)
	if err != nil {
		t.Fatal(err)
	}
	target := <-conns
	if _, err := st.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(st, buf); err != nil {
		t.Fatal(err)
	}
	_ = p.edgeConn.Close() // the cut
	readErr := make(chan error, 1)
	go func() {
		_, err := st.Read(buf)
		readErr <- err
	}()
	select {
	case err := <-readErr:
		if !errors.Is(err, ErrLinkLost) {
			t.Fatalf("the cloud's read after the cut: %v, want ErrLinkLost", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the cloud's read hangs after the cut")
	}
	if _, err := st.Write([]byte("x")); !errors.Is(err, ErrLinkLost) {
		t.Errorf("a write after the cut: %v, want ErrLinkLost", err)
	}
	// The edge's dial is closed: the target reads its end.
	_ = target.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.Copy(io.Discard, target); err != nil {
		t.Errorf("the target's connection was not closed by the edge: %v", err)
	}
	if _, err := p.cloud.Open(t.Context(), addr); !errors.Is(err, ErrLinkLost) {
		t.Errorf("open on the ended connection: %v, want ErrLinkLost", err)
	}
}

// TestStalledStreamHoldsOnlyItself: a stream whose target reads nothing
// fills its window and waits; another stream on the same link carries its
// bytes meanwhile.
func TestStalledStreamHoldsOnlyItself(t *testing.T) {
	p := startStreams(t)
	// A target that accepts and never reads, its receive buffer small.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_ = c.(*net.TCPConn).SetReadBuffer(4096)
			t.Cleanup(func() { _ = c.Close() })
		}
	}()
	stalled, err := p.cloud.Open(t.Context(), l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = stalled.Write(make([]byte, 64<<20)) }()
	waitFor(t, func() bool {
		p.cloud.mu.Lock()
		defer p.cloud.mu.Unlock()
		return stalled.sendCredit == 0 && len(stalled.send) >= int(p.cloud.window)
	}, "the stalled stream to spend its credit and fill its buffer")

	addr, _ := echoServer(t)
	st, err := p.cloud.Open(t.Context(), addr)
	if err != nil {
		t.Fatal(err)
	}
	roundTrip(t, st, randomBytes(t, 2<<20))
	// And twin messages still flow.
	if _, _, err := p.cloudSess.Enqueue(twinReported(0, "cam", "p", 1), ""); err != nil {
		t.Fatal(err)
	}
	select {
	case env := <-p.delivered:
		if env.GetTwinReported() == nil {
			t.Fatalf("delivered %v", env)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a twin message did not get past the stalled stream")
	}
	_ = stalled.Close()
}

// runWithBarePeer runs a connection with streams (it opens them, serves
// none) until the test ends, and returns its context, its session and the
// other end of its pipe, framed, for the test to speak for the peer.
func runWithBarePeer(t *testing.T, streams *Streams) (context.Context, *Session, *Framed) {
	t.Helper()
	sess := NewSession(SessionConfig{})
	ours, theirs := net.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- RunConn(ctx, NewFramed(pipeConn{ours}, 0), sess, &ConnConfig{Heartbeat: time.Minute, Streams: streams,
			Deliver: func(context.Context, *linkv1.Envelope) error { return nil }})
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return ctx, sess, NewFramed(pipeConn{theirs}, 0)
}

// TestTwinsGoAheadOfStreamData: a message queued while a stream carries a
// bulk transfer is written before the stream's next write's worth of data
// (counted on the wire, not timed).
func TestTwinsGoAheadOfStreamData(t *testing.T) {
	streams := NewStreams(nil)
	ctx, sess, peer := runWithBarePeer(t, streams)
	opened := make(chan *Stream, 1)
	go func() {
		st, err := streams.Open(ctx, "plc:502")
		if err != nil {
			t.Error(err)
		}
		opened <- st
	}()
	var env linkv1.Envelope
	for env.GetStreamOpen() == nil {
		if _, err := peer.Read(&env); err != nil {
			t.Fatal(err)
		}
	}
	id := env.GetStreamOpen().Id
	// The peer takes 64 MiB: credit is never what holds the stream up;
	// it sends no receipts (as a peer from before them), so the data in
	// flight is not bounded either (more than 1 MiB goes out below).
	if err := peer.Write(&linkv1.Envelope{Kind: &linkv1.Envelope_StreamWindow{StreamWindow: &linkv1.StreamWindow{Id: id, Credit: 64 << 20}}}); err != nil {
		t.Fatal(err)
	}
	st := <-opened
	go func() { _, _ = st.Write(make([]byte, 32<<20)) }()

	streamBytes, after := 0, -1
	for {
		var env linkv1.Envelope
		if _, err := peer.Read(&env); err != nil {
			t.Fatal(err)
		}
		switch {
		case env.GetStreamData() != nil:
			streamBytes += len(env.GetStreamData().Data)
			if after >= 0 {
				after += len(env.GetStreamData().Data)
			}
			if streamBytes >= 1<<20 && after < 0 {
				after = 0
				if _, _, err := sess.Enqueue(twinReported(0, "cam", "p", 1), ""); err != nil {
					t.Fatal(err)
				}
			}
		case env.GetTwinReported() != nil:
			// What was framed before the message came, at most two writes.
			if after > 2*(streamBudget+MaxStreamData) {
				t.Fatalf("the twin message waited behind %d bytes of stream data", after)
			}
			t.Logf("the twin message came after %d bytes of stream data queued before it", after)
			return
		}
		if streamBytes > 16<<20 {
			t.Fatalf("no twin message within %d bytes of stream data", streamBytes)
		}
	}
}

// waitFor polls cond for up to 10 s.
func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// FuzzStreamFrames: any sequence of stream frames from a peer (opens,
// data beyond credit, windows, closes and resets of any id) leaves every
// stream's buffer within the window granted, never panics, and the
// streams all end with the connection.
func FuzzStreamFrames(f *testing.F) {
	f.Add([]byte{0, 1, 1, 1, 5, 2, 1, 9, 3, 1, 4, 1})
	f.Add([]byte{1, 2, 200, 2, 2, 0, 4, 2, 0, 1, 1})
	f.Fuzz(func(t *testing.T, ops []byte) {
		refused := errors.New("no target here")
		s := NewStreams(func(context.Context, string) (net.Conn, error) { return nil, refused })
		opener := NewStreams(nil)
		s.attach(func() {}, nil)
		opener.attach(func() {}, nil)
		for len(ops) >= 3 {
			kind, id, n := ops[0]%5, uint64(ops[1]%4)+1, int(ops[2])
			ops = ops[3:]
			var env *linkv1.Envelope
			switch kind {
			case 0:
				env = &linkv1.Envelope{Kind: &linkv1.Envelope_StreamOpen{StreamOpen: &linkv1.StreamOpen{Id: id, Target: "t:1", Window: uint32(n) << 10}}}
			case 1:
				env = &linkv1.Envelope{Kind: &linkv1.Envelope_StreamData{StreamData: &linkv1.StreamData{Id: id, Data: make([]byte, n<<7)}}}
			case 2:
				env = &linkv1.Envelope{Kind: &linkv1.Envelope_StreamWindow{StreamWindow: &linkv1.StreamWindow{Id: id, Credit: uint32(n) << 24}}}
			case 3:
				env = &linkv1.Envelope{Kind: &linkv1.Envelope_StreamClose{StreamClose: &linkv1.StreamClose{Id: id}}}
			case 4:
				env = &linkv1.Envelope{Kind: &linkv1.Envelope_StreamReset{StreamReset: &linkv1.StreamReset{Id: id, Reason: "r"}}}
			}
			s.handle(t.Context(), env)
			opener.handle(t.Context(), env)
			for _, x := range []*Streams{s, opener} {
				x.mu.Lock()
				for _, st := range x.streams {
					if st.recvLen > st.window || st.recvLimit < 0 || st.sendCredit > 1<<30 {
						x.mu.Unlock()
						t.Fatalf("stream %d holds %d bytes, may take %d more, credit %d", st.id, st.recvLen, st.recvLimit, st.sendCredit)
					}
				}
				x.mu.Unlock()
			}
			if _, _, _, err := s.appendFrames(nil, 0, 1<<20); err != nil {
				t.Fatal(err)
			}
		}
		s.end(nil)
		opener.end(nil)
		if s.Len() != 0 || opener.Len() != 0 {
			t.Fatal("streams outlive their connection")
		}
	})
}

// TestStreamDataInFlightBounded: a side sends receipts for the stream data
// it reads (every byte, also of a stream it does not know), and once the
// peer sends receipts it keeps the data it has written and the peer has
// not receipted within the bound, so that a twin message queued meanwhile
// goes out ahead of the data held back (counted on the wire, not timed).
func TestStreamDataInFlightBounded(t *testing.T) {
	streams := NewStreams(nil)
	// A clock of its own that stands still: a message once sent keeps
	// the bound tight (quietPeriod) however long the test takes.
	streams.now = func() time.Time { return time.Unix(1000, 0) }
	ctx, sess, peer := runWithBarePeer(t, streams)
	write := func(env *linkv1.Envelope) {
		t.Helper()
		if err := peer.Write(env); err != nil {
			t.Fatal(err)
		}
	}
	// What the peer reads, counted.
	var data, receipted int
	receipt := int64(-1) // the last receipt read
	twins := 0
	read := func() *linkv1.Envelope {
		t.Helper()
		var env linkv1.Envelope
		if _, err := peer.Read(&env); err != nil {
			t.Fatal(err)
		}
		switch {
		case env.GetStreamData() != nil:
			data += len(env.GetStreamData().Data)
		case env.GetStreamReceipt() != nil:
			receipt = int64(env.GetStreamReceipt().Received)
		case env.GetTwinReported() != nil:
			twins++
		}
		return &env
	}
	// sync reads until the replies to two heartbeats: everything the
	// writer did before the second was answered has been read then.
	ping := int64(0)
	sync := func() {
		t.Helper()
		for range 2 {
			ping++
			write(&linkv1.Envelope{Kind: &linkv1.Envelope_Heartbeat{Heartbeat: &linkv1.Heartbeat{SentNanos: ping}}})
			for {
				if hb := read().GetHeartbeat(); hb != nil && hb.Reply && hb.SentNanos == ping {
					break
				}
			}
		}
	}

	// The connection announces its receipts at once, and counts data of a
	// stream it never had.
	sync()
	if receipt != 0 {
		t.Fatalf("no receipt of 0 bytes announced at the start (last receipt %d)", receipt)
	}
	write(&linkv1.Envelope{Kind: &linkv1.Envelope_StreamData{StreamData: &linkv1.StreamData{Id: 99, Data: make([]byte, 1000)}}})
	sync()
	if receipt != 1000 {
		t.Fatalf("receipt %d after 1000 bytes of data read, want 1000", receipt)
	}

	// Twins are in use on the connection: the bound is the tight one.
	if _, _, err := sess.Enqueue(twinReported(0, "cam", "p", 0), ""); err != nil {
		t.Fatal(err)
	}
	for twins == 0 {
		read()
	}
	twins = 0

	// A stream with a bulk transfer and all the credit it could use; the
	// peer announces receipts and withholds them.
	opened := make(chan *Stream, 1)
	go func() {
		st, err := streams.Open(ctx, "plc:502")
		if err != nil {
			t.Error(err)
		}
		opened <- st
	}()
	var open *linkv1.StreamOpen
	for open == nil {
		open = read().GetStreamOpen()
	}
	write(&linkv1.Envelope{Kind: &linkv1.Envelope_StreamReceipt{StreamReceipt: &linkv1.StreamReceipt{}}})
	write(&linkv1.Envelope{Kind: &linkv1.Envelope_StreamWindow{StreamWindow: &linkv1.StreamWindow{Id: open.Id, Credit: 64 << 20}}})
	st := <-opened
	go func() { _, _ = st.Write(make([]byte, 32<<20)) }()
	waitFor(t, func() bool {
		inFlight, _ := streams.InFlight()
		return inFlight > 0
	}, "stream data to go out")
	sync()
	// No round trip measured yet: the bound is the least one.
	if data == 0 || data > MinStreamsInFlight {
		t.Fatalf("%d bytes of stream data written without a receipt, want 1 to %d", data, MinStreamsInFlight)
	}
	if inFlight, limit := streams.InFlight(); inFlight != data || limit != MinStreamsInFlight {
		t.Fatalf("in flight %d (bound %d), the peer read %d (bound %d)", inFlight, limit, data, MinStreamsInFlight)
	}
	// A twin message goes out at once, ahead of the data held back.
	before := data
	if _, _, err := sess.Enqueue(twinReported(0, "cam", "p", 1), ""); err != nil {
		t.Fatal(err)
	}
	for twins == 0 {
		read()
	}
	if data != before {
		t.Fatalf("%d bytes of stream data went out ahead of the twin message, beyond the bound", data-before)
	}

	// A receipt of all of it makes room again, within the bound measured
	// from it: its first round trip delivered at most the data read, so at
	// most twice that (less when the delivery took longer than the round
	// trip, or a millisecond, minRateInterval), and at least the least.
	receipted = data
	write(&linkv1.Envelope{Kind: &linkv1.Envelope_StreamReceipt{StreamReceipt: &linkv1.StreamReceipt{Received: uint64(receipted)}}})
	waitFor(t, func() bool {
		streams.mu.Lock()
		defer streams.mu.Unlock()
		return streams.peerReceived == uint64(receipted)
	}, "the receipt to be taken")
	sync()
	_, limit := streams.InFlight()
	if most := max(2*receipted, MinStreamsInFlight); limit < MinStreamsInFlight || limit > most {
		t.Fatalf("bound %d after the first receipt of %d bytes, want %d to %d", limit, receipted, MinStreamsInFlight, most)
	}
	if data == receipted || data-receipted > limit {
		t.Fatalf("%d bytes of stream data written beyond the receipt, want 1 to %d", data-receipted, limit)
	}
	_ = st.Close()
}

// TestStreamDataInFlightLooseWhileNoMessages: on a connection that has
// carried no sequenced message for quietPeriod the bound on stream data
// in flight is quietGain times as loose (one stream alone runs on); a
// message delivered tightens it at once, and it loosens again a quiet
// period later (counted on the wire and on a clock of the test's own).
func TestStreamDataInFlightLooseWhileNoMessages(t *testing.T) {
	streams := NewStreams(nil)
	var mu sync.Mutex
	now := time.Unix(1000, 0)
	streams.now = func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return now
	}
	ctx, _, peer := runWithBarePeer(t, streams)
	write := func(env *linkv1.Envelope) {
		t.Helper()
		if err := peer.Write(env); err != nil {
			t.Fatal(err)
		}
	}
	// The peer reads on its own goroutine and counts the data.
	var dmu sync.Mutex
	data := 0
	opens := make(chan *linkv1.StreamOpen, 1)
	go func() {
		for {
			var env linkv1.Envelope
			if _, err := peer.Read(&env); err != nil {
				return
			}
			switch {
			case env.GetStreamData() != nil:
				dmu.Lock()
				data += len(env.GetStreamData().Data)
				dmu.Unlock()
			case env.GetStreamOpen() != nil:
				opens <- env.GetStreamOpen()
			}
		}
	}()
	read := func() int {
		dmu.Lock()
		defer dmu.Unlock()
		return data
	}
	opened := make(chan *Stream, 1)
	go func() {
		st, err := streams.Open(ctx, "plc:502")
		if err != nil {
			t.Error(err)
		}
		opened <- st
	}()
	open := <-opens
	write(&linkv1.Envelope{Kind: &linkv1.Envelope_StreamReceipt{StreamReceipt: &linkv1.StreamReceipt{}}})
	write(&linkv1.Envelope{Kind: &linkv1.Envelope_StreamWindow{StreamWindow: &linkv1.StreamWindow{Id: open.Id, Credit: 64 << 20}}})
	st := <-opened
	go func() { _, _ = st.Write(make([]byte, 32<<20)) }()

	// No message yet: the writer goes on to the loose bound, beyond the
	// tight one, and stops there (no receipt comes).
	loose := quietGain * MinStreamsInFlight
	waitFor(t, func() bool { return read() > MinStreamsInFlight }, "stream data beyond the tight bound")
	waitFor(t, func() bool {
		inFlight, _ := streams.InFlight()
		return inFlight > loose-MaxStreamData/2 && read() == inFlight
	}, "the writer to fill the loose bound")
	if inFlight, limit := streams.InFlight(); limit != loose || inFlight > loose {
		t.Fatalf("in flight %d (bound %d) on a quiet connection, want at most the loose bound %d", inFlight, limit, loose)
	}

	// A twin message from the peer, delivered: the bound is tight again.
	write(twinReported(1, "cam", "p", 1))
	waitFor(t, func() bool {
		_, limit := streams.InFlight()
		return limit == MinStreamsInFlight
	}, "the bound to tighten after a delivered message")
	// ... and loose again once the connection was quiet for quietPeriod.
	mu.Lock()
	now = now.Add(quietPeriod)
	mu.Unlock()
	if _, limit := streams.InFlight(); limit != loose {
		t.Fatalf("bound %d a quiet period after the last message, want %d", limit, loose)
	}
	_ = st.Close()
}

// TestStreamSendBufferPooled: a bulk write borrows a pooled send buffer,
// keeps using it as its data goes out (what is left moves to its front),
// and gives it back once all went out; the bytes arrive in order.
func TestStreamSendBufferPooled(t *testing.T) {
	s := NewStreams(nil)
	s.attach(func() {}, nil)
	s.mu.Lock()
	st := s.newStream(1, "t:1")
	st.sendCredit = 1 << 20
	s.mu.Unlock()
	var got []byte
	frame := func(limit int) {
		t.Helper()
		buf, _, _, err := s.appendFrames(nil, 0, limit)
		if err != nil {
			t.Fatal(err)
		}
		for fr := NewFrameReader(bytes.NewReader(buf), DefaultMaxFrame); ; {
			b, err := fr.Next()
			if errors.Is(err, io.EOF) {
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var env linkv1.Envelope
			if err := Decode(b, &env); err != nil {
				t.Fatal(err)
			}
			got = append(got, env.GetStreamData().GetData()...)
		}
	}
	frame(1) // the first receipt, announced at attach
	a, b := randomBytes(t, 48<<10), randomBytes(t, 48<<10)
	if _, err := st.Write(a); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	base := st.sendBase
	s.mu.Unlock()
	if base == nil || cap(*base) != DefaultStreamWindow {
		t.Fatal("a bulk write did not borrow a pooled send buffer")
	}
	frame(1) // one data frame out, 16 KiB left at the buffer's end
	if _, err := st.Write(b); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	if st.sendBase != base || &st.send[0] != &(*base)[0] {
		s.mu.Unlock()
		t.Fatal("the second write left the pooled buffer (its rest was not moved to the front)")
	}
	s.mu.Unlock()
	frame(1 << 20)
	s.mu.Lock()
	if st.sendBase != nil || st.send != nil {
		s.mu.Unlock()
		t.Fatal("the send buffer is still held once all went out")
	}
	s.mu.Unlock()
	if !bytes.Equal(got, append(a, b...)) {
		t.Fatalf("%d bytes arrived, not the %d written in order", len(got), len(a)+len(b))
	}
}
