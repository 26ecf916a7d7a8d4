package dmi

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	dmiv1beta1 "github.com/dowse-dev/dowse/proto/dmi/v1beta1"
	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
	mapperv1 "github.com/dowse-dev/dowse/proto/mapper/v1"
	"github.com/dowse-dev/dowse/shared/twinvalue"
	"github.com/dowse-dev/dowse/test/framework/promtest"
)

// fakeEdge is an in-memory edge store.
type fakeEdge struct {
	mu         sync.Mutex
	devices    map[string]*linkv1.EdgeDevice
	models     map[string]*linkv1.EdgeDeviceModel
	reports    []*linkv1.TwinReportedUpdate
	states     []*linkv1.DeviceStateUpdate
	conditions []*linkv1.DeviceCondition
}

func newFakeEdge() *fakeEdge {
	return &fakeEdge{devices: map[string]*linkv1.EdgeDevice{}, models: map[string]*linkv1.EdgeDeviceModel{}}
}

func (f *fakeEdge) Devices() ([]*linkv1.EdgeDevice, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*linkv1.EdgeDevice
	for _, d := range f.devices {
		out = append(out, d)
	}
	return out, nil
}

func (f *fakeEdge) Models() ([]*linkv1.EdgeDeviceModel, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*linkv1.EdgeDeviceModel
	for _, m := range f.models {
		out = append(out, m)
	}
	return out, nil
}

func (f *fakeEdge) ReportMany(rs []*linkv1.TwinReportedUpdate) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range rs {
		r = proto.Clone(r).(*linkv1.TwinReportedUpdate)
		r.Time = nil
		if r.Reported != nil && len(r.Reported.Metadata) == 0 {
			r.Reported.Metadata = nil
		}
		f.reports = append(f.reports, r)
	}
	return nil
}

func (f *fakeEdge) ReportState(d *linkv1.DeviceRef, st, mapper string, _ time.Time) (uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.states = append(f.states, &linkv1.DeviceStateUpdate{Device: d, State: st, Mapper: mapper})
	return uint64(len(f.states)), nil
}

// Subscribe: the tests hand changes to Changed themselves.
func (f *fakeEdge) Subscribe(func(context.Context, *linkv1.Envelope)) func() { return func() {} }

func (f *fakeEdge) ReportCondition(c *linkv1.DeviceCondition) (uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c = proto.Clone(c).(*linkv1.DeviceCondition)
	c.Time = nil
	f.conditions = append(f.conditions, c)
	return uint64(len(f.conditions)), nil
}

func (f *fakeEdge) conditionList() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, c := range f.conditions {
		out = append(out, fmt.Sprintf("%s/%s %s=%v %s: %s", c.Device.Namespace, c.Device.Name, c.Type, c.Status, c.Reason, c.Message))
	}
	return out
}

// put stores a device or model as a DeviceUpdate/ModelUpdate would and
// returns the envelope to hand to Changed.
func (f *fakeEdge) putDevice(d *linkv1.EdgeDevice) *linkv1.Envelope {
	f.mu.Lock()
	f.devices[refKey(d.Ref)] = d
	f.mu.Unlock()
	return &linkv1.Envelope{Kind: &linkv1.Envelope_DeviceUpdate{DeviceUpdate: &linkv1.DeviceUpdate{Device: d}}}
}

func (f *fakeEdge) putModel(m *linkv1.EdgeDeviceModel) *linkv1.Envelope {
	f.mu.Lock()
	f.models[refKey(m.Ref)] = m
	f.mu.Unlock()
	return &linkv1.Envelope{Kind: &linkv1.Envelope_ModelUpdate{ModelUpdate: &linkv1.DeviceModelUpdate{Model: m}}}
}

func (f *fakeEdge) removeDevice(ref *linkv1.DeviceRef) *linkv1.Envelope {
	f.mu.Lock()
	delete(f.devices, refKey(ref))
	f.mu.Unlock()
	return &linkv1.Envelope{Kind: &linkv1.Envelope_DeviceRemoval{DeviceRemoval: &linkv1.DeviceRemoval{Device: ref}}}
}

// fakeMapper serves DeviceMapperService and records the calls.
type fakeMapper struct {
	dmiv1beta1.UnimplementedDeviceMapperServiceServer
	sock  string
	srv   *grpc.Server
	block chan struct{} // when set, RegisterDevice waits on it
	hold  chan struct{} // when set, RegisterDevice takes the device, then waits on it to answer

	mu      sync.Mutex
	calls   []string
	devices map[string]*dmiv1beta1.Device
}

func startFakeMapper(t *testing.T, sock string) *fakeMapper {
	t.Helper()
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeMapper{sock: sock, srv: grpc.NewServer(), devices: map[string]*dmiv1beta1.Device{}}
	dmiv1beta1.RegisterDeviceMapperServiceServer(f.srv, f)
	go f.srv.Serve(lis)
	t.Cleanup(f.srv.Stop)
	return f
}

