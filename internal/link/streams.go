package link

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
)

// MaxStreamData is the most bytes one StreamData frame carries: a twin
// message waits behind at most a write's worth of such chunks.
const MaxStreamData = 32 << 10

// DefaultStreamWindow is the receive window each side grants a stream: the
// bytes the peer may send before the reader has consumed some. What a
// stream has in flight is what a twin message queued behind it waits for
// on a TCP link, so it is kept near an edge link's bandwidth-delay
// product rather than a data centre's (BenchmarkTwinRoundTripDuringBulk).
const DefaultStreamWindow = 64 << 10

// MaxStreamWindow bounds the receive window a stream grows to (see
// Stream's auto-tuning): one stream fills a link with a bandwidth-delay
// product of window, and the data in flight is bounded to two products at
// most MaxStreamsInFlight, so a larger window would buy that stream nothing.
const MaxStreamWindow = MaxStreamsInFlight / 2

// DefaultWindowGrowth bounds what the receive windows of one connection's
// streams together grow beyond DefaultStreamWindow: the most a node's
// streams may hold for readers that stop, beyond their first windows.
const DefaultWindowGrowth = 16 << 20

// DefaultMaxStreams bounds the streams open at once on one connection.
const DefaultMaxStreams = 1024

// streamBudget bounds the stream data one write of the connection carries
// after its sequenced and control messages on a quiet connection; while
// messages flow a write carries one data frame (appendFrames).
const streamBudget = 96 << 10

// The bound on stream data in flight (written, not yet read by the peer,
// see StreamReceipt): twice the connection's bandwidth-delay product as
// measured from the receipts, within these.
const (
	// MinStreamsInFlight lets a stream run on a link whose round trip
	// is not measured yet or is tiny (loopback, a LAN): one stream's
	// window, so that one stream alone is never held by the bound (16 KiB
	// cost a fifth of the throughput on loopback and bought twins
	// nothing measurable there: test/bench/streams).
	MinStreamsInFlight = 64 << 10
	// MaxStreamsInFlight bounds what a twin waits behind on a fast link
	// with a long round trip (a satellite's 600 ms at 100 Mbit/s needs
	// 7.5 MB: such a link gives up some of the streams' throughput).
	MaxStreamsInFlight = 8 << 20
)

// The bound on stream data in flight is there for the messages (twins)
// that wait behind it. On a connection that has carried no sequenced
// message for quietPeriod nobody waits: the bound is quietGain times as
// loose there (at most MaxStreamsInFlight), which lets one stream alone
// run faster where the measured product is smaller than what the
// connection's round trips take in practice (loopback, busy CPUs). The
// first message after a quiet spell waits behind at most that looser
// bound; it tightens again with that message, both ways (a message
// written or delivered).
const (
	quietPeriod = time.Second
	quietGain   = 8
)

// ErrLinkLost ends every stream of a connection that ended: a byte stream
// cannot resume on the next one.
var ErrLinkLost = errors.New("link lost")

// ErrTooManyStreams: the connection holds as many streams as it may.
var ErrTooManyStreams = errors.New("link: too many streams")

// TooManyStreamsError is an Open refused at the bound: Limit streams are
// open on the connection already. It is ErrTooManyStreams.
type TooManyStreamsError struct{ Limit int }

func (e *TooManyStreamsError) Error() string {
	return fmt.Sprintf("%v: %d open, the most allowed at once", ErrTooManyStreams, e.Limit)
}

// Is makes errors.Is(err, ErrTooManyStreams) true.
func (e *TooManyStreamsError) Is(target error) bool { return target == ErrTooManyStreams }

// StreamCounters count one group of streams (a node's, on the cloud side)
// beside the link end's Metrics, which count every connection's together.
// A nil field is not counted.
type StreamCounters struct {
	// Open streams now, and opened and reset (ended by a reset: refused,
	// abandoned, lost with the link) since the start.
	Open          prometheus.Gauge
	Opened, Reset prometheus.Counter
	// RefusedBound: opens refused here at the bound (SetLimit);
	// RefusedPeer: opens the peer refused (its own bound, a target it does
	// not serve, a failed dial). A refused open is counted reset too when
	// the peer refused it, never opened when refused at the bound.
	RefusedBound, RefusedPeer prometheus.Counter
	// Data bytes received and sent.
	BytesIn, BytesOut prometheus.Counter
}

// StreamResetError is a stream's end when the peer reset it.
type StreamResetError struct{ Reason string }

func (e *StreamResetError) Error() string { return "stream reset by the peer: " + e.Reason }

