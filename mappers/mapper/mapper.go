package mapper

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/dowse-dev/dowse/internal/nodepaths"
	dmiv1beta1 "github.com/dowse-dev/dowse/proto/dmi/v1beta1"
	mapperv1 "github.com/dowse-dev/dowse/proto/mapper/v1"
)

const (
	// DMISocketName is the device manager's DMI socket in the state
	// directory.
	DMISocketName = nodepaths.DMISocket
	// APIVersion is the DMI version mappers register with.
	APIVersion = "v1beta1"

	maxSocketPath = 107
	dmiBufferSize = 8 << 10
	// agentCallers is the number of goroutines that make the devices'
	// calls to the device manager.
	agentCallers = 4
)

// Config is what a Mapper needs. Protocol, NewDriver and StateDir (or both
// DMISocket and Socket) are required; every other zero value is a default.
type Config struct {
	// Protocol is the protocol the mapper serves ("modbus"); the device
	// manager hands it the Devices of that protocol.
	Protocol string
	// Name is the registration name (MapperInfo.name); default Protocol. A
	// Device whose spec.mapperName names it goes to this mapper.
	Name string
	// Version is reported in MapperInfo.version.
	Version string
	// StateDir is the agent's state directory.
	StateDir string
	// DMISocket is the device manager's socket; default
	// <StateDir>/dmi/dmi.sock (the dmi/ folder is all of the node a
	// mapper's container needs to mount). Point it at edgecore's
	// (/etc/kubeedge/dmi.sock) to run under KubeEdge.
	DMISocket string
	// Socket is where the mapper serves DeviceMapperService; default
	// <StateDir>/dmi/mapper-<Name>-<pid>.sock.
	Socket string
	// NewDriver makes a device's Driver.
	NewDriver NewDriver
	Logger    logr.Logger
	// Metrics may be nil.
	Metrics *Metrics

	// DefaultCollectCycle applies to properties without a collectCycle:
	// default 1s (KubeEdge's).
	DefaultCollectCycle time.Duration
	// DefaultReportCycle is the heartbeat of properties without a
	// reportCycle: an unchanged value is reported again after this long.
	// Default 1m.
	DefaultReportCycle time.Duration
	// UnhealthyAfter is the number of read rounds in a row in which every
	// read failed after which a device is unhealthy and reconnected.
	// Default 3.
	UnhealthyAfter int
	// ReconnectInitial and ReconnectMax bound the backoff between connection
	// attempts to a device, and between registration attempts. Defaults
	// 200ms and 30s.
	ReconnectInitial, ReconnectMax time.Duration
	// AuthRetryInitial and AuthRetryMax bound the backoff after a device
	// refused the credentials (ErrAuthFailed): attempts at the reconnect
	// pace would lock the account out. Defaults 30s and 15m.
	AuthRetryInitial, AuthRetryMax time.Duration
	// CredentialPoll is how often the credential files of a device that
	// refused them are checked for a change, which retries at once.
	// Default 1s.
	CredentialPoll time.Duration
	// ReregisterInterval is how often the mapper registers again (with
	// data, reconciling its devices) even when the connection looked
	// fine; it also registers again whenever the connection to the device
	// manager comes back. Default 1m.
	ReregisterInterval time.Duration
	// CallTimeout bounds each call to the device manager and each device
	// exchange the driver does not bound itself. Default 5s.
	CallTimeout time.Duration

	// SinkBufferMessages and SinkBufferBytes bound each sink's buffer of
	// readings not yet delivered (pushMethod): beyond either the oldest are
	// dropped (dowse_mapper_sink_dropped_total). Defaults 10000 and 2 MiB.
	SinkBufferMessages int
	SinkBufferBytes    int64
	// OnSinks, when set, is called with true when the first sink starts
	// and false when the last one stops (Main raises the runtime's memory
	// limit meanwhile: pushing readings makes garbage at their rate).
	OnSinks func(running bool)
	// SinkSecretsDir is where the mapper's Pod mounts the Secrets
	// pushMethods name (<dir>/<secret>/username, password, ca.crt).
	// Default DefaultSinkSecretsDir.
	SinkSecretsDir string
}

