package link

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"sync"

	"google.golang.org/protobuf/proto"

	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
)

// ErrQueueFull is returned by Enqueue when the session holds its maximum of
// unacknowledged messages and is not set to drop the oldest. Retryable once
// the peer acknowledges.
var ErrQueueFull = errors.New("link: send queue full")

// Entry is one sequenced outbound message held until the peer acknowledges it.
type Entry struct {
	Seq uint64
	Env *linkv1.Envelope
	// Key, when set, makes a newer Enqueue with the same key replace this
	// entry while it has not been written on the current connection.
	Key string

	size    int
	sent    bool // written on the current connection
	resend  bool // written on an earlier connection
	removed bool // replaced by a newer entry with the same key
}

// SessionConfig restores and bounds a Session.
type SessionConfig struct {
	// StreamID names this side's outbound stream; 0 picks a random one.
	StreamID uint64
	// NextSeq is the next sequence to assign (1 when 0).
	NextSeq uint64
	// Unacked restores entries held from a previous run, seq ascending.
	Unacked []*Entry
	// PeerStreamID and Received restore the receive position.
	PeerStreamID, Received uint64

	// MaxEntries and MaxBytes bound the unacknowledged messages (0: no bound).
	MaxEntries, MaxBytes int
	// DropOldest makes a full session drop its oldest message instead of
	// refusing the new one (ErrQueueFull).
	DropOldest bool
	// Persist, when set, is called under the session lock whenever an entry
	// is added, with the sequences the same call removed (coalesced or
	// dropped); an error refuses the Enqueue and changes nothing.
	Persist func(add *Entry, removed []uint64) error
	// Acked, when set, is called under the session lock with the new
	// cumulative ack; it must not block.
	Acked func(through uint64)
	// ManualCommit makes the ack told to the peer the position the
	// application committed (Commit) rather than the one it took: for an
	// application that makes what it took durable later, in batches. The
	// peer keeps what is not committed, and resends it to a restarted side.
	ManualCommit bool
}

// Session is one side's state of a link, which outlives connections: the
// outbound sequence and the messages not yet acknowledged, and the position
// in the peer's stream. It holds no connection; RunConn drives it. Safe for
// concurrent use.
type Session struct {
	cfg SessionConfig

	mu       sync.Mutex
	streamID uint64
	nextSeq  uint64
	q        []*Entry // unacked, seq ascending; removed entries are skipped
	cursor   int      // index in q of the first entry not written on this connection
	byKey    map[string]*Entry
	live     int
	bytes    int
	acked    uint64

	peerStream uint64
	received   uint64
	committed  uint64 // with ManualCommit

	waker func() // the connection's writer (setWaker)
}

// NewSession builds a session from cfg.
func NewSession(cfg SessionConfig) *Session {
	s := &Session{cfg: cfg, streamID: cfg.StreamID, nextSeq: cfg.NextSeq, peerStream: cfg.PeerStreamID,
		received: cfg.Received, committed: cfg.Received}
	if s.streamID == 0 {
		s.streamID = RandomID()
	}
	if s.nextSeq == 0 {
		s.nextSeq = 1
	}
	for _, e := range cfg.Unacked {
		e.size = proto.Size(e.Env)
		e.resend = true
		s.q = append(s.q, e)
		s.live++
		s.bytes += e.size
		if e.Key != "" {
			s.keyed(e)
		}
		if e.Seq >= s.nextSeq {
			s.nextSeq = e.Seq + 1
		}
	}
	return s
}

// RandomID returns a non-zero random stream id.
func RandomID() uint64 {
	var b [8]byte
	for {
		_, _ = rand.Read(b[:])
		if id := binary.LittleEndian.Uint64(b[:]); id != 0 {
			return id
		}
	}
}

// StreamID is this side's outbound stream.
func (s *Session) StreamID() uint64 { return s.streamID }

// setWaker sets what a new message or commit wakes: the current
// connection's writer (nil: none).
func (s *Session) setWaker(f func()) {
	s.mu.Lock()
	s.waker = f
	s.mu.Unlock()
}

// wake tells the current connection's writer, outside the lock.
func (s *Session) wake() {
	s.mu.Lock()
	f := s.waker
	s.mu.Unlock()
	if f != nil {
		f()
	}
}

// Enqueue assigns env the next sequence and holds it until acknowledged.
// env must be a sequenced kind and must not be modified afterwards. When key
// is set and an entry with the same key has not been written on the current
// connection, that entry is replaced (the receiver sees a gap in sequence
// numbers, which the protocol allows). It returns the sequence assigned and
// how many older messages a full DropOldest session dropped.
func (s *Session) Enqueue(env *linkv1.Envelope, key string) (seq uint64, dropped int, err error) {
	env.Version = ProtocolVersion
	size := proto.Size(env) + 10
	s.mu.Lock()
	seq, dropped, err = s.enqueue(env, key, size)
	waker := s.waker
	s.mu.Unlock()
	if err == nil && waker != nil {
		waker()
	}
	return seq, dropped, err
}