// StreamDialer serves a StreamOpen on the side that accepts streams (the edge):
// it connects to target or says why not.
type StreamDialer func(ctx context.Context, target string) (net.Conn, error)

// Streams are the byte streams of one connection, multiplexed with its
// messages: one side opens them (Open), the other serves them with its
// StreamDialer. Each stream has credit-based flow control in both directions, so
// a reader that stops holds up its own stream alone; the connection's
// writer takes sequenced and control messages first and stream data after,
// round-robin over the streams that have data and credit. When the
// connection ends, every stream ends with ErrLinkLost.
type Streams struct {
	dial   StreamDialer
	window uint32 // each stream's first receive window
	limit  int
	now    func() time.Time

	// Receive windows grow (Stream.grantLocked): each to at most
	// maxWindow, all of them together by at most growthCap beyond their
	// first windows; grown is what they have grown now.
	maxWindow, growthCap, grown int
	grants, growths             int // StreamWindow grants sent, of them growing a window (tests)

	mu       sync.Mutex
	metrics  *Metrics
	counters *StreamCounters
	wake     func()
	ended    error
	nextID   uint64
	streams  map[uint64]*Stream
	ctrl     []*linkv1.Envelope
	ready    []*Stream

	// Receipts (StreamReceipt) and the bound on data in flight.
	received     uint64 // StreamData bytes read off the connection
	receiptDue   bool   // the peer has not been told received yet
	sent         uint64 // StreamData bytes written to the connection
	peerReceived uint64 // of them, read by the peer (its last receipt)
	bounded      bool   // the peer sends receipts: sent-peerReceived is bounded
	est          bdpEstimate
	maxInFlight  int       // the most sent-peerReceived ever was (tests)
	lastMessage  time.Time // a sequenced message last written or delivered (see quietPeriod)
}

// NewStreams makes the streams of one connection. dial serves the peer's
// opens; nil refuses them (the side that only opens).
func NewStreams(dial StreamDialer) *Streams {
	return &Streams{dial: dial, window: DefaultStreamWindow, limit: DefaultMaxStreams, now: time.Now,
		maxWindow: MaxStreamWindow, growthCap: DefaultWindowGrowth, streams: map[uint64]*Stream{}}
}

// SetWindowGrowth bounds what the streams' receive windows grow to: each
// to at most perStream bytes, all together by at most total beyond their
// first windows (DefaultStreamWindow). perStream <= DefaultStreamWindow
// keeps every window at DefaultStreamWindow, as peers before auto-tuning
// did; 0 keeps a default (MaxStreamWindow, DefaultWindowGrowth). Call
// before the connection runs.
func (s *Streams) SetWindowGrowth(perStream, total int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if perStream != 0 {
		s.maxWindow = perStream
	}
	if total != 0 {
		s.growthCap = total
	}
}

// SetLimit bounds the streams open at once (DefaultMaxStreams when n <= 0):
// an open beyond it fails, a peer's is refused. Call before the connection
// runs.
func (s *Streams) SetLimit(n int) {
	if n <= 0 {
		n = DefaultMaxStreams
	}
	s.mu.Lock()
	s.limit = n
	s.mu.Unlock()
}

// SetCounters counts these streams in c too (a node's counters). Call
// before the connection runs.
func (s *Streams) SetCounters(c *StreamCounters) {
	s.mu.Lock()
	s.counters = c
	s.mu.Unlock()
}

// Each counts in the link end's Metrics and in the counters; s.mu is held.
func (s *Streams) countOpened() {
	if m := s.metrics; m != nil {
		m.StreamsOpened.Inc()
		m.StreamsOpen.Inc()
	}
	if c := s.counters; c != nil {
		inc(c.Opened)
		if c.Open != nil {
			c.Open.Inc()
		}
	}
}

func (s *Streams) countEnded(reset bool) {
	if m := s.metrics; m != nil {
		m.StreamsOpen.Dec()
		if reset {
			m.StreamsReset.Inc()
		}
	}
	if c := s.counters; c != nil {
		if c.Open != nil {
			c.Open.Dec()
		}
		if reset {
			inc(c.Reset)
		}
	}
}

func (s *Streams) countBytes(in bool, n int) {
	m, c := s.metrics, s.counters
	if in {
		if m != nil {
			m.StreamBytesIn.Add(float64(n))
		}
		if c != nil && c.BytesIn != nil {
			c.BytesIn.Add(float64(n))
		}
		return
	}
	if m != nil {
		m.StreamBytesOut.Add(float64(n))
	}
	if c != nil && c.BytesOut != nil {
		c.BytesOut.Add(float64(n))
	}
}

