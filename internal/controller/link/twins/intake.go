package twins

// What nodes report, taken and kept per Device until it is written:
// Handle and Forget.

import (
	"context"
	"fmt"
	"slices"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/internal/controller/link/cloudhub"
	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/shared/twinvalue"
)

type pendingTwin struct {
	reported *v1alpha1.TwinProperty
	observed *v1alpha1.TwinProperty
	// ownObserved: the report itself carried observed (not taken over
	// from the one it replaced).
	ownObserved bool
	at          time.Time
	pos         position
	ref         *msgRef
	applied     bool // by the last write that took it
}

// covers says whether t, the newer report of its property, says all
// that older did: the node may forget older once it holds t.
func (t *pendingTwin) covers(older *pendingTwin) bool {
	return t.ownObserved || !older.ownObserved
}

type pendingState struct {
	state   string
	at      time.Time
	online  bool
	cond    metav1.Condition
	pos     position
	ref     *msgRef
	applied bool // by the last write that took it
}

// pendingCond is a condition the node set on a Device (applyEdgeCondition),
// or, when cloud is set, one the cloud sets for the node's report at pos.
type pendingCond struct {
	c     *linkv1.DeviceCondition
	cloud *metav1.Condition
	gen   int64
	pos   position
	ref   *msgRef
}

func (c *pendingCond) condType() string {
	if c.cloud != nil {
		return c.cloud.Type
	}
	return c.c.GetType()
}

// twinState is what was taken for a Device and not written yet.
type twinState struct {
	twins map[string]*pendingTwin
	state *pendingState
	conds []pendingCond
	// extra are messages taken whose effect the pending state (or the
	// write in flight) holds without a pending item of their own: a
	// state replaced by one that does not say all it said, a report
	// resent while the first copy waits. Durable with the next write.
	extra   []*msgRef
	oldest  time.Time // read time of the oldest unwritten report
	arrived time.Time // when the oldest unwritten report arrived
	seen    *v1alpha1.LinkPosition

	// news: a pending report changes a value Device.status holds (the
	// cache's), rather than repeating it (a mapper's heartbeat).
	news bool
	// prio is that of the most urgent pending item; rush says an urgent
	// one waits.
	prio priority
	rush bool

	writing   bool
	lastWrite time.Time
	// lastNewsWrite is the last write that carried news: news coalesces
	// after it, the rest (repeated values, conditions, states) after any
	// write. A heartbeat or a condition written just before a change then
	// does not hold the change to the interval's end; writes stay at most
	// two an interval.
	lastNewsWrite time.Time
	// written and writtenState are what this writer's last writes put in
	// the Device's status (per property; the state): what it knows etcd
	// holds, for no other writer writes these while this one holds the
	// node's session (a newer session fences it, and Release drops them).
	written      map[string]twinRecord
	writtenState *stateRecord
	// records counts Release's drops of written: a write in flight then
	// records nothing.
	records uint64
	// node is the node of the last report taken.
	node string
	// urgentAt is when the oldest unwritten urgent report arrived (zero
	// when none waits).
	urgentAt time.Time
	// failures counts the writes that failed in a row; retryAt is when
	// the next may be tried.
	failures int
	retryAt  time.Time
}

// hasItems says whether st holds something to write.
func (st *twinState) hasItems() bool {
	return len(st.twins) > 0 || st.state != nil || len(st.conds) > 0
}

func (st *twinState) dirty() bool { return st.hasItems() || len(st.extra) > 0 }

// raise notes a pending report's priority.
func (st *twinState) raise(p priority) {
	if p > st.prio {
		st.prio = p
	}
	st.rush = st.rush || p == prioUrgent
}

