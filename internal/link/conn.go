package link

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/time/rate"

	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
)

// ErrPeerDead: nothing arrived from the peer for two heartbeat intervals.
var ErrPeerDead = errors.New("link: peer silent for two heartbeat intervals")

// ackDelay is how long a bare acknowledgement waits for a message to ride on.
const ackDelay = 5 * time.Millisecond

// RefusedError, returned by a ConnConfig.Deliver, refuses one message: it is
// acknowledged and dropped, the peer is told with an Error of Code, and the
// connection goes on.
type RefusedError struct {
	Code    linkv1.Error_Code
	Message string
}

func (e *RefusedError) Error() string { return fmt.Sprintf("refused (%s): %s", e.Code, e.Message) }

// PeerError is the error RunConn returns when the peer ends the connection
// with an Error frame.
type PeerError struct {
	Code    linkv1.Error_Code
	Message string
}

func (e *PeerError) Error() string { return fmt.Sprintf("peer error %s: %s", e.Code, e.Message) }

// ConnConfig drives one connection.
type ConnConfig struct {
	// Heartbeat is the interval of heartbeats sent; the peer is declared
	// dead when nothing arrives for twice that.
	Heartbeat time.Duration
	// MaxFrame bounds received frames (DefaultMaxFrame when 0).
	MaxFrame int
	// Deliver (required) gets each new sequenced message exactly once, in
	// order, on one goroutine. nil marks it delivered; a *RefusedError refuses it (see
	// there); any other error ends the connection without marking it, so it
	// is received again after the reconnect.
	Deliver func(ctx context.Context, env *linkv1.Envelope) error
	// Limiter, when set, paces received sequenced messages and heartbeats
	// (the reader waits, which pushes back on the peer through the
	// transport; the dead-peer watchdog does not count that wait).
	Limiter *rate.Limiter
	Metrics *Metrics
	// OnAcked, when set, is told how many messages an ack released.
	OnAcked func(released int)
	// Started, when set, is called once the connection runs with a
	// function that queues a control Envelope (a Reconnect) for the peer;
	// it may be called from any goroutine, also after the connection
	// ended (it then does nothing).
	Started func(send func(*linkv1.Envelope))
	// OnReconnect, when set, is told of each Reconnect the peer sends, on
	// the reader's goroutine.
	OnReconnect func(*linkv1.Reconnect)
	// Cancel, when set, is the cancel function of ctx (made with
	// context.WithCancelCause for this connection alone): RunConn ends the
	// connection with it rather than with a context of its own.
	Cancel context.CancelCauseFunc
	// LogValues go with every line RunConn logs (the connection's node).
	LogValues []any
	// Streams, when set, carries byte streams on this connection (one
	// Streams per connection: they end with it). Without it the peer's
	// StreamOpen is refused.
	Streams *Streams
}

// Framed is a Conn with its frame reader, for the handshake and RunConn.
type Framed struct {
	Conn Conn
	fr   *FrameReader
	mu   sync.Mutex
	buf  []byte
}

// NewFramed wraps c, reading frames of at most maxFrame bytes.
func NewFramed(c Conn, maxFrame int) *Framed {
	if maxFrame <= 0 {
		maxFrame = DefaultMaxFrame
	}
	return &Framed{Conn: c, fr: NewFrameReader(c, maxFrame)}
}

// Read reads and validates the next Envelope.
func (f *Framed) Read(env *linkv1.Envelope) (int, error) {
	b, err := f.fr.Next()
	if err != nil {
		return 0, err
	}
	// A frame beyond keepFrameBuffer is a buffer of its own (the reader
	// keeps none that large): a stream's data may keep it.
	if len(b) > keepFrameBuffer && decodeStreamData(b, env) {
		return len(b), Validate(env)
	}
	return len(b), Decode(b, env)
}

// Write writes one Envelope (for the handshake; RunConn batches its own).
func (f *Framed) Write(env *linkv1.Envelope) error {
	env.Version = ProtocolVersion
	f.mu.Lock()
	defer f.mu.Unlock()
	b, err := AppendFrame(f.buf[:0], env)
	if err != nil {
		return err
	}
	f.buf = b[:0]
	_, err = f.Conn.Write(b)
	return err
}