func inc(c prometheus.Counter) {
	if c != nil {
		c.Inc()
	}
}

// attach ties the streams to their running connection.
func (s *Streams) attach(wake func(), m *Metrics) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.wake, s.metrics = wake, m
	// Tell the peer at once that this side sends receipts: it may then
	// bound what it has in flight from its first byte of data.
	s.receiptDue = true
	if m != nil {
		// Streams opened before the connection ran count from now (the
		// counters, set before, counted them already).
		for range s.streams {
			m.StreamsOpened.Inc()
			m.StreamsOpen.Inc()
		}
	}
}

// end ends every stream with ErrLinkLost and refuses new ones.
func (s *Streams) end(cause error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended != nil {
		return
	}
	if cause == nil {
		cause = errors.New("connection closed")
	}
	s.ended = fmt.Errorf("%w: %w", ErrLinkLost, cause)
	for _, st := range s.streams {
		st.fail(s.ended)
		s.forgetLocked(st, true)
	}
	s.ctrl, s.ready = nil, nil
}

// Len is the number of open streams.
func (s *Streams) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.streams)
}

// Open asks the peer to connect to target and returns the stream once it
// did, a *StreamResetError saying why not, or ErrLinkLost.
func (s *Streams) Open(ctx context.Context, target string) (*Stream, error) {
	s.mu.Lock()
	if s.ended != nil {
		s.mu.Unlock()
		return nil, s.ended
	}
	if len(s.streams) >= s.limit {
		if c := s.counters; c != nil {
			inc(c.RefusedBound)
		}
		s.mu.Unlock()
		return nil, &TooManyStreamsError{Limit: s.limit}
	}
	s.nextID++
	st := s.newStream(s.nextID, target)
	st.accepted = make(chan struct{})
	st.recvLimit = int(s.window)
	st.epoch = s.now()
	s.ctrl = append(s.ctrl, &linkv1.Envelope{Kind: &linkv1.Envelope_StreamOpen{StreamOpen: &linkv1.StreamOpen{Id: st.id, Target: target, Window: s.window}}})
	wake := s.wake // nil before the connection runs: its start writes what waits
	s.mu.Unlock()
	if wake != nil {
		wake()
	}
	select {
	case <-st.accepted:
	case <-ctx.Done():
		st.reset("abandoned by its opener: " + context.Cause(ctx).Error())
		return nil, context.Cause(ctx)
	}
	s.mu.Lock()
	err := st.err
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return st, nil
}

// newStream registers a stream; s.mu is held.
func (s *Streams) newStream(id uint64, target string) *Stream {
	st := &Stream{s: s, id: id, target: target, window: int(s.window)}
	st.cond = sync.NewCond(&s.mu)
	s.streams[id] = st
	s.countOpened()
	return st
}

// forgetLocked drops st from the open streams (a reset or both ends
// closed); s.mu is held.
func (s *Streams) forgetLocked(st *Stream, reset bool) {
	if s.streams[st.id] != st {
		return
	}
	delete(s.streams, st.id)
	s.grown -= st.window - int(s.window) // its growth is free for others
	st.window = int(s.window)
	s.countEnded(reset)
}

