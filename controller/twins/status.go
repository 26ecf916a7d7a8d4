package twins

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/controller/cloudhub"
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
	// (1s): however fast its mappers report, each write carries the newest
	// value of every property.
	Interval time.Duration
	// Concurrency bounds parallel status writes (16).
	Concurrency int
}

// Status owns Device.status: it takes what nodes report (Handle), keeps the
// newest value of each property, and writes each changed Device at most
// once per interval. It tells the hub how far each node's stream is written
// (Committer) only after the writes, so a report is acknowledged to the
// edge, and forgotten there, only once it is in the API server; a report
// resent after a controller restart is recognised by the Device's
// status.reportedPosition and not applied twice.
type Status struct {
	client  client.Client // writes status
	reader  client.Reader // the cache
	hub     Committer
	cfg     StatusConfig
	metrics *Metrics
	log     logr.Logger

	mu      sync.Mutex
	devices map[types.NamespacedName]*twinState
	taken   map[string]cloudhub.Position // newest message taken, per node
}

type twinState struct {
	status    v1alpha1.DeviceStatus // what was written, plus what is pending
	dirty     bool
	writing   bool
	oldest    time.Time       // report time of the oldest unwritten change
	pendingBy map[string]bool // properties changed since the last write
}

// NewStatus makes a Status; hub may be nil (nothing to commit: tests).
func NewStatus(c client.Client, reader client.Reader, hub Committer, cfg StatusConfig, m *Metrics, log logr.Logger) *Status {
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 16
	}
	return &Status{client: c, reader: reader, hub: hub, cfg: cfg, metrics: m, log: log,
		devices: map[types.NamespacedName]*twinState{}, taken: map[string]cloudhub.Position{}}
}

// state returns key's twin state, seeded from the cached Device the first
// time (after a restart the API server holds what was written). Under mu.
func (s *Status) state(key types.NamespacedName, d *v1alpha1.Device) *twinState {
	st := s.devices[key]
	if st == nil {
		st = &twinState{status: *d.Status.DeepCopy(), pendingBy: map[string]bool{}}
		s.devices[key] = st
	}
	return st
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
	defer s.took(m)
	if ref == nil {
		return nil
	}
	key := types.NamespacedName{Namespace: ref.Namespace, Name: ref.Name}
	var d v1alpha1.Device
	// Read only (state copies what it keeps): no copy of the cached
	// Device for every report.
	if err := s.reader.Get(ctx, key, &d, client.UnsafeDisableDeepCopy); err != nil {
		if apierrors.IsNotFound(err) {
			s.metrics.dropped("device-gone")
			return nil
		}
		return err // transient: the edge resends
	}
	pos := v1alpha1.LinkPosition{Node: m.Node, Stream: strconv.FormatUint(m.At.Stream, 10), Seq: int64(m.At.Seq)}
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.state(key, &d)
	if p := st.status.ReportedPosition; p != nil && p.Node == pos.Node && p.Stream == pos.Stream && p.Seq >= pos.Seq {
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
		tw := twin(&st.status, r.Property)
		md := maps.Clone(r.Metadata)
		if md == nil {
			md = map[string]string{}
		}
		if _, ok := md[twinvalue.MetaTimestamp]; !ok {
			md[twinvalue.MetaTimestamp] = twinvalue.Timestamp(at)
		}
		tw.Reported = &v1alpha1.TwinProperty{Value: FormatValue(r.Value), Metadata: md}
		if r.ObservedDesired != nil {
			tw.ObservedDesired = &v1alpha1.TwinProperty{Value: FormatValue(r.ObservedDesired), Metadata: map[string]string{twinvalue.MetaTimestamp: md[twinvalue.MetaTimestamp]}}
		}
		if st.pendingBy[r.Property] {
			s.metrics.Coalesced.Inc()
		}
		st.pendingBy[r.Property] = true
		if st.status.LastReportTime == nil || st.status.LastReportTime.Time.Before(at) {
			st.status.LastReportTime = &metav1.Time{Time: at}
		}
		s.metrics.Reports.WithLabelValues("reported").Inc()
	case *linkv1.Envelope_DeviceState:
		ds := k.DeviceState
		if t := ds.GetTime(); t != nil {
			at = t.AsTime()
		}
		st.status.State = ds.State
		if twinvalue.Online(ds.State) {
			st.status.LastOnlineTime = &metav1.Time{Time: at}
		}
		c := metav1.Condition{Type: v1alpha1.ConditionMapperConnected, Status: metav1.ConditionTrue,
			Reason: "Reporting", Message: fmt.Sprintf("mapper %q on node %s reports the device %s", ds.Mapper, m.Node, ds.State), ObservedGeneration: d.Generation}
		if ds.Mapper == "" {
			// The agent's word: no mapper on the node serves the device.
			c.Status, c.Reason, c.Message = metav1.ConditionFalse, "NoMapper",
				fmt.Sprintf("no mapper on node %s serves the device (none registered under its mapperName or its protocol)", m.Node)
		}
		meta.SetStatusCondition(&st.status.Conditions, c)
		s.metrics.Reports.WithLabelValues("state").Inc()
	case *linkv1.Envelope_DeviceCondition:
		if !applyEdgeCondition(&st.status, k.DeviceCondition, d.Generation) {
			s.metrics.dropped("condition-type")
			return nil
		}
		s.metrics.Reports.WithLabelValues("condition").Inc()
	}
	st.status.ReportedPosition = &pos
	if !st.dirty || st.oldest.IsZero() {
		st.oldest = at
	}
	st.dirty = true
	return nil
}

