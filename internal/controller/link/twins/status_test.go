package twins

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/dowse-dev/dowse/internal/controller/link/cloudhub"
	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

type commits struct {
	mu  sync.Mutex
	pos map[string]cloudhub.Position
}

func (c *commits) Commit(node string, pos cloudhub.Position) {
	c.mu.Lock()
	c.pos[node] = pos
	c.mu.Unlock()
}

func (c *commits) seq(node string) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pos[node].Seq
}

// statusRig is a Status on a fake API server with a model of two INT
// properties (temperature; setpoint, ReadWrite) and Devices d0..dn-1 on
// node edge.
type statusRig struct {
	t     *testing.T
	c     client.Client
	s     *Status
	hub   *commits
	seq   uint64
	node  string
	epoch uint64
}

func newStatusRig(t *testing.T, n int, cfg StatusConfig) *statusRig {
	sch := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(sch); err != nil {
		t.Fatal(err)
	}
	objs := []client.Object{&v1alpha1.DeviceModel{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "m"},
		Spec: v1alpha1.DeviceModelSpec{Protocol: "virtual", Properties: []v1alpha1.ModelProperty{
			{Name: "temperature", Type: v1alpha1.PropertyInt},
			{Name: "setpoint", Type: v1alpha1.PropertyInt, AccessMode: v1alpha1.ReadWrite}}}}}
	for i := range n {
		objs = append(objs, &v1alpha1.Device{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "d" + strconv.Itoa(i)},
			Spec: v1alpha1.DeviceSpec{DeviceModelRef: &corev1.LocalObjectReference{Name: "m"}, NodeName: "edge"}})
	}
	c := fake.NewClientBuilder().WithScheme(sch).WithObjects(objs...).WithStatusSubresource(&v1alpha1.Device{}).Build()
	hub := &commits{pos: map[string]cloudhub.Position{}}
	return &statusRig{t: t, c: c, hub: hub, node: "edge", epoch: 1, s: NewStatus(c, c, hub, cfg, NewMetrics(nil), logr.Discard())}
}

func (r *statusRig) report(dev, prop, value string, observed string) uint64 {
	r.t.Helper()
	r.seq++
	u := &linkv1.TwinReportedUpdate{Device: &linkv1.DeviceRef{Namespace: "ns", Name: dev}, Property: prop, Reported: &linkv1.TwinValue{Value: value}}
	if observed != "" {
		u.ObservedDesired = &linkv1.TwinValue{Value: observed}
	}
	if err := r.s.Handle(context.Background(), cloudhub.Inbound{Node: r.node, At: cloudhub.Position{Stream: 1, Seq: r.seq, Epoch: r.epoch}, Epoch: r.epoch,
		Env: &linkv1.Envelope{Seq: r.seq, Kind: &linkv1.Envelope_TwinReported{TwinReported: u}}}); err != nil {
		r.t.Fatal(err)
	}
	return r.seq
}

func (r *statusRig) reported(dev, prop string) (string, string) {
	r.t.Helper()
	var d v1alpha1.Device
	if err := r.c.Get(context.Background(), client.ObjectKey{Namespace: "ns", Name: dev}, &d); err != nil {
		r.t.Fatal(err)
	}
	for _, tw := range d.Status.Twins {
		if tw.PropertyName == prop {
			var rep, obs string
			if tw.Reported != nil {
				rep = tw.Reported.Value
			}
			if tw.ObservedDesired != nil {
				obs = tw.ObservedDesired.Value
			}
			return rep, obs
		}
	}
	return "", ""
}

// TestStatusCommitsReplacedReports: a report replaced by a newer one of
// its property is committed before any write (the node keeps the newer
// one, which says all it said), so the node's backlog is one message a
// property however long the Device waits; the newest is committed only
// once written. A report that carried an observed desired value is kept
// until a write holds it when the one after it does not carry one.
func TestStatusCommitsReplacedReports(t *testing.T) {
	r := newStatusRig(t, 2, StatusConfig{})
	for i := range 100 {
		r.report("d0", "temperature", strconv.Itoa(i), "")
		if got := r.hub.seq("edge"); got != r.seq-1 {
			t.Fatalf("after report %d: committed through %d, want %d (all but the newest, unwritten)", r.seq, got, r.seq-1)
		}
	}
	// Another Device's report in between holds the commit at itself.
	other := r.report("d1", "temperature", "7", "")
	r.report("d0", "temperature", "100", "")
	if got := r.hub.seq("edge"); got != other-1 {
		t.Fatalf("committed through %d, want %d: d1's unwritten report is next", got, other-1)
	}
	r.s.Flush(context.Background())
	if got := r.hub.seq("edge"); got != r.seq {
		t.Fatalf("after the writes committed through %d, want %d", got, r.seq)
	}
	if v, _ := r.reported("d0", "temperature"); v != "100" {
		t.Errorf("d0 temperature %q, want the newest, 100", v)
	}

	// The acknowledgement of a desired value, then a report without one:
	// the first is not committed until a write holds its observedDesired.
	ack := r.report("d0", "setpoint", "21", "21")
	r.report("d0", "setpoint", "21", "")
	if got := r.hub.seq("edge"); got >= ack {
		t.Fatalf("committed through %d before the observed desired value of %d was written", got, ack)
	}
	r.s.Flush(context.Background())
	if rep, obs := r.reported("d0", "setpoint"); rep != "21" || obs != "21" {
		t.Errorf("setpoint reported %q observed %q, want 21 and 21", rep, obs)
	}
	if got := r.hub.seq("edge"); got != r.seq {
		t.Errorf("committed through %d after the write, want %d", got, r.seq)
	}
}