// WriteError tells the peer why the connection is about to end, waiting at
// most a short while (the peer may be the reason).
func (f *Framed) WriteError(code linkv1.Error_Code, msg string) {
	f.WriteFinal(&linkv1.Envelope{Kind: &linkv1.Envelope_Error{Error: &linkv1.Error{Code: code, Message: msg}}})
}

// WriteFinal writes a last control frame before the connection ends and
// lets the peer read it, waiting at most a short while.
func (f *Framed) WriteFinal(env *linkv1.Envelope) {
	done := make(chan struct{})
	go func() {
		_ = f.Write(env)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(200 * time.Millisecond):
	}
	f.linger(200 * time.Millisecond)
}

// linger waits until the peer hangs up or d passes. Closing at once may
// discard what was just written (QUIC's close does not wait for stream
// data to be delivered), and the peer should learn why it was refused.
func (f *Framed) linger(d time.Duration) {
	done := make(chan struct{})
	go func() {
		buf := make([]byte, 512)
		for {
			if _, err := f.Conn.Read(buf); err != nil {
				close(done)
				return
			}
		}
	}()
	select {
	case <-done:
	case <-time.After(d):
	}
}

// RunConn carries sess over one connection after the handshake (the caller
// has exchanged Hello/Welcome and called sess.Resume and sess.SetPeer). It
// writes the session's unacknowledged messages and every new one, acks what
// it receives, sends and answers heartbeats, and returns when the
// connection fails, the peer goes silent (ErrPeerDead), a frame is
// malformed or too large (after telling the peer), or ctx ends. It closes
// the connection before returning. The session stays usable for the next
// connection. RunConn keeps a copy of *cfg: the caller may reuse it. (A
// pointer, because the caller's frame stays under an idle connection's
// reader for the connection's life: see readLoop.)
func RunConn(ctx context.Context, f *Framed, sess *Session, cfg *ConnConfig) error {
	r, ctx, done := start(ctx, f, sess, cfg)
	defer done()
	return r.finish(ctx, r.readLoop(ctx, r.watchdog))
}

// start sets the connection up: its context, timers and writer. (Apart
// from RunConn, whose frame stays under the reader for the connection's
// life: small frames there let the runtime keep idle stacks small.)
func start(ctx context.Context, f *Framed, sess *Session, c *ConnConfig) (*runner, context.Context, func()) {
	r := &runner{f: f, sess: sess, cfg: *c, start: time.Now()}
	cfg := &r.cfg
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = 10 * time.Second
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil, "link")
	}
	cancel := cfg.Cancel
	done := func() {}
	if cancel == nil {
		ctx, cancel = context.WithCancelCause(ctx)
		done = func() { cancel(nil) }
	}
	r.fail = cancel
	// Close the connection when the context ends: it unblocks the reader
	// and a writer stuck on a peer that does not read.
	r.stop = context.AfterFunc(ctx, func() { _ = f.Conn.Close() })
	// The peer is dead when nothing came from it for two intervals while
	// this end waited for it: a reader held up with a frame (a slow
	// Deliver, the rate limit) is this end's delay, and the reader re-arms
	// the watchdog when it waits again.
	r.watchdog = time.AfterFunc(2*cfg.Heartbeat, func() {
		if !r.busy.Load() {
			cancel(ErrPeerDead)
		}
	})
	if cfg.Started != nil {
		cfg.Started(func(env *linkv1.Envelope) {
			if ctx.Err() == nil {
				r.push(env)
			}
		})
	}
	// The writer is a goroutine only while there is something to write
	// (an idle connection costs its reader alone): what is enqueued, acked,
	// committed, pushed, or a heartbeat due wakes it.
	sess.setWaker(r.wake)
	if cfg.Streams != nil {
		cfg.Streams.attach(r.wake, cfg.Metrics)
	}
	r.mu.Lock()
	r.heartbeat = true // announce ourselves at once: it also carries the first ack
	r.hb = time.AfterFunc(cfg.Heartbeat, r.beat)
	r.mu.Unlock()
	r.wake()
	return r, ctx, done
}

