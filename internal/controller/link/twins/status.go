package twins

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/internal/controller/link/cloudhub"
	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/shared/twinvalue"
)

// Committer is what Status needs of a ManualCommit cloudhub.
type Committer interface {
	Commit(node string, pos cloudhub.Position)
}

// StatusConfig configures Status. Zero values take the defaults noted.
type StatusConfig struct {
	// Interval is the least time between two status writes of one Device
	// (1s). A report that changes a value is written as soon as it arrives
	// when no change was written within the last interval; changes within
	// the interval after one coalesce into one trailing write with the
	// newest value of every property. A report that repeats the value the
	// status holds (a heartbeat) waits for the interval after any write,
	// and does not hold back a change that follows it.
	Interval time.Duration
	// Batch is how long a leading-edge write waits for the reports that
	// arrive with the first one (3ms): a mapper's report of several
	// properties comes as several messages.
	Batch time.Duration
	// Concurrency bounds parallel status writes (16).
	Concurrency int
	// Live reads Devices from the API server after a write conflict (the
	// cache may not have seen the write that won yet); nil: the client.
	Live client.Reader
	// OnFenced, when set, is called (after Release) when a write finds the
	// Device written by a newer session of the same node: this replica's
	// sessions of the node through epoch through are not the owner and
	// should be closed.
	OnFenced func(node string, through uint64)
}

// Status owns the reported part of Device.status: it takes what nodes
// report (Handle), keeps the newest value of each property, and writes a
// changed Device at once when it is quiet, at most once per interval when
// it is busy.
//
// Every write is a read-modify-write of the freshly read Device with its
// resourceVersion (a conflict is read again from the API server and
// retried), and applies only the reports after the stored
// status.reportedPosition, written in the same update: a report resent
// after a controller restart, or by a node to another replica, is never
// applied twice, and status never goes back. A writer whose session of a
// node is older (Inbound.Epoch) than the one that wrote the Device is
// fenced: it writes nothing more for that node (StatusConfig.OnFenced).
//
// Acknowledgements follow writes: a node's messages are committed to the
// hub (Committer) only through the last one whose effect is in the API
// server; messages that change nothing (a Device gone, a report already
// written, kinds the writer ignores) count as durable at once. So an edge
// forgets a report only once it is in etcd.
type Status struct {
	client  client.Client // writes status
	reader  client.Reader // the cache
	live    client.Reader
	hub     Committer
	cfg     StatusConfig
	metrics *Metrics
	log     logr.Logger
	queue   workqueue.TypedRateLimitingInterface[types.NamespacedName]

	mu       sync.Mutex
	devices  map[types.NamespacedName]*twinState
	nodes    map[string]*nodeAcks
	released map[string]int64 // node → the epoch Release dropped
	arrival  uint64
}

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

// msgRef is one message taken from a node, durable once its effect is
// written (or at once when it had none).
type msgRef struct {
	at      cloudhub.Position
	durable bool
}

// nodeAcks tracks a node's taken messages in order, to commit through the
// last one before the oldest not yet durable.
type nodeAcks struct {
	node   string
	epoch  int64
	stream uint64
	fifo   []*msgRef
}

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