// Handle is the cloudhub Handler: it takes reported values and device
// states. Messages about a Device that no longer exists are dropped.
func (s *Status) Handle(ctx context.Context, m cloudhub.Inbound) error {
	var ref *linkv1.DeviceRef
	switch k := m.Env.Kind.(type) {
	case *linkv1.Envelope_TwinReported:
		ref = k.TwinReported.Device
	case *linkv1.Envelope_DeviceState:
		ref = k.DeviceState.Device
	case *linkv1.Envelope_DeviceCondition:
		ref = k.DeviceCondition.Device
	}
	if ref == nil {
		s.noop(m)
		return nil
	}
	key := types.NamespacedName{Namespace: ref.Namespace, Name: ref.Name}
	var d v1alpha1.Device
	// Read only: no copy of the cached Device for every report.
	if err := s.reader.Get(ctx, key, &d, client.UnsafeDisableDeepCopy); err != nil {
		if apierrors.IsNotFound(err) {
			s.metrics.dropped("device-gone")
			s.noop(m)
			return nil
		}
		return err // transient: the edge resends
	}
	var checked checkedReport
	if r := m.Env.GetTwinReported(); r != nil {
		var model v1alpha1.DeviceModel
		if d.Spec.DeviceModelRef == nil {
			s.metrics.dropped("model-gone")
			s.noop(m)
			return nil
		}
		if err := s.reader.Get(ctx, types.NamespacedName{Namespace: d.Namespace, Name: d.Spec.DeviceModelRef.Name}, &model, client.UnsafeDisableDeepCopy); err != nil {
			if apierrors.IsNotFound(err) {
				s.metrics.dropped("model-gone")
				s.noop(m)
				return nil
			}
			return err
		}
		checked = checkReport(&model, r, m.Node, time.Now())
	}
	s.mu.Lock()
	s.arrival++
	pos := position{node: m.Node, stream: m.At.Stream, seq: m.At.Seq, epoch: int64(m.Epoch), order: s.arrival}
	acks, ok := s.acksLocked(m)
	if !ok {
		s.mu.Unlock()
		s.metrics.dropped("released")
		return nil
	}
	stored := d.Status.ReportedPosition
	if pos.fencedBy(stored) {
		s.mu.Unlock()
		s.fenced(m.Node, stored)
		return nil
	}
	st := s.devices[key]
	if st == nil {
		st = &twinState{twins: map[string]*pendingTwin{}}
		s.devices[key] = st
	}
	if !pos.after(stored) {
		s.pushLocked(acks, m.At, true)
		s.mu.Unlock()
		s.metrics.dropped("already-written")
		return nil
	}
	if st.seen != nil && !pos.after(st.seen) {
		// A resend of what was taken (the node reconnected): durable
		// with the write that holds the first copy, at once if that
		// write is done.
		if st.writing || st.hasItems() {
			st.extra = append(st.extra, s.pushLocked(acks, m.At, false))
		} else {
			s.pushLocked(acks, m.At, true)
		}
		s.mu.Unlock()
		s.metrics.dropped("already-taken")
		return nil
	}
	msg := s.pushLocked(acks, m.At, false)
	st.node = m.Node
	at := s.now()
	switch k := m.Env.Kind.(type) {
	case *linkv1.Envelope_TwinReported:
		r := k.TwinReported
		if checked.refused != "" {
			s.metrics.dropped(checked.refused)
			s.log.V(1).Info("dropped a report the node's agent should have refused", "node", m.Node, "device", key.String(), "reason", checked.message)
			cond := refusalCondition(checked, d.Generation)
			s.addCondLocked(st, pendingCond{cloud: &cond, gen: d.Generation, pos: pos, ref: msg}, conditionPriority(&d, cond))
			break
		}
		if checked.trimmed > 0 {
			s.metrics.Trimmed.Inc()
		}
		at = checked.at
		pt := &pendingTwin{reported: checked.reported, observed: checked.observed, ownObserved: checked.observed != nil, at: at, pos: pos, ref: msg}
		p, news := st.twinPriority(&d, r.Property, pt.reported, pt.observed)
		st.news = st.news || news
		st.raise(p)
		if p == prioRepeat && !st.writing {
			// Its value is in etcd (this writer put it there): only its
			// read time waits, for the heartbeat.
			s.durableLocked([]*msgRef{msg})
		}
		if old := st.twins[r.Property]; old != nil {
			s.metrics.Coalesced.Inc()
			if pt.observed == nil {
				pt.observed = old.observed
			}
			s.replacedLocked(st, old.ref, pt.covers(old))
		}
		st.twins[r.Property] = pt
		if s.cfg.Readings != nil {
			s.cfg.Readings.Observe(key, m.Node, r.Property, pt.reported.Value, at)
		}
		s.metrics.Reports.WithLabelValues("reported").Inc()
	case *linkv1.Envelope_DeviceState:
		ds := k.DeviceState
		if t := ds.GetTime(); t != nil {
			at = t.AsTime()
		}
		c := metav1.Condition{Type: v1alpha1.ConditionMapperConnected, Status: metav1.ConditionTrue,
			Reason: "Reporting", Message: fmt.Sprintf("mapper %q on node %s reports the device %s", ds.Mapper, m.Node, ds.State), ObservedGeneration: d.Generation}
		if ds.Mapper == "" {
			// The agent's word: no mapper on the node serves the device.
			c.Status, c.Reason, c.Message = metav1.ConditionFalse, "NoMapper",
				fmt.Sprintf("no mapper on node %s serves the device (none registered under its mapperName or its protocol)", m.Node)
		}
		ps := &pendingState{state: ds.State, at: at, cond: c, pos: pos, ref: msg,
			online: twinvalue.Online(ds.State)}
		p := st.statePriority(&d, ds.State, c)
		st.raise(p)
		if p == prioRepeat && !st.writing {
			s.durableLocked([]*msgRef{msg}) // as a repeated value's
		}
		if old := st.state; old != nil {
			covers := true
			if !ps.online && old.online {
				// Keep the newer online time a coalesced report carried;
				// only the older report says it.
				ps.online, ps.at = false, old.at
				covers = false
			}
			s.replacedLocked(st, old.ref, covers)
		}
		st.state = ps
		if s.cfg.Readings != nil {
			s.cfg.Readings.SetState(key, m.Node, ds.State, at)
		}
		s.metrics.Reports.WithLabelValues("state").Inc()
	case *linkv1.Envelope_DeviceCondition:
		var scratch v1alpha1.DeviceStatus
		if !applyEdgeCondition(&scratch, k.DeviceCondition, d.Generation) {
			s.durableLocked([]*msgRef{msg})
			s.mu.Unlock()
			s.metrics.dropped("condition-type")
			return nil
		}
		s.addCondLocked(st, pendingCond{c: k.DeviceCondition, gen: d.Generation, pos: pos, ref: msg}, conditionPriority(&d, scratch.Conditions[0]))
		s.metrics.Reports.WithLabelValues("condition").Inc()
	}
	st.seen = pos.linkPosition()
	now := s.now()
	if st.oldest.IsZero() {
		st.oldest = at
	}
	if st.arrived.IsZero() {
		st.arrived = now
	}
	if st.rush && st.urgentAt.IsZero() {
		st.urgentAt = now
	}
	if _, ok := m.Env.Kind.(*linkv1.Envelope_TwinReported); ok && !at.IsZero() {
		s.metrics.ReportTransit.Observe(now.Sub(at).Seconds())
	}
	s.scheduleLocked(key, st)
	s.mu.Unlock()
	return nil
}

