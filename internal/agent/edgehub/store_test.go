package edgehub

import (
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/dowse-dev/dowse/internal/link"
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
	od := &linkv1.TwinValue{Value: "21"}
	if _, err := e.Report(d, "temp", &linkv1.TwinValue{Value: "20", Metadata: map[string]string{"timestamp": "1700000000123", "type": "INT"}}, at,
		WithObservedDesired(od)); err != nil {
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
	if rep.GetReported().GetMetadata()["timestamp"] != "1700000000123" || !proto.Equal(rep.GetObservedDesired(), od) || !rep.GetTime().AsTime().Equal(at) {
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
				if _, err := e.Report(ref("default", fmt.Sprintf("d%d", w)), fmt.Sprintf("p%d", i), &linkv1.TwinValue{Value: strconv.Itoa(i)}, time.Now()); err != nil {
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
	if _, err := e.Report(ref("default", "late"), "p", &linkv1.TwinValue{Value: "1"}, time.Now()); err == nil {
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
	seq, err := e2.Report(ref("default", "after"), "p", &linkv1.TwinValue{Value: "1"}, time.Now())
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
	iv := func(v int64) *linkv1.TwinValue { return &linkv1.TwinValue{Value: strconv.FormatInt(v, 10)} }
	if err := e.ReportMany([]*linkv1.TwinReportedUpdate{
		{Device: d, Property: "a", Reported: iv(1)}, {Device: d, Property: "b", Reported: iv(2)}, {Device: d, Property: "a", Reported: iv(3)},
	}); err != nil {
		t.Fatal(err)
	}
	if err := e.ReportMany([]*linkv1.TwinReportedUpdate{{Device: d, Property: "", Reported: iv(1)}}); err == nil {
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
		got = append(got, r.Property+"="+r.GetReported().GetValue())
	}
	if !equal(got, []string{"b=2", "a=3"}) {
		t.Fatalf("stored %v, want [b=2 a=3]", got)
	}
}

// TestStoreReadsOlderAgents: a store an older agent wrote (a report with
// its value typed, and the bucket of TwinDesiredUpdates) opens, and the
// report is sent as text.
func TestStoreReadsOlderAgents(t *testing.T) {
	dir := t.TempDir()
	db, err := bolt.Open(filepath.Join(dir, "edge.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	// TwinReportedUpdate{device, property, value: Value{double_value: 21.5},
	// metadata: {timestamp: 1700000000123}, observed_desired: Value{int_value: 21}}.
	var r []byte
	dev, _ := proto.Marshal(ref("default", "thermo-1"))
	r = protowire.AppendBytes(protowire.AppendTag(r, 1, protowire.BytesType), dev)
	r = protowire.AppendString(protowire.AppendTag(r, 2, protowire.BytesType), "temp")
	v := protowire.AppendFixed64(protowire.AppendTag(nil, 3, protowire.Fixed64Type), math.Float64bits(21.5))
	r = protowire.AppendBytes(protowire.AppendTag(r, 3, protowire.BytesType), v)
	md := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "timestamp")
	md = protowire.AppendString(protowire.AppendTag(md, 2, protowire.BytesType), "1700000000123")
	r = protowire.AppendBytes(protowire.AppendTag(r, 5, protowire.BytesType), md)
	od := protowire.AppendVarint(protowire.AppendTag(nil, 2, protowire.VarintType), 21)
	r = protowire.AppendBytes(protowire.AppendTag(r, 6, protowire.BytesType), od)
	env := protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), link.ProtocolVersion)
	env = protowire.AppendBytes(protowire.AppendTag(env, 14, protowire.BytesType), r)
	err = db.Update(func(tx *bolt.Tx) error {
		out, err := tx.CreateBucketIfNotExists(bOut)
		if err != nil {
			return err
		}
		if err := out.Put(be(1), env); err != nil {
			return err
		}
		desired, err := tx.CreateBucketIfNotExists(bDesired)
		if err != nil {
			return err
		}
		return desired.Put([]byte("default\x00thermo-1\x00temp"), []byte{0x12, 0x04, 't', 'e', 'm', 'p'})
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
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
	if len(cfg.Unacked) != 1 {
		t.Fatalf("%d entries, want 1", len(cfg.Unacked))
	}
	got := cfg.Unacked[0].Env.GetTwinReported()
	if got.GetReported().GetValue() != "21.5" || got.GetReported().GetMetadata()["timestamp"] != "1700000000123" ||
		got.GetObservedDesired().GetValue() != "21" || cfg.Unacked[0].Key != propKey(ref("default", "thermo-1"), "temp") {
		t.Fatalf("old report read as %v (key %q)", got, cfg.Unacked[0].Key)
	}
	if err := link.Validate(&linkv1.Envelope{Version: link.ProtocolVersion, Seq: 1, Kind: cfg.Unacked[0].Env.Kind}); err != nil {
		t.Fatalf("old report does not validate: %v", err)
	}
	err = st.db.View(func(tx *bolt.Tx) error {
		if tx.Bucket(bDesired) != nil {
			return errors.New("the bucket of desired updates is still there")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