func (f *fakeMapper) record(c string) {
	f.mu.Lock()
	f.calls = append(f.calls, c)
	f.mu.Unlock()
}

func (f *fakeMapper) RegisterDevice(ctx context.Context, r *dmiv1beta1.RegisterDeviceRequest) (*dmiv1beta1.RegisterDeviceResponse, error) {
	if f.block != nil {
		select {
		case <-f.block:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	f.record("RegisterDevice " + r.Device.Namespace + "/" + r.Device.Name)
	f.mu.Lock()
	f.devices[r.Device.Namespace+"/"+r.Device.Name] = r.Device
	f.mu.Unlock()
	if f.hold != nil {
		select {
		case <-f.hold:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return &dmiv1beta1.RegisterDeviceResponse{DeviceName: r.Device.Name, DeviceNamespace: r.Device.Namespace}, nil
}

func (f *fakeMapper) UpdateDevice(_ context.Context, r *dmiv1beta1.UpdateDeviceRequest) (*dmiv1beta1.UpdateDeviceResponse, error) {
	f.record("UpdateDevice " + r.Device.Namespace + "/" + r.Device.Name)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.devices[r.Device.Namespace+"/"+r.Device.Name] == nil {
		return nil, status.Error(codes.NotFound, "no such device")
	}
	f.devices[r.Device.Namespace+"/"+r.Device.Name] = r.Device
	return &dmiv1beta1.UpdateDeviceResponse{}, nil
}

func (f *fakeMapper) RemoveDevice(_ context.Context, r *dmiv1beta1.RemoveDeviceRequest) (*dmiv1beta1.RemoveDeviceResponse, error) {
	f.record("RemoveDevice " + r.DeviceNamespace + "/" + r.DeviceName)
	f.mu.Lock()
	delete(f.devices, r.DeviceNamespace+"/"+r.DeviceName)
	f.mu.Unlock()
	return &dmiv1beta1.RemoveDeviceResponse{}, nil
}

func (f *fakeMapper) CreateDeviceModel(_ context.Context, r *dmiv1beta1.CreateDeviceModelRequest) (*dmiv1beta1.CreateDeviceModelResponse, error) {
	f.record("CreateDeviceModel " + r.Model.Namespace + "/" + r.Model.Name)
	return &dmiv1beta1.CreateDeviceModelResponse{DeviceModelName: r.Model.Name}, nil
}

func (f *fakeMapper) UpdateDeviceModel(_ context.Context, r *dmiv1beta1.UpdateDeviceModelRequest) (*dmiv1beta1.UpdateDeviceModelResponse, error) {
	f.record("UpdateDeviceModel " + r.Model.Namespace + "/" + r.Model.Name)
	return &dmiv1beta1.UpdateDeviceModelResponse{}, nil
}

func (f *fakeMapper) RemoveDeviceModel(_ context.Context, r *dmiv1beta1.RemoveDeviceModelRequest) (*dmiv1beta1.RemoveDeviceModelResponse, error) {
	f.record("RemoveDeviceModel " + r.ModelNamespace + "/" + r.ModelName)
	return &dmiv1beta1.RemoveDeviceModelResponse{}, nil
}

func (f *fakeMapper) GetDevice(context.Context, *dmiv1beta1.GetDeviceRequest) (*dmiv1beta1.GetDeviceResponse, error) {
	f.record("GetDevice")
	return nil, status.Error(codes.Internal, "GetDevice must never be called")
}

func (f *fakeMapper) has(name string) *dmiv1beta1.Device {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.devices[name]
}

func (f *fakeMapper) callList() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

type run struct {
	srv    *Server
	reg    *prometheus.Registry
	client dmiv1beta1.DeviceManagerServiceClient
	cancel context.CancelFunc
	done   chan error
}

func startServer(t *testing.T, dir string, edge Edge, tweak func(*Config)) *run {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg := Config{StateDir: dir, Node: "edge", CallTimeout: time.Second, RetryMin: 20 * time.Millisecond, RetryMax: 200 * time.Millisecond}
	if tweak != nil {
		tweak(&cfg)
	}
	srv, err := New(cfg, edge, NewMetrics(reg))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &run{srv: srv, reg: reg, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- srv.Start(ctx) }()
	sock := filepath.Join(dir, "dmi", "dmi.sock")
	waitFor(t, "dmi.sock", func() error { _, err := os.Stat(sock); return err })
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	r.client = dmiv1beta1.NewDeviceManagerServiceClient(conn)
	t.Cleanup(r.stop)
	return r
}

func (r *run) stop() {
	if r.cancel != nil {
		r.cancel()
		<-r.done
		r.cancel = nil
	}
}

func waitFor(t *testing.T, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func model(name, protocol string) *linkv1.EdgeDeviceModel {
	return &linkv1.EdgeDeviceModel{Ref: &linkv1.DeviceRef{Namespace: "default", Name: name}, Protocol: protocol, Properties: []*linkv1.EdgeModelProperty{
		{Name: "temp", Type: "INT", AccessMode: "ReadWrite"}, {Name: "label", Type: "STRING", AccessMode: "ReadOnly"}, {Name: "ratio", Type: "DOUBLE"}}}
}

func device(name, modelName, protocol, mapperName, desired string) *linkv1.EdgeDevice {
	return &linkv1.EdgeDevice{Ref: &linkv1.DeviceRef{Namespace: "default", Name: name}, Model: modelName, ProtocolName: protocol, Mapper: mapperName,
		Properties: []*linkv1.EdgeDeviceProperty{{Name: "temp", Desired: &linkv1.TwinValue{Value: desired}}}}
}

func register(t *testing.T, c dmiv1beta1.DeviceManagerServiceClient, name, protocol, sock string, withData bool) *dmiv1beta1.MapperRegisterResponse {
	t.Helper()
	resp, err := c.MapperRegister(context.Background(), &dmiv1beta1.MapperRegisterRequest{WithData: withData,
		Mapper: &dmiv1beta1.MapperInfo{Name: name, Protocol: protocol, Address: []byte(sock), Version: "v1", ApiVersion: "v1beta1"}})
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func deviceNames(ds []*dmiv1beta1.Device) string {
	var n []string
	for _, d := range ds {
		n = append(n, d.Namespace+"/"+d.Name)
	}
	sort.Strings(n)
	return strings.Join(n, ",")
}

// TestAssignmentAndDelivery: withData answers with the mapper's devices; a
// named mapper takes the devices that ask for it from the generic one; an
// update and a removal reach the mapper that holds the device; GetDevice
// is never called.
func TestAssignmentAndDelivery(t *testing.T) {
	dir := t.TempDir()
	edge := newFakeEdge()
	edge.putModel(model("thermo", "virtual"))
	edge.putModel(model("pump", "modbus"))
	edge.putDevice(device("a", "thermo", "virtual", "", "1"))
	edge.putDevice(device("b", "thermo", "virtual", "special", "2"))
	edge.putDevice(device("c", "pump", "modbus", "", "3"))
	edge.putDevice(device("orphan", "missing-model", "virtual", "", "4"))
	r := startServer(t, dir, edge, nil)

	generic := startFakeMapper(t, filepath.Join(dir, "generic.sock"))
	resp := register(t, r.client, "virtual-mapper", "virtual", generic.sock, true)
	// b asks for "special", which is not registered: the generic mapper serves it meanwhile.
	if got := deviceNames(resp.DeviceList); got != "default/a,default/b" {
		t.Fatalf("withData devices %q", got)
	}
	if len(resp.ModelList) != 1 || resp.ModelList[0].Name != "thermo" {
		t.Fatalf("withData models %v", resp.ModelList)
	}

	special := startFakeMapper(t, filepath.Join(dir, "special.sock"))
	register(t, r.client, "special", "virtual", special.sock, false)
	waitFor(t, "b moves to the named mapper", func() error {
		if special.has("default/b") == nil {
			return fmt.Errorf("special holds nothing; calls %v", special.callList())
		}
		if !contains(generic.callList(), "RemoveDevice default/b") {
			return fmt.Errorf("generic calls %v", generic.callList())
		}
		return nil
	})
	if c := special.callList(); c[0] != "CreateDeviceModel default/thermo" {
		t.Fatalf("model not sent before the device: %v", c)
	}

	// Desired value change rides a DeviceUpdate.
	r.srv.Changed(context.Background(), edge.putDevice(device("a", "thermo", "virtual", "", "99")))
	waitFor(t, "update reaches the generic mapper", func() error {
		if !contains(generic.callList(), "UpdateDevice default/a") {
			return fmt.Errorf("calls %v", generic.callList())
		}
		return nil
	})
	// The generic mapper registered withData and never had a's device
	// registered by call: UpdateDevice on its fake fails NotFound, and the
	// agent falls back to RegisterDevice.
	waitFor(t, "a holds the new desired value", func() error {
		if d := generic.has("default/a"); desiredOf(d) != "99" {
			return fmt.Errorf("a: %v", d)
		}
		return nil
	})
	if n := histCount(t, r.reg, "dowse_dmi_desired_to_mapper_seconds"); n < 1 {
		t.Fatalf("desired-to-mapper latency not observed (%v)", n)
	}

	r.srv.Changed(context.Background(), edge.removeDevice(&linkv1.DeviceRef{Namespace: "default", Name: "b"}))
	// No device asks for "special" any more: it is now a generic mapper
	// of its protocol, registered after virtual-mapper, which keeps a (a
	// Device naming no mapper stays with the protocol's first registered,
	// whatever names later ones pick).
	waitFor(t, "removal reaches the named mapper, a stays", func() error {
		if special.has("default/b") != nil || special.has("default/a") != nil || generic.has("default/a") == nil {
			return fmt.Errorf("special calls %v, generic calls %v", special.callList(), generic.callList())
		}
		return nil
	})
	for _, m := range []*fakeMapper{generic, special} {
		if contains(m.callList(), "GetDevice") {
			t.Fatal("GetDevice called")
		}
	}
}

func histCount(t *testing.T, g prometheus.Gatherer, name string) uint64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				n += m.GetHistogram().GetSampleCount()
			}
		}
	}
	return n
}

func desiredOf(d *dmiv1beta1.Device) string {
	for _, p := range d.GetSpec().GetProperties() {
		return p.GetDesired().GetValue()
	}
	return ""
}

func contains(xs []string, s string) bool {
	for _, x := range xs {
		if x == s {
			return true
		}
	}
	return false
}

// TestReports: valid reports reach the edge typed, with metadata and the
// observed desired value; refusals are InvalidArgument naming the problem
// and are counted.
func TestReports(t *testing.T) {
	dir := t.TempDir()
	edge := newFakeEdge()
	edge.putModel(model("thermo", "virtual"))
	edge.putDevice(device("a", "thermo", "virtual", "", "1"))
	r := startServer(t, dir, edge, nil)
	ctx := context.Background()
	register(t, r.client, "virt", "virtual", startFakeMapper(t, filepath.Join(dir, "m.sock")).sock, false)

	twin := func(prop, v, od string) *dmiv1beta1.Twin {
		return &dmiv1beta1.Twin{PropertyName: prop, Reported: &dmiv1beta1.TwinProperty{Value: v, Metadata: map[string]string{"timestamp": "1700000000123", "type": "int"}},
			ObservedDesired: &dmiv1beta1.TwinProperty{Value: od}}
	}
	report := func(ns, name string, twins ...*dmiv1beta1.Twin) error {
		_, err := r.client.ReportDeviceStatus(ctx, &dmiv1beta1.ReportDeviceStatusRequest{DeviceNamespace: ns, DeviceName: name, ReportedDevice: &dmiv1beta1.DeviceStatus{Twins: twins}})
		return err
	}
	// Values go on in their type's canonical text ("0.250" as 0.25).
	if err := report("default", "a", twin("temp", " 21", "22"), twin("label", "hello", ""), twin("ratio", "0.250", "")); err != nil {
		t.Fatal(err)
	}
	edge.mu.Lock()
	got := edge.reports
	edge.mu.Unlock()
	md := map[string]string{"timestamp": "1700000000123", "type": "int"}
	want := []*linkv1.TwinReportedUpdate{
		{Device: &linkv1.DeviceRef{Namespace: "default", Name: "a"}, Property: "temp", Reported: &linkv1.TwinValue{Value: "21", Metadata: md},
			ObservedDesired: &linkv1.TwinValue{Value: "22"}},
		{Device: &linkv1.DeviceRef{Namespace: "default", Name: "a"}, Property: "label", Reported: &linkv1.TwinValue{Value: "hello", Metadata: md}},
		{Device: &linkv1.DeviceRef{Namespace: "default", Name: "a"}, Property: "ratio", Reported: &linkv1.TwinValue{Value: "0.25", Metadata: md}},
	}
	if len(got) != len(want) {
		t.Fatalf("reports %v", got)
	}
	for i := range want {
		if !proto.Equal(got[i], want[i]) {
			t.Fatalf("report %d: %v, want %v", i, got[i], want[i])
		}
	}
	if at := r.srv.reportTime(map[string]string{"timestamp": "1700000000123"}); !at.Equal(time.UnixMilli(1700000000123)) {
		t.Fatalf("timestamp %v", at)
	}
	// An older mapper without namespace still finds the node's only "a".
	if err := report("", "a", twin("temp", "23", "")); err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		name  string
		err   error
		wants string
	}{
		{"unknown device", report("default", "nope", twin("temp", "1", "")), "device default/nope is not assigned to node edge"},
		{"other namespace", report("other", "a", twin("temp", "1", "")), "device other/a is not assigned"},
		{"unknown property", report("default", "a", twin("temp", "1", ""), twin("humidity", "1", "")), `property "humidity": model default/thermo has no such property`},
		{"bad value", report("default", "a", twin("temp", "warm", "")), `property "temp": reported value "warm" is not an INT`},
		{"bad observed desired", report("default", "a", twin("temp", "1", "x")), `property "temp": observed desired value "x" is not an INT`},
		{"no twins", report("default", "a"), "carries no twins"},
	} {
		if status.Code(c.err) != codes.InvalidArgument || !strings.Contains(status.Convert(c.err).Message(), c.wants) {
			t.Errorf("%s: %v, want InvalidArgument with %q", c.name, c.err, c.wants)
		}
	}
	edge.mu.Lock()
	if len(edge.reports) != 5 {
		t.Errorf("%d reports stored, want 5 (a refused twin stores nothing; the valid temp beside humidity is stored)", len(edge.reports))
	}
	edge.mu.Unlock()
	for reason, want := range map[string]float64{reasonUnknownDevice: 2, reasonUnknownProperty: 1, reasonBadValue: 2, reasonEmpty: 1} {
		if got := promtest.Sum(t, r.reg, "dowse_dmi_reports_refused_total", map[string]string{"kind": "twin", "reason": reason}); got != want {
			t.Errorf("refused %s: %v, want %v", reason, got, want)
		}
	}

	// States.
	for _, st := range twinvalue.States() {
		if _, err := r.client.ReportDeviceStates(ctx, &dmiv1beta1.ReportDeviceStatesRequest{DeviceNamespace: "default", DeviceName: "a", State: st}); err != nil {
			t.Fatalf("state %s: %v", st, err)
		}
	}
	_, err := r.client.ReportDeviceStates(ctx, &dmiv1beta1.ReportDeviceStatesRequest{DeviceNamespace: "default", DeviceName: "a", State: "exploded"})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), `"exploded"`) {
		t.Fatalf("bad state: %v", err)
	}
	_, err = r.client.ReportDeviceStates(ctx, &dmiv1beta1.ReportDeviceStatesRequest{DeviceNamespace: "default", DeviceName: "ghost", State: "ok"})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("state of unknown device: %v", err)
	}
	edge.mu.Lock()
	if len(edge.states) != len(twinvalue.States()) {
		t.Errorf("%d states stored", len(edge.states))
	}
	edge.mu.Unlock()

	// Registration without protocol or address.
	for _, info := range []*dmiv1beta1.MapperInfo{{Name: "x", Address: []byte("/x.sock")}, {Name: "y", Protocol: "virtual"}} {
		_, err := r.client.MapperRegister(ctx, &dmiv1beta1.MapperRegisterRequest{Mapper: info})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("register %v: %v", info, err)
		}
	}
}