func (c *Config) validateAndDefault() error {
	var errs []error
	if c.Protocol == "" {
		errs = append(errs, errors.New("protocol is required"))
	}
	if c.NewDriver == nil {
		errs = append(errs, errors.New("a driver constructor is required"))
	}
	if c.StateDir == "" && (c.DMISocket == "" || c.Socket == "") {
		errs = append(errs, errors.New("state directory is required (or both the DMI socket and the mapper socket)"))
	}
	if c.DefaultCollectCycle < 0 || c.DefaultReportCycle < 0 || c.UnhealthyAfter < 0 || c.ReconnectInitial < 0 ||
		c.ReconnectMax < 0 || c.ReregisterInterval < 0 || c.CallTimeout < 0 || c.AuthRetryInitial < 0 || c.AuthRetryMax < 0 || c.CredentialPoll < 0 ||
		c.SinkBufferMessages < 0 || c.SinkBufferBytes < 0 {
		errs = append(errs, errors.New("durations and counts must not be negative"))
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if c.Name == "" {
		c.Name = c.Protocol
	}
	if c.Version == "" {
		c.Version = Version()
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.DefaultCollectCycle, time.Second)
	def(&c.DefaultReportCycle, time.Minute)
	def(&c.ReconnectInitial, 200*time.Millisecond)
	def(&c.ReconnectMax, 30*time.Second)
	def(&c.AuthRetryInitial, 30*time.Second)
	def(&c.AuthRetryMax, 15*time.Minute)
	def(&c.CredentialPoll, time.Second)
	if c.AuthRetryMax < c.AuthRetryInitial {
		c.AuthRetryMax = c.AuthRetryInitial
	}
	def(&c.ReregisterInterval, time.Minute)
	def(&c.CallTimeout, 5*time.Second)
	if c.SinkBufferMessages == 0 {
		c.SinkBufferMessages = 10000
	}
	if c.SinkBufferBytes == 0 {
		c.SinkBufferBytes = 2 << 20
	}
	if c.SinkSecretsDir == "" {
		c.SinkSecretsDir = DefaultSinkSecretsDir
	}
	if c.ReconnectMax < c.ReconnectInitial {
		c.ReconnectMax = c.ReconnectInitial
	}
	if c.UnhealthyAfter == 0 {
		c.UnhealthyAfter = 3
	}
	if c.StateDir != "" {
		dir, err := filepath.Abs(c.StateDir)
		if err != nil {
			return err
		}
		c.StateDir = dir
	}
	if c.DMISocket == "" {
		c.DMISocket = filepath.Join(nodepaths.DMIDir(c.StateDir), DMISocketName)
	}
	if c.Socket == "" {
		c.Socket = filepath.Join(nodepaths.DMIDir(c.StateDir), "mapper-"+c.Name+"-"+strconv.Itoa(os.Getpid())+".sock")
	}
	for _, p := range []string{c.DMISocket, c.Socket} {
		if len(p) > maxSocketPath {
			return fmt.Errorf("socket path %q is %d bytes, longer than the %d a Unix socket allows: use a shorter state directory", p, len(p), maxSocketPath)
		}
	}
	return nil
}

// Mapper serves one protocol's devices for a device manager (the Dowse
// agent, or KubeEdge's edgecore) over DMI v1beta1: it registers on the
// manager's socket and takes the devices it answers with, serves
// DeviceMapperService on a socket of its own for later changes, runs one
// goroutine (and one connection) per device, and reports readings and
// states over one long-lived connection.
type Mapper struct {
	dmiv1beta1.UnimplementedDeviceMapperServiceServer

	cfg   Config
	log   logr.Logger
	conn  *grpc.ClientConn
	agent dmiv1beta1.DeviceManagerServiceClient
	// conditions is Dowse's DeviceConditions on the same socket;
	// noConditions once the device manager said it has none.
	conditions   mapperv1.DeviceConditionsClient
	noConditions atomic.Bool

	runCtx context.Context
	wg     sync.WaitGroup
	// calls takes the devices' reports to the agentCallers goroutines.
	calls chan func()
	// twins are the report twins not in a report (device_report.go).
	twins sync.Pool

	mu         sync.Mutex
	models     map[string]*dmiv1beta1.DeviceModel
	devices    map[string]*device
	registered chan struct{} // closed after the first successful registration
	stopped    bool
	// seq counts device changes; a device changed by a call after a
	// registration began is newer than that registration's answer.
	seq uint64

	sinks *sinkSet
}

// New validates cfg and returns a Mapper; Start runs it.
func New(cfg Config) (*Mapper, error) {
	if err := cfg.validateAndDefault(); err != nil {
		return nil, fmt.Errorf("mapper config: %w", err)
	}
	m := &Mapper{
		cfg:        cfg,
		log:        cfg.Logger.WithValues("mapper", cfg.Name),
		models:     map[string]*dmiv1beta1.DeviceModel{},
		devices:    map[string]*device{},
		registered: make(chan struct{}),
	}
	m.sinks = &sinkSet{m: m, by: map[string]*sink{}}
	return m, nil
}

// Socket is the path of the mapper's DeviceMapperService socket.
func (m *Mapper) Socket() string { return m.cfg.Socket }

// Registered is closed once the first registration succeeded.
func (m *Mapper) Registered() <-chan struct{} { return m.registered }

// Start runs the mapper until ctx ends: it returns nil then, after closing
// every device's connection and removing its socket. It returns an error
// only when it cannot serve at all (its socket cannot be made). The device
// manager may be absent: the mapper keeps trying to register with backoff,
// and registers again each time the manager comes back.
func (m *Mapper) Start(ctx context.Context) error {
	lis, err := listenUnix(m.cfg.Socket)
	if err != nil {
		return err
	}
	defer os.Remove(m.cfg.Socket)
	// Small transport buffers (gRPC gives the write buffer back between
	// writes): DMI messages are a few hundred bytes, and 32 KiB defaults per
	// direction per connection are a mapper's memory on an edge node.
	srv := grpc.NewServer(grpc.ReadBufferSize(dmiBufferSize), grpc.WriteBufferSize(dmiBufferSize))
	dmiv1beta1.RegisterDeviceMapperServiceServer(srv, m)

	conn, err := grpc.NewClient("unix://"+m.cfg.DMISocket,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithReadBufferSize(dmiBufferSize), grpc.WithWriteBufferSize(dmiBufferSize),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: m.cfg.ReconnectInitial, Multiplier: 1.6, Jitter: 0.2, MaxDelay: min(m.cfg.ReconnectMax, 5*time.Second)},
			MinConnectTimeout: m.cfg.CallTimeout,
		}))
	if err != nil {
		lis.Close()
		return fmt.Errorf("dmi client for %s: %w", m.cfg.DMISocket, err)
	}
	defer conn.Close()
	m.conn = conn
	m.agent = dmiv1beta1.NewDeviceManagerServiceClient(conn)
	m.conditions = mapperv1.NewDeviceConditionsClient(conn)

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	m.runCtx = runCtx
	m.calls = make(chan func())
	quitCalls := make(chan struct{})
	var callers sync.WaitGroup
	for range agentCallers {
		callers.Go(func() {
			for {
				select {
				case f := <-m.calls:
					f()
				case <-quitCalls:
					return
				}
			}
		})
	}
	m.log.Info("mapper serving", "protocol", m.cfg.Protocol, "socket", m.cfg.Socket, "dmiSocket", m.cfg.DMISocket, "version", m.cfg.Version)

	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(lis) }()
	var loops sync.WaitGroup
	kick := make(chan struct{}, 1)
	loops.Go(func() { m.watchConn(runCtx, kick) })
	loops.Go(func() { m.registerLoop(runCtx, kick) })

	var result error
	select {
	case <-ctx.Done():
	case err := <-serveErr:
		result = fmt.Errorf("serving %s: %w", m.cfg.Socket, err)
	}
	cancel()
	stopped := make(chan struct{})
	go func() { srv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(m.cfg.CallTimeout):
		srv.Stop()
	}
	loops.Wait()
	m.mu.Lock()
	m.stopped = true
	for _, d := range m.devices {
		d.stop()
	}
	m.mu.Unlock()
	m.wg.Wait()
	m.sinks.stop()   // no device is left to push
	close(quitCalls) // no device is left to call
	callers.Wait()
	m.log.Info("mapper stopped")
	return result
}