// handle takes one received stream frame, on the reader's goroutine: it
// never blocks on a stream's reader or a dial. ctx is the connection's:
// dials end with it.
func (s *Streams) handle(ctx context.Context, env *linkv1.Envelope) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended != nil {
		return
	}
	switch k := env.Kind.(type) {
	case *linkv1.Envelope_StreamOpen:
		s.serveOpen(ctx, k.StreamOpen)
	case *linkv1.Envelope_StreamData:
		// Every byte read counts for the receipt, also one dropped: the
		// peer counts what it wrote.
		data := k.StreamData.Data
		s.received += uint64(len(data))
		if !s.receiptDue {
			s.receiptDue = true
			if s.wake != nil {
				s.wake()
			}
		}
		st := s.streams[k.StreamData.Id]
		if st == nil {
			return // reset here before the frame arrived
		}
		switch {
		case len(data) > st.recvLimit:
			st.resetLocked(fmt.Sprintf("flow control: %d bytes sent, %d granted", len(data), st.recvLimit))
		case st.closed:
			st.resetLocked("closed by its reader")
		default:
			// The decoded frame's bytes are the stream's now: no copy.
			st.recvLimit -= len(data)
			st.received += uint64(len(data))
			if len(data) > 0 {
				st.recv = append(st.recv, data)
				st.recvLen += len(data)
			}
			st.sampleLocked()
			st.cond.Broadcast()
			s.countBytes(true, len(data))
		}
	case *linkv1.Envelope_StreamWindow:
		st := s.streams[k.StreamWindow.Id]
		if st == nil {
			return
		}
		st.settleOpen()
		if st.sendCredit+int(k.StreamWindow.Credit) > 1<<30 {
			st.resetLocked("flow control: credit beyond 1 GiB")
			return
		}
		st.sendCredit += int(k.StreamWindow.Credit)
		s.readyLocked(st)
	case *linkv1.Envelope_StreamClose:
		if st := s.streams[k.StreamClose.Id]; st != nil {
			st.recvEOF = true
			st.cond.Broadcast()
			st.doneLocked()
		}
	case *linkv1.Envelope_StreamReceipt:
		s.receiptLocked(k.StreamReceipt.Received, time.Now())
	case *linkv1.Envelope_StreamReset:
		if st := s.streams[k.StreamReset.Id]; st != nil {
			if st.opening() {
				if c := s.counters; c != nil {
					inc(c.RefusedPeer)
				}
			}
			st.fail(&StreamResetError{Reason: k.StreamReset.Reason})
			s.forgetLocked(st, true)
		}
	}
}

// serveOpen dials for a peer's StreamOpen; s.mu is held.
func (s *Streams) serveOpen(ctx context.Context, o *linkv1.StreamOpen) {
	refuse := func(reason string) {
		s.ctrl = append(s.ctrl, &linkv1.Envelope{Kind: &linkv1.Envelope_StreamReset{StreamReset: &linkv1.StreamReset{Id: o.Id, Reason: reason}}})
		s.wake()
	}
	switch {
	case s.dial == nil:
		refuse("this side opens streams, it serves none")
		return
	case s.streams[o.Id] != nil:
		refuse("stream id in use")
		return
	case len(s.streams) >= s.limit:
		refuse(fmt.Sprintf("%d streams open on the connection", s.limit))
		return
	}
	st := s.newStream(o.Id, o.Target)
	st.sendCredit = int(o.Window)
	go func() {
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		conn, err := s.dial(dctx, o.Target)
		cancel()
		s.mu.Lock()
		if err == nil && st.err != nil {
			err = st.err // reset or lost while dialling
		}
		if err != nil {
			if st.err == nil {
				st.resetLocked("dial " + o.Target + ": " + err.Error())
			}
			s.mu.Unlock()
			if conn != nil {
				_ = conn.Close()
			}
			return
		}
		st.recvLimit = int(s.window)
		st.epoch = s.now()
		s.ctrl = append(s.ctrl, &linkv1.Envelope{Kind: &linkv1.Envelope_StreamWindow{StreamWindow: &linkv1.StreamWindow{Id: st.id, Credit: s.window}}})
		s.readyLocked(st)
		s.mu.Unlock()
		s.wake()
		Splice(st, conn)
	}()
}

// readyLocked queues st for the writer (once); s.mu is held.
func (s *Streams) readyLocked(st *Stream) {
	if !st.queued {
		st.queued = true
		s.ready = append(s.ready, st)
	}
	if s.wake != nil {
		s.wake()
	}
}

// receiptLocked takes the peer's receipt: it now bounds what is in
// flight, and the data it read makes room; s.mu is held.
func (s *Streams) receiptLocked(received uint64, now time.Time) {
	s.bounded = true
	if received > s.sent {
		received = s.sent // a peer cannot have read what was never sent
	}
	if received <= s.peerReceived {
		return
	}
	s.est.receipt(received, now)
	s.peerReceived = received
	if len(s.ready) > 0 && s.wake != nil {
		s.wake()
	}
}

// noteMessage tells the streams that the connection wrote or delivered a
// sequenced message now: the bound on data in flight is tight for
// quietPeriod.
func (s *Streams) noteMessage() {
	s.mu.Lock()
	s.lastMessage = s.now()
	s.mu.Unlock()
}

// boundLocked is the bound on stream data in flight now: twice the
// measured product, or quietGain times that while no message was written
// or delivered for quietPeriod; s.mu is held.
func (s *Streams) boundLocked() int {
	limit := s.est.limit()
	if s.quietLocked() {
		limit = min(quietGain*limit, MaxStreamsInFlight)
	}
	return limit
}

