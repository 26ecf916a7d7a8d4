package twins

// Fenced writes: a Device's batch applied on the freshly read Device after
// its stored position, patched with its resourceVersion as precondition.

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strconv"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// position is a report's place: its node's stream and session.
type position struct {
	node   string
	stream uint64
	seq    uint64
	epoch  int64
	order  uint64 // arrival order in this process
}

func (p position) linkPosition() *v1alpha1.LinkPosition {
	return &v1alpha1.LinkPosition{Node: p.node, Stream: strconv.FormatUint(p.stream, 10), Seq: int64(p.seq), Epoch: p.epoch}
}

// after says whether p comes after the stored position (a report of
// another node or stream always does).
func (p position) after(stored *v1alpha1.LinkPosition) bool {
	return stored == nil || stored.Node != p.node || stored.Stream != strconv.FormatUint(p.stream, 10) || int64(p.seq) > stored.Seq
}

// fencedBy says whether a newer session of p's node wrote stored.
func (p position) fencedBy(stored *v1alpha1.LinkPosition) bool {
	return stored != nil && stored.Node == p.node && stored.Epoch > p.epoch
}

func (s *Status) fenced(node string, stored *v1alpha1.LinkPosition) {
	s.metrics.dropped("fenced")
	s.log.Info("a newer session of the node wrote a device: releasing the node", "node", node, "storedEpoch", stored.Epoch)
	s.Release(node)
	if s.cfg.OnFenced != nil && stored.Epoch > 0 {
		s.cfg.OnFenced(node, uint64(stored.Epoch)-1)
	}
}

// batch is what one write takes of a Device's pending state.
type batch struct {
	twins   map[string]*pendingTwin
	state   *pendingState
	conds   []pendingCond
	extra   []*msgRef
	oldest  time.Time
	arrived time.Time
	// urgentAt: twinState.urgentAt when taken.
	urgentAt time.Time
	news     bool
	prio     priority
	rush     bool
	records  uint64 // twinState.records when taken
}

func (b *batch) refs() []*msgRef {
	st := twinState{twins: b.twins, state: b.state, conds: b.conds, extra: b.extra}
	return st.refs()
}

// takeLocked takes key's pending state for a write, if it has some and
// none is in flight.
func (s *Status) takeLocked(key types.NamespacedName) (*twinState, *batch) {
	s.queue.remove(key)
	st := s.devices[key]
	if st == nil || st.writing || !st.dirty() {
		return nil, nil
	}
	b := &batch{twins: st.twins, state: st.state, conds: st.conds, extra: st.extra,
		oldest: st.oldest, arrived: st.arrived, urgentAt: st.urgentAt, news: st.news, prio: st.prio, rush: st.rush, records: st.records}
	st.twins, st.state, st.conds, st.extra = map[string]*pendingTwin{}, nil, nil, nil
	st.oldest, st.arrived, st.urgentAt, st.news, st.prio, st.rush = time.Time{}, time.Time{}, time.Time{}, false, prioRepeat, false
	st.writing = true
	st.lastWrite = s.now()
	if !b.arrived.IsZero() {
		s.metrics.StatusWait.Observe(st.lastWrite.Sub(b.arrived).Seconds())
	}
	if b.news {
		st.lastNewsWrite = st.lastWrite
	}
	return st, b
}

// writeTaken writes a batch takeLocked took. On an error the state is
// kept (merged under what came meanwhile) and retried after a back-off.
func (s *Status) writeTaken(ctx context.Context, key types.NamespacedName, st *twinState, b *batch) {
	err := s.write(ctx, key, b)

	s.mu.Lock()
	defer s.mu.Unlock()
	st.writing = false
	if cur := s.devices[key]; cur != st {
		return // forgotten or released meanwhile
	}
	if err != nil {
		if errors.Is(err, errFenced) {
			return
		}
		// Keep what was taken; newer reports of a property win.
		for p, t := range b.twins {
			cur, ok := st.twins[p]
			switch {
			case !ok:
				st.twins[p] = t
			case cur.pos.order < t.pos.order:
				st.twins[p] = t
				s.replacedLocked(st, cur.ref, t.covers(cur))
			default:
				if cur.observed == nil {
					cur.observed = t.observed
				}
				s.replacedLocked(st, t.ref, cur.covers(t))
			}
		}
		if st.state == nil {
			st.state = b.state
		} else if b.state != nil {
			st.extra = append(st.extra, b.state.ref)
		}
		for _, c := range b.conds {
			// The newer of a type, pending, wins.
			if slices.ContainsFunc(st.conds, func(o pendingCond) bool { return o.condType() == c.condType() }) {
				st.extra = append(st.extra, c.ref)
				continue
			}
			st.conds = append(st.conds, c)
		}
		st.extra = append(st.extra, b.extra...)
		st.news = st.news || b.news
		st.prio = max(st.prio, b.prio)
		st.rush = st.rush || b.rush
		if !b.oldest.IsZero() && (st.oldest.IsZero() || b.oldest.Before(st.oldest)) {
			st.oldest = b.oldest
		}
		if !b.arrived.IsZero() && (st.arrived.IsZero() || b.arrived.Before(st.arrived)) {
			st.arrived = b.arrived
		}
		if !b.urgentAt.IsZero() && (st.urgentAt.IsZero() || b.urgentAt.Before(st.urgentAt)) {
			st.urgentAt = b.urgentAt
		}
		st.failures++
		st.retryAt = s.now().Add(min(100*time.Millisecond<<min(st.failures-1, 9), 30*time.Second))
		s.scheduleLocked(key, st)
		return
	}
	st.failures, st.retryAt = 0, time.Time{}
	s.durableLocked(b.refs())
	if b.records == st.records {
		st.record(b)
		// Repeats that came during the write of what it wrote: their
		// values are in etcd now.
		var confirmed []*msgRef
		for prop, t := range st.twins {
			if !t.ref.durable && st.confirmed(prop, t) {
				confirmed = append(confirmed, t.ref)
			}
		}
		if ps, r := st.state, st.writtenState; ps != nil && !ps.ref.durable && r != nil && r.state == ps.state &&
			r.cond.Status == ps.cond.Status && r.cond.Reason == ps.cond.Reason && r.cond.Message == ps.cond.Message {
			confirmed = append(confirmed, ps.ref)
		}
		s.durableLocked(confirmed)
	}
	if !st.hasItems() && len(st.extra) > 0 {
		// Resends that came during the write: what they said is written.
		s.durableLocked(st.extra)
		st.extra = nil
	}
	s.scheduleLocked(key, st)
}