// TestRestartAndIsolation: a mapper that hangs in a call, and one whose
// socket is gone, hold up no other mapper; after an agent restart the
// remembered mappers get their devices without registering again.
func TestRestartAndIsolation(t *testing.T) {
	dir := t.TempDir()
	edge := newFakeEdge()
	edge.putModel(model("thermo", "virtual"))
	edge.putModel(model("pump", "modbus"))
	edge.putModel(model("cam", "onvif"))
	edge.putDevice(device("t1", "thermo", "virtual", "", "1"))
	edge.putDevice(device("p1", "pump", "modbus", "", "2"))
	edge.putDevice(device("c1", "cam", "onvif", "", "3"))
	r := startServer(t, dir, edge, nil)

	hung := startFakeMapper(t, filepath.Join(dir, "hung.sock"))
	hung.block = make(chan struct{})
	defer close(hung.block)
	register(t, r.client, "modbus-mapper", "modbus", hung.sock, false)
	register(t, r.client, "onvif-mapper", "onvif", filepath.Join(dir, "nobody-listens.sock"), false)
	healthy := startFakeMapper(t, filepath.Join(dir, "healthy.sock"))
	register(t, r.client, "virtual-mapper", "virtual", healthy.sock, false)
	waitFor(t, "the healthy mapper gets its device", func() error {
		if healthy.has("default/t1") == nil {
			return fmt.Errorf("calls %v", healthy.callList())
		}
		return nil
	})

	// Agent restart: a new server on the same state directory.
	r.stop()
	healthy.srv.Stop()
	os.Remove(healthy.sock)
	again := startFakeMapper(t, healthy.sock) // the mapper restarted too, and holds nothing
	edge.putDevice(device("t1", "thermo", "virtual", "", "5"))
	r2 := startServer(t, dir, edge, nil)
	waitFor(t, "the remembered mapper is told again", func() error {
		if d := again.has("default/t1"); desiredOf(d) != "5" {
			return fmt.Errorf("calls %v", again.callList())
		}
		return nil
	})

	// A device the node loses while the agent is down is removed from the
	// still running mapper by the restarted agent.
	r2.srv.Changed(context.Background(), edge.putDevice(device("t2", "thermo", "virtual", "", "7")))
	waitFor(t, "t2 delivered", func() error {
		if again.has("default/t2") == nil {
			return fmt.Errorf("calls %v", again.callList())
		}
		return nil
	})
	r2.stop()
	edge.removeDevice(&linkv1.DeviceRef{Namespace: "default", Name: "t2"})
	startServer(t, dir, edge, nil)
	waitFor(t, "t2 removed after the restart", func() error {
		if again.has("default/t2") != nil || again.has("default/t1") == nil {
			return fmt.Errorf("calls %v", again.callList())
		}
		return nil
	})
}