// agentCall runs f (a call to the device manager) on one of the mapper's
// caller goroutines and returns its error, or ctx's when ctx ends before a
// caller is free. A device's goroutine then never holds the stack of a gRPC
// call (16 KiB and more once grown, kept until a collection shrinks it):
// with a hundred devices those stacks were a mapper's largest memory after
// its heap. Devices still wait for their own reports, in order.
func (m *Mapper) agentCall(ctx context.Context, f func(context.Context) error) error {
	if m.calls == nil {
		return f(ctx)
	}
	var err error
	done := make(chan struct{})
	select {
	case m.calls <- func() { err = f(ctx); close(done) }:
	case <-ctx.Done():
		return ctx.Err()
	}
	<-done
	return err
}

// listenUnix listens on path, replacing a stale socket file but never one a
// live process answers on.
func listenUnix(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	if _, err := os.Stat(path); err == nil {
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("socket %s is in use by another process", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("removing stale socket %s: %w", path, err)
		}
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", path, err)
	}
	// Only the mapper's (and the agent's) user and group may call it.
	if err := os.Chmod(path, 0o660); err != nil {
		lis.Close()
		return nil, fmt.Errorf("restricting socket %s: %w", path, err)
	}
	return lis, nil
}

// watchConn keeps the connection to the device manager up and kicks a
// registration each time it becomes ready again after a loss (the manager
// restarted and may have forgotten the mapper).
func (m *Mapper) watchConn(ctx context.Context, kick chan<- struct{}) {
	wasReady, lost := false, false
	for {
		s := m.conn.GetState()
		switch s {
		case connectivity.Ready:
			if wasReady && lost {
				m.log.Info("device manager connection is back; registering again")
				select {
				case kick <- struct{}{}:
				default:
				}
			}
			wasReady, lost = true, false
		case connectivity.Idle:
			if wasReady {
				lost = true
			}
			m.conn.Connect()
		case connectivity.TransientFailure, connectivity.Connecting:
			if wasReady {
				lost = true
			}
		}
		if !m.conn.WaitForStateChange(ctx, s) {
			return
		}
	}
}

