// Package mappertest is a fake device manager for mapper tests: it serves
// DMI v1beta1 DeviceManagerService on <dir>/dmi.sock in-process, answers
// MapperRegister with the devices and models a test sets, records every
// report, and calls the mapper's DeviceMapperService.
package mappertest

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/dowse-dev/dowse/mappers/mapper"
	dmiv1beta1 "github.com/dowse-dev/dowse/proto/dmi/v1beta1"
	mapperv1 "github.com/dowse-dev/dowse/proto/mapper/v1"
	"github.com/dowse-dev/dowse/shared/twinvalue"
)

// Report is one ReportDeviceStatus as received.
type Report struct {
	At  time.Time
	Req *dmiv1beta1.ReportDeviceStatusRequest
}

// State is one ReportDeviceStates as received.
type State struct {
	At                time.Time
	Namespace, Device string
	State             string
}

// Condition is one ReportDeviceCondition (Dowse's DeviceConditions).
type Condition struct {
	At                      time.Time
	Namespace, Device, Type string
	Status                  bool
	Reason, Message         string
}

// Agent is a fake device manager.
type Agent struct {
	dmiv1beta1.UnimplementedDeviceManagerServiceServer

	Socket string
	// OnReport, when set before Start, is called for every status report
	// as it arrives (benchmarks time with it).
	OnReport func(Report)
	// BeforeRegisterReply, when set before Start, runs after a
	// registration is recorded and before it is answered (tests hold an
	// answer back with it).
	BeforeRegisterReply func()

	mu            sync.Mutex
	cond          *sync.Cond
	srv           *grpc.Server
	models        []*dmiv1beta1.DeviceModel
	devices       []*dmiv1beta1.Device
	registrations []*dmiv1beta1.MapperInfo
	reports       []Report
	states        []State
	conditions    []Condition
	client        *grpc.ClientConn
	clientAddr    string
	refused       []string
}

func (a *Agent) check(req *dmiv1beta1.ReportDeviceStatusRequest) error {
	a.mu.Lock()
	types := map[string]string{}
	for _, d := range a.devices {
		if d.GetName() != req.GetDeviceName() || d.GetNamespace() != req.GetDeviceNamespace() {
			continue
		}
		for _, m := range a.models {
			if m.GetNamespace() == d.GetNamespace() && m.GetName() == d.GetSpec().GetDeviceModelReference() {
				for _, p := range m.GetSpec().GetProperties() {
					types[p.GetName()] = p.GetType()
				}
			}
		}
	}
	a.mu.Unlock()
	if len(req.GetReportedDevice().GetTwins()) == 0 {
		return status.Error(codes.InvalidArgument, "report carries no twins")
	}
	for _, tw := range req.GetReportedDevice().GetTwins() {
		if tw.GetReported() == nil {
			return status.Errorf(codes.InvalidArgument, "property %q: no reported value", tw.GetPropertyName())
		}
		typ, known := types[tw.GetPropertyName()]
		if !known {
			continue
		}
		nt, err := twinvalue.ParseType(typ)
		if err != nil {
			continue
		}
		values := []string{tw.GetReported().GetValue()}
		if od := tw.GetObservedDesired().GetValue(); od != "" {
			values = append(values, od)
		}
		for _, v := range values {
			if nt != twinvalue.String && strings.TrimSpace(v) == "" {
				return status.Errorf(codes.InvalidArgument, "property %q: empty %s value", tw.GetPropertyName(), nt)
			}
			if _, err := twinvalue.Parse(nt, v); err != nil {
				return status.Errorf(codes.InvalidArgument, "property %q: %v", tw.GetPropertyName(), err)
			}
		}
	}
	return nil
}

// Refused returns the reports refused so far, as their errors.
func (a *Agent) Refused() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.refused...)
}

// ShortTempDir makes a temporary directory short enough for Unix socket
// paths, removed when the test ends.
func ShortTempDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "dowse-m")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// Start serves a fake agent on <dir>/dmi/dmi.sock, where a mapper of state
// directory dir looks, until the test ends.
func Start(t testing.TB, dir string) *Agent {
	t.Helper()
	a := NewAgent(filepath.Join(dir, "dmi", mapper.DMISocketName))
	a.Serve(t)
	t.Cleanup(func() {
		a.Close()
		if r := a.Refused(); len(r) > 0 {
			t.Errorf("the fake agent refused %d reports, as Dowse's agent would; the first: %s", len(r), r[0])
		}
	})
	return a
}