// TestCutShortRegistrationIsRemembered: a RegisterDevice the mapper took
// but the agent did not see answered (the agent stopped meanwhile) still
// counts as held: the device, lost while the agent was down, is removed
// from the mapper by the restarted agent.
func TestCutShortRegistrationIsRemembered(t *testing.T) {
	dir := t.TempDir()
	edge := newFakeEdge()
	edge.putModel(model("thermo", "virtual"))
	edge.putDevice(device("t1", "thermo", "virtual", "", "1"))
	m := startFakeMapper(t, filepath.Join(dir, "m.sock"))
	m.hold = make(chan struct{})
	r := startServer(t, dir, edge, func(c *Config) { c.CallTimeout = time.Minute })
	register(t, r.client, "virtual-mapper", "virtual", m.sock, false)
	waitFor(t, "the mapper takes t1", func() error {
		if m.has("default/t1") == nil {
			return fmt.Errorf("calls %v", m.callList())
		}
		return nil
	})
	r.stop() // while RegisterDevice is unanswered
	close(m.hold)

	edge.removeDevice(&linkv1.DeviceRef{Namespace: "default", Name: "t1"})
	startServer(t, dir, edge, nil)
	waitFor(t, "t1 removed after the restart", func() error {
		if m.has("default/t1") != nil {
			return fmt.Errorf("calls %v", m.callList())
		}
		return nil
	})
}