// finish ends the connection after its reader returned rerr.
func (r *runner) finish(ctx context.Context, rerr error) error {
	r.stop()
	r.watchdog.Stop()
	// When the context ended first (peer dead, replaced, shutting down) the
	// read error is only its consequence.
	if c := context.Cause(ctx); c != nil {
		rerr = c
	}
	var code linkv1.Error_Code
	switch {
	case errors.Is(rerr, ErrFrameTooLarge):
		code = linkv1.Error_TOO_LARGE
	case errors.Is(rerr, ErrMalformed):
		code = linkv1.Error_MALFORMED
	}
	if code != 0 {
		// Let the writer finish what it has, then say why we hang up.
		r.final(code, rerr.Error())
		r.f.linger(200 * time.Millisecond)
	}
	r.fail(rerr)
	if r.cfg.Streams != nil {
		r.cfg.Streams.end(rerr)
	}
	r.sess.setWaker(nil)
	r.mu.Lock()
	r.stopped = true // no writer starts after this
	r.hb.Stop()
	if r.ackTimer != nil {
		r.ackTimer.Stop()
	}
	r.mu.Unlock()
	_ = r.f.Conn.Close()
	r.writers.Wait() // a writer ends with this same hang-up; rerr says why
	return rerr
}

type runner struct {
	f     *Framed
	sess  *Session
	cfg   ConnConfig
	start time.Time
	fail  context.CancelCauseFunc

	stop     func() bool // the context's AfterFunc
	watchdog *time.Timer
	busy     atomic.Bool // the reader handles a frame, not waiting for the peer

	mu        sync.Mutex
	ctrl      []*linkv1.Envelope
	lastAck   uint64
	closing   bool
	flushed   chan struct{}
	writing   bool // a writer goroutine runs
	dirty     bool // something may wait since the writer last looked
	stopped   bool // the connection ended: no writer any more
	heartbeat bool // one is due
	ackDue    bool // the delayed bare ack is due
	ackTimer  *time.Timer
	hb        *time.Timer
	writers   sync.WaitGroup
}

func (r *runner) push(env *linkv1.Envelope) {
	r.mu.Lock()
	r.ctrl = append(r.ctrl, env)
	r.mu.Unlock()
	r.wake()
}

// wake makes sure a writer will look at what is waiting, starting one if
// none runs.
func (r *runner) wake() {
	r.mu.Lock()
	r.dirty = true
	start := !r.writing && !r.stopped
	if start {
		r.writing = true
		r.writers.Add(1)
	}
	r.mu.Unlock()
	if start {
		go r.writer()
	}
}

func (r *runner) beat() {
	r.mu.Lock()
	r.heartbeat = true
	if !r.stopped {
		r.hb.Reset(r.cfg.Heartbeat)
	}
	r.mu.Unlock()
	r.wake()
}

// final queues a last Error and waits briefly for the writer to flush it.
func (r *runner) final(code linkv1.Error_Code, msg string) {
	done := make(chan struct{})
	r.mu.Lock()
	r.ctrl = append(r.ctrl, &linkv1.Envelope{Kind: &linkv1.Envelope_Error{Error: &linkv1.Error{Code: code, Message: msg}}})
	r.closing = true
	r.flushed = done
	r.mu.Unlock()
	r.wake()
	select {
	case <-done:
	case <-time.After(200 * time.Millisecond):
	}
}

func (r *runner) readLoop(ctx context.Context, watchdog *time.Timer) error {
	waiter, _ := r.f.Conn.(interface{ WaitReadable() error })
	for {
		if waiter != nil {
			// An idle connection waits here, a few small frames deep (see
			// wsServerConn.WaitReadable): keep this loop's frame small.
			if err := waiter.WaitReadable(); err != nil {
				if ctx.Err() != nil {
					return context.Cause(ctx)
				}
				return err
			}
		}
		if err := r.readOne(ctx, watchdog); err != nil {
			return err
		}
	}
}

