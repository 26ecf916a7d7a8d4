package link

import "time"

// bdpEstimate measures a connection's bandwidth-delay product from the
// peer's stream receipts and bounds the stream data in flight to twice it
// (BBR's reasoning: the link is full at one product, a second one lets the
// delivery rate grow while it is measured, and a message written now waits
// behind at most that). The round trip is the least a byte took from its
// write to the receipt that covered it, over the last minRTTWindow; the
// rate, the most bytes a second the receipts covered over a round trip,
// over the last rateWindow. Until both are measured the bound is
// MinStreamsInFlight. Not safe for concurrent use (Streams.mu guards it).
type bdpEstimate struct {
	marks     []writeMark // writes not yet covered by a receipt, oldest first
	receiptAt time.Time   // the last receipt that covered more
	minRTT    time.Duration
	minRTTAt  time.Time
	rate      float64 // bytes a second
	rateAt    time.Time
}

// writeMark is a write: the stream data written up to its end (sent),
// the peer's receipt then and when that receipt came.
type writeMark struct {
	sent, peerReceived uint64
	at, receiptAt      time.Time
}

const (
	minRTTWindow = 10 * time.Second
	rateWindow   = 2 * time.Second
	maxMarks     = 64
	// minRateInterval is the least time a delivery rate is measured over:
	// receipts come in bursts (a peer's write carries one, a reader takes
	// several frames at once), and over less a burst reads as a rate many
	// times the link's, which would loosen the bound by as much (on
	// loopback, tenfold). On a link whose round trip is longer it changes
	// nothing.
	minRateInterval = time.Millisecond
)

// wrote records a write that took the stream data sent to sent.
func (e *bdpEstimate) wrote(sent, peerReceived uint64, now time.Time) {
	if len(e.marks) == maxMarks {
		// Writes faster than receipts come back: the newest stands for
		// the ones it replaces (its round trip is the shortest of them).
		e.marks[len(e.marks)-1] = writeMark{sent: sent, peerReceived: peerReceived, at: now, receiptAt: e.receiptAt}
		return
	}
	e.marks = append(e.marks, writeMark{sent: sent, peerReceived: peerReceived, at: now, receiptAt: e.receiptAt})
}

// receipt takes the peer's receipt of received bytes.
func (e *bdpEstimate) receipt(received uint64, now time.Time) {
	i := 0
	for i < len(e.marks) && e.marks[i].sent <= received {
		i++
	}
	if i == 0 {
		e.receiptAt = now
		return // covers no whole write yet
	}
	m := e.marks[i-1] // the newest write covered: its round trip
	e.marks = append(e.marks[:0], e.marks[i:]...)
	rtt := now.Sub(m.at)
	if rtt <= 0 {
		rtt = time.Microsecond
	}
	if e.minRTT == 0 || rtt <= e.minRTT || now.Sub(e.minRTTAt) > minRTTWindow {
		e.minRTT, e.minRTTAt = rtt, now
	}
	// Delivered since that write over the time it took to deliver (BBR's
	// delivery rate): from the receipt the write saw to this one, at least
	// the write's round trip. Over the round trip alone, a receipt that
	// covers bytes written long before the write would count them as
	// delivered within it, and the bound would grow with the error.
	interval := max(rtt, minRateInterval)
	if !m.receiptAt.IsZero() {
		interval = max(interval, now.Sub(m.receiptAt))
	}
	e.receiptAt = now
	rate := float64(received-m.peerReceived) / interval.Seconds()
	if rate >= e.rate || now.Sub(e.rateAt) > rateWindow {
		e.rate, e.rateAt = rate, now
	}
}

// limit is the bound on stream data in flight now.
func (e *bdpEstimate) limit() int {
	if e.minRTT == 0 {
		return MinStreamsInFlight
	}
	bdp := e.rate * e.minRTT.Seconds()
	return int(min(max(2*bdp, MinStreamsInFlight), MaxStreamsInFlight))
}