// TestFloodIsolated: reports for one mapper's devices beyond its rate are
// refused with ResourceExhausted and counted; another mapper's devices are
// not affected. The clock stands still, so the bound is the burst.
func TestFloodIsolated(t *testing.T) {
	dir := t.TempDir()
	edge := newFakeEdge()
	edge.putModel(model("thermo", "virtual"))
	edge.putModel(model("pump", "modbus"))
	edge.putDevice(device("t1", "thermo", "virtual", "", "1"))
	edge.putDevice(device("p1", "pump", "modbus", "", "2"))
	frozen := time.Unix(1_800_000_000, 0)
	r := startServer(t, dir, edge, func(c *Config) {
		c.ReportRate, c.ReportBurst, c.Now = 10, 50, func() time.Time { return frozen }
	})
	register(t, r.client, "virtual-mapper", "virtual", startFakeMapper(t, filepath.Join(dir, "v.sock")).sock, true)
	register(t, r.client, "modbus-mapper", "modbus", startFakeMapper(t, filepath.Join(dir, "m.sock")).sock, true)
	report := func(name string) error {
		_, err := r.client.ReportDeviceStatus(context.Background(), &dmiv1beta1.ReportDeviceStatusRequest{DeviceNamespace: "default", DeviceName: name,
			ReportedDevice: &dmiv1beta1.DeviceStatus{Twins: []*dmiv1beta1.Twin{{PropertyName: "temp", Reported: &dmiv1beta1.TwinProperty{Value: "1"}}}}})
		return err
	}
	accepted, limited := 0, 0
	for range 200 {
		switch err := report("t1"); status.Code(err) {
		case codes.OK:
			accepted++
		case codes.ResourceExhausted:
			limited++
		default:
			t.Fatal(err)
		}
	}
	if accepted != 50 || limited != 150 {
		t.Fatalf("flood: %d accepted, %d limited; want 50 and 150", accepted, limited)
	}
	if err := report("p1"); err != nil {
		t.Fatalf("the other mapper's device: %v", err)
	}
	if got := promtest.Sum(t, r.reg, "dowse_dmi_reports_refused_total", map[string]string{"reason": reasonRateLimited}); got != 150 {
		t.Fatalf("rate-limited counted %v", got)
	}
}