// readOne reads and handles one frame.
//
//go:noinline
func (r *runner) readOne(ctx context.Context, watchdog *time.Timer) error {
	m := r.cfg.Metrics
	{
		var env linkv1.Envelope
		n, err := r.f.Read(&env)
		if err != nil {
			if ctx.Err() != nil {
				return context.Cause(ctx)
			}
			return err
		}
		r.busy.Store(true)
		defer r.waitAgain(watchdog)
		m.MessagesIn.Inc()
		m.BytesIn.Add(float64(n))
		if env.Ack > 0 {
			if released := r.sess.Ack(env.Ack); released > 0 && r.cfg.OnAcked != nil {
				r.cfg.OnAcked(released)
			}
		}
		switch k := env.Kind.(type) {
		case nil:
		case *linkv1.Envelope_Heartbeat:
			if k.Heartbeat.Reply {
				m.RTT.Observe(time.Since(r.start.Add(time.Duration(k.Heartbeat.SentNanos))).Seconds())
			} else {
				// Each heartbeat costs us a reply: pace them like messages.
				if r.cfg.Limiter != nil {
					if err := r.cfg.Limiter.Wait(ctx); err != nil {
						return context.Cause(ctx)
					}
				}
				r.push(&linkv1.Envelope{Kind: &linkv1.Envelope_Heartbeat{Heartbeat: &linkv1.Heartbeat{SentNanos: k.Heartbeat.SentNanos, Reply: true}}})
			}
		case *linkv1.Envelope_Error:
			if k.Error.Code != linkv1.Error_PERMISSION_DENIED {
				return &PeerError{Code: k.Error.Code, Message: k.Error.Message}
			}
			// A refused message: the application above learns of it through
			// the log; the link goes on.
			logr.FromContextOrDiscard(ctx).Info("peer refused a message", append(slices.Clip(r.cfg.LogValues), "code", k.Error.Code.String(), "seq", k.Error.RefSeq, "reason", k.Error.Message)...)
		case *linkv1.Envelope_Reconnect:
			if r.cfg.OnReconnect != nil {
				r.cfg.OnReconnect(k.Reconnect)
			}
		case *linkv1.Envelope_Hello, *linkv1.Envelope_Welcome:
			return fmt.Errorf("%w: %T after the handshake", ErrMalformed, env.Kind)
		case *linkv1.Envelope_StreamOpen, *linkv1.Envelope_StreamData, *linkv1.Envelope_StreamWindow,
			*linkv1.Envelope_StreamClose, *linkv1.Envelope_StreamReset, *linkv1.Envelope_StreamReceipt:
			if r.cfg.Streams != nil {
				r.cfg.Streams.handle(ctx, &env)
			} else if o := env.GetStreamOpen(); o != nil {
				r.push(&linkv1.Envelope{Kind: &linkv1.Envelope_StreamReset{StreamReset: &linkv1.StreamReset{Id: o.Id, Reason: "streams are not served on this link"}}})
			}
		default:
			if !r.sess.Accept(env.Seq) {
				m.Duplicates.Inc()
				r.wake() // re-ack, the peer evidently missed it
				return nil
			}
			if r.cfg.Limiter != nil {
				if err := r.cfg.Limiter.Wait(ctx); err != nil {
					return context.Cause(ctx)
				}
			}
			if err := r.cfg.Deliver(ctx, &env); err != nil {
				var refused *RefusedError
				if !errors.As(err, &refused) {
					return err
				}
				m.Refused.Inc()
				r.push(&linkv1.Envelope{Kind: &linkv1.Envelope_Error{Error: &linkv1.Error{Code: refused.Code, Message: refused.Message, RefSeq: env.Seq}}})
			}
			r.sess.Delivered(env.Seq)
			if r.cfg.Streams != nil {
				r.cfg.Streams.noteMessage() // a reply is likely: keep stream data from its way
			}
			r.wake()
			// Let what the message woke run before the next frame (the
			// writer with its ack, the application's goroutines): a reader
			// with a bulk transfer's frames waiting would otherwise keep
			// its P, and them waiting, until it is preempted (up to 10 ms).
			runtime.Gosched()
		}
	}
	return nil
}

// waitAgain starts the peer's two intervals again as the reader goes back
// to waiting for it (the watchdog ignores a firing while it is busy).
func (r *runner) waitAgain(watchdog *time.Timer) {
	watchdog.Reset(2 * r.cfg.Heartbeat)
	r.busy.Store(false)
}

