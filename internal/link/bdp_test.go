package link

import (
	"testing"
	"time"
)

// TestBDPEstimate: the bound is the least one until a round trip is
// measured, then twice the rate times the least round trip, within its
// limits; old figures give way to new ones after their windows.
func TestBDPEstimate(t *testing.T) {
	var e bdpEstimate
	t0 := time.Unix(1000, 0)
	if got := e.limit(); got != MinStreamsInFlight {
		t.Fatalf("unmeasured: %d, want %d", got, MinStreamsInFlight)
	}
	// A link of 10 MB/s and a 50 ms round trip, its product 500 kB: 100 kB
	// written every 10 ms, each receipted 50 ms after its write.
	const rate, rtt = 10e6, 50 * time.Millisecond
	var sent, received uint64
	for i := range 100 {
		now := t0.Add(time.Duration(i) * 10 * time.Millisecond)
		sent += 100e3
		e.wrote(sent, received, now)
		if i >= 5 {
			received += 100e3
			e.receipt(received, now.Add(time.Microsecond))
		}
	}
	if want := int(2 * rate * rtt.Seconds()); e.limit() < want*8/10 || e.limit() > want*13/10 {
		t.Fatalf("bound %d, want about %d (twice 10 MB/s x 50 ms)", e.limit(), want)
	}
	// A receipt covering no whole write measures nothing.
	before := e
	e.receipt(received+1, t0.Add(2*time.Second))
	if e.minRTT != before.minRTT || e.rate != before.rate {
		t.Fatal("a receipt inside a write changed the estimate")
	}
	// Bounded above and below.
	e = bdpEstimate{}
	e.wrote(1<<30, 0, t0)
	e.receipt(1<<30, t0.Add(time.Second))
	if got := e.limit(); got != MaxStreamsInFlight {
		t.Fatalf("1 GiB a second over a second: %d, want the most, %d", got, MaxStreamsInFlight)
	}
	e = bdpEstimate{}
	e.wrote(100, 0, t0)
	e.receipt(100, t0.Add(time.Millisecond))
	if got := e.limit(); got != MinStreamsInFlight {
		t.Fatalf("a trickle: %d, want the least, %d", got, MinStreamsInFlight)
	}
	// A rate measured long ago gives way to the one now.
	e = bdpEstimate{}
	e.wrote(1e6, 0, t0)
	e.receipt(1e6, t0.Add(10*time.Millisecond)) // 100 MB/s
	t1 := t0.Add(rateWindow + time.Second)
	e.wrote(2e6, 1e6, t1)
	e.receipt(1e6+1e4, t1.Add(10*time.Millisecond)) // covers nothing
	e.receipt(2e6, t1.Add(100*time.Millisecond))    // 10 MB/s
	if e.rate > 11e6 {
		t.Fatalf("rate %.0f B/s kept past its window", e.rate)
	}
	// More writes than marks: the newest stands for the rest.
	e = bdpEstimate{}
	for i := range 2 * maxMarks {
		e.wrote(uint64(i+1)*1000, 0, t0.Add(time.Duration(i)*time.Millisecond))
	}
	if len(e.marks) != maxMarks || e.marks[maxMarks-1].sent != 2*maxMarks*1000 {
		t.Fatalf("%d marks, the last at %d", len(e.marks), e.marks[len(e.marks)-1].sent)
	}
}

// TestBDPEstimateBurstyReceipts: receipts that come in bursts (one a
// millisecond, each covering all that was written until a round trip
// before) do not read as a rate many times the link's: a link of 100 MB/s
// and 100 µs has a product of 10 kB, so the bound stays the least one.
func TestBDPEstimateBurstyReceipts(t *testing.T) {
	var e bdpEstimate
	t0 := time.Unix(1000, 0)
	const step, rtt = 160 * time.Microsecond, 100 * time.Microsecond
	var sent, received uint64
	type w struct {
		sent uint64
		at   time.Time
	}
	var writes []w
	next := t0.Add(time.Millisecond)
	for i := range 1000 {
		now := t0.Add(time.Duration(i) * step)
		sent += 16e3
		e.wrote(sent, received, now)
		writes = append(writes, w{sent, now})
		if !now.Before(next) {
			for len(writes) > 0 && !writes[0].at.After(now.Add(-rtt)) {
				received = writes[0].sent
				writes = writes[1:]
			}
			e.receipt(received, now)
			next = now.Add(time.Millisecond)
		}
	}
	if got := e.limit(); got != MinStreamsInFlight {
		t.Fatalf("bound %d for a 10 kB product seen through bursty receipts (rate %.0f B/s, round trip %s), want the least, %d", got, e.rate, e.minRTT, MinStreamsInFlight)
	}
}