// TestForgetUnreachable: a mapper whose socket stays dead is forgotten
// (registry file too), and its device goes to the other mapper of its
// protocol.
func TestForgetUnreachable(t *testing.T) {
	dir := t.TempDir()
	edge := newFakeEdge()
	edge.putModel(model("thermo", "virtual"))
	edge.putDevice(device("t1", "thermo", "virtual", "", "1"))
	r := startServer(t, dir, edge, func(c *Config) { c.ForgetAfter = 100 * time.Millisecond; c.CallTimeout = 100 * time.Millisecond })
	register(t, r.client, "a-gone", "virtual", filepath.Join(dir, "nobody.sock"), false)
	alive := startFakeMapper(t, filepath.Join(dir, "alive.sock"))
	register(t, r.client, "b-alive", "virtual", alive.sock, false)
	waitFor(t, "the device moves to the live mapper once the dead one is forgotten", func() error {
		if alive.has("default/t1") == nil {
			return fmt.Errorf("calls %v", alive.callList())
		}
		b, err := os.ReadFile(filepath.Join(dir, "dmi-mappers.json"))
		if err != nil {
			return err
		}
		if strings.Contains(string(b), "a-gone") {
			return fmt.Errorf("still remembered: %s", b)
		}
		return nil
	})
}

// TestReflection: the socket lists its service as edgecore's does.
func TestReflection(t *testing.T) {
	dir := t.TempDir()
	startServer(t, dir, newFakeEdge(), nil)
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, "dmi", "dmi.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	if !slices.Contains(names, "v1beta1.DeviceManagerService") {
		t.Fatalf("services %v", names)
	}
}

