package edgehub

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
)

func ref(ns, name string) *linkv1.DeviceRef { return &linkv1.DeviceRef{Namespace: ns, Name: name} }

func devUpdate(ns, name, model string, gen int64) *linkv1.Envelope {
	return &linkv1.Envelope{Kind: &linkv1.Envelope_DeviceUpdate{DeviceUpdate: &linkv1.DeviceUpdate{Device: &linkv1.EdgeDevice{
		Ref: ref(ns, name), Generation: gen, Model: model, ProtocolName: "virtual",
		Properties: []*linkv1.EdgeDeviceProperty{{Name: "temp", Desired: &linkv1.TwinValue{Value: "21"}}},
	}}}}
}

func modelUpdate(ns, name string) *linkv1.Envelope {
	return &linkv1.Envelope{Kind: &linkv1.Envelope_ModelUpdate{ModelUpdate: &linkv1.DeviceModelUpdate{Model: &linkv1.EdgeDeviceModel{
		Ref: ref(ns, name), Protocol: "virtual", Properties: []*linkv1.EdgeModelProperty{{Name: "temp", Type: "INT", AccessMode: "ReadWrite"}},
	}}}}
}

func names[T interface{ GetRef() *linkv1.DeviceRef }](xs []T) []string {
	var out []string
	for _, x := range xs {
		out = append(out, x.GetRef().GetNamespace()+"/"+x.GetRef().GetName())
	}
	return out
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestStoreDevices: device and model messages are applied with the received
// position in one transaction and survive a reopen; removals and the
// inventory forget what they name or leave out.
func TestStoreDevices(t *testing.T) {
	dir := t.TempDir()
	st, err := openStore(dir, true)
	if err != nil {
		t.Fatal(err)
	}
	const peer = 77
	seq := uint64(0)
	recv := func(env *linkv1.Envelope) {
		t.Helper()
		seq++
		env.Seq = seq
		if err := st.received(peer, env); err != nil {
			t.Fatal(err)
		}
	}
	recv(modelUpdate("default", "thermo"))
	recv(modelUpdate("other", "pump"))
	recv(devUpdate("default", "b", "thermo", 1))
	recv(devUpdate("default", "a", "thermo", 1))
	recv(devUpdate("other", "c", "pump", 3))
	recv(devUpdate("default", "a", "thermo", 2)) // replaces
	recv(&linkv1.Envelope{Kind: &linkv1.Envelope_DeviceRemoval{DeviceRemoval: &linkv1.DeviceRemoval{Device: ref("default", "b")}}})

	devs, err := st.devices()
	if err != nil {
		t.Fatal(err)
	}
	if got := names(devs); !equal(got, []string{"default/a", "other/c"}) {
		t.Fatalf("devices %v", got)
	}
	if devs[0].Generation != 2 || devs[0].Properties[0].Desired.GetValue() != "21" {
		t.Fatalf("device a not replaced whole: %v", devs[0])
	}
	if d, _ := st.device(ref("default", "b")); d != nil {
		t.Fatalf("removed device still held: %v", d)
	}
	if d, _ := st.device(ref("other", "c")); d.GetGeneration() != 3 {
		t.Fatalf("device c: %v", d)
	}
	if m, _ := st.model(ref("other", "pump")); m.GetProtocol() != "virtual" {
		t.Fatalf("model pump: %v", m)
	}

	// Restart: everything and the position are still there.
	if err := st.close(); err != nil {
		t.Fatal(err)
	}
	if st, err = openStore(dir, true); err != nil {
		t.Fatal(err)
	}
	cfg, err := st.load()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.PeerStreamID != peer || cfg.Received != seq {
		t.Fatalf("position %d/%d, want %d/%d", cfg.PeerStreamID, cfg.Received, peer, seq)
	}
	models, _ := st.models()
	if got := names(models); !equal(got, []string{"default/thermo", "other/pump"}) {
		t.Fatalf("models after reopen %v", got)
	}

	// Inventory after a reconnect: the node now has a and the model thermo only.
	recv(&linkv1.Envelope{Kind: &linkv1.Envelope_DeviceInventory{DeviceInventory: &linkv1.DeviceInventory{
		Node: "edge", Devices: []*linkv1.DeviceRef{ref("default", "a"), ref("default", "never-sent")}, Models: []*linkv1.DeviceRef{ref("default", "thermo")}}}})
	devs, _ = st.devices()
	models, _ = st.models()
	if got := names(devs); !equal(got, []string{"default/a"}) {
		t.Fatalf("devices after inventory %v", got)
	}
	if got := names(models); !equal(got, []string{"default/thermo"}) {
		t.Fatalf("models after inventory %v", got)
	}
	recv(&linkv1.Envelope{Kind: &linkv1.Envelope_ModelRemoval{ModelRemoval: &linkv1.DeviceModelRemoval{Model: ref("default", "thermo")}}})
	if models, _ = st.models(); len(models) != 0 {
		t.Fatalf("models after removal %v", names(models))
	}
	st.close()
}

// TestReportStateAndExtras: reports carry metadata and the observed desired
// value through the store; states of one device coalesce while unsent, and
// a state does not replace a property's report.
func TestReportStateAndExtras(t *testing.T) {
	dir := t.TempDir()
	e, err := New(Config{Node: "edge", StateDir: dir, Dialer: offline{}, NoSync: true}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	d := ref("default", "thermo-1")
	at := time.UnixMilli(1_700_000_000_123)
	od := &linkv1.Value{Kind: &linkv1.Value_IntValue{IntValue: 21}}
	if _, err := e.Report(d, "temp", &linkv1.Value{Kind: &linkv1.Value_IntValue{IntValue: 20}}, at,
		WithMetadata(map[string]string{"timestamp": "1700000000123", "type": "INT"}), WithObservedDesired(od)); err != nil {
		t.Fatal(err)
	}
	for _, st := range []string{"online", "unhealthy", "ok"} {
		if _, err := e.ReportState(d, st, "virtual-mapper", at); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.ReportState(ref("default", "thermo-2"), "offline", "virtual-mapper", at); err != nil {
		t.Fatal(err)
	}
	if n := e.Pending(); n != 3 {
		t.Fatalf("pending %d, want 3 (one report, one state per device)", n)
	}
	if n := e.Coalesced(); n != 2 {
		t.Fatalf("coalesced %d, want 2", n)
	}
	if _, err := e.ReportState(d, "", "m", at); err == nil {
		t.Fatal("empty state accepted")
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}

	st, err := openStore(dir, true)
	if err != nil {
		t.Fatal(err)
	}
	defer st.close()
	cfg, err := st.load()
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Unacked) != 3 {
		t.Fatalf("%d entries after reopen, want 3", len(cfg.Unacked))
	}
	rep := cfg.Unacked[0].Env.GetTwinReported()
	if rep.GetMetadata()["timestamp"] != "1700000000123" || !proto.Equal(rep.GetObservedDesired(), od) || !rep.GetTime().AsTime().Equal(at) {
		t.Fatalf("report after reopen: %v", rep)
	}
	if s := cfg.Unacked[1].Env.GetDeviceState(); s.GetState() != "ok" || s.GetMapper() != "virtual-mapper" || s.GetDevice().GetName() != "thermo-1" {
		t.Fatalf("coalesced state: %v", s)
	}
	if cfg.Unacked[1].Key == cfg.Unacked[0].Key || cfg.Unacked[1].Key == cfg.Unacked[2].Key {
		t.Fatal("a state shares a coalescing key with a report or another device's state")
	}
}

// TestGroupCommit: concurrent reports are all committed before their calls
// return and survive a reopen; a restarted edge never assigns a sequence
// again, even one the store did not keep.
func TestGroupCommit(t *testing.T) {
	dir := t.TempDir()
	e, err := New(Config{Node: "edge", StateDir: dir, Dialer: offline{}, NoSync: true, StoreMaxEntries: 1 << 20}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	const writers, each = 8, 300
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				if _, err := e.Report(ref("default", fmt.Sprintf("d%d", w)), fmt.Sprintf("p%d", i), &linkv1.Value{Kind: &linkv1.Value_IntValue{IntValue: int64(i)}}, time.Now()); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	last := e.sess.NextSeq() - 1
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Report(ref("default", "late"), "p", &linkv1.Value{Kind: &linkv1.Value_IntValue{IntValue: 1}}, time.Now()); err == nil {
		t.Fatal("report after Close accepted")
	}

	e2, err := New(Config{Node: "edge", StateDir: dir, Dialer: offline{}, NoSync: true, StoreMaxEntries: 1 << 20}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer e2.Close()
	if n := e2.Pending(); n != writers*each {
		t.Fatalf("%d messages after reopen, want %d", n, writers*each)
	}
	seq, err := e2.Report(ref("default", "after"), "p", &linkv1.Value{Kind: &linkv1.Value_IntValue{IntValue: 1}}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if seq <= last {
		t.Fatalf("restarted edge assigned seq %d again (last before restart %d)", seq, last)
	}
}

// TestReportMany: one request's values commit together; two values of one
// property in the same batch leave only the newer, in memory and on disk.
func TestReportMany(t *testing.T) {
	dir := t.TempDir()
	e, err := New(Config{Node: "edge", StateDir: dir, Dialer: offline{}, NoSync: true}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	d := ref("default", "d")
	iv := func(v int64) *linkv1.Value { return &linkv1.Value{Kind: &linkv1.Value_IntValue{IntValue: v}} }
	if err := e.ReportMany([]*linkv1.TwinReportedUpdate{
		{Device: d, Property: "a", Value: iv(1)}, {Device: d, Property: "b", Value: iv(2)}, {Device: d, Property: "a", Value: iv(3)},
	}); err != nil {
		t.Fatal(err)
	}
	if err := e.ReportMany([]*linkv1.TwinReportedUpdate{{Device: d, Property: "", Value: iv(1)}}); err == nil {
		t.Fatal("a report without property accepted")
	}
	if n := e.Pending(); n != 2 {
		t.Fatalf("pending %d, want 2", n)
	}
	e.Close()
	st, err := openStore(dir, true)
	if err != nil {
		t.Fatal(err)
	}
	defer st.close()
	cfg, err := st.load()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, u := range cfg.Unacked {
		r := u.Env.GetTwinReported()
		got = append(got, fmt.Sprintf("%s=%d", r.Property, r.Value.GetIntValue()))
	}
	if !equal(got, []string{"b=2", "a=3"}) {
		t.Fatalf("stored %v, want [b=2 a=3]", got)
	}
}
