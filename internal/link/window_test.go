package link

import (
	"bytes"
	"context"
	"testing"
	"time"

	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
)

// windowPeer drives one side's streams by hand, as the peer of the
// streams it opens: it sends exactly the credit it was granted (as a peer
// that knows nothing of auto-tuning does), on a clock of the test's own,
// so that what is counted (grants, windows, bytes held) never depends on
// the machine's speed.
type windowPeer struct {
	t      *testing.T
	s      *Streams
	now    time.Time
	grants map[uint64]int // StreamWindow frames read, per stream
	credit map[uint64]int // credit granted, not yet spent
}

func newWindowPeer(t *testing.T) *windowPeer {
	p := &windowPeer{t: t, s: NewStreams(nil), now: time.Unix(1000, 0), grants: map[uint64]int{}, credit: map[uint64]int{}}
	p.s.now = func() time.Time { return p.now }
	p.s.attach(func() {}, nil)
	return p
}

// frames takes what the streams would write and handles it as the peer.
func (p *windowPeer) frames() (opens []*linkv1.StreamOpen) {
	p.t.Helper()
	buf, _, _, err := p.s.appendFrames(nil, 0, 1<<30)
	if err != nil {
		p.t.Fatal(err)
	}
	fr := NewFrameReader(bytes.NewReader(buf), DefaultMaxFrame)
	for {
		b, err := fr.Next()
		if err != nil {
			return opens
		}
		var env linkv1.Envelope
		if err := Decode(b, &env); err != nil {
			p.t.Fatal(err)
		}
		switch {
		case env.GetStreamOpen() != nil:
			opens = append(opens, env.GetStreamOpen())
		case env.GetStreamWindow() != nil:
			w := env.GetStreamWindow()
			p.grants[w.Id]++
			p.credit[w.Id] += int(w.Credit)
		}
	}
}

// open opens a stream and accepts it as the peer.
func (p *windowPeer) open() *Stream {
	p.t.Helper()
	opened := make(chan *Stream, 1)
	go func() {
		st, err := p.s.Open(context.Background(), "127.0.0.1:80")
		if err != nil {
			p.t.Error(err)
		}
		opened <- st
	}()
	var open *linkv1.StreamOpen
	waitFor(p.t, func() bool {
		if o := p.frames(); len(o) > 0 {
			open = o[0]
		}
		return open != nil
	}, "the stream's open")
	p.credit[open.Id] = int(open.Window)
	p.s.handle(context.Background(), &linkv1.Envelope{Kind: &linkv1.Envelope_StreamWindow{StreamWindow: &linkv1.StreamWindow{Id: open.Id, Credit: DefaultStreamWindow}}})
	return <-opened
}

// transfer sends total bytes on st as the peer, the reader taking 16 KiB
// a read, each read costing readCost on the clock; each grant reaches the
// peer, and the data it allows comes back, a round trip (rtt) after it
// was made. It checks on every frame that the stream holds at most its
// window and that the peer never had to be refused.
func (p *windowPeer) transfer(st *Stream, total int, rtt, readCost time.Duration) {
	p.t.Helper()
	type grant struct {
		at     time.Time
		credit int
	}
	var pending []grant
	sent, read := 0, 0
	buf := make([]byte, 16<<10)
	for read < total {
		for len(pending) > 0 && !pending[0].at.After(p.now) {
			p.credit[st.id] += pending[0].credit
			pending = pending[1:]
		}
		for p.credit[st.id] > 0 && sent < total {
			n := min(p.credit[st.id], MaxStreamData, total-sent)
			p.s.handle(context.Background(), &linkv1.Envelope{Kind: &linkv1.Envelope_StreamData{StreamData: &linkv1.StreamData{Id: st.id, Data: make([]byte, n)}}})
			p.credit[st.id] -= n
			sent += n
			p.s.mu.Lock()
			held, window, err := st.recvLen, st.window, st.err
			p.s.mu.Unlock()
			if err != nil || held > window {
				p.t.Fatalf("after %d bytes sent within the credit: %d held, window %d, stream error %v", sent, held, window, err)
			}
		}
		if p.s.recvHeld(st) == 0 {
			if len(pending) == 0 {
				p.t.Fatalf("%d bytes read, %d sent: no data and no grant on its way", read, sent)
			}
			p.now = pending[0].at // the reader waits for the peer
			continue
		}
		n, err := st.Read(buf)
		if err != nil {
			p.t.Fatal(err)
		}
		read += n
		p.now = p.now.Add(readCost)
		before := p.credit[st.id]
		p.frames()
		if c := p.credit[st.id] - before; c > 0 {
			p.credit[st.id] = before
			pending = append(pending, grant{at: p.now.Add(rtt), credit: c})
		}
	}
}

// recvHeld is the stream data st holds unread.
func (s *Streams) recvHeld(st *Stream) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return st.recvLen
}

