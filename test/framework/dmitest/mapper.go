// Package dmitest is a scripted mapper for tests: it speaks DMI v1beta1 to
// an agent's dmi.sock like any mapper (registers, serves
// DeviceMapperService), records what the agent tells it, applies desired
// values and reports increasing counters on demand.
package dmitest

import (
	"context"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	dmiv1beta1 "github.com/dowse-dev/dowse/proto/dmi/v1beta1"
)

// Mapper is a scripted DMI mapper.
type Mapper struct {
	dmiv1beta1.UnimplementedDeviceMapperServiceServer
	Name, Protocol, Socket, DMISocket string

	srv  *grpc.Server
	conn *grpc.ClientConn
	cli  dmiv1beta1.DeviceManagerServiceClient

	mu        sync.Mutex
	devices   map[string]*dmiv1beta1.Device // by namespace/name
	desired   map[string]map[string]string  // applied desired values per device
	registers int                           // RegisterDevice calls
	updates   []time.Time                   // when each UpdateDevice came
}

// Start serves DeviceMapperService on a socket in stateDir and registers
// with the agent's dmi.sock there (retrying until ctx ends).
func Start(ctx context.Context, stateDir, name, protocol string) (*Mapper, error) {
	m := &Mapper{Name: name, Protocol: protocol, Socket: filepath.Join(stateDir, "scripted-"+name+".sock"), DMISocket: filepath.Join(stateDir, "dmi", "dmi.sock"),
		devices: map[string]*dmiv1beta1.Device{}, desired: map[string]map[string]string{}}
	_ = os.Remove(m.Socket)
	l, err := net.Listen("unix", m.Socket)
	if err != nil {
		return nil, err
	}
	m.srv = grpc.NewServer()
	dmiv1beta1.RegisterDeviceMapperServiceServer(m.srv, m)
	go func() { _ = m.srv.Serve(l) }()
	if m.conn, err = grpc.NewClient("unix://"+m.DMISocket, grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
		m.srv.Stop()
		return nil, err
	}
	m.cli = dmiv1beta1.NewDeviceManagerServiceClient(m.conn)
	return m, m.Register(ctx)
}

// Register registers with the agent, as a mapper does when it starts.
func (m *Mapper) Register(ctx context.Context) error {
	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		resp, err := m.cli.MapperRegister(cctx, &dmiv1beta1.MapperRegisterRequest{WithData: true, Mapper: &dmiv1beta1.MapperInfo{
			Name: m.Name, Protocol: m.Protocol, Address: []byte(m.Socket), State: "ok", ApiVersion: "v1beta1"}})
		cancel()
		if err == nil {
			for _, d := range resp.GetDeviceList() {
				m.take(d)
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("registering mapper %s: %w", m.Name, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Stop stops serving and closes the connection to the agent.
func (m *Mapper) Stop() {
	m.srv.Stop()
	_ = m.conn.Close()
}

func key(ns, name string) string { return ns + "/" + name }

func (m *Mapper) take(d *dmiv1beta1.Device) {
	m.mu.Lock()
	defer m.mu.Unlock()
	k := key(d.GetNamespace(), d.GetName())
	m.devices[k] = d
	des := map[string]string{}
	for _, p := range d.GetSpec().GetProperties() {
		if v := p.GetDesired().GetValue(); v != "" {
			des[p.GetName()] = v
		}
	}
	m.desired[k] = des
}

func (m *Mapper) RegisterDevice(_ context.Context, req *dmiv1beta1.RegisterDeviceRequest) (*dmiv1beta1.RegisterDeviceResponse, error) {
	m.take(req.GetDevice())
	m.mu.Lock()
	m.registers++
	m.mu.Unlock()
	return &dmiv1beta1.RegisterDeviceResponse{DeviceName: req.GetDevice().GetName(), DeviceNamespace: req.GetDevice().GetNamespace()}, nil
}

func (m *Mapper) UpdateDevice(_ context.Context, req *dmiv1beta1.UpdateDeviceRequest) (*dmiv1beta1.UpdateDeviceResponse, error) {
	m.take(req.GetDevice())
	m.mu.Lock()
	m.updates = append(m.updates, time.Now())
	m.mu.Unlock()
	return &dmiv1beta1.UpdateDeviceResponse{}, nil
}

func (m *Mapper) RemoveDevice(_ context.Context, req *dmiv1beta1.RemoveDeviceRequest) (*dmiv1beta1.RemoveDeviceResponse, error) {
	m.mu.Lock()
	delete(m.devices, key(req.GetDeviceNamespace(), req.GetDeviceName()))
	m.mu.Unlock()
	return &dmiv1beta1.RemoveDeviceResponse{}, nil
}

func (m *Mapper) CreateDeviceModel(context.Context, *dmiv1beta1.CreateDeviceModelRequest) (*dmiv1beta1.CreateDeviceModelResponse, error) {
	return &dmiv1beta1.CreateDeviceModelResponse{}, nil
}

func (m *Mapper) UpdateDeviceModel(context.Context, *dmiv1beta1.UpdateDeviceModelRequest) (*dmiv1beta1.UpdateDeviceModelResponse, error) {
	return &dmiv1beta1.UpdateDeviceModelResponse{}, nil
}

func (m *Mapper) RemoveDeviceModel(context.Context, *dmiv1beta1.RemoveDeviceModelRequest) (*dmiv1beta1.RemoveDeviceModelResponse, error) {
	return &dmiv1beta1.RemoveDeviceModelResponse{}, nil
}

// Has reports whether the agent has handed it the device.
func (m *Mapper) Has(ns, name string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.devices[key(ns, name)]
	return ok
}

// Desired is the desired value the mapper holds for a property ("" none).
func (m *Mapper) Desired(ns, name, prop string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.desired[key(ns, name)][prop]
}

// Registers counts RegisterDevice calls; Updates lists when UpdateDevice
// calls came.
func (m *Mapper) Registers() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.registers
}

func (m *Mapper) Updates() []time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]time.Time(nil), m.updates...)
}

// Report sends one ReportDeviceStatus with values (property → text) and,
// for properties with a desired value, that value as observed desired.
func (m *Mapper) Report(ctx context.Context, ns, name string, values map[string]string) error {
	m.mu.Lock()
	des := maps.Clone(m.desired[key(ns, name)])
	m.mu.Unlock()
	ts := strconv.FormatInt(time.Now().UnixMilli(), 10)
	st := &dmiv1beta1.DeviceStatus{}
	for prop, v := range values {
		tw := &dmiv1beta1.Twin{PropertyName: prop, Reported: &dmiv1beta1.TwinProperty{Value: v, Metadata: map[string]string{"timestamp": ts, "type": "integer"}}}
		if d, ok := des[prop]; ok {
			tw.ObservedDesired = &dmiv1beta1.TwinProperty{Value: d, Metadata: map[string]string{"timestamp": ts}}
		}
		st.Twins = append(st.Twins, tw)
	}
	_, err := m.cli.ReportDeviceStatus(ctx, &dmiv1beta1.ReportDeviceStatusRequest{DeviceName: name, DeviceNamespace: ns, ReportedDevice: st})
	return err
}

// ReportState sends one ReportDeviceStates.
func (m *Mapper) ReportState(ctx context.Context, ns, name, state string) error {
	_, err := m.cli.ReportDeviceStates(ctx, &dmiv1beta1.ReportDeviceStatesRequest{DeviceName: name, DeviceNamespace: ns, State: state})
	return err
}