// TestUnservedDevicesAreReported: a Device no mapper of the node serves is
// reported once as state "unknown" with no mapper (the cloud's
// MapperConnected False); once a mapper serves it, nothing more is said for
// it, and it is said again when it is unserved again.
func TestUnservedDevicesAreReported(t *testing.T) {
	dir := t.TempDir()
	edge := newFakeEdge()
	edge.putModel(model("thermo", "virtual"))
	edge.putDevice(device("a", "thermo", "virtual", "", "1"))
	r := startServer(t, dir, edge, func(c *Config) { c.UnservedInterval = 20 * time.Millisecond })
	unserved := func() []string {
		edge.mu.Lock()
		defer edge.mu.Unlock()
		var out []string
		for _, s := range edge.states {
			if s.Mapper == "" {
				out = append(out, s.Device.Name+":"+s.State)
			}
		}
		return out
	}
	waitFor(t, "unserved report", func() error {
		if got := unserved(); len(got) != 1 || got[0] != "a:unknown" {
			return fmt.Errorf("unserved reports %v, want [a:unknown]", got)
		}
		return nil
	})
	time.Sleep(100 * time.Millisecond) // several checks: still one report
	if got := unserved(); len(got) != 1 {
		t.Fatalf("unserved reports %v, want one", got)
	}
	startFakeMapper(t, filepath.Join(dir, "m.sock"))
	register(t, r.client, "virt", "virtual", filepath.Join(dir, "m.sock"), true)
	time.Sleep(100 * time.Millisecond)
	if got := unserved(); len(got) != 1 {
		t.Fatalf("unserved reports %v after a mapper took the device, want still one", got)
	}
	// A device asking for a mapper name nobody registered: the protocol's
	// mapper serves it.
	r.srv.Changed(context.Background(), edge.putDevice(device("a", "thermo", "virtual", "special", "1")))
	time.Sleep(100 * time.Millisecond)
	if got := unserved(); len(got) != 1 {
		t.Fatalf("unserved reports %v, want one: the protocol's mapper serves a device whose named mapper is absent", got)
	}
	r.srv.Changed(context.Background(), edge.putDevice(device("b", "thermo", "nothing-speaks-this", "", "1")))
	waitFor(t, "second unserved report", func() error {
		if got := unserved(); len(got) != 2 || got[1] != "b:unknown" {
			return fmt.Errorf("unserved reports %v, want a then b", got)
		}
		return nil
	})
}