// quietLocked says whether the connection carried no sequenced message for
// quietPeriod (see there); s.mu is held.
func (s *Streams) quietLocked() bool {
	return s.lastMessage.IsZero() || s.now().Sub(s.lastMessage) >= quietPeriod
}

// inFlightRoom is the stream data the writer may add now (-1: unbounded,
// the peer sends no receipts) and the size of a data frame; s.mu is held.
func (s *Streams) inFlightRoom() (room, chunk int) {
	if !s.bounded {
		return -1, MaxStreamData
	}
	limit := s.boundLocked()
	// Frames of half the bound (32 KiB at the least bound) keep its
	// room in use while the peer's receipts come back, and cost half the
	// frames a quarter did on a link held at the least bound.
	return limit - int(s.sent-s.peerReceived), min(max(limit/2, 4<<10), MaxStreamData)
}

// InFlight is the stream data written and not yet read by the peer, and
// its bound now (0: unbounded, the peer sends no receipts).
func (s *Streams) InFlight() (inFlight, limit int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.bounded {
		limit = s.boundLocked()
	}
	return int(s.sent - s.peerReceived), limit
}

// appendFrames appends the stream frames waiting (control first, then data
// round-robin) until buf holds limit bytes or the data in flight its bound;
// more says whether some wait that a write makes room for (data held by
// the bound waits for the peer's receipt, which wakes the writer).
func (s *Streams) appendFrames(buf []byte, ack uint64, limit int) (_ []byte, frames int, more bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.receiptDue {
		s.ctrl = append(s.ctrl, &linkv1.Envelope{Kind: &linkv1.Envelope_StreamReceipt{StreamReceipt: &linkv1.StreamReceipt{Received: s.received}}})
		s.receiptDue = false
	}
	for _, c := range s.ctrl {
		c.Version, c.Ack = ProtocolVersion, ack
		if buf, err = AppendFrame(buf, c); err != nil {
			return buf, frames, false, err
		}
		frames++
	}
	s.ctrl = s.ctrl[:0]
	room, chunk := s.inFlightRoom()
	// While messages flow, a write carries one data frame: the writer
	// comes around again and takes any message that came meanwhile first,
	// so that a message waits behind at most one frame being written (as
	// well as the bound's data in flight), on a QUIC stream, which keeps
	// no bound on what is unsent, as on a WebSocket's socket.
	paced := !s.quietLocked()
	sentBefore := s.sent
	defer func() {
		if s.sent > sentBefore {
			s.est.wrote(s.sent, s.peerReceived, time.Now())
			s.maxInFlight = max(s.maxInFlight, int(s.sent-s.peerReceived))
		}
	}()
	for len(s.ready) > 0 {
		if len(buf) >= limit {
			return buf, frames, true, nil
		}
		st := s.ready[0]
		if st.err != nil || s.streams[st.id] != st {
			s.ready = s.ready[1:]
			st.queued = false
			continue
		}
		n := min(len(st.send), st.sendCredit, chunk)
		if room >= 0 && n > room {
			// Held by the bound: a frame smaller than half a chunk waits
			// for more room rather than go out in slivers.
			if n = room; n < chunk/2 {
				return buf, frames, false, nil
			}
		}
		s.ready = s.ready[1:]
		st.queued = false
		if n > 0 {
			env := &linkv1.Envelope{Version: ProtocolVersion, Ack: ack, Kind: &linkv1.Envelope_StreamData{StreamData: &linkv1.StreamData{Id: st.id, Data: st.send[:n]}}}
			if buf, err = AppendFrame(buf, env); err != nil {
				return buf, frames, false, err
			}
			frames++
			st.send = st.send[n:]
			st.releaseSendLocked()
			st.sendCredit -= n
			s.sent += uint64(n)
			if room >= 0 {
				room -= n
			}
			s.countBytes(false, n)
			st.cond.Broadcast() // room for its writer
		}
		if len(st.send) == 0 && st.sendClosed && !st.closeSent {
			env := &linkv1.Envelope{Version: ProtocolVersion, Ack: ack, Kind: &linkv1.Envelope_StreamClose{StreamClose: &linkv1.StreamClose{Id: st.id}}}
			if buf, err = AppendFrame(buf, env); err != nil {
				return buf, frames, false, err
			}
			frames++
			st.closeSent = true
			st.doneLocked()
		}
		if len(st.send) > 0 && st.sendCredit > 0 {
			st.queued = true
			s.ready = append(s.ready, st)
		}
		if n > 0 && paced && len(s.ready) > 0 {
			return buf, frames, true, nil
		}
	}
	return buf, frames, false, nil
}