// NewAgent makes a fake agent for socket; Listen or Serve starts it, Close
// ends it. Benchmarks use it outside tests.
func NewAgent(socket string) *Agent {
	a := &Agent{Socket: socket}
	a.cond = sync.NewCond(&a.mu)
	return a
}

// Close stops serving and closes the client of the mapper.
func (a *Agent) Close() {
	a.Stop()
	a.mu.Lock()
	if a.client != nil {
		a.client.Close()
		a.client = nil
	}
	a.mu.Unlock()
}

// Serve (re)starts serving on the socket, as a restarted agent would.
func (a *Agent) Serve(t testing.TB) {
	t.Helper()
	if err := a.Listen(); err != nil {
		t.Fatal(err)
	}
}

// Listen is Serve without a test.
func (a *Agent) Listen() error {
	_ = os.Remove(a.Socket)
	if err := os.MkdirAll(filepath.Dir(a.Socket), 0o750); err != nil {
		return err
	}
	lis, err := net.Listen("unix", a.Socket)
	if err != nil {
		return err
	}
	srv := grpc.NewServer()
	dmiv1beta1.RegisterDeviceManagerServiceServer(srv, a)
	mapperv1.RegisterDeviceConditionsServer(srv, conditionsServer{a: a})
	a.mu.Lock()
	a.srv = srv
	a.mu.Unlock()
	go func() { _ = srv.Serve(lis) }()
	return nil
}

// Stop stops serving (the agent "goes away").
func (a *Agent) Stop() {
	a.mu.Lock()
	srv := a.srv
	a.srv = nil
	a.mu.Unlock()
	if srv != nil {
		srv.Stop()
	}
}

// SetData sets what MapperRegister answers with.
func (a *Agent) SetData(models []*dmiv1beta1.DeviceModel, devices []*dmiv1beta1.Device) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.models, a.devices = models, devices
}

func (a *Agent) MapperRegister(_ context.Context, req *dmiv1beta1.MapperRegisterRequest) (*dmiv1beta1.MapperRegisterResponse, error) {
	a.mu.Lock()
	a.registrations = append(a.registrations, proto.Clone(req.GetMapper()).(*dmiv1beta1.MapperInfo))
	a.cond.Broadcast()
	a.mu.Unlock()
	if a.BeforeRegisterReply != nil {
		a.BeforeRegisterReply()
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	resp := &dmiv1beta1.MapperRegisterResponse{}
	if req.GetWithData() {
		for _, m := range a.models {
			resp.ModelList = append(resp.ModelList, proto.Clone(m).(*dmiv1beta1.DeviceModel))
		}
		for _, d := range a.devices {
			resp.DeviceList = append(resp.DeviceList, proto.Clone(d).(*dmiv1beta1.Device))
		}
	}
	return resp, nil
}

// ReportDeviceStatus refuses a report whole, as Dowse's agent does, when a
// twin has no reported value or a value (reported or observed desired)
// that does not parse as the type its model (as set with SetData) gives.
// Refusals are kept (Refused) and fail the test that started the agent.
func (a *Agent) ReportDeviceStatus(_ context.Context, req *dmiv1beta1.ReportDeviceStatusRequest) (*dmiv1beta1.ReportDeviceStatusResponse, error) {
	if err := a.check(req); err != nil {
		a.mu.Lock()
		a.refused = append(a.refused, err.Error())
		a.mu.Unlock()
		return nil, err
	}
	r := Report{At: time.Now(), Req: req}
	if a.OnReport != nil {
		a.OnReport(r)
	}
	a.mu.Lock()
	a.reports = append(a.reports, r)
	a.cond.Broadcast()
	a.mu.Unlock()
	return &dmiv1beta1.ReportDeviceStatusResponse{}, nil
}

func (a *Agent) ReportDeviceStates(_ context.Context, req *dmiv1beta1.ReportDeviceStatesRequest) (*dmiv1beta1.ReportDeviceStatesResponse, error) {
	a.mu.Lock()
	a.states = append(a.states, State{At: time.Now(), Namespace: req.GetDeviceNamespace(), Device: req.GetDeviceName(), State: req.GetState()})
	a.cond.Broadcast()
	a.mu.Unlock()
	return &dmiv1beta1.ReportDeviceStatesResponse{}, nil
}

type conditionsServer struct {
	mapperv1.UnimplementedDeviceConditionsServer
	a *Agent
}

func (c conditionsServer) ReportDeviceCondition(_ context.Context, req *mapperv1.ReportDeviceConditionRequest) (*mapperv1.ReportDeviceConditionResponse, error) {
	a := c.a
	a.mu.Lock()
	a.conditions = append(a.conditions, Condition{At: time.Now(), Namespace: req.GetDeviceNamespace(), Device: req.GetDeviceName(), Type: req.GetType(),
		Status: req.GetStatus(), Reason: req.GetReason(), Message: req.GetMessage()})
	a.cond.Broadcast()
	a.mu.Unlock()
	return &mapperv1.ReportDeviceConditionResponse{}, nil
}

// Conditions are the device conditions reported so far.
func (a *Agent) Conditions() []Condition {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]Condition(nil), a.conditions...)
}

