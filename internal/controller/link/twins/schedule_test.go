package twins

import (
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

func dev(i int) types.NamespacedName {
	return types.NamespacedName{Namespace: "ns", Name: fmt.Sprintf("d%04d", i)}
}

// sim drives a writeQueue on a fake clock in 1 ms steps, as Start's
// dispatcher would, with every Device reporting news again right after
// each of its writes (the queue is always in overload). It records when
// each Device was written.
type sim struct {
	q       *writeQueue
	now     time.Time
	written map[types.NamespacedName][]time.Time
	order   []types.NamespacedName
	prios   []priority
}

func newSim(rate float64) *sim {
	return &sim{q: newWriteQueue(rate), now: time.Unix(1_700_000_000, 0), written: map[types.NamespacedName][]time.Time{}}
}

// run advances the clock by d, taking every Device next hands out;
// after is told of each write (to queue the Device again).
func (s *sim) run(d time.Duration, after func(key types.NamespacedName, p priority)) {
	end := s.now.Add(d)
	for ; s.now.Before(end); s.now = s.now.Add(time.Millisecond) {
		for {
			key, p, ok, _ := s.q.next(s.now)
			if !ok {
				break
			}
			s.written[key] = append(s.written[key], s.now)
			s.order = append(s.order, key)
			s.prios = append(s.prios, p)
			if after != nil {
				after(key, p)
			}
		}
	}
}

// TestWriteQueueBudget: with a thousand Devices always due, the queue
// hands out no more than the budget a second (its burst aside), and no
// fewer.
func TestWriteQueueBudget(t *testing.T) {
	const rate, devices = 20.0, 1000
	s := newSim(rate)
	for i := range devices {
		s.q.add(dev(i), prioChange, s.now, s.now)
	}
	again := func(key types.NamespacedName, p priority) { s.q.add(key, p, s.now, s.now) }
	s.run(10*time.Second, again)
	got := len(s.order)
	if lo, hi := int(10*rate), int(10*rate+s.q.burst); got < lo || got > hi {
		t.Errorf("%d writes in 10 s at a budget of %v a second (burst %v), want %d to %d", got, rate, s.q.burst, lo, hi)
	}
	// Over any one second, at most the budget and the burst.
	times := []time.Time{}
	for _, ws := range s.written {
		times = append(times, ws...)
	}
	for _, t0 := range times {
		n := 0
		for _, t1 := range times {
			if !t1.Before(t0) && t1.Before(t0.Add(time.Second)) {
				n++
			}
		}
		if float64(n) > rate+s.q.burst {
			t.Fatalf("%d writes within the second from %v, want at most %v", n, t0, rate+s.q.burst)
		}
	}

	// No budget: everything due at once goes at once.
	u := newSim(-1)
	for i := range devices {
		u.q.add(dev(i), prioChange, u.now, u.now)
	}
	u.run(time.Millisecond, nil)
	if len(u.order) != devices {
		t.Errorf("without a budget %d of %d due Devices were handed out at once", len(u.order), devices)
	}
}

// TestWriteQueueFairness: D Devices that always have news share a budget
// B: each is written once every D/B seconds, none starves, and each
// waits about as long as any other (their statuses age alike).
func TestWriteQueueFairness(t *testing.T) {
	const rate, devices = 20.0, 500
	period := time.Duration(float64(devices) / rate * float64(time.Second)) // 25 s
	s := newSim(rate)
	// Added at odd times and in shuffled order: the order they are
	// written in is that of the time they wait since.
	for i := range devices {
		k := (i * 7919) % devices
		s.q.add(dev(k), prioChange, s.now, s.now.Add(-time.Duration(k)*time.Millisecond))
	}
	// Each reports again a second after its write (and is due an
	// interval after it).
	again := func(key types.NamespacedName, p priority) {
		s.q.add(key, p, s.now.Add(time.Second), s.now.Add(time.Second))
	}
	s.run(4*period, again)
	if first := s.order[0]; first != dev(devices-1) {
		t.Errorf("first written %v, want the one that waited longest, %v", first, dev(devices-1))
	}
	for i := range devices {
		ws := s.written[dev(i)]
		if len(ws) < 3 {
			t.Fatalf("%v written %d times in %s, want at least 3 (every %s)", dev(i), len(ws), 4*period, period)
		}
		for j := 1; j < len(ws); j++ {
			gap := ws[j].Sub(ws[j-1])
			// The budget's burst lets a write come a little early or late.
			if gap > period+time.Second || gap < period-2*time.Second {
				t.Errorf("%v written %s after its previous write, want about %s (Devices ÷ budget)", dev(i), gap, period)
			}
		}
	}
}

// TestWriteQueuePriorities: an urgent Device goes before every change
// and a change before every repeat whatever they waited; a repeat is not
// written before it is due; a Device queued again takes the higher
// priority and the earlier time.
func TestWriteQueuePriorities(t *testing.T) {
	s := newSim(10)
	t0 := s.now
	for i := range 50 {
		s.q.add(dev(i), prioChange, t0, t0.Add(-time.Hour+time.Duration(i)*time.Millisecond))
	}
	s.q.add(dev(100), prioRepeat, t0, t0.Add(-2*time.Hour))
	s.q.add(dev(101), prioRepeat, t0.Add(time.Minute), t0.Add(-3*time.Hour))
	s.q.add(dev(102), prioUrgent, t0.Add(500*time.Millisecond), t0)
	s.run(time.Second, nil)
	// The burst first (changes), then the urgent one as soon as it is due.
	var urgentAt = -1
	for i, p := range s.prios {
		if p == prioUrgent {
			urgentAt = i
		}
		if p == prioRepeat {
			t.Errorf("a repeat written (%v) while changes waited", s.order[i])
		}
	}
	if urgentAt < 0 || s.order[urgentAt] != dev(102) {
		t.Fatalf("the urgent Device was not written within a second: %v", s.order)
	}
	if when := s.written[dev(102)][0].Sub(t0); when < 500*time.Millisecond || when > 700*time.Millisecond {
		t.Errorf("urgent Device written %s after it was queued, want as soon as due (500 ms) and a token came", when)
	}
	// A change queued again as urgent jumps the queue.
	s.q.add(dev(49), prioUrgent, s.now, s.now)
	before := len(s.order)
	s.run(200*time.Millisecond, nil)
	if len(s.order) == before || s.order[before] != dev(49) || s.prios[before] != prioUrgent {
		t.Errorf("a Device raised to urgent was not the next written: %v", s.order[before:])
	}
	// The changes drain, then the due repeat; the other repeat waits for
	// its time.
	s.run(6*time.Second, nil)
	if s.written[dev(100)] == nil {
		t.Errorf("the due repeat was not written once the changes were")
	}
	if s.written[dev(101)] != nil {
		t.Errorf("a repeat was written %s before it was due", t0.Add(time.Minute).Sub(s.written[dev(101)][0]))
	}
	for i := range 50 {
		if n := len(s.written[dev(i)]); n != 1 {
			t.Errorf("%v written %d times, want once", dev(i), n)
		}
	}
	// Queued again with an earlier time (a change arrived): it goes.
	s.q.add(dev(101), prioChange, s.now, s.now)
	s.run(200*time.Millisecond, nil)
	if s.written[dev(101)] == nil {
		t.Errorf("a repeat raised to a change was not written")
	}
	if p := s.q.pending(); p != [numPriorities]int{} {
		t.Errorf("pending %v after everything was written", p)
	}
	// Removed Devices are not handed out.
	s.q.add(dev(7), prioUrgent, s.now, s.now)
	s.q.remove(dev(7))
	if _, _, ok, wait := s.q.next(s.now.Add(time.Hour)); ok || wait != 0 {
		t.Errorf("a removed Device was handed out (ok %v, wait %v)", ok, wait)
	}
}