// Stream is one byte stream on the link, a net.Conn with a half-close
// (CloseWrite). Read and Write may be called from different goroutines;
// deadlines are not supported.
type Stream struct {
	s      *Streams
	id     uint64
	target string
	cond   *sync.Cond // on s.mu

	// Guarded by s.mu.
	accepted  chan struct{} // an opener's, closed by the first grant or the end
	recv      [][]byte      // received, not yet read: the frames' own bytes
	recvLen   int           // bytes in recv
	recvEOF   bool
	recvLimit int // bytes the peer may still send
	consumed  int // read since the last grant

	// Receive window auto-tuning (grantLocked).
	window     int           // the receive window now
	received   uint64        // data bytes received
	epoch      time.Time     // the last grant (or the stream's start)
	rtt        time.Duration // smoothed: a grant until the first byte it allowed
	probe      uint64        // received beyond this came by the grant at probeAt
	probeAt    time.Time     // zero: no grant being timed
	send       []byte
	sendBase   *[]byte // the pooled buffer send lies in (appendSendLocked), nil: none
	sendCredit int
	sendClosed bool
	closeSent  bool
	closed     bool // Close called: reads fail, data received is refused
	queued     bool
	err        error
}

var _ net.Conn = (*Stream)(nil)

// ID is the stream's id on its connection.
func (st *Stream) ID() uint64 { return st.id }

// Target is what the stream was opened to.
func (st *Stream) Target() string { return st.target }

// Read reads the peer's bytes; io.EOF once the peer closed its side.
func (st *Stream) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	st.s.mu.Lock()
	defer st.s.mu.Unlock()
	if err := st.waitLocked(); err != nil {
		return 0, err
	}
	n := 0
	for n < len(p) && len(st.recv) > 0 {
		c := copy(p[n:], st.recv[0])
		n += c
		if st.recv[0] = st.recv[0][c:]; len(st.recv[0]) == 0 {
			st.recv[0] = nil
			st.recv = st.recv[1:]
		}
	}
	st.tookLocked(n)
	return n, nil
}

// WriteTo writes the peer's bytes to w as they come, from the frames they
// came in (one vectored write for all that waits where w takes one, as a
// TCP connection does): io.Copy from a stream needs no copy buffer of its
// own, which an idle stream would hold for its whole life.
func (st *Stream) WriteTo(w io.Writer) (int64, error) {
	var total int64
	var bufs net.Buffers
	for {
		st.s.mu.Lock()
		err := st.waitLocked()
		if err == nil {
			// All of it: the frames are the write's now.
			bufs = append(bufs[:0], st.recv...)
			clear(st.recv)
			st.recv = st.recv[:0]
			st.tookLocked(st.recvLen)
		}
		st.s.mu.Unlock()
		if errors.Is(err, io.EOF) {
			return total, nil
		}
		if err != nil {
			return total, err
		}
		n, err := bufs.WriteTo(w)
		total += n
		if err != nil {
			return total, err
		}
	}
}

// waitLocked waits for the peer's bytes: nil once some are there, io.EOF
// once the peer closed its side and all were read. s.mu is held.
func (st *Stream) waitLocked() error {
	for len(st.recv) == 0 && !st.recvEOF && st.err == nil && !st.closed {
		st.cond.Wait()
	}
	switch {
	case st.closed:
		return net.ErrClosed
	case len(st.recv) > 0:
		return nil
	case st.err != nil:
		return st.err
	}
	return io.EOF
}

// tookLocked accounts n bytes the reader took, granting the peer as much
// again in time. s.mu is held.
func (st *Stream) tookLocked(n int) {
	st.recvLen -= n
	if len(st.recv) == 0 {
		st.recv = nil // let a drained burst's slice go
	}
	st.consumedLocked(n)
}

// ReadFrom sends what r reads, through a small buffer: an idle stream's
// copy holds it while it waits on r.
func (st *Stream) ReadFrom(r io.Reader) (int64, error) {
	buf := make([]byte, 4<<10)
	var total int64
	for {
		n, err := r.Read(buf)
		if n > 0 {
			w, werr := st.Write(buf[:n])
			total += int64(w)
			if werr != nil {
				return total, werr
			}
		}
		if errors.Is(err, io.EOF) {
			return total, nil
		}
		if err != nil {
			return total, err
		}
		if n == len(buf) && len(buf) < MaxStreamData {
			buf = make([]byte, 2*len(buf)) // a busy stream reads more at once
		}
	}
}