// WaitCondition waits for a condition of device (namespace/name) of type
// typ whose latest report has status, and returns it.
func (a *Agent) WaitCondition(t testing.TB, device, typ string, status bool, timeout time.Duration) Condition {
	t.Helper()
	var got Condition
	a.waitFor(t, timeout, device+" condition "+typ, func() bool {
		for i := len(a.conditions) - 1; i >= 0; i-- {
			c := a.conditions[i]
			if c.Namespace+"/"+c.Device == device && c.Type == typ {
				got = c
				return c.Status == status
			}
		}
		return false
	})
	return got
}

// waitFor waits until cond (called with a.mu held) is true.
func (a *Agent) waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	timer := time.AfterFunc(timeout, func() {
		a.mu.Lock()
		a.cond.Broadcast()
		a.mu.Unlock()
	})
	defer timer.Stop()
	deadline := time.Now().Add(timeout)
	a.mu.Lock()
	defer a.mu.Unlock()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		a.cond.Wait()
	}
}

// WaitRegistrations waits until the mapper registered n times in all and
// returns the last registration.
func (a *Agent) WaitRegistrations(t testing.TB, n int, timeout time.Duration) *dmiv1beta1.MapperInfo {
	t.Helper()
	var info *dmiv1beta1.MapperInfo
	a.waitFor(t, timeout, "a registration", func() bool {
		if len(a.registrations) >= n {
			info = a.registrations[len(a.registrations)-1]
			return true
		}
		return false
	})
	return info
}

// Registrations returns how many registrations arrived.
func (a *Agent) Registrations() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.registrations)
}

// Reports returns the status reports received so far (from index from).
func (a *Agent) Reports(from int) []Report {
	a.mu.Lock()
	defer a.mu.Unlock()
	if from > len(a.reports) {
		from = len(a.reports)
	}
	return append([]Report(nil), a.reports[from:]...)
}

// ReportCount returns how many status reports arrived.
func (a *Agent) ReportCount() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.reports)
}

// States returns the state reports received so far.
func (a *Agent) States() []State {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]State(nil), a.states...)
}

// Twins returns, in order, every twin of property reported for device
// (namespace/name) from report index from.
func (a *Agent) Twins(device, property string, from int) []*dmiv1beta1.Twin {
	var out []*dmiv1beta1.Twin
	for _, r := range a.Reports(from) {
		if r.Req.GetDeviceNamespace()+"/"+r.Req.GetDeviceName() != device {
			continue
		}
		for _, tw := range r.Req.GetReportedDevice().GetTwins() {
			if tw.GetPropertyName() == property {
				out = append(out, tw)
			}
		}
	}
	return out
}

