package twins

// What nodes report, taken and kept per Device until it is written:
// Handle, Touch and Forget.

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
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
	at       time.Time
	pos      position
}

type pendingState struct {
	state  string
	at     time.Time
	online bool
	cond   metav1.Condition
	pos    position
}

// pendingCond is a condition the node set on a Device (applyEdgeCondition),
// or, when cloud is set, one the cloud sets for the node's report at pos.
type pendingCond struct {
	c     *linkv1.DeviceCondition
	cloud *metav1.Condition
	gen   int64
	pos   position
}

// twinState is what was taken for a Device and not written yet.
type twinState struct {
	twins   map[string]*pendingTwin
	state   *pendingState
	conds   []pendingCond
	refs    []*msgRef
	acks    []*nodeAcks // the node of each ref
	touched bool        // recompute DesiredApplied even without reports
	oldest  time.Time   // read time of the oldest unwritten report
	arrived time.Time   // when the oldest unwritten report arrived
	seen    *v1alpha1.LinkPosition

	// news: a pending report changes a value Device.status holds (the
	// cache's), rather than repeating it (a mapper's heartbeat).
	news bool

	writing   bool
	lastWrite time.Time
	// lastNewsWrite is the last write that carried news: news coalesces
	// after it, the rest (repeated values, conditions, states) after any
	// write. A heartbeat or a condition written just before a change then
	// does not hold the change to the interval's end; writes stay at most
	// two an interval.
	lastNewsWrite time.Time
}

func (st *twinState) dirty() bool {
	return len(st.twins) > 0 || st.state != nil || len(st.conds) > 0 || len(st.refs) > 0 || st.touched
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
	if !pos.after(stored) || (st.seen != nil && !pos.after(st.seen)) {
		s.pushLocked(acks, m.At, true)
		s.mu.Unlock()
		s.metrics.dropped("already-written")
		return nil
	}
	at := time.Now()
	switch k := m.Env.Kind.(type) {
	case *linkv1.Envelope_TwinReported:
		r := k.TwinReported
		if checked.refused != "" {
			s.metrics.dropped(checked.refused)
			s.log.V(1).Info("dropped a report the node's agent should have refused", "node", m.Node, "device", key.String(), "reason", checked.message)
			cond := refusalCondition(checked, d.Generation)
			st.conds = append(st.conds, pendingCond{cloud: &cond, gen: d.Generation, pos: pos})
			break
		}
		if checked.trimmed > 0 {
			s.metrics.Trimmed.Inc()
		}
		at = checked.at
		pt := &pendingTwin{reported: checked.reported, observed: checked.observed, at: at, pos: pos}
		st.news = st.news || !holds(&d, r.Property, pt.reported.Value, pt.observed)
		if old := st.twins[r.Property]; old != nil {
			s.metrics.Coalesced.Inc()
			if pt.observed == nil {
				pt.observed = old.observed
			}
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
		ps := &pendingState{state: ds.State, at: at, cond: c, pos: pos,
			online: twinvalue.Online(ds.State)}
		if st.state != nil && !ps.online && st.state.online {
			// Keep the newer online time a coalesced report carried.
			ps.online, ps.at = false, st.state.at
		}
		st.state = ps
		s.metrics.Reports.WithLabelValues("state").Inc()
	case *linkv1.Envelope_DeviceCondition:
		var scratch v1alpha1.DeviceStatus
		if !applyEdgeCondition(&scratch, k.DeviceCondition, d.Generation) {
			s.pushLocked(acks, m.At, true)
			s.mu.Unlock()
			s.metrics.dropped("condition-type")
			return nil
		}
		st.conds = append(st.conds, pendingCond{c: k.DeviceCondition, gen: d.Generation, pos: pos})
		s.metrics.Reports.WithLabelValues("condition").Inc()
	}
	st.seen = pos.linkPosition()
	now := time.Now()
	if st.oldest.IsZero() {
		st.oldest = at
	}
	if st.arrived.IsZero() {
		st.arrived = now
	}
	if _, ok := m.Env.Kind.(*linkv1.Envelope_TwinReported); ok && !at.IsZero() {
		s.metrics.ReportTransit.Observe(now.Sub(at).Seconds())
	}
	ref2 := s.pushLocked(acks, m.At, false)
	st.refs = append(st.refs, ref2)
	st.acks = append(st.acks, acks)
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
	s.scheduleLocked(key, st)
}

// Forget drops a deleted Device's state; its messages count as durable.
func (s *Status) Forget(key types.NamespacedName) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.devices[key]
	delete(s.devices, key)
	if st != nil {
		s.durableLocked(st.refs, st.acks)
	}
}

// holds says whether d's status already shows property prop reported as
// value (and observedDesired as observed, when given).
func holds(d *v1alpha1.Device, prop, value string, observed *v1alpha1.TwinProperty) bool {
	for _, t := range d.Status.Twins {
		if t.PropertyName != prop {
			continue
		}
		if t.Reported == nil || !twinvalue.Equal(t.Reported.Value, value) {
			return false
		}
		return observed == nil || (t.ObservedDesired != nil && twinvalue.Equal(t.ObservedDesired.Value, observed.Value))
	}
	return false
}