// Write queues p for the peer, waiting while the stream's send buffer is
// full (the peer's credit is spent).
func (st *Stream) Write(p []byte) (int, error) {
	s := st.s
	s.mu.Lock()
	defer s.mu.Unlock()
	written := 0
	for len(p) > 0 {
		for len(st.send) >= int(s.window) && st.err == nil && !st.sendClosed {
			st.cond.Wait()
		}
		switch {
		case st.err != nil:
			return written, st.err
		case st.sendClosed:
			return written, net.ErrClosed
		}
		n := min(len(p), int(s.window)-len(st.send))
		st.appendSendLocked(p[:n])
		p = p[n:]
		written += n
		if st.sendCredit > 0 {
			s.readyLocked(st)
		}
	}
	return written, nil
}

// sendBufs are stream send buffers of DefaultStreamWindow bytes, lent to
// a stream from a write of pooledSendMin bytes until what it queued has
// gone out: a bulk transfer reuses the same few buffers instead of
// allocating as its queue moves along, and an idle stream holds none.
var sendBufs = sync.Pool{New: func() any {
	b := make([]byte, DefaultStreamWindow)
	return &b
}}

// pooledSendMin is the least write that borrows a pooled send buffer.
const pooledSendMin = 4 << 10

// appendSendLocked queues p (at most the stream window's room, as Write
// takes it); s.mu is held.
func (st *Stream) appendSendLocked(p []byte) {
	if st.sendBase == nil && len(st.send) == 0 && len(p) >= pooledSendMin && st.s.window == DefaultStreamWindow {
		if b, ok := sendBufs.Get().(*[]byte); ok {
			st.sendBase = b
			st.send = (*b)[:0]
		}
	}
	if base := st.sendBase; base != nil && cap(st.send)-len(st.send) < len(p) {
		if len(st.send)+len(p) > cap(*base) {
			st.sendBase = nil // does not fit: the buffer goes to the collector, not back to the pool
		} else {
			// What went out made room at the front.
			st.send = (*base)[:copy(*base, st.send)]
		}
	}
	st.send = append(st.send, p...)
}

// releaseSendLocked returns the pooled send buffer once all it held went
// out (copied into the connection's write); s.mu is held.
func (st *Stream) releaseSendLocked() {
	if len(st.send) == 0 && st.sendBase != nil {
		sendBufs.Put(st.sendBase)
		st.send, st.sendBase = nil, nil
	}
}

// consumedLocked grants the peer what the reader took, once it is half a
// window; s.mu is held.
func (st *Stream) consumedLocked(n int) {
	st.consumed += n
	if st.consumed >= st.window/2 && st.err == nil && !st.recvEOF {
		st.grantLocked()
	}
}

// grantLocked grants the peer what the reader consumed, and grows the
// stream's receive window when the window, not the reader, holds the
// stream back (HTTP/2's and QUIC's receive-window auto-tuning): when the
// reader took this part of its window in less than two round trips' worth
// of time (2 x rtt x consumed/window), a reader as fast as that would
// wait for the peer's data within the next round trip, so the window
// doubles, up to s.maxWindow and within what the connection's windows
// may grow together (s.growthCap). The round trip is a grant's: from a
// grant until the first byte that only it allowed arrives (the peer's
// reaction included), smoothed. A window never shrinks while its stream
// lives; its growth returns to the connection when the stream ends. Only
// credit changes, so a peer that does not know of auto-tuning is served
// the same way. s.mu is held.
func (st *Stream) grantLocked() {
	s := st.s
	now := s.now()
	credit := st.consumed
	if st.rtt > 0 && now.Sub(st.epoch) < time.Duration(2*float64(st.rtt)*float64(st.consumed)/float64(st.window)) {
		grow := min(st.window, s.maxWindow-st.window, s.growthCap-s.grown)
		if grow > 0 {
			st.window += grow
			s.grown += grow
			credit += grow
			s.growths++
		}
	}
	st.epoch = now
	if st.probeAt.IsZero() && st.recvLimit < st.window/4 {
		// Time this grant: bytes beyond what the peer may send now come
		// by it. Only when the peer has spent most of its credit: else
		// those bytes would wait behind the rest of it on their way.
		st.probe, st.probeAt = st.received+uint64(st.recvLimit), now
	}
	st.recvLimit += credit
	st.consumed = 0
	s.grants++
	s.ctrl = append(s.ctrl, &linkv1.Envelope{Kind: &linkv1.Envelope_StreamWindow{StreamWindow: &linkv1.StreamWindow{Id: st.id, Credit: uint32(credit)}}})
	if s.wake != nil {
		s.wake()
	}
}