// writer writes until nothing is left, then ends; wake starts the next.
// Its buffer goes with it, so an idle connection holds none.
func (r *runner) writer() {
	defer r.writers.Done()
	var buf []byte
	var batch []*Entry
	for {
		r.mu.Lock()
		if !r.dirty || r.stopped {
			r.writing = false
			r.mu.Unlock()
			return
		}
		r.dirty = false
		r.mu.Unlock()
		var err error
		if buf, batch, err = r.write(buf[:0], batch); err != nil {
			r.fail(err) // a failed write ends the connection, reader too
			r.mu.Lock()
			r.writing = false
			r.mu.Unlock()
			return
		}
		if cap(buf) > 256<<10 {
			buf = nil // a burst's buffer is not kept
		}
	}
}

// write writes what is waiting, once: sequenced messages in order (up to
// about 64 KiB; more makes the writer come around again), control
// messages, a heartbeat when due, and the ack.
func (r *runner) write(buf []byte, batch []*Entry) ([]byte, []*Entry, error) {
	m := r.cfg.Metrics
	var err error
	frames := 0
	// One ack value for the whole write, so that lastAck is what the peer
	// was told.
	ack := r.sess.AckPosition()
	more := false
	seqFrames := 0
	for {
		if len(buf) >= 64<<10 {
			more = true
			break
		}
		var resent int
		batch, resent = r.sess.Next(64, batch)
		if len(batch) == 0 {
			break
		}
		m.Resends.Add(float64(resent))
		for _, e := range batch {
			if buf, err = appendFrameAck(buf, e.Env, ack); err != nil {
				return buf, batch, err
			}
			frames++
			seqFrames++
		}
		clear(batch)
	}
	r.mu.Lock()
	ctrl := r.ctrl
	r.ctrl = nil
	closing, flushed := r.closing, r.flushed
	heartbeat := r.heartbeat
	r.heartbeat = false
	r.mu.Unlock()
	if heartbeat {
		ctrl = append(ctrl, &linkv1.Envelope{Kind: &linkv1.Envelope_Heartbeat{Heartbeat: &linkv1.Heartbeat{SentNanos: int64(time.Since(r.start))}}})
	}
	for _, c := range ctrl {
		c.Version, c.Ack = ProtocolVersion, ack
		if buf, err = AppendFrame(buf, c); err != nil {
			return buf, batch, err
		}
		frames++
	}
	// Streams last: a bulk transfer fills what room the messages left,
	// and the next write takes messages first again.
	if r.cfg.Streams != nil {
		if seqFrames > 0 {
			r.cfg.Streams.noteMessage() // before its data: they wait behind the tight bound
		}
		var n int
		var moreStreams bool
		if buf, n, moreStreams, err = r.cfg.Streams.appendFrames(buf, ack, len(buf)+streamBudget); err != nil {
			return buf, batch, err
		}
		frames += n
		more = more || moreStreams
	}
	// Acks ride on outgoing messages; a bare ack waits ackDelay for one to
	// come along (as TCP's delayed ack does), which saves a frame per
	// message in request/response traffic.
	r.mu.Lock()
	if frames == 0 && ack > r.lastAck {
		if r.ackDue {
			// Nothing carried the ack within ackDelay: send it bare.
			if buf, err = AppendFrame(buf, &linkv1.Envelope{Version: ProtocolVersion, Ack: ack}); err != nil {
				r.mu.Unlock()
				return buf, batch, err
			}
			frames++
		} else if r.ackTimer == nil && !r.stopped {
			r.ackTimer = time.AfterFunc(ackDelay, func() {
				r.mu.Lock()
				r.ackTimer, r.ackDue = nil, true
				r.mu.Unlock()
				r.wake()
			})
		}
	}
	if frames > 0 {
		r.lastAck = ack
		r.ackDue = false
		if r.ackTimer != nil {
			r.ackTimer.Stop()
			r.ackTimer = nil
		}
	}
	if more {
		r.dirty = true
	}
	r.mu.Unlock()
	if frames > 0 {
		if _, err := r.f.Conn.Write(buf); err != nil {
			return buf, batch, err
		}
		m.MessagesOut.Add(float64(frames))
		m.BytesOut.Add(float64(len(buf)))
	}
	if closing {
		close(flushed)
		r.mu.Lock()
		r.stopped = true
		r.mu.Unlock()
	}
	return buf, batch, nil
}