func (s *Status) took(m cloudhub.Inbound) {
	s.mu.Lock()
	if p := s.taken[m.Node]; p.Stream != m.At.Stream || p.Seq < m.At.Seq {
		s.taken[m.Node] = m.At
	}
	s.mu.Unlock()
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

// Forget drops a deleted Device's state.
func (s *Status) Forget(key types.NamespacedName) {
	s.mu.Lock()
	delete(s.devices, key)
	s.mu.Unlock()
}

// Release drops what this replica holds of node's twins that is not
// written: another replica owns the node's session now, and the edge
// resends to it whatever was not acknowledged. What it held of the node's
// Devices is dropped too (it is read again from the API server if the node
// comes back here).
func (s *Status) Release(node string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.taken, node)
	for key, st := range s.devices {
		if p := st.status.ReportedPosition; p != nil && p.Node == node {
			delete(s.devices, key)
		}
	}
}

// NeedLeaderElection is false: every replica writes the status of the
// Devices of the nodes whose sessions it holds.
func (s *Status) NeedLeaderElection() bool { return false }

// Start writes changed Devices every interval until ctx ends.
func (s *Status) Start(ctx context.Context) error {
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			s.Flush(ctx)
		}
	}
}

type pendingWrite struct {
	key    types.NamespacedName
	status v1alpha1.DeviceStatus
	oldest time.Time
	node   string
}

// Flush writes every changed Device once, then commits each node's stream
// as far as it was taken before the writes, unless a write of that node's
// Devices failed (those are retried next time, and the edge keeps the
// reports meanwhile).
func (s *Status) Flush(ctx context.Context) {
	s.mu.Lock()
	taken := maps.Clone(s.taken)
	var work []pendingWrite
	for key, st := range s.devices {
		if !st.dirty || st.writing {
			continue
		}
		node := ""
		if p := st.status.ReportedPosition; p != nil {
			node = p.Node
		}
		work = append(work, pendingWrite{key: key, status: *st.status.DeepCopy(), oldest: st.oldest, node: node})
		st.dirty, st.writing, st.oldest = false, true, time.Time{}
		clear(st.pendingBy)
	}
	s.mu.Unlock()

	failed := map[string]bool{}
	var fmu sync.Mutex
	sem := make(chan struct{}, s.cfg.Concurrency)
	var wg sync.WaitGroup
	for i := range work {
		w := &work[i]
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			err := s.write(ctx, w)
			s.mu.Lock()
			if st := s.devices[w.key]; st != nil {
				st.writing = false
				if err != nil {
					st.dirty = true
					if st.oldest.IsZero() || (!w.oldest.IsZero() && w.oldest.Before(st.oldest)) {
						st.oldest = w.oldest
					}
				}
			}
			s.mu.Unlock()
			if err != nil {
				fmu.Lock()
				failed[w.node] = true
				fmu.Unlock()
			}
		}()
	}
	wg.Wait()
	if s.hub == nil {
		return
	}
	for node, pos := range taken {
		if !failed[node] {
			s.hub.Commit(node, pos)
		}
	}
}

func (s *Status) write(ctx context.Context, w *pendingWrite) error {
	var d v1alpha1.Device
	if err := s.reader.Get(ctx, w.key, &d); err != nil {
		if apierrors.IsNotFound(err) {
			s.Forget(w.key)
			return nil
		}
		return err
	}
	desiredApplied(&d, &w.status)
	// The Valid condition and observedGeneration are Validity's (the
	// leader's): keep what the Device says of them.
	if c := meta.FindStatusCondition(d.Status.Conditions, v1alpha1.ConditionDeviceValid); c != nil {
		meta.SetStatusCondition(&w.status.Conditions, *c)
	} else {
		meta.RemoveStatusCondition(&w.status.Conditions, v1alpha1.ConditionDeviceValid)
	}
	w.status.ObservedGeneration = d.Status.ObservedGeneration
	w.status.Differing = differing(&d, &w.status)
	body, err := json.Marshal(map[string]any{"status": w.status})
	if err != nil {
		return err
	}
	start := time.Now()
	err = s.client.Status().Patch(ctx, &d, client.RawPatch(types.MergePatchType, body))
	switch {
	case apierrors.IsNotFound(err):
		s.Forget(w.key)
		return nil
	case err != nil:
		s.metrics.Writes.WithLabelValues("error").Inc()
		s.log.Error(err, "writing device status", "device", w.key.String())
		return err
	}
	s.metrics.Writes.WithLabelValues("ok").Inc()
	s.metrics.WriteSeconds.Observe(time.Since(start).Seconds())
	if !w.oldest.IsZero() {
		s.metrics.ReportToStatus.Observe(time.Since(w.oldest).Seconds())
	}
	return nil
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

// sameValue compares as numbers where both parse, so "1.50" equals "1.5".
func sameValue(a, b string) bool {
	if a == b {
		return true
	}
	fa, errA := strconv.ParseFloat(a, 64)
	fb, errB := strconv.ParseFloat(b, 64)
	return errA == nil && errB == nil && fa == fb
}