func (m *Mapper) registerLoop(ctx context.Context, kick <-chan struct{}) {
	delay := m.cfg.ReconnectInitial
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-kick:
		case <-timer.C:
		}
		if err := m.register(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			m.log.Info("registration with the device manager failed; retrying", "socket", m.cfg.DMISocket, "in", delay, "err", err)
			resetTimer(timer, delay)
			delay = min(delay*2, m.cfg.ReconnectMax)
			continue
		}
		delay = m.cfg.ReconnectInitial
		resetTimer(timer, m.cfg.ReregisterInterval)
	}
}

func resetTimer(t *time.Timer, d time.Duration) {
	t.Stop()
	select {
	case <-t.C:
	default:
	}
	t.Reset(d)
}

// register calls MapperRegister with data and reconciles the devices with
// the answer: new ones start, changed ones update, missing ones stop.
func (m *Mapper) register(ctx context.Context) error {
	m.mu.Lock()
	began := m.seq
	m.mu.Unlock()
	callCtx, cancel := context.WithTimeout(ctx, m.cfg.CallTimeout)
	defer cancel()
	resp, err := m.agent.MapperRegister(callCtx, &dmiv1beta1.MapperRegisterRequest{
		WithData: true,
		Mapper: &dmiv1beta1.MapperInfo{
			Name:       m.cfg.Name,
			Version:    m.cfg.Version,
			ApiVersion: APIVersion,
			Protocol:   m.cfg.Protocol,
			Address:    []byte(m.cfg.Socket),
			State:      "ok",
		},
	}, grpc.WaitForReady(true))
	m.cfg.Metrics.register(err)
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stopped {
		return nil
	}
	// Models are merged, never dropped here: one created by a call while the
	// answer was on its way stays (RemoveDeviceModel removes them).
	for _, mod := range resp.GetModelList() {
		m.models[key(mod.GetNamespace(), mod.GetName())] = mod
	}
	seen := map[string]bool{}
	existed := map[string]bool{}
	for k := range m.devices {
		existed[k] = true
	}
	for _, dev := range resp.GetDeviceList() {
		if dev.GetName() == "" {
			continue
		}
		k := key(dev.GetNamespace(), dev.GetName())
		seen[k] = true
		if d := m.devices[k]; d != nil && d.seq > began {
			continue // changed by a call since the registration began
		}
		m.ensureLocked(dev)
	}
	for k, d := range m.devices {
		if !seen[k] && d.seq <= began {
			m.log.Info("device no longer in the device manager's list; removing", "device", k)
			d.stop()
			delete(m.devices, k)
		} else if seen[k] && existed[k] {
			d.resync() // the manager may have restarted and lost what it had
		}
	}
	select {
	case <-m.registered:
	default:
		close(m.registered)
	}
	m.log.Info("registered with the device manager", "devices", len(resp.GetDeviceList()), "models", len(resp.GetModelList()))
	return nil
}

func key(namespace, name string) string { return namespace + "/" + name }

// ensureLocked starts or updates a device; m.mu is held.
func (m *Mapper) ensureLocked(dev *dmiv1beta1.Device) {
	k := key(dev.GetNamespace(), dev.GetName())
	model := m.models[key(dev.GetNamespace(), dev.GetSpec().GetDeviceModelReference())]
	d := m.devices[k]
	if d == nil {
		d = newDevice(m, dev.GetNamespace(), dev.GetName())
		m.devices[k] = d
		m.wg.Go(func() { d.run(m.runCtx) })
	}
	m.seq++
	d.seq = m.seq
	// Kept as it came (no copy): a request's message is the handler's
	// alone once unmarshalled, and the device never changes it.
	d.update(dev, model)
}