// Forget drops a deleted Device's state; its messages count as durable.
func (s *Status) Forget(key types.NamespacedName) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.devices[key]
	delete(s.devices, key)
	s.queue.remove(key)
	if s.cfg.Readings != nil {
		s.cfg.Readings.Forget(key)
	}
	if st != nil {
		s.durableLocked(st.refs())
	}
}

// refs are the messages st's pending items and extras hold.
func (st *twinState) refs() []*msgRef {
	out := slices.Clone(st.extra)
	for _, t := range st.twins {
		out = append(out, t.ref)
	}
	if st.state != nil {
		out = append(out, st.state.ref)
	}
	for _, c := range st.conds {
		out = append(out, c.ref)
	}
	return out
}

// replacedLocked settles the message of a pending item a newer one
// replaced: durable at once when the newer one says all it said (the node
// keeps the newer one until it is written, and resends it to whichever
// replica serves it next), else with the Device's next write.
func (s *Status) replacedLocked(st *twinState, old *msgRef, covered bool) {
	if covered {
		s.durableLocked([]*msgRef{old})
		return
	}
	st.extra = append(st.extra, old)
}

// addCondLocked adds a condition to st's pending ones, replacing one of
// the same type (it would be overwritten in the write anyway).
func (s *Status) addCondLocked(st *twinState, c pendingCond, p priority) {
	st.raise(p)
	for i := range st.conds {
		if st.conds[i].condType() == c.condType() {
			s.replacedLocked(st, st.conds[i].ref, true)
			st.conds = slices.Delete(st.conds, i, i+1)
			break
		}
	}
	st.conds = append(st.conds, c)
}

// twinRecord is what a status holds of a twin; reported is false when
// it holds no reported value.
type twinRecord struct {
	reported bool
	value    string
	metadata map[string]string
	observed *string
}

func cachedTwin(d *v1alpha1.Device, prop string) twinRecord {
	var r twinRecord
	t := d.Twin(prop)
	if t == nil {
		return r
	}
	if t.Reported != nil {
		r.reported, r.value, r.metadata = true, t.Reported.Value, t.Reported.Metadata
	}
	if t.ObservedDesired != nil {
		r.observed = &t.ObservedDesired.Value
	}
	return r
}

