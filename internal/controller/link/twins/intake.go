package twins

// What nodes report, taken and kept per Device until it is written:
// Handle, Touch and Forget.

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
}

// covers says whether t, the newer report of its property, says all
// that older did: the node may forget older once it holds t.
func (t *pendingTwin) covers(older *pendingTwin) bool {
	return t.ownObserved || !older.ownObserved
}

type pendingState struct {
	state  string
	at     time.Time
	online bool
	cond   metav1.Condition
	pos    position
	ref    *msgRef
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
	touched bool      // recompute DesiredApplied even without reports
	oldest  time.Time // read time of the oldest unwritten report
	arrived time.Time // when the oldest unwritten report arrived
	seen    *v1alpha1.LinkPosition

	// news: a pending report changes a value Device.status holds (the
	// cache's), rather than repeating it (a mapper's heartbeat).
	news bool
	// prio is that of the most urgent pending item.
	prio priority

	writing   bool
	lastWrite time.Time
	// lastNewsWrite is the last write that carried news: news coalesces
	// after it, the rest (repeated values, conditions, states) after any
	// write. A heartbeat or a condition written just before a change then
	// does not hold the change to the interval's end; writes stay at most
	// two an interval.
	lastNewsWrite time.Time
	// statusTime is the cached status' lastReportTime when this writer
	// first took a report of the Device: the heartbeat counts from it
	// until this writer has written the Device.
	statusTime time.Time
	// failures counts the writes that failed in a row; retryAt is when
	// the next may be tried.
	failures int
	retryAt  time.Time
}

// hasItems says whether st holds something to write.
func (st *twinState) hasItems() bool {
	return len(st.twins) > 0 || st.state != nil || len(st.conds) > 0 || st.touched
}

func (st *twinState) dirty() bool { return st.hasItems() || len(st.extra) > 0 }

func (st *twinState) raise(p priority) {
	if p > st.prio {
		st.prio = p
	}
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
	if st.lastWrite.IsZero() && st.statusTime.IsZero() && d.Status.LastReportTime != nil {
		st.statusTime = d.Status.LastReportTime.Time
	}
	msg := s.pushLocked(acks, m.At, false)
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
		p := twinPriority(&d, r.Property, pt.reported, pt.observed)
		st.news = st.news || p >= prioChange
		st.raise(p)
		if old := st.twins[r.Property]; old != nil {
			s.metrics.Coalesced.Inc()
			if pt.observed == nil {
				pt.observed = old.observed
			}
			s.replacedLocked(st, old.ref, pt.covers(old))
		}
		st.twins[r.Property] = pt
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
		st.raise(statePriority(&d, ds.State, c))
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
	if _, ok := m.Env.Kind.(*linkv1.Envelope_TwinReported); ok && !at.IsZero() {
		s.metrics.ReportTransit.Observe(now.Sub(at).Seconds())
	}
	s.scheduleLocked(key, st)
	s.mu.Unlock()
	return nil
}

// Touch asks for key's DesiredApplied condition to be brought up to date
// with its spec (a desired value changed) at the next write.
func (s *Status) Touch(key types.NamespacedName) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.devices[key]
	if st == nil {
		st = &twinState{twins: map[string]*pendingTwin{}}
		s.devices[key] = st
	}
	st.touched = true
	st.raise(prioUrgent)
	s.scheduleLocked(key, st)
}

// Forget drops a deleted Device's state; its messages count as durable.
func (s *Status) Forget(key types.NamespacedName) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.devices[key]
	delete(s.devices, key)
	s.queue.remove(key)
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

// twinPriority ranks a report of property prop against what d's status
// (the cache's) holds: urgent when it acknowledges a desired value (an
// observedDesired, or a desiredError, the status does not hold), a change
// when its value or metadata (but for the read time) differ, else a
// repeat.
func twinPriority(d *v1alpha1.Device, prop string, reported, observed *v1alpha1.TwinProperty) priority {
	var cur *v1alpha1.Twin
	for i := range d.Status.Twins {
		if d.Status.Twins[i].PropertyName == prop {
			cur = &d.Status.Twins[i]
			break
		}
	}
	var curReported map[string]string
	curValue, hasValue := "", false
	if cur != nil && cur.Reported != nil {
		curValue, hasValue, curReported = cur.Reported.Value, true, cur.Reported.Metadata
	}
	if observed != nil && (cur == nil || cur.ObservedDesired == nil || !twinvalue.Equal(cur.ObservedDesired.Value, observed.Value)) {
		return prioUrgent
	}
	if reported.Metadata[twinvalue.MetaDesiredError] != curReported[twinvalue.MetaDesiredError] {
		return prioUrgent
	}
	if !hasValue || !twinvalue.Equal(curValue, reported.Value) || !sameMetadata(curReported, reported.Metadata) {
		return prioChange
	}
	return prioRepeat
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
// it sets, differs from d's status; else a repeat (it refreshes
// lastOnlineTime).
func statePriority(d *v1alpha1.Device, state string, c metav1.Condition) priority {
	if d.Status.State != state {
		return prioUrgent
	}
	return conditionPriority(d, c)
}

// conditionPriority: urgent when c differs from d's condition of its type.
func conditionPriority(d *v1alpha1.Device, c metav1.Condition) priority {
	cur := meta.FindStatusCondition(d.Status.Conditions, c.Type)
	if cur == nil || cur.Status != c.Status || cur.Reason != c.Reason || cur.Message != c.Message {
		return prioUrgent
	}
	return prioRepeat
}