func (s *Session) enqueue(env *linkv1.Envelope, key string, size int) (seq uint64, dropped int, err error) {
	var removed []uint64
	var old *Entry
	if key != "" {
		if o := s.byKey[key]; o != nil && !o.sent && !o.removed {
			old = o
			removed = append(removed, o.Seq)
		}
	}
	live, bytes := s.live, s.bytes
	if old != nil {
		live--
		bytes -= old.size
	}
	// Which entries must go to make room (DropOldest), without changing
	// anything until Persist has accepted.
	var drop []*Entry
	for i := 0; s.full(live+1, bytes+size); i++ {
		if !s.cfg.DropOldest {
			return 0, 0, ErrQueueFull
		}
		for i < len(s.q) && (s.q[i].removed || s.q[i] == old) {
			i++
		}
		if i >= len(s.q) {
			break
		}
		drop = append(drop, s.q[i])
		removed = append(removed, s.q[i].Seq)
		live--
		bytes -= s.q[i].size
	}
	env.Seq = s.nextSeq
	e := &Entry{Seq: env.Seq, Env: env, Key: key, size: size}
	if s.cfg.Persist != nil {
		if err := s.cfg.Persist(e, removed); err != nil {
			return 0, 0, err
		}
	}
	s.nextSeq++
	if old != nil {
		s.remove(old)
	}
	for _, d := range drop {
		s.remove(d)
	}
	s.q = append(s.q, e)
	s.live++
	s.bytes += size
	if key != "" {
		s.keyed(e)
	}
	s.compact()
	return e.Seq, len(drop), nil
}

// keyed indexes e by its key; the index is made on first use (the cloud's
// sessions never key their messages).
func (s *Session) keyed(e *Entry) {
	if s.byKey == nil {
		s.byKey = map[string]*Entry{}
	}
	s.byKey[e.Key] = e
}

func (s *Session) full(live, bytes int) bool {
	return (s.cfg.MaxEntries > 0 && live > s.cfg.MaxEntries) || (s.cfg.MaxBytes > 0 && bytes > s.cfg.MaxBytes)
}

func (s *Session) remove(e *Entry) {
	e.removed = true
	s.live--
	s.bytes -= e.size
	if e.Key != "" && s.byKey[e.Key] == e {
		delete(s.byKey, e.Key)
	}
}

// compact drops removed entries from the head of the queue.
func (s *Session) compact() {
	n := 0
	for n < len(s.q) && s.q[n].removed {
		s.q[n] = nil
		n++
	}
	if n > 0 {
		s.q = s.q[n:]
		s.cursor = max(0, s.cursor-n)
	}
}

// Ack releases every message with seq <= through (a cumulative ack). Acks for
// sequences never assigned are ignored; it returns how many were released.
func (s *Session) Ack(through uint64) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ackLocked(through)
}

func (s *Session) ackLocked(through uint64) int {
	// An ack of a sequence never assigned comes from a confused peer (or
	// one remembering an earlier stream); ignoring it loses nothing.
	if through <= s.acked || through >= s.nextSeq {
		return 0
	}
	s.acked = through
	n := 0
	for len(s.q) > 0 && s.q[0].Seq <= through {
		e := s.q[0]
		if !e.removed {
			s.remove(e)
			n++
		}
		s.q[0] = nil
		s.q = s.q[1:]
		s.cursor = max(0, s.cursor-1)
	}
	s.compact()
	if s.cfg.Acked != nil {
		s.cfg.Acked(through)
	}
	return n
}

// Resume starts a new connection: everything unacknowledged will be written
// again. peerStream and peerReceived are the peer's view of this side's
// stream (from Hello or Welcome); when the peer names this stream, what it
// received is released first.
func (s *Session) Resume(peerStream, peerReceived uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if peerStream == s.streamID {
		s.ackLocked(peerReceived)
	}
	for _, e := range s.q {
		if e.sent {
			e.sent = false
			e.resend = true
		}
	}
	s.cursor = 0
}

// Next returns up to max entries not yet written on this connection, in
// order, marking them written; resent is how many of them had been written
// on an earlier connection.
func (s *Session) Next(max int, buf []*Entry) (out []*Entry, resent int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out = buf[:0]
	for s.cursor < len(s.q) && len(out) < max {
		e := s.q[s.cursor]
		s.cursor++
		if e.removed {
			continue
		}
		e.sent = true
		if e.resend {
			resent++
		}
		out = append(out, e)
	}
	return out, resent
}

// SetPeer records the peer's outbound stream from its Hello or Welcome. A
// stream other than the one last received from resets the receive position:
// the next sequenced message is accepted whatever its number.
func (s *Session) SetPeer(peerStream uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if peerStream != s.peerStream {
		s.peerStream = peerStream
		s.received, s.committed = 0, 0
	}
}

// Commit records, with ManualCommit, that the application has made
// everything of the peer's stream peerStream through seq durable; the ack
// told to the peer moves up to it. A position in another stream than the
// current one (the peer started afresh meanwhile) is ignored.
func (s *Session) Commit(peerStream, seq uint64) {
	s.mu.Lock()
	moved := peerStream == s.peerStream && seq > s.committed
	if moved {
		s.committed = seq
	}
	s.mu.Unlock()
	if moved {
		s.wake()
	}
}

// AckPosition is the highest seq of the peer's stream to acknowledge: the
// delivered one, or with ManualCommit the committed one.
func (s *Session) AckPosition() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cfg.ManualCommit {
		return min(s.received, s.committed)
	}
	return s.received
}

// Accept reports whether a sequenced message with seq is new (it must then
// be delivered and Delivered called) or a duplicate to drop. Numbers grow
// strictly; gaps are allowed (the sender coalesced or dropped).
func (s *Session) Accept(seq uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return seq > s.received
}

// Delivered advances the receive position to seq after the application took
// the message.
func (s *Session) Delivered(seq uint64) {
	s.mu.Lock()
	if seq > s.received {
		s.received = seq
	}
	s.mu.Unlock()
}

// Received is the peer's stream and the highest seq of it delivered.
func (s *Session) Received() (peerStream, received uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.peerStream, s.received
}

// Len is the number and encoded size of messages not yet acknowledged.
func (s *Session) Len() (entries, bytes int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.live, s.bytes
}

// NextSeq is the sequence the next Enqueue will assign.
func (s *Session) NextSeq() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.nextSeq
}