// pendingCond is a condition the node set on a Device (applyEdgeCondition).
type pendingCond struct {
	c   *linkv1.DeviceCondition
	gen int64
	pos position
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

// NewStatus makes a Status; hub may be nil (nothing to commit: tests).
func NewStatus(c client.Client, reader client.Reader, hub Committer, cfg StatusConfig, m *Metrics, log logr.Logger) *Status {
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.Batch <= 0 {
		cfg.Batch = 3 * time.Millisecond
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 16
	}
	live := cfg.Live
	if live == nil {
		live = c
	}
	return &Status{client: c, reader: reader, live: live, hub: hub, cfg: cfg, metrics: m, log: log,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[types.NamespacedName](100*time.Millisecond, 30*time.Second),
			workqueue.TypedRateLimitingQueueConfig[types.NamespacedName]{Name: "twin-status"}),
		devices: map[types.NamespacedName]*twinState{}, nodes: map[string]*nodeAcks{}, released: map[string]int64{}}
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
		if t := r.GetTime(); t != nil {
			at = t.AsTime()
		}
		md := maps.Clone(r.Metadata)
		if md == nil {
			md = map[string]string{}
		}
		if _, ok := md[twinvalue.MetaTimestamp]; !ok {
			md[twinvalue.MetaTimestamp] = twinvalue.Timestamp(at)
		}
		pt := &pendingTwin{reported: &v1alpha1.TwinProperty{Value: FormatValue(r.Value), Metadata: md}, at: at, pos: pos}
		if r.ObservedDesired != nil {
			pt.observed = &v1alpha1.TwinProperty{Value: FormatValue(r.ObservedDesired), Metadata: map[string]string{twinvalue.MetaTimestamp: md[twinvalue.MetaTimestamp]}}
		}
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

// noop takes a message that changes nothing: durable at once.
func (s *Status) noop(m cloudhub.Inbound) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if acks, ok := s.acksLocked(m); ok {
		s.pushLocked(acks, m.At, true)
	}
}

// acksLocked returns m's node's message tracking; false when the node's
// session of m's epoch was released (nothing of it is applied or
// committed any more: the edge resends it to the node's new owner).
func (s *Status) acksLocked(m cloudhub.Inbound) (*nodeAcks, bool) {
	if e, ok := s.released[m.Node]; ok {
		if int64(m.Epoch) <= e {
			return nil, false
		}
		delete(s.released, m.Node)
	}
	a := s.nodes[m.Node]
	if a == nil || a.stream != m.At.Stream || a.epoch != int64(m.Epoch) {
		// A new stream (a wiped edge store) or session: what was taken of
		// the old one is no use to commit.
		a = &nodeAcks{node: m.Node, epoch: int64(m.Epoch), stream: m.At.Stream}
		s.nodes[m.Node] = a
	}
	return a, true
}

// pushLocked appends a taken message to its node's queue and commits as
// far as it can.
func (s *Status) pushLocked(a *nodeAcks, at cloudhub.Position, durable bool) *msgRef {
	r := &msgRef{at: at, durable: durable}
	a.fifo = append(a.fifo, r)
	if durable {
		s.advanceLocked(a)
	}
	return r
}

// advanceLocked commits a node through its last durable message before
// the first one that is not.
func (s *Status) advanceLocked(a *nodeAcks) {
	var last *msgRef
	i := 0
	for ; i < len(a.fifo) && a.fifo[i].durable; i++ {
		last = a.fifo[i]
	}
	if last == nil {
		return
	}
	a.fifo = slices.Delete(a.fifo, 0, i)
	// A released node's queue commits nothing.
	if s.nodes[a.node] == a && s.hub != nil {
		s.hub.Commit(a.node, last.at)
	}
}

// scheduleLocked queues key's write: at once (after the batch wait) when
// the Device was not written within the interval, else at the end of it.
func (s *Status) scheduleLocked(key types.NamespacedName, st *twinState) {
	if st.writing {
		return // the write in flight schedules what came meanwhile
	}
	now := time.Now()
	due := now.Add(s.cfg.Batch)
	last := st.lastWrite
	if st.news {
		last = st.lastNewsWrite
	}
	if next := last.Add(s.cfg.Interval); next.After(due) {
		due = next
	}
	s.queue.AddAfter(key, due.Sub(now))
}

// Connected is cloudhub.SessionObserver's: nothing to do, the node
// resends what was not committed.
func (s *Status) Connected(context.Context, string) {}

// TakenOver is cloudhub.SessionObserver's: Release.
func (s *Status) TakenOver(node string) { s.Release(node) }