func (s *Streams) windowOf(st *Stream) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return st.window
}

// TestStreamWindowGrowsForAReaderThatKeepsUp: a stream whose reader takes
// each half window in less than a round trip has its window doubled up to
// MaxStreamWindow, so that the same bytes need a small part of the grants
// (and credit round trips) a fixed window needs; a peer that only spends
// what it is granted is served so with no change of its own.
func TestStreamWindowGrowsForAReaderThatKeepsUp(t *testing.T) {
	const total = 32 << 20
	p := newWindowPeer(t)
	st := p.open()
	p.transfer(st, total, 10*time.Millisecond, 100*time.Microsecond)
	if w := p.s.windowOf(st); w != MaxStreamWindow {
		t.Fatalf("window %d after %d bytes read as fast as they came, want the most, %d", w, total, MaxStreamWindow)
	}
	fixed := total / (DefaultStreamWindow / 2)
	if g := p.grants[st.id]; g > fixed/10 {
		t.Fatalf("%d grants for %d bytes, want at most a tenth of a fixed window's %d", g, total, fixed)
	}
	t.Logf("%d grants for %d bytes (a fixed window: %d), %d windows grown", p.grants[st.id], total, fixed, p.s.growths)
}

// TestStreamWindowStaysForASlowReader: a reader that takes longer than a
// round trip for each half window is what holds its stream back: the
// window stays, and so does the memory the stream may hold.
func TestStreamWindowStaysForASlowReader(t *testing.T) {
	const total = 4 << 20
	p := newWindowPeer(t)
	st := p.open()
	p.transfer(st, total, 10*time.Millisecond, 20*time.Millisecond)
	if w := p.s.windowOf(st); w != DefaultStreamWindow {
		t.Fatalf("window %d for a reader slower than the round trip, want %d", w, DefaultStreamWindow)
	}
	if g, want := p.grants[st.id], total/(DefaultStreamWindow/2); g != want {
		t.Fatalf("%d grants for %d bytes, want a fixed window's %d", g, total, want)
	}
}

// TestStreamWindowGrowthBounded: windows grow within the per-stream bound
// and together within the connection's; a stream's growth returns to the
// connection when it ends; growth turned off is a fixed window, as before
// auto-tuning.
func TestStreamWindowGrowthBounded(t *testing.T) {
	const total = 8 << 20
	p := newWindowPeer(t)
	p.s.SetWindowGrowth(1<<20, 1<<20)
	a, b := p.open(), p.open()
	p.transfer(a, total, 10*time.Millisecond, 100*time.Microsecond)
	p.transfer(b, total, 10*time.Millisecond, 100*time.Microsecond)
	wa, wb := p.s.windowOf(a), p.s.windowOf(b)
	if wa != 1<<20 {
		t.Fatalf("first stream's window %d, want the per-stream bound %d", wa, 1<<20)
	}
	if grown := wa + wb - 2*DefaultStreamWindow; grown > 1<<20 {
		t.Fatalf("windows %d and %d grew %d together, beyond the connection's %d", wa, wb, grown, 1<<20)
	}
	if wb != DefaultStreamWindow+(1<<20)-(wa-DefaultStreamWindow) {
		t.Fatalf("second stream's window %d, want what the first left, %d", wb, DefaultStreamWindow+(1<<20)-(wa-DefaultStreamWindow))
	}
	// The first one ends (reset by the peer): its growth is free again.
	p.s.handle(context.Background(), &linkv1.Envelope{Kind: &linkv1.Envelope_StreamReset{StreamReset: &linkv1.StreamReset{Id: a.id, Reason: "done"}}})
	p.s.mu.Lock()
	grown := p.s.grown
	p.s.mu.Unlock()
	if grown != wb-DefaultStreamWindow {
		t.Fatalf("grown %d after the first stream ended, want the second's %d", grown, wb-DefaultStreamWindow)
	}
	c := p.open()
	p.transfer(c, total, 10*time.Millisecond, 100*time.Microsecond)
	if wc := p.s.windowOf(c); wc != DefaultStreamWindow+(1<<20)-(wb-DefaultStreamWindow) {
		t.Fatalf("a new stream's window %d, want what the second left, %d", wc, DefaultStreamWindow+(1<<20)-(wb-DefaultStreamWindow))
	}

	// Off: a fixed window.
	q := newWindowPeer(t)
	q.s.SetWindowGrowth(DefaultStreamWindow, 0)
	st := q.open()
	q.transfer(st, total, 10*time.Millisecond, 100*time.Microsecond)
	if w := q.s.windowOf(st); w != DefaultStreamWindow {
		t.Fatalf("window %d with growth off, want %d", w, DefaultStreamWindow)
	}
	if g, want := q.grants[st.id], total/(DefaultStreamWindow/2); g != want {
		t.Fatalf("%d grants with growth off, want %d", g, want)
	}
}
