package twins

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/dowse-dev/dowse/internal/controller/link/cloudhub"
	"github.com/dowse-dev/dowse/internal/controller/link/twins"
	"github.com/dowse-dev/dowse/internal/scheme"
	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/framework/testwait"
)

// fakeHub records what is sent to each node, and what is committed.
type fakeHub struct {
	mu        sync.Mutex
	connected []string
	sent      map[string][]*linkv1.Envelope
	committed map[string]cloudhub.Position
}

func newFakeHub(connected ...string) *fakeHub {
	return &fakeHub{connected: connected, sent: map[string][]*linkv1.Envelope{}, committed: map[string]cloudhub.Position{}}
}

func (h *fakeHub) Send(node string, env *linkv1.Envelope) (uint64, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.sent[node] = append(h.sent[node], env)
	return uint64(len(h.sent[node])), nil
}

func (h *fakeHub) IsConnected(node string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Contains(h.connected, node)
}

func (h *fakeHub) Commit(node string, pos cloudhub.Position) {
	h.mu.Lock()
	h.committed[node] = pos
	h.mu.Unlock()
}

func (h *fakeHub) commit(node string) cloudhub.Position {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.committed[node]
}

// take returns and forgets what node was sent, as "kind name" strings.
func (h *fakeHub) take(node string) ([]string, []*linkv1.Envelope) {
	h.mu.Lock()
	defer h.mu.Unlock()
	envs := h.sent[node]
	h.sent[node] = nil
	var out []string
	for _, e := range envs {
		switch k := e.Kind.(type) {
		case *linkv1.Envelope_ModelUpdate:
			out = append(out, "model "+k.ModelUpdate.Model.Ref.Name)
		case *linkv1.Envelope_ModelRemoval:
			out = append(out, "model-removal "+k.ModelRemoval.Model.Name)
		case *linkv1.Envelope_DeviceUpdate:
			out = append(out, "device "+k.DeviceUpdate.Device.Ref.Name)
		case *linkv1.Envelope_DeviceRemoval:
			out = append(out, "device-removal "+k.DeviceRemoval.Device.Name)
		case *linkv1.Envelope_DeviceInventory:
			out = append(out, fmt.Sprintf("inventory %d/%d", len(k.DeviceInventory.Devices), len(k.DeviceInventory.Models)))
		}
	}
	return out, envs
}

type twinRig struct {
	hub    *fakeHub
	sync   *twins.Sync
	status *twins.Status
	writes *writeCounter
	cache  client.Reader // what the status writer reads
}

// startTwins runs the twin sync and status writer in a manager of their
// own against the API server, with a fake hub.
func startTwins(t *testing.T, hub *fakeHub) *twinRig {
	t.Helper()
	sch, err := scheme.New()
	if err != nil {
		t.Fatal(err)
	}
	writes := &writeCounter{match: "/status"}
	restCfg := rest.CopyConfig(suite.Config)
	restCfg.WrapTransport = writes.wrap
	mgr, err := ctrl.NewManager(restCfg, ctrl.Options{Scheme: sch, Metrics: metricsserver.Options{BindAddress: "0"},
		Controller: config.Controller{SkipNameValidation: ptr.To(true)}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := mgr.GetFieldIndexer().IndexField(ctx, &v1alpha1.Device{}, twins.NodeIndex, twins.IndexByNode); err != nil {
		t.Fatal(err)
	}
	if err := mgr.GetFieldIndexer().IndexField(ctx, &v1alpha1.Device{}, twins.ModelIndex, twins.IndexByModel); err != nil {
		t.Fatal(err)
	}
	m := twins.NewMetrics(nil)
	log := testr.New(t)
	status := twins.NewStatus(mgr.GetClient(), mgr.GetClient(), hub, twins.StatusConfig{Interval: time.Hour}, m, log)
	s := twins.NewSync(mgr.GetClient(), mgr.GetAPIReader(), hub, status, m, log)
	if err := s.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	if err := twins.NewValidity(mgr.GetClient(), mgr.GetClient(), mgr.GetAPIReader(), log).SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})
	if !mgr.GetCache().WaitForCacheSync(ctx) {
		t.Fatal("cache never synced")
	}
	return &twinRig{hub: hub, sync: s, status: status, writes: writes, cache: mgr.GetClient()}
}