// Departed is cloudhub.SessionObserver's: nothing more to drop than what
// the node's Devices' removals drop.
func (s *Status) Departed(string) {}

// Release drops what node reported and was not written yet, for a node
// whose session this replica no longer holds: nothing of it was
// committed, so the edge resends it to its new owner. Messages of the
// released session (its epoch or older) that still arrive are dropped
// uncommitted.
func (s *Status) Release(node string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := int64(0)
	if a := s.nodes[node]; a != nil {
		e = a.epoch
	}
	if old, ok := s.released[node]; !ok || old < e {
		s.released[node] = e
	}
	delete(s.nodes, node)
	for key, st := range s.devices {
		drop := false
		for _, p := range st.twins {
			drop = drop || p.pos.node == node
		}
		if st.state != nil && st.state.pos.node == node {
			drop = true
		}
		for _, c := range st.conds {
			drop = drop || c.pos.node == node
		}
		if !drop {
			continue
		}
		if st.writing {
			// The write in flight commits nothing (its node's queue is
			// gone); its pending rest is dropped when it ends.
			st.twins, st.state, st.conds, st.refs, st.acks, st.news = map[string]*pendingTwin{}, nil, nil, nil, nil, false
			st.seen = nil
			continue
		}
		delete(s.devices, key)
	}
}

func (s *Status) fenced(node string, stored *v1alpha1.LinkPosition) {
	s.metrics.dropped("fenced")
	s.log.Info("a newer session of the node wrote a device: releasing the node", "node", node, "storedEpoch", stored.Epoch)
	s.Release(node)
	if s.cfg.OnFenced != nil && stored.Epoch > 0 {
		s.cfg.OnFenced(node, uint64(stored.Epoch)-1)
	}
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

func (s *Status) durableLocked(refs []*msgRef, acks []*nodeAcks) {
	seen := map[*nodeAcks]bool{}
	for i, r := range refs {
		r.durable = true
		seen[acks[i]] = true
	}
	for a := range seen {
		s.advanceLocked(a)
	}
}

// NeedLeaderElection is false: every replica writes the status of the
// Devices of the nodes whose sessions it holds.
func (s *Status) NeedLeaderElection() bool { return false }

// Start writes changed Devices until ctx ends, with Concurrency workers.
func (s *Status) Start(ctx context.Context) error {
	var wg sync.WaitGroup
	for range s.cfg.Concurrency {
		wg.Go(func() {
			for {
				key, shutdown := s.queue.Get()
				if shutdown {
					return
				}
				if err := s.writeOne(ctx, key); err != nil && ctx.Err() == nil {
					s.queue.AddRateLimited(key)
				} else {
					s.queue.Forget(key)
				}
				s.queue.Done(key)
			}
		})
	}
	<-ctx.Done()
	s.queue.ShutDown()
	wg.Wait()
	return nil
}

// Flush writes every changed Device now, whatever the interval, and
// returns when the writes are done (tests, and a stopping controller).
func (s *Status) Flush(ctx context.Context) {
	s.mu.Lock()
	var keys []types.NamespacedName
	for key, st := range s.devices {
		if st.dirty() && !st.writing {
			keys = append(keys, key)
		}
	}
	s.mu.Unlock()
	sem := make(chan struct{}, s.cfg.Concurrency)
	var wg sync.WaitGroup
	for _, key := range keys {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			_ = s.writeOne(ctx, key)
		})
	}
	wg.Wait()
}

// batch is what one write takes of a Device's pending state.
type batch struct {
	twins   map[string]*pendingTwin
	state   *pendingState
	conds   []pendingCond
	refs    []*msgRef
	acks    []*nodeAcks
	touched bool
	oldest  time.Time
}

