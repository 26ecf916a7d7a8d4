package mapper_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"

	"github.com/dowse-dev/dowse/mappers/mapper"
	"github.com/dowse-dev/dowse/mappers/mapper/mappertest"
	dmiv1beta1 "github.com/dowse-dev/dowse/proto/dmi/v1beta1"
	"github.com/dowse-dev/dowse/shared/twinvalue"
)

const wait = 15 * time.Second

// fakeDevices is a set of in-memory devices the fake driver talks to,
// keyed by the protocol config's "id".
type fakeDevices struct {
	mu       sync.Mutex
	values   map[string]map[string]any // id -> register -> value
	down     map[string]bool           // connect and reads fail
	drops    map[string]bool           // connect works, every read finds the connection closed
	connects map[string]int
	batches  map[string]int
	writes   map[string][]any
	pushes   map[string]func(p *mapper.Property, v any, err error)
	subProps map[string][]*mapper.Property
	subFails int // Subscribe calls to fail
	// hold, when set, stops reads of holdReg until a value is sent on it
	// (each read signals held as it stops); events logs reads and writes.
	hold    chan struct{}
	held    chan struct{}
	holdReg string
	events  []string
}

func newFake() *fakeDevices {
	return &fakeDevices{values: map[string]map[string]any{}, down: map[string]bool{}, drops: map[string]bool{}, connects: map[string]int{},
		batches: map[string]int{}, writes: map[string][]any{}, pushes: map[string]func(*mapper.Property, any, error){},
		subProps: map[string][]*mapper.Property{}}
}

func (f *fakeDevices) set(id, reg string, v any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.values[id] == nil {
		f.values[id] = map[string]any{}
	}
	f.values[id][reg] = v
}

func (f *fakeDevices) get(id, reg string) any {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.values[id][reg]
}

func (f *fakeDevices) setDown(id string, down bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.down[id] = down
}

func (f *fakeDevices) count(m map[string]int, id string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return m[id]
}

func (f *fakeDevices) newDriver(dev mapper.DeviceInfo) (mapper.Driver, error) {
	id, err := dev.Protocol.String("id", "")
	if err != nil || id == "" {
		return nil, fmt.Errorf("id is required")
	}
	return &fakeDriver{f: f, id: id}, nil
}

type fakeDriver struct {
	f  *fakeDevices
	id string
}

func (d *fakeDriver) Prepare(p *mapper.Property) error {
	reg, err := p.Visitor.String("register", "")
	if err != nil || reg == "" {
		return fmt.Errorf("register is required")
	}
	if reg == "bad" {
		return fmt.Errorf("register %q does not exist", reg)
	}
	p.Data = reg
	return nil
}

func (d *fakeDriver) Connect(context.Context) error {
	d.f.mu.Lock()
	defer d.f.mu.Unlock()
	d.f.connects[d.id]++
	if d.f.down[d.id] {
		return errors.New("connection refused")
	}
	return nil
}

func (d *fakeDriver) Read(_ context.Context, p *mapper.Property) (any, error) {
	d.f.mu.Lock()
	if hold := d.f.hold; hold != nil && p.Data.(string) == d.f.holdReg {
		d.f.mu.Unlock()
		d.f.held <- struct{}{}
		<-hold
		d.f.mu.Lock()
	}
	defer d.f.mu.Unlock()
	d.f.events = append(d.f.events, "read "+p.Data.(string))
	if d.f.down[d.id] {
		return nil, errors.New("i/o timeout")
	}
	if d.f.drops[d.id] {
		return nil, fmt.Errorf("read: %w", mapper.ErrDisconnected)
	}
	v, ok := d.f.values[d.id][p.Data.(string)]
	if !ok {
		return nil, mapper.Permanentf("illegal data address %s", p.Data)
	}
	return v, nil
}

func (d *fakeDriver) ReadBatch(ctx context.Context, ps []*mapper.Property) []mapper.Result {
	d.f.mu.Lock()
	d.f.batches[d.id]++
	d.f.mu.Unlock()
	rs := make([]mapper.Result, len(ps))
	for i, p := range ps {
		rs[i].Value, rs[i].Err = d.Read(ctx, p)
	}
	return rs
}