// stateRecord is the state a write put in a status, with the
// MapperConnected condition it set.
type stateRecord struct {
	state string
	cond  metav1.Condition
}

// twinPriority ranks a report of property prop against what the
// Device's status holds: what this writer wrote, or else the cache's d.
// Urgent when it acknowledges a desired value (an observedDesired, or a
// desiredError, the status does not hold), a change when its value or
// metadata (but for the read time) differ, else a repeat. A repeat that
// only the cache vouches for is a change: the cache may not have seen a
// newer write yet (another replica's, before this one took the node), and
// a repeat is acknowledged to the node before it is written.
//
// news says whether it changes anything the status holds, by either's
// word: a repeat the cache vouches for is written as a change, but like a
// repeat it does not count as news for the coalescing interval.
func (st *twinState) twinPriority(d *v1alpha1.Device, prop string, reported, observed *v1alpha1.TwinProperty) (p priority, news bool) {
	cur, own := st.written[prop]
	if !own {
		cur = cachedTwin(d, prop)
	}
	switch {
	case observed != nil && (cur.observed == nil || !twinvalue.Equal(*cur.observed, observed.Value)):
		return prioUrgent, true
	case reported.Metadata[twinvalue.MetaDesiredError] != cur.metadata[twinvalue.MetaDesiredError]:
		return prioUrgent, true
	case !cur.reported || !twinvalue.Equal(cur.value, reported.Value) || !sameMetadata(cur.metadata, reported.Metadata):
		return prioChange, true
	case !own:
		return prioChange, false
	}
	return prioRepeat, false
}

// confirmed says whether this writer's last write of the Device holds
// what t's own message said (its value, metadata but the read time, and
// its observed desired value if it carried one).
func (st *twinState) confirmed(prop string, t *pendingTwin) bool {
	cur, ok := st.written[prop]
	if !ok || !cur.reported || !twinvalue.Equal(cur.value, t.reported.Value) || !sameMetadata(cur.metadata, t.reported.Metadata) {
		return false
	}
	return !t.ownObserved || (cur.observed != nil && twinvalue.Equal(*cur.observed, t.observed.Value))
}

// record notes what a write that landed put in the status.
func (st *twinState) record(b *batch) {
	if st.written == nil {
		st.written = map[string]twinRecord{}
	}
	for prop, t := range b.twins {
		if !t.applied {
			delete(st.written, prop) // another write's value is there
			continue
		}
		rec := twinRecord{reported: true, value: t.reported.Value, metadata: t.reported.Metadata}
		if t.observed != nil {
			rec.observed = &t.observed.Value
		} else if old, ok := st.written[prop]; ok {
			rec.observed = old.observed
		}
		st.written[prop] = rec
	}
	if ps := b.state; ps != nil {
		st.writtenState = nil
		if ps.applied {
			st.writtenState = &stateRecord{state: ps.state, cond: ps.cond}
		}
	}
}

// sameMetadata compares two twins' metadata but for the read time.
func sameMetadata(a, b map[string]string) bool {
	for k, v := range a {
		if k != twinvalue.MetaTimestamp && b[k] != v {
			return false
		}
	}
	for k, v := range b {
		if k != twinvalue.MetaTimestamp && a[k] != v {
			return false
		}
	}
	return true
}

// statePriority: urgent when the state, or the MapperConnected condition
// it sets, differs from what the status holds (this writer's last state,
// or else the cache's); a repeat when it is this writer's last state
// again (it refreshes lastOnlineTime); else (the cache's word alone) a
// change.
func (st *twinState) statePriority(d *v1alpha1.Device, state string, c metav1.Condition) priority {
	if r := st.writtenState; r != nil {
		if r.state != state || r.cond.Status != c.Status || r.cond.Reason != c.Reason || r.cond.Message != c.Message {
			return prioUrgent
		}
		return prioRepeat
	}
	if d.Status.State != state || conditionPriority(d, c) == prioUrgent {
		return prioUrgent
	}
	return prioChange
}

// conditionPriority: urgent when c differs from d's condition of its
// type, else a change (a condition said again is rare; it is written, as
// the cache alone vouches for it).
func conditionPriority(d *v1alpha1.Device, c metav1.Condition) priority {
	cur := meta.FindStatusCondition(d.Status.Conditions, c.Type)
	if cur == nil || cur.Status != c.Status || cur.Reason != c.Reason || cur.Message != c.Message {
		return prioUrgent
	}
	return prioChange
}