// WaitTwin waits for a twin of property of device (namespace/name), in a
// report at index from or later, for which ok is true, and returns it with
// the index after its report.
func (a *Agent) WaitTwin(t testing.TB, device, property string, from int, timeout time.Duration, ok func(*dmiv1beta1.Twin) bool) (*dmiv1beta1.Twin, int) {
	t.Helper()
	var found *dmiv1beta1.Twin
	next := from
	a.waitFor(t, timeout, "a twin of "+device+" "+property, func() bool {
		for i := next; i < len(a.reports); i++ {
			r := a.reports[i].Req
			if r.GetDeviceNamespace()+"/"+r.GetDeviceName() != device {
				continue
			}
			for _, tw := range r.GetReportedDevice().GetTwins() {
				if tw.GetPropertyName() == property && ok(tw) {
					found, next = tw, i+1
					return true
				}
			}
		}
		return false
	})
	return found, next
}

// WaitReported waits for property's reported value to be value.
func (a *Agent) WaitReported(t testing.TB, device, property, value string, from int, timeout time.Duration) (*dmiv1beta1.Twin, int) {
	t.Helper()
	return a.WaitTwin(t, device, property, from, timeout, func(tw *dmiv1beta1.Twin) bool {
		return tw.GetReported() != nil && tw.GetReported().GetValue() == value && tw.GetReported().GetMetadata()[twinvalue.MetaError] == ""
	})
}

// WaitState waits until the last state reported for device is state.
func (a *Agent) WaitState(t testing.TB, device, state string, timeout time.Duration) {
	t.Helper()
	a.waitFor(t, timeout, "state "+state+" of "+device, func() bool {
		for i := len(a.states) - 1; i >= 0; i-- {
			if a.states[i].Namespace+"/"+a.states[i].Device == device {
				return a.states[i].State == state
			}
		}
		return false
	})
}

// Mapper returns a client of the DeviceMapperService the mapper registered
// last.
func (a *Agent) Mapper(t testing.TB) dmiv1beta1.DeviceMapperServiceClient {
	t.Helper()
	a.WaitRegistrations(t, 1, 15*time.Second)
	c, err := a.MapperClient()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// MapperClient returns a client of the DeviceMapperService the mapper
// registered last (an error before any registration).
func (a *Agent) MapperClient() (dmiv1beta1.DeviceMapperServiceClient, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.registrations) == 0 {
		return nil, errors.New("no mapper registered yet")
	}
	addr := string(a.registrations[len(a.registrations)-1].GetAddress())
	if a.client == nil || a.clientAddr != addr {
		if a.client != nil {
			a.client.Close()
		}
		c, err := grpc.NewClient("unix://"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return nil, err
		}
		a.client, a.clientAddr = c, addr
	}
	return dmiv1beta1.NewDeviceMapperServiceClient(a.client), nil
}

// DeviceTwin returns the mapper's own view of a property (GetDevice), which
// includes properties never read successfully, with their error.
func (a *Agent) DeviceTwin(t testing.TB, namespace, name, property string) *dmiv1beta1.Twin {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := a.Mapper(t).GetDevice(ctx, &dmiv1beta1.GetDeviceRequest{DeviceName: name, DeviceNamespace: namespace})
	if err != nil {
		t.Fatalf("GetDevice %s/%s: %v", namespace, name, err)
	}
	for _, tw := range resp.GetDevice().GetStatus().GetTwins() {
		if tw.GetPropertyName() == property {
			return tw
		}
	}
	return nil
}

// WaitDeviceError waits until GetDevice shows property with a read error
// (metadata "error") and returns it.
func (a *Agent) WaitDeviceError(t testing.TB, namespace, name, property string, timeout time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if tw := a.DeviceTwin(t, namespace, name, property); tw != nil {
			if e := tw.GetReported().GetMetadata()[twinvalue.MetaError]; e != "" {
				return e
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("GetDevice shows no error for %s/%s %s within %v", namespace, name, property, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// RunMapper makes a mapper of cfg and runs it until the test ends; the test
// fails when the mapper cannot be made or its Start returns an error.
func RunMapper(t testing.TB, cfg mapper.Config) *mapper.Mapper {
	t.Helper()
	m, err := mapper.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("mapper Start = %v", err)
		}
	})
	return m
}