func (m *Mapper) deviceRequest(dev *dmiv1beta1.Device) error {
	if dev == nil || dev.GetName() == "" {
		return status.Error(codes.InvalidArgument, "device with a name is required")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stopped || m.runCtx == nil {
		return status.Error(codes.Unavailable, "mapper is stopping")
	}
	m.ensureLocked(dev)
	return nil
}

// RegisterDevice starts serving a device (or updates it when served).
func (m *Mapper) RegisterDevice(_ context.Context, req *dmiv1beta1.RegisterDeviceRequest) (*dmiv1beta1.RegisterDeviceResponse, error) {
	if err := m.deviceRequest(req.GetDevice()); err != nil {
		return nil, err
	}
	return &dmiv1beta1.RegisterDeviceResponse{DeviceName: req.GetDevice().GetName(), DeviceNamespace: req.GetDevice().GetNamespace()}, nil
}

// UpdateDevice applies a changed device: desired values only are written
// on the open connection; a changed protocol configuration reconnects;
// changed properties are prepared again on the open connection.
func (m *Mapper) UpdateDevice(_ context.Context, req *dmiv1beta1.UpdateDeviceRequest) (*dmiv1beta1.UpdateDeviceResponse, error) {
	if err := m.deviceRequest(req.GetDevice()); err != nil {
		return nil, err
	}
	return &dmiv1beta1.UpdateDeviceResponse{}, nil
}

// RemoveDevice stops serving a device and closes its connection. Removing
// an unknown device succeeds.
func (m *Mapper) RemoveDevice(_ context.Context, req *dmiv1beta1.RemoveDeviceRequest) (*dmiv1beta1.RemoveDeviceResponse, error) {
	k := key(req.GetDeviceNamespace(), req.GetDeviceName())
	m.mu.Lock()
	if d := m.devices[k]; d != nil {
		d.stop()
		delete(m.devices, k)
	}
	m.mu.Unlock()
	return &dmiv1beta1.RemoveDeviceResponse{}, nil
}

func (m *Mapper) modelRequest(mod *dmiv1beta1.DeviceModel) error {
	if mod == nil || mod.GetName() == "" {
		return status.Error(codes.InvalidArgument, "model with a name is required")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.models[key(mod.GetNamespace(), mod.GetName())] = proto.CloneOf(mod)
	for _, d := range m.devices {
		d.modelChanged(mod)
	}
	return nil
}

// CreateDeviceModel stores a model; devices waiting for it start.
func (m *Mapper) CreateDeviceModel(_ context.Context, req *dmiv1beta1.CreateDeviceModelRequest) (*dmiv1beta1.CreateDeviceModelResponse, error) {
	if err := m.modelRequest(req.GetModel()); err != nil {
		return nil, err
	}
	return &dmiv1beta1.CreateDeviceModelResponse{DeviceModelName: req.GetModel().GetName(), DeviceModelNamespace: req.GetModel().GetNamespace()}, nil
}

// UpdateDeviceModel stores a model; its devices take the new property
// types and bounds.
func (m *Mapper) UpdateDeviceModel(_ context.Context, req *dmiv1beta1.UpdateDeviceModelRequest) (*dmiv1beta1.UpdateDeviceModelResponse, error) {
	if err := m.modelRequest(req.GetModel()); err != nil {
		return nil, err
	}
	return &dmiv1beta1.UpdateDeviceModelResponse{}, nil
}

// RemoveDeviceModel forgets a model; devices already running keep theirs.
func (m *Mapper) RemoveDeviceModel(_ context.Context, req *dmiv1beta1.RemoveDeviceModelRequest) (*dmiv1beta1.RemoveDeviceModelResponse, error) {
	m.mu.Lock()
	delete(m.models, key(req.GetModelNamespace(), req.GetModelName()))
	m.mu.Unlock()
	return &dmiv1beta1.RemoveDeviceModelResponse{}, nil
}

// GetDevice returns a served device with its last reported twins.
func (m *Mapper) GetDevice(_ context.Context, req *dmiv1beta1.GetDeviceRequest) (*dmiv1beta1.GetDeviceResponse, error) {
	m.mu.Lock()
	d := m.devices[key(req.GetDeviceNamespace(), req.GetDeviceName())]
	m.mu.Unlock()
	if d == nil {
		return nil, status.Errorf(codes.NotFound, "device %s/%s is not served here", req.GetDeviceNamespace(), req.GetDeviceName())
	}
	return &dmiv1beta1.GetDeviceResponse{Device: d.snapshot()}, nil
}