// TestStatusBudgetAndPriority: with Start running on a budget, a Device
// acknowledging a desired value is written before Devices that waited
// longer with changed values, and repeats wait for the heartbeat.
func TestStatusBudgetAndPriority(t *testing.T) {
	const n = 30
	r := newStatusRig(t, n+2, StatusConfig{Budget: 10, Heartbeat: time.Hour, Interval: time.Millisecond})
	// d0..d29 change; d30 repeats what its status holds; d31 acknowledges.
	for i := range n {
		r.report("d"+strconv.Itoa(i), "temperature", "1", "")
	}
	r.report("d30", "temperature", "5", "")
	r.s.Flush(context.Background())
	r.report("d30", "temperature", "5", "")
	for i := range n {
		r.report("d"+strconv.Itoa(i), "temperature", "2", "")
	}
	r.report("d31", "setpoint", "3", "3")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.s.Start(ctx) }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, obs := r.reported("d31", "setpoint"); obs == "3" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the acknowledgement was not written in 10 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	// The writer's part of the acknowledgement's way is measured: one
	// urgent report, one sample (the changes before it carried none).
	if n := testutil.CollectAndCount(r.s.metrics.UrgentWait); n != 1 {
		t.Errorf("dowse_twins_status_urgent_wait_seconds has %d series", n)
	}
	for { // observed just after the write returns
		var m dto.Metric
		if err := r.s.metrics.UrgentWait.Write(&m); err != nil {
			t.Fatal(err)
		}
		if c := m.GetHistogram().GetSampleCount(); c == 1 {
			break
		} else if c > 1 || time.Now().After(deadline) {
			t.Fatalf("urgent waits observed: %d, want the acknowledgement's", c)
		}
		time.Sleep(time.Millisecond)
	}
	changed := 0
	for i := range n {
		if v, _ := r.reported("d"+strconv.Itoa(i), "temperature"); v == "2" {
			changed++
		}
	}
	// The burst (one token at 10 a second) may go to a change first.
	if changed > 1 {
		t.Errorf("%d changes written before the acknowledgement that came after them, want at most the burst, 1", changed)
	}
	// The changes follow, about ten a second.
	for time.Now().Before(deadline) {
		changed = 0
		for i := range n {
			if v, _ := r.reported("d"+strconv.Itoa(i), "temperature"); v == "2" {
				changed++
			}
		}
		if changed == n {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if changed != n {
		t.Fatalf("%d of %d changes written", changed, n)
	}
	r.s.mu.Lock()
	repeatQueued := r.s.queue.has(client.ObjectKey{Namespace: "ns", Name: "d30"})
	r.s.mu.Unlock()
	if !repeatQueued {
		t.Errorf("the repeat is not waiting for its heartbeat")
	}
}

// TestStatusAcksRepeats: a report that repeats what this writer wrote is
// committed at once (its value is in etcd), and waits for the heartbeat
// only to refresh the status' read time; one that repeats what only the
// cache shows (a writer that has not written the Device yet: a replica
// that just took the node) is written first, as a change.
func TestStatusAcksRepeats(t *testing.T) {
	r := newStatusRig(t, 1, StatusConfig{Heartbeat: time.Hour})
	r.report("d0", "temperature", "5", "")
	r.s.Flush(context.Background())
	seq := r.report("d0", "temperature", "5", "")
	if got := r.hub.seq("edge"); got != seq {
		t.Fatalf("a repeat of the written value: committed through %d, want %d at once", got, seq)
	}
	r.s.mu.Lock()
	st := r.s.devices[client.ObjectKey{Namespace: "ns", Name: "d0"}]
	p, queued := st.prio, r.s.queue.has(client.ObjectKey{Namespace: "ns", Name: "d0"})
	r.s.mu.Unlock()
	if p != prioRepeat || !queued {
		t.Errorf("the repeat is pending at %v (queued %v), want a repeat waiting for its heartbeat", p, queued)
	}

	// A writer that did not write it: the cache's word is not enough.
	fresh := NewStatus(r.c, r.c, r.hub, StatusConfig{Heartbeat: time.Hour}, NewMetrics(nil), logr.Discard())
	r.s = fresh
	seq = r.report("d0", "temperature", "5", "")
	if got := r.hub.seq("edge"); got >= seq {
		t.Fatalf("a repeat only the cache vouches for was committed (%d) before a write", got)
	}
	fresh.mu.Lock()
	p = fresh.devices[client.ObjectKey{Namespace: "ns", Name: "d0"}].prio
	fresh.mu.Unlock()
	if p != prioChange {
		t.Errorf("a repeat only the cache vouches for is pending at %v, want change", p)
	}
	fresh.Flush(context.Background())
	if got := r.hub.seq("edge"); got != seq {
		t.Errorf("committed through %d after the write, want %d", got, seq)
	}
	seq = r.report("d0", "temperature", "5", "")
	if got := r.hub.seq("edge"); got != seq {
		t.Errorf("once written, a repeat: committed through %d, want %d at once", got, seq)
	}
	// Released (another replica took the node): it knows nothing again.
	fresh.Release("edge")
	r.hub.pos = map[string]cloudhub.Position{}
	r.epoch = 2 // the node's next session, here again
	seq = r.report("d0", "temperature", "5", "")
	if got := r.hub.seq("edge"); got != 0 {
		t.Errorf("after a release a repeat was committed (%d, report %d) before a write", got, seq)
	}
	fresh.Flush(context.Background())
	if got := r.hub.seq("edge"); got != seq {
		t.Errorf("committed through %d after the write, want %d", got, seq)
	}
}