// sampleLocked takes a grant's round trip once data it allowed arrived;
// s.mu is held.
func (st *Stream) sampleLocked() {
	if st.probeAt.IsZero() || st.received <= st.probe {
		return
	}
	rtt := max(st.s.now().Sub(st.probeAt), time.Microsecond)
	st.probeAt = time.Time{}
	if st.rtt == 0 {
		st.rtt = rtt
	} else {
		st.rtt += (rtt - st.rtt) / 8
	}
}

// CloseWrite sends the peer an end of stream once what was written has
// gone; reading goes on.
func (st *Stream) CloseWrite() error {
	s := st.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if st.err != nil {
		return st.err
	}
	st.sendClosed = true
	st.cond.Broadcast()
	s.readyLocked(st)
	return nil
}

// Close ends this side: what was written still goes, then the end of
// stream; reads end, and data the peer still sends resets the stream.
func (st *Stream) Close() error {
	s := st.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if st.closed {
		return nil
	}
	st.closed = true
	st.recv, st.recvLen = nil, 0
	st.cond.Broadcast()
	if st.err != nil {
		return nil
	}
	st.sendClosed = true
	s.readyLocked(st)
	st.doneLocked()
	return nil
}

// reset ends the stream both ways, telling the peer why.
func (st *Stream) reset(reason string) {
	st.s.mu.Lock()
	defer st.s.mu.Unlock()
	st.resetLocked(reason)
}

func (st *Stream) resetLocked(reason string) {
	s := st.s
	if st.err != nil {
		return
	}
	st.fail(fmt.Errorf("stream reset: %s", reason))
	s.forgetLocked(st, true)
	s.ctrl = append(s.ctrl, &linkv1.Envelope{Kind: &linkv1.Envelope_StreamReset{StreamReset: &linkv1.StreamReset{Id: st.id, Reason: reason}}})
	if s.wake != nil {
		s.wake()
	}
}

// fail ends the stream locally with err; s.mu is held.
func (st *Stream) fail(err error) {
	if st.err == nil {
		st.err = err
	}
	st.send, st.sendBase = nil, nil
	st.settleOpen()
	st.cond.Broadcast()
}

// opening says whether st is an opener's stream not yet accepted; s.mu
// is held.
func (st *Stream) opening() bool {
	if st.accepted == nil {
		return false
	}
	select {
	case <-st.accepted:
		return false
	default:
		return true
	}
}

// settleOpen ends an opener's wait (accepted or failed), once; s.mu is
// held.
func (st *Stream) settleOpen() {
	if st.accepted == nil {
		return
	}
	select {
	case <-st.accepted:
	default:
		close(st.accepted)
	}
}

// doneLocked forgets the stream once both sides closed (or this one did
// and reads no more); s.mu is held.
func (st *Stream) doneLocked() {
	if st.closeSent && (st.recvEOF || st.closed) {
		st.s.forgetLocked(st, false)
	}
}

// LocalAddr and RemoteAddr name the stream; deadlines are not supported.
func (st *Stream) LocalAddr() net.Addr { return streamAddr(fmt.Sprintf("link-stream-%d", st.id)) }

// RemoteAddr is the target the stream was opened to.
func (st *Stream) RemoteAddr() net.Addr { return streamAddr(st.target) }

// SetDeadline is not supported.
func (st *Stream) SetDeadline(time.Time) error { return errors.ErrUnsupported }

// SetReadDeadline is not supported.
func (st *Stream) SetReadDeadline(time.Time) error { return errors.ErrUnsupported }

// SetWriteDeadline is not supported.
func (st *Stream) SetWriteDeadline(time.Time) error { return errors.ErrUnsupported }

type streamAddr string

func (streamAddr) Network() string  { return "link" }
func (a streamAddr) String() string { return string(a) }

// Splice copies a and b into each other until both directions ended,
// passing each end of stream on as a half-close, then closes both.
func Splice(a, b net.Conn) {
	var wg sync.WaitGroup
	one := func(dst, src net.Conn) {
		defer wg.Done()
		_, err := io.Copy(dst, src)
		if cw, ok := dst.(interface{ CloseWrite() error }); ok && err == nil {
			_ = cw.CloseWrite()
		} else {
			// An error one way ends both.
			_ = a.Close()
			_ = b.Close()
		}
	}
	wg.Add(2)
	go one(a, b)
	go one(b, a)
	wg.Wait()
	_ = a.Close()
	_ = b.Close()
}