// writeOne writes key's pending state, if any. On an error the state is
// kept (merged under what came meanwhile) for a retry.
func (s *Status) writeOne(ctx context.Context, key types.NamespacedName) error {
	s.mu.Lock()
	st := s.devices[key]
	if st == nil || st.writing || !st.dirty() {
		s.mu.Unlock()
		return nil
	}
	b := batch{twins: st.twins, state: st.state, conds: st.conds, refs: st.refs, acks: st.acks, touched: st.touched, oldest: st.oldest}
	arrived, news := st.arrived, st.news
	st.twins, st.state, st.conds, st.refs, st.acks, st.touched, st.oldest, st.arrived, st.news = map[string]*pendingTwin{}, nil, nil, nil, nil, false, time.Time{}, time.Time{}, false
	st.writing = true
	st.lastWrite = time.Now()
	if !arrived.IsZero() {
		s.metrics.StatusWait.Observe(st.lastWrite.Sub(arrived).Seconds())
	}
	if news {
		st.lastNewsWrite = st.lastWrite
	}
	s.mu.Unlock()

	err := s.write(ctx, key, &b)

	s.mu.Lock()
	defer s.mu.Unlock()
	st.writing = false
	if cur := s.devices[key]; cur != st {
		return nil // forgotten or released meanwhile
	}
	if err != nil {
		if errors.Is(err, errFenced) {
			return nil
		}
		// Keep what was taken; newer reports of a property win.
		for p, t := range b.twins {
			if cur, ok := st.twins[p]; !ok || cur.pos.order < t.pos.order {
				st.twins[p] = t
			}
		}
		if st.state == nil {
			st.state = b.state
		}
		st.conds = append(b.conds, st.conds...)
		st.refs, st.acks = append(b.refs, st.refs...), append(b.acks, st.acks...)
		st.touched = st.touched || b.touched
		st.news = st.news || news
		if !b.oldest.IsZero() && (st.oldest.IsZero() || b.oldest.Before(st.oldest)) {
			st.oldest = b.oldest
		}
		if !arrived.IsZero() && (st.arrived.IsZero() || arrived.Before(st.arrived)) {
			st.arrived = arrived
		}
		return err
	}
	s.durableLocked(b.refs, b.acks)
	if st.dirty() {
		s.scheduleLocked(key, st)
	}
	return nil
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
		changed := b.touched
		names := slices.Sorted(maps.Keys(b.twins))
		for _, name := range names {
			pt := b.twins[name]
			if !consider(pt.pos) {
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
			if consider(pc.pos) && applyEdgeCondition(&d.Status, pc.c, pc.gen) {
				changed = true
			}
		}
		if ps := b.state; ps != nil && consider(ps.pos) {
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
			s.metrics.WriteSeconds.Observe(time.Since(start).Seconds())
			if !b.oldest.IsZero() {
				s.metrics.ReportToStatus.Observe(time.Since(b.oldest).Seconds())
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

// SetValid records whether d fits its model (the Valid condition, and the
// generation it was checked for): a read-modify-write of that condition
// alone, apart from the reports, so that one replica (the leader) can own
// it while others write twins. err nil means d fits. Idempotent.
func (s *Status) SetValid(ctx context.Context, d *v1alpha1.Device, err error) error {
	c := metav1.Condition{Type: v1alpha1.ConditionDeviceValid, Status: metav1.ConditionTrue, Reason: "FitsModel",
		Message: "the spec fits DeviceModel " + d.Spec.DeviceModelRef.Name, ObservedGeneration: d.Generation}
	var pmErr *PushMethodError
	switch {
	case errors.As(err, &pmErr):
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, "InvalidPushMethod", "pushMethod not used: "+err.Error()
	case err != nil:
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, "Invalid", err.Error()
	}
	key := client.ObjectKeyFromObject(d)
	reader := s.reader
	for attempt := 0; ; attempt++ {
		var cur v1alpha1.Device
		if err := reader.Get(ctx, key, &cur); err != nil {
			return client.IgnoreNotFound(err)
		}
		if cur.Generation != d.Generation {
			return nil // a newer spec is on its way to be checked
		}
		old := meta.FindStatusCondition(cur.Status.Conditions, c.Type)
		if old != nil && old.Status == c.Status && old.Message == c.Message && old.ObservedGeneration == c.ObservedGeneration &&
			cur.Status.ObservedGeneration == d.Generation {
			return nil
		}
		orig := cur.DeepCopy()
		meta.SetStatusCondition(&cur.Status.Conditions, c)
		cur.Status.ObservedGeneration = d.Generation
		err := s.client.Status().Patch(ctx, &cur, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{}))
		switch {
		case err == nil:
			s.metrics.Writes.WithLabelValues("ok").Inc()
			return nil
		case apierrors.IsConflict(err) && attempt < 10:
			s.metrics.Writes.WithLabelValues("conflict").Inc()
			reader = s.live
		default:
			s.metrics.Writes.WithLabelValues("error").Inc()
			return client.IgnoreNotFound(err)
		}
	}
}

// desiredApplied sets DesiredApplied: True once every desired value of the
// spec has come back as observedDesired; False with the mapper's error when
// it reports one for a desired write, else Pending.
func desiredApplied(d *v1alpha1.Device, st *v1alpha1.DeviceStatus) {
	var waiting, failed []string
	some := false
	for _, p := range d.Spec.Properties {
		if p.Desired == nil {
			continue
		}
		some = true
		var observed, writeErr string
		for _, t := range st.Twins {
			if t.PropertyName != p.Name {
				continue
			}
			if t.ObservedDesired != nil {
				observed = t.ObservedDesired.Value
			}
			if t.Reported != nil {
				writeErr = t.Reported.Metadata[twinvalue.MetaDesiredError]
			}
		}
		switch {
		case sameValue(observed, p.Desired.Value):
		case writeErr != "":
			failed = append(failed, fmt.Sprintf("%s: %s", p.Name, writeErr))
		default:
			waiting = append(waiting, p.Name)
		}
	}
	if !some {
		meta.RemoveStatusCondition(&st.Conditions, v1alpha1.ConditionDesiredApplied)
		return
	}
	c := metav1.Condition{Type: v1alpha1.ConditionDesiredApplied, Status: metav1.ConditionTrue, Reason: "Applied",
		Message: "every desired value is observed on the device", ObservedGeneration: d.Generation}
	switch {
	case len(failed) > 0:
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, "MapperError", "the mapper could not write: "+strings.Join(failed, "; ")
	case len(waiting) > 0:
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, "Pending", fmt.Sprintf("not yet observed: %v", waiting)
	}
	meta.SetStatusCondition(&st.Conditions, c)
}

// needsDesiredApplied says whether d's DesiredApplied condition lags its
// spec (a desired value changed since it was written).
func needsDesiredApplied(d *v1alpha1.Device) bool {
	c := meta.FindStatusCondition(d.Status.Conditions, v1alpha1.ConditionDesiredApplied)
	if c == nil {
		return slices.ContainsFunc(d.Spec.Properties, func(p v1alpha1.DeviceProperty) bool { return p.Desired != nil })
	}
	return c.ObservedGeneration != d.Generation
}

// holds says whether d's status already shows property prop reported as
// value (and observedDesired as observed, when given).
func holds(d *v1alpha1.Device, prop, value string, observed *v1alpha1.TwinProperty) bool {
	for _, t := range d.Status.Twins {
		if t.PropertyName != prop {
			continue
		}
		if t.Reported == nil || !sameValue(t.Reported.Value, value) {
			return false
		}
		return observed == nil || (t.ObservedDesired != nil && sameValue(t.ObservedDesired.Value, observed.Value))
	}
	return false
}

// sameValue compares as numbers where both parse, so "1.50" equals "1.5".
func sameValue(a, b string) bool {
	if a == b {
		return true
	}
	fa, errA := strconv.ParseFloat(a, 64)
	fb, errB := strconv.ParseFloat(b, 64)
	return errA == nil && errB == nil && fa == fb
}
