package twins

// The order and pace of status writes: a budget of writes a second for
// the whole replica, spent on the most urgent Devices first and, within a
// priority, on the one that has waited longest.

import (
	"container/heap"
	"math"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// priority ranks what a Device's pending write carries; a Device's is
// that of the most urgent thing it holds.
type priority int

const (
	// prioRepeat: only values, states and conditions the status already
	// holds, reported again; they refresh its timestamps, on the heartbeat
	// interval.
	prioRepeat priority = iota
	// prioChange: a reported value (or its metadata) the status does not
	// hold.
	prioChange
	// prioUrgent: what someone waits for: a desired value's
	// acknowledgement (observedDesired, a mapper's desiredError, the
	// DesiredApplied condition behind the spec) and changes of state or
	// conditions.
	prioUrgent
	numPriorities
)

var priorityNames = [numPriorities]string{"repeat", "change", "urgent"}

func (p priority) String() string { return priorityNames[p] }

// writeQueue holds the Devices that have something to write, each once,
// with the priority of what it holds, the time it may be written (due:
// the coalescing interval after its last write, the heartbeat interval
// for repeats) and the time it has waited since (its oldest unwritten
// report's arrival). next hands out, at most rate a second (a token
// bucket of burst), the due Device of the highest priority that has
// waited longest: with D Devices of one priority due and a budget of B,
// each is written at least once every D/B seconds, and their statuses age
// alike. Not safe for concurrent use (Status's mutex guards it).
type writeQueue struct {
	rate   float64 // tokens a second; <= 0: no budget
	burst  float64
	tokens float64
	filled time.Time // when tokens was last brought up to date

	entries map[types.NamespacedName]*queued
	waiting itemHeap                // not yet due, earliest first
	ready   [numPriorities]itemHeap // due, by priority, oldest first
	counts  [numPriorities]int      // entries by priority
}

type queued struct {
	key   types.NamespacedName
	prio  priority
	due   time.Time
	since time.Time
	// gen changes whenever the entry does: heap items of another gen are
	// stale and skipped (an entry is not searched for in the heaps).
	gen uint64
}

// item is an entry as it was filed: its keys do not change while it is
// in a heap.
type item struct {
	e          *queued
	gen        uint64
	due, since time.Time
}

func newWriteQueue(rate float64) *writeQueue {
	q := &writeQueue{rate: rate, entries: map[types.NamespacedName]*queued{}, waiting: itemHeap{less: byDue}}
	for p := range q.ready {
		q.ready[p].less = byWait
	}
	if rate > 0 {
		// A tenth of a second's worth: a quiet replica writes a burst of
		// changes at once, and no window of a second sees much more than
		// the budget.
		q.burst = math.Max(1, math.Ceil(rate/10))
		q.tokens = q.burst
	}
	return q
}

// add queues key, or updates its entry: the priority only rises, the due
// time and the time it waits since only move earlier.
func (q *writeQueue) add(key types.NamespacedName, p priority, due, since time.Time) {
	e := q.entries[key]
	if e == nil {
		e = &queued{key: key, prio: p, due: due, since: since}
		q.entries[key] = e
		q.counts[p]++
		q.push(e)
		return
	}
	changed := false
	if p > e.prio {
		q.counts[e.prio]--
		q.counts[p]++
		e.prio, changed = p, true
	}
	if due.Before(e.due) {
		e.due, changed = due, true
	}
	if since.Before(e.since) {
		e.since, changed = since, true
	}
	if changed {
		q.push(e)
	}
}

// push files e afresh (its older heap items go stale).
func (q *writeQueue) push(e *queued) {
	e.gen++
	heap.Push(&q.waiting, item{e: e, gen: e.gen, due: e.due, since: e.since})
}

// remove drops key's entry, if any.
func (q *writeQueue) remove(key types.NamespacedName) {
	if e := q.entries[key]; e != nil {
		delete(q.entries, key)
		q.counts[e.prio]--
		e.gen++ // its heap items go stale
	}
}

// has says whether key is queued.
func (q *writeQueue) has(key types.NamespacedName) bool { return q.entries[key] != nil }

// pending is how many Devices of each priority are queued.
func (q *writeQueue) pending() [numPriorities]int { return q.counts }

// next returns the Device to write now and its priority, taking it off
// the queue and spending a token; when there is none, ok is false and
// wait says when to ask again (0: not until something is added).
func (q *writeQueue) next(now time.Time) (key types.NamespacedName, p priority, ok bool, wait time.Duration) {
	for q.waiting.Len() > 0 {
		it := q.waiting.top()
		if it.gen != it.e.gen || q.entries[it.e.key] != it.e {
			heap.Pop(&q.waiting)
			continue
		}
		if it.due.After(now) {
			break
		}
		heap.Pop(&q.waiting)
		heap.Push(&q.ready[it.e.prio], it)
	}
	var e *queued
	for p := numPriorities - 1; p >= 0 && e == nil; p-- {
		h := &q.ready[p]
		for h.Len() > 0 {
			it := h.top()
			if it.gen != it.e.gen || q.entries[it.e.key] != it.e {
				heap.Pop(h)
				continue
			}
			e = it.e
			break
		}
	}
	if e == nil {
		if q.waiting.Len() > 0 {
			// The head may be stale; asking again early costs one pass.
			return key, 0, false, max(q.waiting.top().due.Sub(now), time.Millisecond)
		}
		return key, 0, false, 0
	}
	if q.rate > 0 {
		q.refill(now)
		if q.tokens < 1 {
			return key, 0, false, time.Duration((1 - q.tokens) / q.rate * float64(time.Second))
		}
		q.tokens--
	}
	heap.Pop(&q.ready[e.prio])
	q.remove(e.key)
	return e.key, e.prio, true, 0
}

func (q *writeQueue) refill(now time.Time) {
	if q.filled.IsZero() {
		q.filled = now
	}
	if d := now.Sub(q.filled); d > 0 {
		q.tokens = math.Min(q.burst, q.tokens+d.Seconds()*q.rate)
		q.filled = now
	}
}

// itemHeap is a container/heap of items in the order less says.
type itemHeap struct {
	items []item
	less  func(a, b item) bool
}

func (h *itemHeap) Len() int           { return len(h.items) }
func (h *itemHeap) Less(i, j int) bool { return h.less(h.items[i], h.items[j]) }
func (h *itemHeap) Swap(i, j int)      { h.items[i], h.items[j] = h.items[j], h.items[i] }
func (h *itemHeap) Push(x any) {
	if it, ok := x.(item); ok {
		h.items = append(h.items, it)
	}
}
func (h *itemHeap) Pop() any {
	it := h.items[len(h.items)-1]
	h.items[len(h.items)-1] = item{}
	h.items = h.items[:len(h.items)-1]
	return it
}

func (h *itemHeap) top() item { return h.items[0] }

// byDue puts the earliest due first; byWait the one waiting since the
// earliest time.
func byDue(a, b item) bool { return a.due.Before(b.due) }
func byWait(a, b item) bool {
	if !a.since.Equal(b.since) {
		return a.since.Before(b.since)
	}
	return a.due.Before(b.due)
}