var errFenced = errors.New("fenced by a newer session of the node")

// write applies b on the freshly read Device and patches its status with
// the resourceVersion read as a precondition (a compare-and-swap that needs
// only the patch verb the chart grants); a conflict is read again from the
// API server.
func (s *Status) write(ctx context.Context, key types.NamespacedName, b *batch) error {
	reader := s.reader
	for attempt := 0; ; attempt++ {
		var d v1alpha1.Device
		if err := reader.Get(ctx, key, &d); err != nil {
			if apierrors.IsNotFound(err) {
				s.Forget(key)
				return nil
			}
			return err
		}
		orig := d.DeepCopy()
		stored := d.Status.ReportedPosition
		var newest *position
		consider := func(p position) bool {
			if p.fencedBy(stored) {
				return false
			}
			if !p.after(stored) {
				return false
			}
			if newest == nil || p.order > newest.order {
				newest = &p
			}
			return true
		}
		for _, p := range b.all() {
			if p.fencedBy(stored) {
				s.fenced(p.node, stored)
				return errFenced
			}
		}
		changed := false
		names := slices.Sorted(maps.Keys(b.twins))
		for _, name := range names {
			pt := b.twins[name]
			pt.applied = consider(pt.pos)
			if !pt.applied {
				continue
			}
			tw := twin(&d.Status, name)
			tw.Reported = pt.reported
			if pt.observed != nil {
				tw.ObservedDesired = pt.observed
			}
			if d.Status.LastReportTime == nil || d.Status.LastReportTime.Time.Before(pt.at) {
				d.Status.LastReportTime = &metav1.Time{Time: pt.at}
			}
			changed = true
		}
		for _, pc := range b.conds {
			if !consider(pc.pos) {
				continue
			}
			if pc.cloud != nil {
				meta.SetStatusCondition(&d.Status.Conditions, *pc.cloud)
				changed = true
			} else if applyEdgeCondition(&d.Status, pc.c, pc.gen) {
				changed = true
			}
		}
		if ps := b.state; ps != nil {
			ps.applied = consider(ps.pos)
		}
		if ps := b.state; ps != nil && ps.applied {
			d.Status.State = ps.state
			if ps.online {
				d.Status.LastOnlineTime = &metav1.Time{Time: ps.at}
			}
			meta.SetStatusCondition(&d.Status.Conditions, ps.cond)
			changed = true
		}
		if !changed {
			return nil // all written already (by another replica, or before a restart)
		}
		if newest != nil {
			d.Status.ReportedPosition = newest.linkPosition()
		}
		desiredApplied(&d, &d.Status)
		d.Status.Differing = differing(&d, &d.Status)
		start := time.Now()
		err := s.client.Status().Patch(ctx, &d, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{}))
		switch {
		case err == nil:
			s.metrics.Writes.WithLabelValues("ok").Inc()
			s.metrics.PriorityWrites.WithLabelValues(b.prio.String()).Inc()
			s.metrics.WriteSeconds.Observe(time.Since(start).Seconds())
			if !b.arrived.IsZero() {
				s.metrics.StatusAge.WithLabelValues(b.prio.String()).Observe(s.now().Sub(b.arrived).Seconds())
			}
			if !b.oldest.IsZero() {
				s.metrics.ReportToStatus.Observe(time.Since(b.oldest).Seconds())
			}
			if !b.urgentAt.IsZero() {
				s.metrics.UrgentWait.Observe(s.now().Sub(b.urgentAt).Seconds())
			}
			return nil
		case apierrors.IsConflict(err) && attempt < 10:
			s.metrics.Writes.WithLabelValues("conflict").Inc()
			reader = s.live // the cache may not hold the write that won yet
			continue
		case apierrors.IsNotFound(err):
			s.Forget(key)
			return nil
		default:
			s.metrics.Writes.WithLabelValues("error").Inc()
			s.log.Error(err, "writing device status", "device", key.String())
			return err
		}
	}
}

func (b *batch) all() []position {
	var out []position
	for _, t := range b.twins {
		out = append(out, t.pos)
	}
	if b.state != nil {
		out = append(out, b.state.pos)
	}
	for _, c := range b.conds {
		out = append(out, c.pos)
	}
	return out
}

func twin(st *v1alpha1.DeviceStatus, property string) *v1alpha1.Twin {
	for i := range st.Twins {
		if st.Twins[i].PropertyName == property {
			return &st.Twins[i]
		}
	}
	st.Twins = append(st.Twins, v1alpha1.Twin{PropertyName: property})
	return &st.Twins[len(st.Twins)-1]
}