// TestMixedReportKeepsValidTwins: a report with invalid twins stores the
// valid ones, answers InvalidArgument naming each refused twin (with a
// BadRequest detail per twin) and counts them; the Device's
// ReportsAccepted condition names the refused properties, is told again
// only when that changes, and turns True when each has been taken since;
// a Device update makes it judged afresh.
func TestMixedReportKeepsValidTwins(t *testing.T) {
	dir := t.TempDir()
	edge := newFakeEdge()
	edge.putModel(model("thermo", "virtual"))
	edge.putDevice(device("a", "thermo", "virtual", "", "1"))
	r := startServer(t, dir, edge, nil)
	register(t, r.client, "virt", "virtual", startFakeMapper(t, filepath.Join(dir, "m.sock")).sock, false)
	report := func(twins ...*dmiv1beta1.Twin) error {
		_, err := r.client.ReportDeviceStatus(context.Background(), &dmiv1beta1.ReportDeviceStatusRequest{DeviceNamespace: "default", DeviceName: "a",
			ReportedDevice: &dmiv1beta1.DeviceStatus{Twins: twins}})
		return err
	}
	tw := func(prop, v string) *dmiv1beta1.Twin {
		return &dmiv1beta1.Twin{PropertyName: prop, Reported: &dmiv1beta1.TwinProperty{Value: v}}
	}
	stored := func() []string {
		edge.mu.Lock()
		defer edge.mu.Unlock()
		var out []string
		for _, r := range edge.reports {
			out = append(out, r.Property+"="+r.GetReported().GetValue())
		}
		return out
	}

	err := report(tw("temp", "21"), tw("humidity", "3"), tw("ratio", "half"))
	st := status.Convert(err)
	if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "report for device default/a: 2 of 3 twins refused") ||
		!strings.Contains(st.Message(), `property "humidity": model default/thermo has no such property`) ||
		!strings.Contains(st.Message(), `property "ratio": reported value "half" is not a DOUBLE`) || !strings.Contains(st.Message(), "the other 1 taken") {
		t.Fatalf("mixed report: %v", err)
	}
	var fields []string
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, v := range br.FieldViolations {
				fields = append(fields, v.Field)
			}
		}
	}
	if !slices.Equal(fields, []string{"reportedDevice.twins[1]", "reportedDevice.twins[2]"}) {
		t.Fatalf("BadRequest fields %v", fields)
	}
	if got := stored(); !slices.Equal(got, []string{"temp=21"}) {
		t.Fatalf("stored %v, want the valid temp", got)
	}
	for reason, want := range map[string]float64{reasonUnknownProperty: 1, reasonBadValue: 1} {
		if got := promtest.Sum(t, r.reg, "dowse_dmi_reports_refused_total", map[string]string{"kind": "twin", "reason": reason}); got != want {
			t.Errorf("refused %s: %v, want %v", reason, got, want)
		}
	}
	want := []string{`default/a ReportsAccepted=false TwinRefused: refused by node edge: property "humidity": model default/thermo has no such property; property "ratio": reported value "half" is not a DOUBLE`}
	if got := edge.conditionList(); !slices.Equal(got, want) {
		t.Fatalf("conditions %q, want %q", got, want)
	}

	// The same refusals again (one twin a call, as mapper-framework
	// reports): nothing new to tell.
	for _, twin := range []*dmiv1beta1.Twin{tw("humidity", "3"), tw("ratio", "half"), tw("temp", "22")} {
		_ = report(twin)
	}
	if got := edge.conditionList(); len(got) != 1 {
		t.Fatalf("conditions %q, want still one", got)
	}
	// ratio is fixed: only humidity is named.
	if err := report(tw("ratio", "0.5")); err != nil {
		t.Fatal(err)
	}
	want = append(want, `default/a ReportsAccepted=false TwinRefused: refused by node edge: property "humidity": model default/thermo has no such property`)
	if got := edge.conditionList(); !slices.Equal(got, want) {
		t.Fatalf("conditions %q, want %q", got, want)
	}
	// The Device is updated (the mapper stopped reporting humidity, say):
	// its next report is judged afresh.
	r.srv.Changed(context.Background(), edge.putDevice(device("a", "thermo", "virtual", "", "2")))
	if err := report(tw("temp", "23")); err != nil {
		t.Fatal(err)
	}
	want = append(want, `default/a ReportsAccepted=true Accepted: the latest report of every property was taken`)
	if got := edge.conditionList(); !slices.Equal(got, want) {
		t.Fatalf("conditions %q, want %q", got, want)
	}
	// Only invalid twins: nothing stored, all named.
	n := len(stored())
	err = report(tw("temp", "warm"))
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "1 of 1 twins refused") || len(stored()) != n {
		t.Fatalf("all invalid: %v, stored %v", err, stored())
	}
}

// TestMapperConditions: a mapper's Authenticated condition of its Device
// goes to the cloud as a DeviceCondition naming the mapper; a type a
// mapper does not set, and a Device not on the node, are refused.
func TestMapperConditions(t *testing.T) {
	dir := t.TempDir()
	edge := newFakeEdge()
	edge.putModel(model("thermo", "virtual"))
	edge.putDevice(device("a", "thermo", "virtual", "", "1"))
	r := startServer(t, dir, edge, nil)
	register(t, r.client, "virt", "virtual", startFakeMapper(t, filepath.Join(dir, "m.sock")).sock, false)
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, "dmi", "dmi.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := mapperv1.NewDeviceConditionsClient(conn)
	ctx := context.Background()
	if _, err := c.ReportDeviceCondition(ctx, &mapperv1.ReportDeviceConditionRequest{DeviceNamespace: "default", DeviceName: "a",
		Type: "Authenticated", Reason: "AuthFailed", Message: "BadUserAccessDenied"}); err != nil {
		t.Fatal(err)
	}
	if got, want := edge.conditionList(), []string{"default/a Authenticated=false AuthFailed: BadUserAccessDenied"}; !slices.Equal(got, want) {
		t.Fatalf("conditions %q, want %q", got, want)
	}
	edge.mu.Lock()
	if m := edge.conditions[0].Mapper; m != "virt" {
		t.Errorf("condition of mapper %q, want virt", m)
	}
	edge.mu.Unlock()
	for _, req := range []*mapperv1.ReportDeviceConditionRequest{
		{DeviceNamespace: "default", DeviceName: "a", Type: "ReportsAccepted", Status: true},
		{DeviceNamespace: "default", DeviceName: "a", Type: "Valid", Status: true},
		{DeviceNamespace: "default", DeviceName: "ghost", Type: "Authenticated"},
	} {
		if _, err := c.ReportDeviceCondition(ctx, req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%v: %v, want InvalidArgument", req, err)
		}
	}
	if n := len(edge.conditionList()); n != 1 {
		t.Errorf("%d conditions stored, want 1", n)
	}
}