func device(ns, name, node string, props ...v1alpha1.DeviceProperty) *v1alpha1.Device {
	return &v1alpha1.Device{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.DeviceSpec{DeviceModelRef: &corev1.LocalObjectReference{Name: "thermostat"}, NodeName: node, Properties: props}}
}

func desired(name, v string) v1alpha1.DeviceProperty {
	return v1alpha1.DeviceProperty{Name: name, Desired: &v1alpha1.TwinProperty{Value: v}}
}

func waitSent(t *testing.T, hub *fakeHub, node string, want ...string) []*linkv1.Envelope {
	t.Helper()
	var got []string
	var envs []*linkv1.Envelope
	testwait.For(t, 10*time.Second, func() error {
		g, e := hub.take(node)
		got, envs = append(got, g...), append(envs, e...)
		if len(got) < len(want) {
			return fmt.Errorf("node %s was sent %v, want %v", node, got, want)
		}
		return nil
	})
	if !slices.Equal(got, want) {
		t.Fatalf("node %s was sent %v, want %v", node, got, want)
	}
	return envs
}

// TestTwinSync: a node is sent its valid Devices and their model when it
// connects, then an inventory; a changed desired value is sent; a Device
// that moves away is removed (and its model with it); a Device that does
// not fit its model is not sent and says why.
func TestTwinSync(t *testing.T) {
	ctx := context.Background()
	ns := suite.Namespace(t)
	// Node names of this test's own: the sync lists Devices by node
	// across namespaces, and other tests use edge-1 too.
	edge1, edge2 := ns+"-edge-1", ns+"-edge-2"
	if err := suite.Client.Create(ctx, thermostatModel(ns)); err != nil {
		t.Fatal(err)
	}
	good := device(ns, "good", edge1, desired("setpoint", "21"))
	bad := device(ns, "readonly", edge1, desired("temperature", "3"))
	outOfRange := device(ns, "too-hot", edge1, desired("setpoint", "31"))
	unknown := device(ns, "unknown", edge1, v1alpha1.DeviceProperty{Name: "humidity"})
	for _, d := range []*v1alpha1.Device{good, bad, outOfRange, unknown, device(ns, "elsewhere", edge2)} {
		if err := suite.Client.Create(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	hub := newFakeHub(edge1)
	rig := startTwins(t, hub)
	rig.sync.Connected(ctx, edge1)
	envs := waitSent(t, hub, edge1, "model thermostat", "device good", "inventory 1/1")
	ed := envs[1].GetDeviceUpdate().Device
	if p := ed.Properties[0]; p.Name != "setpoint" || p.Desired.GetValue() != "21" || ed.ProtocolName != "virtual" {
		t.Errorf("device sent %v: want setpoint desired 21 and the model's protocol", ed)
	}
	if got := hub.sent[edge2]; len(got) != 0 {
		t.Errorf("a node that is not connected was sent %d messages", len(got))
	}

	// The Valid condition is written by Validity (the leader's), apart
	// from the twins.
	testwait.For(t, 10*time.Second, func() error {
		for name, want := range map[string]string{"readonly": "ReadOnly", "too-hot": "above the maximum 30", "unknown": "humidity is not in DeviceModel"} {
			d, err := getDevice(ns, name)
			if err != nil {
				return err
			}
			c := meta.FindStatusCondition(d.Status.Conditions, v1alpha1.ConditionDeviceValid)
			if c == nil || c.Status != metav1.ConditionFalse || !strings.Contains(c.Message, want) {
				return fmt.Errorf("%s: Valid condition %+v, want False saying %q", name, c, want)
			}
		}
		if d, _ := getDevice(ns, "good"); !meta.IsStatusConditionTrue(d.Status.Conditions, v1alpha1.ConditionDeviceValid) {
			return fmt.Errorf("good device: conditions %+v, want Valid", d.Status.Conditions)
		}
		return nil
	})

	// A new desired value.
	d, _ := getDevice(ns, "good")
	d.Spec.Properties[0].Desired.Value = "22"
	if err := suite.Client.Update(ctx, d); err != nil {
		t.Fatal(err)
	}
	envs = waitSent(t, hub, edge1, "device good")
	if v := envs[0].GetDeviceUpdate().Device.Properties[0].Desired.GetValue(); v != "22" {
		t.Errorf("desired sent %q, want 22", v)
	}
	// Fixed, the out-of-range one is sent.
	d, _ = getDevice(ns, "too-hot")
	d.Spec.Properties[0].Desired.Value = "30"
	if err := suite.Client.Update(ctx, d); err != nil {
		t.Fatal(err)
	}
	waitSent(t, hub, edge1, "device too-hot")
	// Moved to another node: removed here, model too once no device needs it.
	for _, name := range []string{"good", "too-hot"} {
		d, _ = getDevice(ns, name)
		d.Spec.NodeName = edge2
		if err := suite.Client.Update(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	waitSent(t, hub, edge1, "device-removal good", "device-removal too-hot", "model-removal thermostat")
}

// TestTwinStatus: however many reports arrive between two flushes, a Device
// gets one status write with the newest value of every property; a report
// is committed to the hub once a newer one of its property replaced it,
// the newest only after the write; a report resent after a restart is not
// applied again; DesiredApplied follows observedDesired.
func TestTwinStatus(t *testing.T) {
	ctx := context.Background()
	ns := suite.Namespace(t)
	if err := suite.Client.Create(ctx, thermostatModel(ns)); err != nil {
		t.Fatal(err)
	}
	if err := suite.Client.Create(ctx, device(ns, "t1", "edge-1", desired("setpoint", "21"))); err != nil {
		t.Fatal(err)
	}
	hub := newFakeHub()
	rig := startTwins(t, hub)
	// The Valid condition is a write of its own (the twin sync's).
	waitValid(t, ns, "t1")
	const stream = 77
	seq := uint64(0)
	report := func(prop string, v, observed *linkv1.TwinValue) error {
		seq++
		return rig.status.Handle(ctx, cloudhub.Inbound{Node: "edge-1", At: cloudhub.Position{Stream: stream, Seq: seq},
			Env: &linkv1.Envelope{Seq: seq, Kind: &linkv1.Envelope_TwinReported{TwinReported: &linkv1.TwinReportedUpdate{
				Device: &linkv1.DeviceRef{Namespace: ns, Name: "t1"}, Property: prop, Reported: v, ObservedDesired: observed,
				Time: timestamppb.New(time.UnixMilli(1_700_000_000_000 + int64(seq)))}}}})
	}
	t1 := "/namespaces/" + ns + "/devices/t1/status"
	before := rig.writes.to(t1)
	for i := range 500 {
		if err := report("temperature", &linkv1.TwinValue{Value: strconv.FormatFloat(float64(i)/2, 'g', -1, 64)}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := report("setpoint", &linkv1.TwinValue{Value: "20"}, &linkv1.TwinValue{Value: "20"}); err != nil {
		t.Fatal(err)
	}
	// Each temperature report the next one replaced is committed (the
	// node keeps the newer, which says all it said); the newest of each
	// property waits for the write.
	if got := hub.commit("edge-1"); got.Seq != seq-2 {
		t.Fatalf("committed %+v before the write, want seq %d: all but the newest temperature and the setpoint", got, seq-2)
	}
	rig.status.Flush(ctx)
	if n := rig.writes.to(t1) - before; n != 1 {
		t.Errorf("%d status writes for 501 reports between two flushes, want 1", n)
	}
	if got := hub.committed["edge-1"]; got.Seq != seq || got.Stream != stream {
		t.Errorf("committed %+v after the write, want seq %d", got, seq)
	}
	d, err := getDevice(ns, "t1")
	if err != nil {
		t.Fatal(err)
	}
	if tw := d.Twin("temperature"); tw == nil || tw.Reported.Value != "249.5" || tw.Reported.Metadata["timestamp"] != strconv.Itoa(1_700_000_000_000+500) {
		t.Errorf("temperature twin %+v: want the newest value 249.5 with its read time", tw)
	}
	if c := meta.FindStatusCondition(d.Status.Conditions, v1alpha1.ConditionDesiredApplied); c == nil || c.Status != metav1.ConditionFalse {
		t.Errorf("DesiredApplied %+v: want False (observed 20, desired 21)", c)
	}

	// The mapper applies 21; a report resent from before (a controller
	// restart) changes nothing.
	if err := report("setpoint", &linkv1.TwinValue{Value: "21"}, &linkv1.TwinValue{Value: "21"}); err != nil {
		t.Fatal(err)
	}
	last := seq
	seq = 10 // a resend of seq 11: temperature 5
	if err := report("temperature", &linkv1.TwinValue{Value: "5"}, nil); err != nil {
		t.Fatal(err)
	}
	seq = last
	rig.status.Flush(ctx)
	d, _ = getDevice(ns, "t1")
	if tw := d.Twin("temperature"); tw.Reported.Value != "249.5" {
		t.Errorf("a resent older report was applied: temperature %q", tw.Reported.Value)
	}
	if c := meta.FindStatusCondition(d.Status.Conditions, v1alpha1.ConditionDesiredApplied); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("DesiredApplied %+v: want True once 21 is observed", c)
	}
	if tw := d.Twin("setpoint"); tw.ObservedDesired == nil || tw.ObservedDesired.Value != "21" {
		t.Errorf("setpoint observedDesired %+v, want 21", tw.ObservedDesired)
	}
	// A restarted controller (a new Status, seeded from the API server)
	// skips what was written too.
	restarted := twins.NewStatus(suite.Client, suite.Client, hub, twins.StatusConfig{}, twins.NewMetrics(nil), testr.New(t))
	seq = 5
	if err := restarted.Handle(ctx, cloudhub.Inbound{Node: "edge-1", At: cloudhub.Position{Stream: stream, Seq: seq}, Env: &linkv1.Envelope{Seq: seq,
		Kind: &linkv1.Envelope_TwinReported{TwinReported: &linkv1.TwinReportedUpdate{Device: &linkv1.DeviceRef{Namespace: ns, Name: "t1"},
			Property: "temperature", Reported: &linkv1.TwinValue{Value: strconv.FormatFloat(2, 'g', -1, 64)}}}}}); err != nil {
		t.Fatal(err)
	}
	restarted.Flush(ctx)
	if d, _ = getDevice(ns, "t1"); d.Twin("temperature").Reported.Value != "249.5" {
		t.Errorf("a restarted writer applied a resent report: %q", d.Twin("temperature").Reported.Value)
	}
	// The agent says no mapper serves the device: MapperConnected False;
	// a mapper's state report turns it True.
	state := func(seq uint64, st, mapper string) {
		t.Helper()
		if err := restarted.Handle(ctx, cloudhub.Inbound{Node: "edge-1", At: cloudhub.Position{Stream: stream, Seq: seq}, Env: &linkv1.Envelope{Seq: seq,
			Kind: &linkv1.Envelope_DeviceState{DeviceState: &linkv1.DeviceStateUpdate{Device: &linkv1.DeviceRef{Namespace: ns, Name: "t1"}, State: st, Mapper: mapper}}}}); err != nil {
			t.Fatal(err)
		}
		restarted.Flush(ctx)
	}
	state(800, "unknown", "")
	d, _ = getDevice(ns, "t1")
	if c := meta.FindStatusCondition(d.Status.Conditions, v1alpha1.ConditionMapperConnected); c == nil || c.Status != metav1.ConditionFalse || c.Reason != "NoMapper" {
		t.Errorf("MapperConnected %+v, want False NoMapper", c)
	}
	state(801, "ok", "thermostats")
	d, _ = getDevice(ns, "t1")
	if c := meta.FindStatusCondition(d.Status.Conditions, v1alpha1.ConditionMapperConnected); c == nil || c.Status != metav1.ConditionTrue || d.Status.State != "ok" || d.Status.LastOnlineTime == nil {
		t.Errorf("MapperConnected %+v, state %q, lastOnlineTime %v: want True, ok and a time", c, d.Status.State, d.Status.LastOnlineTime)
	}
	// A report for a Device that is gone is dropped and committed.
	if err := restarted.Handle(ctx, cloudhub.Inbound{Node: "edge-1", At: cloudhub.Position{Stream: stream, Seq: 900}, Env: &linkv1.Envelope{Seq: 900,
		Kind: &linkv1.Envelope_DeviceState{DeviceState: &linkv1.DeviceStateUpdate{Device: &linkv1.DeviceRef{Namespace: ns, Name: "gone"}, State: "ok"}}}}); err != nil {
		t.Fatal(err)
	}
	restarted.Flush(ctx)
	if got := hub.committed["edge-1"]; got.Seq != 900 {
		t.Errorf("committed %+v, want 900 (a report about a deleted Device is dropped, not retried)", got)
	}
}

func waitValid(t *testing.T, ns, name string) {
	t.Helper()
	testwait.For(t, 10*time.Second, func() error {
		d, err := getDevice(ns, name)
		if err != nil {
			return err
		}
		if meta.FindStatusCondition(d.Status.Conditions, v1alpha1.ConditionDeviceValid) == nil {
			return fmt.Errorf("%s has no Valid condition yet", name)
		}
		return nil
	})
}

// TestTwinStatusLeadingEdge: a report on a quiet Device reaches its status
// at once, without waiting for an interval; a burst of 500 reports within
// the interval after that makes one more write, with the newest values,
// and its newest report is not committed before that write.
func TestTwinStatusLeadingEdge(t *testing.T) {
	ctx := context.Background()
	ns := suite.Namespace(t)
	edge := ns + "-edge"
	if err := suite.Client.Create(ctx, thermostatModel(ns)); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"quiet", "busy", "steady"} {
		if err := suite.Client.Create(ctx, device(ns, name, edge)); err != nil {
			t.Fatal(err)
		}
	}
	hub := newFakeHub()
	// An hour's interval: only a leading-edge write can make a report
	// visible while the test runs.
	rig := startTwins(t, hub)
	waitValid(t, ns, "quiet")
	waitValid(t, ns, "busy")
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- rig.status.Start(rctx) }()
	defer func() { cancel(); <-done }()

	seq := uint64(0)
	report := func(name string, v float64) {
		t.Helper()
		seq++
		if err := rig.status.Handle(ctx, cloudhub.Inbound{Node: edge, At: cloudhub.Position{Stream: 9, Seq: seq},
			Env: &linkv1.Envelope{Seq: seq, Kind: &linkv1.Envelope_TwinReported{TwinReported: &linkv1.TwinReportedUpdate{
				Device: &linkv1.DeviceRef{Namespace: ns, Name: name}, Property: "temperature",
				Reported: &linkv1.TwinValue{Value: strconv.FormatFloat(v, 'g', -1, 64)}}}}}); err != nil {
			t.Fatal(err)
		}
	}
	reported := func(name string) string {
		d, err := getDevice(ns, name)
		if err != nil {
			t.Fatal(err)
		}
		if tw := d.Twin("temperature"); tw != nil && tw.Reported != nil {
			return tw.Reported.Value
		}
		return ""
	}
	writes := func() int64 {
		return rig.writes.to("/namespaces/"+ns+"/devices/quiet/status") + rig.writes.to("/namespaces/"+ns+"/devices/busy/status")
	}
	before := writes()
	report("quiet", 1.5)
	testwait.For(t, 30*time.Second, func() error {
		if v := reported("quiet"); v != "1.5" {
			return fmt.Errorf("quiet device reports %q, want 1.5", v)
		}
		return nil
	})
	testwait.For(t, 10*time.Second, func() error {
		if got := hub.commit(edge); got.Seq != 1 {
			return fmt.Errorf("committed %+v, want seq 1 once it is written", got)
		}
		return nil
	})

	// The busy device: its first report is written at once, the 499 after
	// it wait for the interval's end (Flush stands for it here).
	report("busy", 0)
	testwait.For(t, 30*time.Second, func() error {
		if v := reported("busy"); v != "0" {
			return fmt.Errorf("busy device reports %q, want 0", v)
		}
		return nil
	})
	for i := 1; i < 500; i++ {
		report("busy", float64(i))
	}
	leading := writes() - before
	if leading != 2 {
		t.Errorf("%d status writes for one report on each of two quiet devices, want 2", leading)
	}
	// The burst's reports but its newest are committed as the next
	// replaces each; the newest waits for the trailing write.
	testwait.For(t, 10*time.Second, func() error {
		if got := hub.commit(edge); got.Seq != seq-1 {
			return fmt.Errorf("committed %+v before the burst was written, want seq %d", got, seq-1)
		}
		return nil
	})
	rig.status.Flush(ctx)
	if n := writes() - before - leading; n != 1 {
		t.Errorf("%d status writes for 499 reports within one interval, want 1 (2 with the leading one)", n)
	}
	if v := reported("busy"); v != "499" {
		t.Errorf("busy device reports %q after the trailing write, want the newest, 499", v)
	}
	if got := hub.commit(edge); got.Seq != seq {
		t.Errorf("committed %+v after the trailing write, want seq %d", got, seq)
	}

	// A heartbeat (the value the status holds, reported again) is written,
	// and the change right after it is written at once all the same.
	waitValid(t, ns, "steady")
	d, err := getDevice(ns, "steady")
	if err != nil {
		t.Fatal(err)
	}
	d.Status.Twins = []v1alpha1.Twin{{PropertyName: "temperature", Reported: &v1alpha1.TwinProperty{Value: "1.5"}}}
	if err := suite.Client.Status().Update(ctx, d); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 10*time.Second, func() error {
		var cached v1alpha1.Device
		if err := rig.cache.Get(ctx, keyOf(ns, "steady"), &cached); err != nil {
			return err
		}
		if tw := cached.Twin("temperature"); tw == nil || tw.Reported == nil || tw.Reported.Value != "1.5" {
			return fmt.Errorf("the status writer's cache does not show steady's 1.5 yet")
		}
		return nil
	})
	report("steady", 1.5)
	testwait.For(t, 30*time.Second, func() error {
		if got := hub.commit(edge); got.Seq != seq {
			return fmt.Errorf("committed %+v, want seq %d once the heartbeat is written", got, seq)
		}
		return nil
	})
	report("steady", 2.5)
	testwait.For(t, 30*time.Second, func() error {
		if v := reported("steady"); v != "2.5" {
			return fmt.Errorf("steady device reports %q, want 2.5 (a change after a heartbeat's write is not held to the interval)", v)
		}
		return nil
	})
}

// TestTwinStatusFenced: a writer of an older session of the node (another
// replica that has not seen the takeover yet) finds the Device written by
// the newer one, applies nothing and says which sessions are fenced
// (StatusConfig.OnFenced: through the epoch below the stored one).
func TestTwinStatusFenced(t *testing.T) {
	ctx := context.Background()
	ns := suite.Namespace(t)
	if err := suite.Client.Create(ctx, thermostatModel(ns)); err != nil {
		t.Fatal(err)
	}
	if err := suite.Client.Create(ctx, device(ns, "t1", "edge-1")); err != nil {
		t.Fatal(err)
	}
	hub := newFakeHub()
	type fence struct {
		node    string
		through uint64
	}
	var fences []fence
	writer := func() *twins.Status {
		return twins.NewStatus(suite.Client, suite.Client, hub, twins.StatusConfig{
			OnFenced: func(node string, through uint64) { fences = append(fences, fence{node, through}) }}, twins.NewMetrics(nil), testr.New(t))
	}
	report := func(s *twins.Status, epoch, seq uint64, v float64) {
		t.Helper()
		if err := s.Handle(ctx, cloudhub.Inbound{Node: "edge-1", At: cloudhub.Position{Stream: 3, Seq: seq, Epoch: epoch}, Epoch: epoch,
			Env: &linkv1.Envelope{Seq: seq, Kind: &linkv1.Envelope_TwinReported{TwinReported: &linkv1.TwinReportedUpdate{
				Device: &linkv1.DeviceRef{Namespace: ns, Name: "t1"}, Property: "temperature", Reported: &linkv1.TwinValue{Value: strconv.FormatFloat(v, 'g', -1, 64)}}}}}); err != nil {
			t.Fatal(err)
		}
		s.Flush(ctx)
	}
	newer, older := writer(), writer()
	report(newer, 5, 10, 1.5)
	if d, err := getDevice(ns, "t1"); err != nil || d.Status.ReportedPosition == nil || d.Status.ReportedPosition.Epoch != 5 {
		t.Fatalf("after the newer session's write: %+v, %v; want the position of epoch 5", d.Status.ReportedPosition, err)
	}
	report(older, 4, 11, 2.5)
	d, err := getDevice(ns, "t1")
	if err != nil {
		t.Fatal(err)
	}
	if tw := d.Twin("temperature"); tw == nil || tw.Reported.Value != "1.5" {
		t.Errorf("temperature twin %+v: an older session's report was applied over the newer one's", tw)
	}
	if !slices.Equal(fences, []fence{{"edge-1", 4}}) {
		t.Errorf("OnFenced told %v, want [{edge-1 4}]", fences)
	}
}