func (d *fakeDriver) Write(_ context.Context, p *mapper.Property, v any) error {
	d.f.mu.Lock()
	defer d.f.mu.Unlock()
	if d.f.down[d.id] {
		return errors.New("i/o timeout")
	}
	d.f.writes[d.id] = append(d.f.writes[d.id], v)
	d.f.events = append(d.f.events, "write "+p.Data.(string))
	d.f.values[d.id][p.Data.(string)] = v
	return nil
}

func (d *fakeDriver) Close() error { return nil }

func (d *fakeDriver) Subscribe(ctx context.Context, ps []*mapper.Property, push func(*mapper.Property, any, error)) error {
	d.f.mu.Lock()
	defer d.f.mu.Unlock()
	d.f.connects[d.id+"/subscribe"]++
	if d.f.subFails > 0 {
		d.f.subFails--
		return errors.New("BadTooManySubscriptions")
	}
	d.f.pushes[d.id] = push
	d.f.subProps[d.id] = ps
	return nil
}

func (f *fakeDevices) push(t *testing.T, id, prop string, v any) {
	t.Helper()
	f.pushResult(t, id, prop, v, nil)
}

func (f *fakeDevices) pushResult(t *testing.T, id, prop string, v any, err error) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for {
		f.mu.Lock()
		push := f.pushes[id]
		var p *mapper.Property
		for _, sp := range f.subProps[id] {
			if sp.Name == prop {
				p = sp
			}
		}
		f.mu.Unlock()
		if push != nil && p != nil {
			push(p, v, err)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no subscription of %s %s", id, prop)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

type run struct {
	agent *mappertest.Agent
	fake  *fakeDevices
	m     *mapper.Mapper
}

var model = mappertest.NewModel("ns", "thermo",
	mappertest.ModelProp("temp", "DOUBLE", "ReadOnly", "", ""),
	mappertest.ModelProp("setpoint", "INT", "ReadWrite", "10", "30"),
	mappertest.ModelProp("label", "STRING", "ReadOnly", "", ""),
	mappertest.ModelProp("pushed", "DOUBLE", "ReadOnly", "", ""),
)

func thermo(t *testing.T, name, id string, props ...mappertest.Prop) *dmiv1beta1.Device {
	if len(props) == 0 {
		props = []mappertest.Prop{
			{Name: "temp", Visitor: map[string]any{"register": "t", "scale": 0.5, "offset": -10, "deadband": 1}},
			{Name: "setpoint", Visitor: map[string]any{"register": "s", "scale": 0.1}},
		}
	}
	return mappertest.NewDevice(t, "ns", name, "thermo", "fake", map[string]any{"id": id}, props...)
}

func TestReportsOnChangeWithTransformsAndDeadband(t *testing.T) {
	dev := thermo(t, "a", "A")
	r := startWith(t, dev, func(f *fakeDevices) {
		f.set("A", "t", int64(100)) // 100*0.5-10 = 40
		f.set("A", "s", int64(200)) // 20
	})
	info := r.agent.WaitRegistrations(t, 1, wait)
	if info.GetProtocol() != "fake" || info.GetName() != "fake" || info.GetApiVersion() != "v1beta1" || string(info.GetAddress()) != r.m.Socket() {
		t.Errorf("registration = %v", info)
	}
	if fi, err := os.Stat(r.m.Socket()); err != nil || fi.Mode().Perm() != 0o660 {
		t.Errorf("mapper socket: %v, %v; want mode 0660 (the mapper's and agent's user and group only)", fi, err)
	}
	_, next := r.agent.WaitReported(t, "ns/a", "temp", "40", 0, wait)
	tw, _ := r.agent.WaitReported(t, "ns/a", "setpoint", "20", 0, wait)
	if md := tw.GetReported().GetMetadata(); md["type"] != "INT" || md["timestamp"] == "" {
		t.Errorf("metadata = %v", md)
	}
	r.agent.WaitState(t, "ns/a", "ok", wait)

	// Within the deadband (40 -> 40.5): not reported; beyond (-> 42): once.
	r.fake.set("A", "t", int64(101))
	time.Sleep(150 * time.Millisecond) // several cycles
	r.fake.set("A", "t", int64(104))
	_, after := r.agent.WaitReported(t, "ns/a", "temp", "42", next, wait)
	time.Sleep(150 * time.Millisecond)
	var temps []string
	for _, tw := range r.agent.Twins("ns/a", "temp", next) {
		temps = append(temps, tw.GetReported().GetValue())
	}
	if len(temps) != 1 || temps[0] != "42" {
		t.Errorf("temp reports after the first = %q, want just [42] (no report within the deadband, one on change)", temps)
	}
	if n := len(r.agent.Twins("ns/a", "setpoint", after)); n != 0 {
		t.Errorf("unchanged setpoint reported %d more times", n)
	}
	if r.fake.count(r.fake.batches, "A") == 0 {
		t.Errorf("two properties of one cycle were never read as a batch")
	}
	// One report carries every changed property.
	r.fake.set("A", "t", int64(120))
	r.fake.set("A", "s", int64(150))
	r.agent.WaitTwin(t, "ns/a", "temp", after, wait, func(*dmiv1beta1.Twin) bool { return true })
	both := false
	for _, rep := range r.agent.Reports(after) {
		if len(rep.Req.GetReportedDevice().GetTwins()) == 2 {
			both = true
		}
	}
	if !both {
		// They might straddle two reads; allow it but say so.
		t.Logf("the two changes were read in different rounds")
	}
}

func startWith(t *testing.T, dev *dmiv1beta1.Device, setup func(*fakeDevices)) *run {
	t.Helper()
	dir := mappertest.ShortTempDir(t)
	agent := mappertest.Start(t, dir)
	agent.SetData([]*dmiv1beta1.DeviceModel{model}, []*dmiv1beta1.Device{dev})
	fake := newFake()
	setup(fake)
	m := mappertest.RunMapper(t, mapper.Config{Protocol: "fake", StateDir: dir, NewDriver: fake.newDriver, Logger: testr.New(t),
		DefaultCollectCycle: 20 * time.Millisecond, ReconnectInitial: 10 * time.Millisecond, ReconnectMax: 50 * time.Millisecond,
		ReregisterInterval: time.Hour})
	return &run{agent: agent, fake: fake, m: m}
}

func TestHeartbeat(t *testing.T) {
	dev := thermo(t, "a", "A", mappertest.Prop{Name: "temp", Visitor: map[string]any{"register": "t"}, ReportCycle: 100 * time.Millisecond})
	r := startWith(t, dev, func(f *fakeDevices) { f.set("A", "t", 7.5) })
	_, next := r.agent.WaitReported(t, "ns/a", "temp", "7.5", 0, wait)
	// Unchanged, yet reported again within a few report cycles.
	r.agent.WaitReported(t, "ns/a", "temp", "7.5", next, wait)
}

func TestDesiredWritesWithoutReconnecting(t *testing.T) {
	dev := thermo(t, "a", "A")
	r := startWith(t, dev, func(f *fakeDevices) {
		f.set("A", "t", int64(100))
		f.set("A", "s", int64(200))
	})
	r.agent.WaitReported(t, "ns/a", "setpoint", "20", 0, wait)
	client := r.agent.Mapper(t)
	ctx := context.Background()

	// 25 -> raw 250 through the inverse transform.
	from := r.agent.ReportCount()
	dev = mappertest.SetDesired(dev, "setpoint", "25")
	if _, err := client.UpdateDevice(ctx, &dmiv1beta1.UpdateDeviceRequest{Device: dev}); err != nil {
		t.Fatal(err)
	}
	tw, _ := r.agent.WaitTwin(t, "ns/a", "setpoint", from, wait, func(tw *dmiv1beta1.Twin) bool {
		return tw.GetObservedDesired().GetValue() == "25" && tw.GetReported().GetValue() == "25"
	})
	if e := tw.GetObservedDesired().GetMetadata()["error"]; e != "" {
		t.Errorf("observedDesired error %q", e)
	}
	if got := r.fake.get("A", "s"); got != 250.0 {
		t.Errorf("register s = %v, want 250", got)
	}
	if n := r.fake.count(r.fake.connects, "A"); n != 1 {
		t.Errorf("%d connects for a desired-only update, want 1", n)
	}

	// Outside the model's maximum: refused before any write, with an error.
	writes := len(r.fake.writes["A"])
	from = r.agent.ReportCount()
	dev = mappertest.SetDesired(dev, "setpoint", "31")
	if _, err := client.UpdateDevice(ctx, &dmiv1beta1.UpdateDeviceRequest{Device: dev}); err != nil {
		t.Fatal(err)
	}
	// The reported twin says why; observedDesired stays the value applied.
	tw, _ = r.agent.WaitTwin(t, "ns/a", "setpoint", from, wait, func(tw *dmiv1beta1.Twin) bool {
		return tw.GetReported().GetMetadata()[twinvalue.MetaDesiredError] != ""
	})
	if e := tw.GetReported().GetMetadata()[twinvalue.MetaDesiredError]; !strings.Contains(e, "maximum") || tw.GetObservedDesired().GetValue() != "25" {
		t.Errorf("desired value above the maximum: twin %v", tw)
	} else {
		t.Logf("above maximum: %s", e)
	}
	// A read-only property and a value of the wrong type.
	dev = mappertest.SetDesired(dev, "setpoint", "abc")
	dev = mappertest.SetDesired(dev, "temp", "1")
	from = r.agent.ReportCount()
	if _, err := client.UpdateDevice(ctx, &dmiv1beta1.UpdateDeviceRequest{Device: dev}); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]string{"setpoint": "not an INT", "temp": "ReadOnly"} {
		tw, _ = r.agent.WaitTwin(t, "ns/a", p, from, wait, func(tw *dmiv1beta1.Twin) bool {
			return strings.Contains(tw.GetReported().GetMetadata()[twinvalue.MetaDesiredError], want)
		})
		t.Logf("%s: %s", p, tw.GetReported().GetMetadata()[twinvalue.MetaDesiredError])
	}
	r.fake.mu.Lock()
	if n := len(r.fake.writes["A"]); n != writes {
		t.Errorf("%d writes of refused values", n-writes)
	}
	r.fake.mu.Unlock()

	// A protocol change reconnects.
	dev.Spec.Protocol.ConfigData, _ = mapper.EncodeConfig(map[string]any{"id": "B"})
	r.fake.set("B", "t", int64(40))
	r.fake.set("B", "s", int64(100))
	from = r.agent.ReportCount()
	if _, err := client.UpdateDevice(ctx, &dmiv1beta1.UpdateDeviceRequest{Device: dev}); err != nil {
		t.Fatal(err)
	}
	r.agent.WaitReported(t, "ns/a", "temp", "10", from, wait)
	if n := r.fake.count(r.fake.connects, "B"); n != 1 {
		t.Errorf("%d connects to the new device, want 1", n)
	}
}

func TestHealthAndReconnect(t *testing.T) {
	dev := thermo(t, "a", "A")
	other := thermo(t, "b", "B")
	dir := mappertest.ShortTempDir(t)
	agent := mappertest.Start(t, dir)
	agent.SetData([]*dmiv1beta1.DeviceModel{model}, []*dmiv1beta1.Device{dev, other})
	fake := newFake()
	for _, id := range []string{"A", "B"} {
		fake.set(id, "t", int64(100))
		fake.set(id, "s", int64(200))
	}
	mappertest.RunMapper(t, mapper.Config{Protocol: "fake", StateDir: dir, NewDriver: fake.newDriver, Logger: testr.New(t),
		DefaultCollectCycle: 20 * time.Millisecond, ReconnectInitial: 10 * time.Millisecond, ReconnectMax: 50 * time.Millisecond,
		ReregisterInterval: time.Hour})
	agent.WaitState(t, "ns/a", "ok", wait)
	fake.setDown("A", true)
	agent.WaitState(t, "ns/a", "offline", wait)
	seen := map[string]bool{}
	for _, s := range agent.States() {
		if s.Device == "a" {
			seen[s.State] = true
		}
	}
	if !seen["unhealthy"] {
		t.Errorf("states of a = %v, want unhealthy before offline", agent.States())
	}
	// The other device goes on.
	from := agent.ReportCount()
	fake.set("B", "t", int64(110))
	agent.WaitReported(t, "ns/b", "temp", "45", from, wait)

	fake.set("A", "t", int64(120))
	fake.setDown("A", false)
	agent.WaitState(t, "ns/a", "ok", wait)
	agent.WaitReported(t, "ns/a", "temp", "50", from, wait)
}

func TestBadPropertyAndModelLater(t *testing.T) {
	dev := thermo(t, "a", "A",
		mappertest.Prop{Name: "temp", Visitor: map[string]any{"register": "t"}},
		mappertest.Prop{Name: "label", Visitor: map[string]any{"register": "bad"}},
		mappertest.Prop{Name: "nothere", Visitor: map[string]any{"register": "t"}},
		mappertest.Prop{Name: "setpoint", Visitor: map[string]any{"register": "missing"}},
	)
	dir := mappertest.ShortTempDir(t)
	agent := mappertest.Start(t, dir)
	// No model at first: the device waits for it.
	agent.SetData(nil, []*dmiv1beta1.Device{dev})
	fake := newFake()
	fake.set("A", "t", 1.5)
	mappertest.RunMapper(t, mapper.Config{Protocol: "fake", StateDir: dir, NewDriver: fake.newDriver, Logger: testr.New(t),
		DefaultCollectCycle: 20 * time.Millisecond, ReregisterInterval: time.Hour})
	ctx := t.Context()
	agent.WaitState(t, "ns/a", "offline", wait)
	if _, err := agent.Mapper(t).CreateDeviceModel(ctx, &dmiv1beta1.CreateDeviceModelRequest{Model: model}); err != nil {
		t.Fatal(err)
	}
	agent.WaitReported(t, "ns/a", "temp", "1.5", 0, wait)
	agent.WaitState(t, "ns/a", "ok", wait)
	// Never read: not reported (a device manager would refuse the report),
	// but shown with the error by GetDevice.
	for _, p := range []string{"label", "nothere", "setpoint"} {
		t.Logf("%s: %s", p, agent.WaitDeviceError(t, "ns", "a", p, wait))
	}
	time.Sleep(150 * time.Millisecond)
	for _, p := range []string{"label", "nothere", "setpoint"} {
		if n := len(agent.Twins("ns/a", p, 0)); n != 0 {
			t.Errorf("%s, never read, reported %d times", p, n)
		}
	}
	// A property that was read and now fails: reported once with its last
	// good value and the error.
	from := agent.ReportCount()
	fake.mu.Lock()
	delete(fake.values["A"], "t")
	fake.mu.Unlock()
	tw, _ := agent.WaitTwin(t, "ns/a", "temp", from, wait, func(tw *dmiv1beta1.Twin) bool {
		return tw.GetReported().GetMetadata()[twinvalue.MetaError] != ""
	})
	if tw.GetReported().GetValue() != "1.5" {
		t.Errorf("failing property reported %q, want the last good value 1.5", tw.GetReported().GetValue())
	}
	time.Sleep(150 * time.Millisecond)
	if n := len(agent.Twins("ns/a", "temp", from)); n != 1 {
		t.Errorf("temp's read error reported %d times, want once", n)
	}
	got, err := agent.Mapper(t).GetDevice(ctx, &dmiv1beta1.GetDeviceRequest{DeviceName: "a", DeviceNamespace: "ns"})
	if err != nil || len(got.GetDevice().GetStatus().GetTwins()) != 4 {
		t.Errorf("GetDevice = %v, %v", got, err)
	}
	if _, err := agent.Mapper(t).RemoveDevice(ctx, &dmiv1beta1.RemoveDeviceRequest{DeviceName: "a", DeviceNamespace: "ns"}); err != nil {
		t.Fatal(err)
	}
	if _, err := agent.Mapper(t).GetDevice(ctx, &dmiv1beta1.GetDeviceRequest{DeviceName: "a", DeviceNamespace: "ns"}); err == nil {
		t.Errorf("removed device still served")
	}
}

func TestRegistersAgainWhenTheAgentRestarts(t *testing.T) {
	dev := thermo(t, "a", "A")
	r := startWith(t, dev, func(f *fakeDevices) {
		f.set("A", "t", int64(100))
		f.set("A", "s", int64(200))
	})
	r.agent.WaitReported(t, "ns/a", "temp", "40", 0, wait)
	n := r.agent.Registrations()
	r.agent.Stop()
	time.Sleep(100 * time.Millisecond)
	// The restarted agent knows a second device.
	r.agent.SetData([]*dmiv1beta1.DeviceModel{model}, []*dmiv1beta1.Device{dev, thermo(t, "c", "A")})
	from := r.agent.ReportCount()
	r.agent.Serve(t)
	r.agent.WaitRegistrations(t, n+1, wait)
	// Values and state are sent again to the new agent, and the new device
	// starts.
	r.agent.WaitReported(t, "ns/a", "temp", "40", from, wait)
	r.agent.WaitReported(t, "ns/c", "temp", "40", from, wait)
	r.agent.WaitState(t, "ns/a", "ok", wait)
}

func TestSubscription(t *testing.T) {
	dev := thermo(t, "a", "A",
		mappertest.Prop{Name: "pushed", Visitor: map[string]any{"register": "p", "subscribe": true}},
		mappertest.Prop{Name: "temp", Visitor: map[string]any{"register": "t"}})
	// The first subscription fails: the mapper reconnects and subscribes
	// again.
	r := startWith(t, dev, func(f *fakeDevices) {
		f.set("A", "t", 1.0)
		f.subFails = 1
	})
	r.agent.WaitReported(t, "ns/a", "temp", "1", 0, wait)
	r.fake.push(t, "A", "pushed", 3.25)
	r.agent.WaitReported(t, "ns/a", "pushed", "3.25", 0, wait)
	r.fake.push(t, "A", "pushed", 3.5)
	r.agent.WaitReported(t, "ns/a", "pushed", "3.5", 0, wait)
	if n := r.fake.count(r.fake.connects, "A"); n != 2 {
		t.Errorf("%d connects, want 2 (the first subscription failed)", n)
	}

	// Properties changed on the open connection: subscribed again, the
	// new properties pushed.
	dev.Spec.Properties[0].Visitors.ConfigData, _ = mapper.EncodeConfig(map[string]any{"register": "p", "subscribe": true, "deadband": 0.1})
	if _, err := r.agent.Mapper(t).UpdateDevice(context.Background(), &dmiv1beta1.UpdateDeviceRequest{Device: dev}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(wait)
	for r.fake.count(r.fake.connects, "A/subscribe") < 3 {
		if time.Now().After(deadline) {
			t.Fatal("no new subscription after the properties changed")
		}
		time.Sleep(10 * time.Millisecond)
	}
	r.fake.push(t, "A", "pushed", 4.5)
	r.agent.WaitReported(t, "ns/a", "pushed", "4.5", 0, wait)
	if n := r.fake.count(r.fake.connects, "A"); n != 2 {
		t.Errorf("%d connects after a property change, want still 2", n)
	}
}

// A device whose pushed value says it is offline (ErrDeviceOffline: it
// announced so over a working connection) is reported offline with the
// reason on its twin, without a reconnect, and ok with its next value.
func TestDeviceOfflinePushed(t *testing.T) {
	dev := thermo(t, "a", "A", mappertest.Prop{Name: "pushed", Visitor: map[string]any{"register": "p", "subscribe": true}})
	r := startWith(t, dev, func(*fakeDevices) {})
	r.agent.WaitState(t, "ns/a", "ok", wait)
	r.fake.push(t, "A", "pushed", 1.5)
	r.agent.WaitReported(t, "ns/a", "pushed", "1.5", 0, wait)
	from := r.agent.ReportCount()
	r.fake.pushResult(t, "A", "pushed", nil, fmt.Errorf("%w: it said goodbye", mapper.ErrDeviceOffline))
	r.agent.WaitState(t, "ns/a", "offline", wait)
	r.agent.WaitTwin(t, "ns/a", "pushed", from, wait, func(tw *dmiv1beta1.Twin) bool {
		return strings.Contains(tw.GetReported().GetMetadata()[twinvalue.MetaError], "it said goodbye")
	})
	r.fake.push(t, "A", "pushed", 2.5)
	r.agent.WaitReported(t, "ns/a", "pushed", "2.5", 0, wait)
	r.agent.WaitState(t, "ns/a", "ok", wait)
	if n := r.fake.count(r.fake.connects, "A"); n != 1 {
		t.Errorf("%d connects, want 1 (offline is not a reconnect)", n)
	}
	var states []string
	for _, s := range r.agent.States() {
		if s.Namespace+"/"+s.Device == "ns/a" {
			states = append(states, s.State)
		}
	}
	if strings.Join(states, " ") != "ok offline ok" {
		t.Errorf("states %v, want ok offline ok", states)
	}
}

// A device registered by a call while a registration's answer (which does
// not list it yet) is on its way stays.
func TestRegisterDeviceDuringRegistration(t *testing.T) {
	dir := mappertest.ShortTempDir(t)
	agent := mappertest.NewAgent(dir + "/dmi/dmi.sock")
	release := make(chan struct{})
	var once sync.Once
	agent.BeforeRegisterReply = func() { once.Do(func() { <-release }) }
	agent.SetData([]*dmiv1beta1.DeviceModel{model}, nil)
	agent.Serve(t)
	t.Cleanup(agent.Close)
	fake := newFake()
	fake.set("A", "t", int64(100))
	fake.set("A", "s", int64(200))
	m := mappertest.RunMapper(t, mapper.Config{Protocol: "fake", StateDir: dir, NewDriver: fake.newDriver, Logger: testr.New(t),
		DefaultCollectCycle: 20 * time.Millisecond, ReregisterInterval: time.Hour})
	ctx := t.Context()
	client := agent.Mapper(t)
	// The model arrives with the (held) answer; create it directly too.
	if _, err := client.CreateDeviceModel(ctx, &dmiv1beta1.CreateDeviceModelRequest{Model: model}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.RegisterDevice(ctx, &dmiv1beta1.RegisterDeviceRequest{Device: thermo(t, "a", "A")}); err != nil {
		t.Fatal(err)
	}
	close(release)
	<-m.Registered()
	from := agent.ReportCount()
	fake.set("A", "t", int64(110))
	agent.WaitReported(t, "ns/a", "temp", "45", from, wait)
}

// Under KubeEdge's edgecore the mapper is pointed at its DMI socket and
// needs no Dowse state directory.
func TestOwnSocketsWithoutStateDir(t *testing.T) {
	dir := mappertest.ShortTempDir(t)
	agent := mappertest.NewAgent(dir + "/edgecore-dmi.sock")
	agent.SetData([]*dmiv1beta1.DeviceModel{model}, []*dmiv1beta1.Device{thermo(t, "a", "A")})
	agent.Serve(t)
	t.Cleanup(agent.Close)
	fake := newFake()
	fake.set("A", "t", int64(100))
	fake.set("A", "s", int64(200))
	m, err := mapper.New(mapper.Config{Protocol: "fake", Name: "fake-1", DMISocket: dir + "/edgecore-dmi.sock", Socket: dir + "/m.sock",
		NewDriver: fake.newDriver, Logger: testr.New(t), DefaultCollectCycle: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Start(ctx) }()
	info := agent.WaitRegistrations(t, 1, wait)
	if string(info.GetAddress()) != dir+"/m.sock" || info.GetName() != "fake-1" {
		t.Errorf("registration %v", info)
	}
	agent.WaitReported(t, "ns/a", "temp", "40", 0, wait)
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Start = %v", err)
	}
	if _, err := os.Stat(dir + "/m.sock"); !os.IsNotExist(err) {
		t.Errorf("the mapper's socket is left behind: %v", err)
	}
	if _, err := mapper.New(mapper.Config{Protocol: "fake", NewDriver: fake.newDriver}); err == nil {
		t.Errorf("a mapper without a state directory or sockets was accepted")
	}
}

// While the agent is away the mapper keeps reading, and retries its reports
// with backoff rather than in a loop.
func TestAgentAwayNoSpin(t *testing.T) {
	dev := thermo(t, "a", "A", mappertest.Prop{Name: "temp", Visitor: map[string]any{"register": "t"}, ReportCycle: 50 * time.Millisecond})
	dir := mappertest.ShortTempDir(t)
	agent := mappertest.Start(t, dir)
	agent.SetData([]*dmiv1beta1.DeviceModel{model}, []*dmiv1beta1.Device{dev})
	fake := newFake()
	fake.set("A", "t", 7.5)
	metrics := mapper.NewMetrics()
	mappertest.RunMapper(t, mapper.Config{Protocol: "fake", StateDir: dir, NewDriver: fake.newDriver, Logger: testr.New(t), Metrics: metrics,
		DefaultCollectCycle: time.Hour, ReconnectInitial: 50 * time.Millisecond, ReconnectMax: 200 * time.Millisecond, ReregisterInterval: time.Hour})
	_, next := agent.WaitReported(t, "ns/a", "temp", "7.5", 0, wait)
	agent.WaitReported(t, "ns/a", "temp", "7.5", next, wait) // a heartbeat
	agent.Stop()
	time.Sleep(time.Second)
	failed := metrics.Value("dowse_mapper_reports_total", `kind="status",result="error"`)
	t.Logf("%v failed reports in a second without the agent", failed)
	if failed > 20 {
		t.Errorf("%v failed report attempts in a second without the agent: the heartbeat spins", failed)
	}
	from := agent.ReportCount()
	agent.Serve(t)
	agent.WaitReported(t, "ns/a", "temp", "7.5", from, wait)
}

// A peer that accepts connections and drops them at the first read is
// redialled with backoff, not in a loop.
func TestDroppingPeerBackoff(t *testing.T) {
	dev := thermo(t, "a", "A")
	dir := mappertest.ShortTempDir(t)
	agent := mappertest.Start(t, dir)
	agent.SetData([]*dmiv1beta1.DeviceModel{model}, []*dmiv1beta1.Device{dev})
	fake := newFake()
	fake.set("A", "t", int64(100))
	fake.set("A", "s", int64(200))
	fake.drops["A"] = true
	mappertest.RunMapper(t, mapper.Config{Protocol: "fake", StateDir: dir, NewDriver: fake.newDriver, Logger: testr.New(t),
		DefaultCollectCycle: 20 * time.Millisecond, ReconnectInitial: 50 * time.Millisecond, ReconnectMax: 200 * time.Millisecond, ReregisterInterval: time.Hour})
	agent.WaitState(t, "ns/a", "unhealthy", wait)
	time.Sleep(time.Second)
	n := fake.count(fake.connects, "A")
	t.Logf("%d connects in about a second", n)
	if n > 20 {
		t.Errorf("%d connects to a peer that drops every connection: no backoff", n)
	}
	// Once reads work the device is ok again.
	fake.mu.Lock()
	fake.drops["A"] = false
	fake.mu.Unlock()
	agent.WaitState(t, "ns/a", "ok", wait)
}

// A desired value that arrives while the device is reading is written as
// soon as the read in progress ends: before the other collect cycles due
// are read, and before their report goes out.
func TestDesiredWriteDoesNotWaitForTheRound(t *testing.T) {
	dev := thermo(t, "a", "A",
		mappertest.Prop{Name: "temp", Visitor: map[string]any{"register": "t"}, CollectCycle: 30 * time.Millisecond},
		mappertest.Prop{Name: "label", Visitor: map[string]any{"register": "l"}, CollectCycle: 35 * time.Millisecond},
		mappertest.Prop{Name: "setpoint", Visitor: map[string]any{"register": "s"}, CollectCycle: 40 * time.Millisecond})
	// The first round has the three cycles due at once; its first read
	// waits for the test.
	r := startWith(t, dev, func(f *fakeDevices) {
		f.set("A", "t", 20.5)
		f.set("A", "l", "x")
		f.set("A", "s", int64(20))
		f.hold, f.held, f.holdReg = make(chan struct{}), make(chan struct{}), "t"
	})
	select {
	case <-r.fake.held:
	case <-time.After(wait):
		t.Fatal("no read of t")
	}
	if _, err := r.agent.Mapper(t).UpdateDevice(context.Background(), &dmiv1beta1.UpdateDeviceRequest{Device: mappertest.SetDesired(dev, "setpoint", "25")}); err != nil {
		t.Fatal(err)
	}
	// The update is with the device (UpdateDevice hands it over before it
	// returns); let the read end.
	r.fake.mu.Lock()
	hold := r.fake.hold
	r.fake.hold = nil
	r.fake.mu.Unlock()
	hold <- struct{}{}
	r.agent.WaitTwin(t, "ns/a", "setpoint", 0, wait, func(tw *dmiv1beta1.Twin) bool { return tw.GetObservedDesired().GetValue() == "25" })
	r.fake.mu.Lock()
	events := append([]string(nil), r.fake.events...)
	r.fake.mu.Unlock()
	if len(events) < 2 || events[0] != "read t" || events[1] != "write s" {
		t.Errorf("reads and writes: %q, want the write right after the read in progress (read t, write s, ...)", events)
	}
}
