// Package dmi is the node's mapper API: it serves KubeEdge's DMI v1beta1
// DeviceManagerService on <state-dir>/dmi.sock, so that mappers written for
// KubeEdge's edgecore (mapper-framework's grpcclient) plug in unchanged,
// and it calls each registered mapper's DeviceMapperService with the
// Devices and DeviceModels of this node that are the mapper's.
//
// What the cloud assigned to the node comes from the edge store (Edge), so
// a restarted agent serves its mappers while the cloud is unreachable.
//
// Assignment: a Device whose EdgeDevice.mapper names a registered mapper
// (MapperInfo.name) is that mapper's; any other Device goes to a mapper of
// its protocol whose name no Device of the node asks for (the first by
// name when there are several). A Device whose DeviceModel the node does
// not hold waits for it. Assignments follow registrations: a named mapper
// that registers takes its Devices from the generic one (RemoveDevice
// there, RegisterDevice here).
//
// Delivery is level-triggered, one worker per mapper: the worker compares
// what the mapper should hold with what it has accepted and makes the
// calls (models before devices, removals last), each bounded by
// Config.CallTimeout; a failed call is retried with backoff and never
// holds up another mapper. A model change is also sent again as
// UpdateDevice to the model's devices, so that the mapper rebuilds them
// with the new property types. GetDevice is never called (edgecore never
// does, and KubeEdge's template mapper crashes on it).
//
// Callers: a report is taken only from the process that registered the
// mapper serving its Device (peer.go says how processes are told apart);
// others are refused with PermissionDenied naming the Device.
//
// Restarts: MapperRegister(withData) answers with the mapper's Devices and
// models and counts them as delivered; without data they are sent with
// CreateDeviceModel/RegisterDevice. Registered mappers, and the keys of
// what each was sent, are remembered in <state-dir>/dmi-mappers.json; a
// restarted agent sends each of them its Devices again (UpdateDevice,
// falling back to RegisterDevice), since it cannot know what the mapper
// kept, and removes what the node lost meanwhile.
package dmi

// The Server: its configuration, its copy of the node's Devices and models
// (kept by the edge store's changes), and serving the socket.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/reflection"

	"github.com/dowse-dev/dowse/internal/agent/peercred"
	"github.com/dowse-dev/dowse/internal/agent/socketdir"
	"github.com/dowse-dev/dowse/internal/nodepaths"
	dmiv1beta1 "github.com/dowse-dev/dowse/proto/dmi/v1beta1"
	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
	mapperv1 "github.com/dowse-dev/dowse/proto/mapper/v1"
)

// Edge is what the mapper API needs of the edge store and link;
// *edgehub.EdgeHub is one. It works whether or not the link is up: reports
// wait in the store for it. Report and ReportState return once the report
// is stored (it then reaches the cloud however long the link is down).
type Edge interface {
	Devices() ([]*linkv1.EdgeDevice, error)
	Models() ([]*linkv1.EdgeDeviceModel, error)
	// ReportMany stores a request's values in one transaction.
	ReportMany(reports []*linkv1.TwinReportedUpdate) error
	// ReportCondition stores a condition of a Device (the newest of a type
	// replaces an unsent older one).
	ReportCondition(c *linkv1.DeviceCondition) (uint64, error)
	ReportState(device *linkv1.DeviceRef, state, mapper string, at time.Time) (uint64, error)
	// Subscribe tells f of each message from the cloud once the store
	// has applied it; the returned function ends that.
	Subscribe(f func(ctx context.Context, env *linkv1.Envelope)) (unsubscribe func())
}

// Config configures a Server. Zero values take the defaults noted.
type Config struct {
	// StateDir holds dmi-mappers.json and, by default, the socket.
	StateDir string
	// SocketPath is where DeviceManagerService is served
	// (<StateDir>/dmi/dmi.sock), mode 0660, in a folder of its own that
	// mappers' containers mount alone.
	SocketPath string
	// SocketGroup owns the socket and its folder (socketdir.Prepare);
	// socketdir.NoGroup leaves them to the agent's group.
	SocketGroup int
	// Node names this node in messages.
	Node string
	// CallTimeout bounds each call to a mapper (5s).
	CallTimeout time.Duration
	// RetryMin and RetryMax bound the delay before a mapper whose call
	// failed is called again (200ms, 30s).
	RetryMin, RetryMax time.Duration
	// ReportRate and ReportBurst bound the reports (property values and
	// states) accepted per second for the Devices of one mapper (10000/s,
	// burst 20000); beyond them a report is refused with
	// ResourceExhausted, so that a flooding mapper cannot starve the
	// others of the edge store. Negative: no bound.
	ReportRate  float64
	ReportBurst int
	// ForgetAfter drops a mapper that has been unreachable (its socket
	// refuses or its calls time out) this long (10m): it is told nothing
	// more, and its Devices go to another mapper of their protocol if there
	// is one. A mapper that comes back registers again (mapper-framework
	// registers when it starts). Negative: never.
	ForgetAfter time.Duration
	// UnservedInterval is how often Devices no mapper serves are looked
	// for (5s); each is reported once, as state "unknown" without a
	// mapper, which the cloud shows as MapperConnected False.
	UnservedInterval time.Duration
	// Now is the clock (time.Now).
	Now func() time.Time
}

// Server serves the mapper API. Build it with New, run it with Start.
type Server struct {
	dmiv1beta1.UnimplementedDeviceManagerServiceServer

	cfg     Config
	edge    Edge
	metrics *Metrics

	fileMu sync.Mutex

	mu      sync.Mutex
	devices map[string]*linkv1.EdgeDevice
	models  map[string]*linkv1.EdgeDeviceModel
	asked   map[string]bool // see askedLocked; nil when devices changed
	mappers map[string]*mapper
	// registered counts registrations of new names (mapper.since).
	registered uint64
	pending    map[string]time.Time // device -> when its update reached the edge
	limiters   map[string]*rate.Limiter
	unserved   map[string]bool // Devices told to the cloud as served by no mapper
	refused    map[string]*refusals
	condMu     sync.Mutex // orders the condition messages of noteRefusals
	// runCtx is Start's context, under which the workers of mappers that
	// register later run: a registration's call ends long before its
	// mapper's worker does. Nil until Start.
	runCtx context.Context
	log    logr.Logger // Start's
	wg     sync.WaitGroup
	unsub  func()
}

// New builds a Server on edge, follows the edge store's changes from then
// on (edge.Subscribe), and restores the mappers remembered in
// cfg.StateDir. metrics may be nil.
func New(cfg Config, edge Edge, metrics *Metrics) (*Server, error) {
	if cfg.StateDir == "" || edge == nil {
		return nil, errors.New("dmi: state directory and edge are required")
	}
	if cfg.SocketPath == "" {
		cfg.SocketPath = filepath.Join(nodepaths.DMIDir(cfg.StateDir), nodepaths.DMISocket)
	}
	if cfg.CallTimeout <= 0 {
		cfg.CallTimeout = 5 * time.Second
	}
	if cfg.RetryMin <= 0 {
		cfg.RetryMin = 200 * time.Millisecond
	}
	if cfg.RetryMax <= 0 {
		cfg.RetryMax = 30 * time.Second
	}
	if cfg.ReportRate == 0 {
		cfg.ReportRate = 10000
	}
	if cfg.ReportBurst <= 0 {
		cfg.ReportBurst = 20000
	}
	if cfg.ForgetAfter == 0 {
		cfg.ForgetAfter = 10 * time.Minute
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	s := &Server{cfg: cfg, edge: edge, metrics: metrics, mappers: map[string]*mapper{},
		pending: map[string]time.Time{}, limiters: map[string]*rate.Limiter{}, unserved: map[string]bool{}, refused: map[string]*refusals{}}
	// Subscribed before the store is read, under mu: a change applied
	// meanwhile waits for the load and is applied over it (changes are
	// whole objects, so applying one again is harmless).
	s.mu.Lock()
	s.unsub = edge.Subscribe(s.Changed)
	err := s.load()
	s.mu.Unlock()
	if err != nil {
		s.unsub()
		return nil, err
	}
	infos, err := s.readMappers()
	if err != nil {
		s.unsub()
		return nil, err
	}
	for _, sm := range infos {
		info := &dmiv1beta1.MapperInfo{Name: sm.Name, Version: sm.Version, ApiVersion: sm.APIVersion, Protocol: sm.Protocol, Address: []byte(sm.Address)}
		m, err := s.newMapper(info)
		if err != nil {
			s.unsub()
			return nil, err
		}
		m.restored = true
		if sm.Caller != nil {
			m.registrant = *sm.Caller
		}
		// Files before Since was kept list by name: that order, after
		// every recorded one.
		m.since = sm.Since
		if m.since == 0 {
			m.since = 1<<32 + uint64(len(s.mappers))
		}
		s.registered = max(s.registered, m.since)
		for _, k := range sm.Devices {
			m.devices[k] = "" // held, content unknown: sent again
		}
		for _, k := range sm.Models {
			m.models[k] = ""
		}
		s.mappers[info.GetName()] = m
	}
	return s, nil
}

func refKey(r *linkv1.DeviceRef) string { return r.GetNamespace() + "/" + r.GetName() }

// load takes the node's Devices and models from the edge store; Changed
// keeps them afterwards.
func (s *Server) load() error {
	devs, err := s.edge.Devices()
	if err != nil {
		return fmt.Errorf("dmi: devices from the edge store: %w", err)
	}
	models, err := s.edge.Models()
	if err != nil {
		return fmt.Errorf("dmi: models from the edge store: %w", err)
	}
	s.devices = make(map[string]*linkv1.EdgeDevice, len(devs))
	for _, d := range devs {
		s.devices[refKey(d.GetRef())] = d
	}
	s.models = make(map[string]*linkv1.EdgeDeviceModel, len(models))
	for _, m := range models {
		s.models[refKey(m.GetRef())] = m
	}
	return nil
}

// Changed is told (edge.Subscribe) that the edge store took a message
// from the cloud; device and model messages are applied to the server's
// copy of the node's Devices and models as the store applied them, and
// kick the mappers' workers. Safe before Start; it does not block on
// mappers.
func (s *Server) Changed(ctx context.Context, env *linkv1.Envelope) {
	s.mu.Lock()
	switch k := env.GetKind().(type) {
	case *linkv1.Envelope_DeviceUpdate:
		d := k.DeviceUpdate.GetDevice()
		key := refKey(d.GetRef())
		s.devices[key] = d
		delete(s.refused, key) // judged afresh against the new spec
		if _, ok := s.pending[key]; !ok {
			s.pending[key] = s.cfg.Now()
		}
	case *linkv1.Envelope_DeviceRemoval:
		delete(s.devices, refKey(k.DeviceRemoval.GetDevice()))
		delete(s.pending, refKey(k.DeviceRemoval.GetDevice()))
		delete(s.refused, refKey(k.DeviceRemoval.GetDevice()))
	case *linkv1.Envelope_ModelUpdate:
		mk := refKey(k.ModelUpdate.GetModel().GetRef())
		s.models[mk] = k.ModelUpdate.GetModel()
		for key, d := range s.devices {
			if modelKey(d) == mk {
				delete(s.refused, key)
			}
		}
	case *linkv1.Envelope_ModelRemoval:
		delete(s.models, refKey(k.ModelRemoval.GetModel()))
	case *linkv1.Envelope_DeviceInventory:
		keep := map[string]bool{}
		for _, r := range k.DeviceInventory.GetDevices() {
			keep[refKey(r)] = true
		}
		for key := range s.devices {
			if !keep[key] {
				delete(s.devices, key)
				delete(s.pending, key)
				delete(s.refused, key)
			}
		}
		keep = map[string]bool{}
		for _, r := range k.DeviceInventory.GetModels() {
			keep[refKey(r)] = true
		}
		for key := range s.models {
			if !keep[key] {
				delete(s.models, key)
			}
		}
	default:
		s.mu.Unlock()
		return
	}
	s.asked = nil
	for _, m := range s.mappers {
		m.requestSync()
	}
	s.mu.Unlock()
}

// Start serves the mapper API until ctx ends, then stops the workers,
// removes the socket and stops following the edge store. It fails only
// when the socket cannot be served.
func (s *Server) Start(ctx context.Context) error {
	defer s.unsub()
	log := logr.FromContextOrDiscard(ctx).WithName("dmi")
	ctx = logr.NewContext(ctx, log)
	sock := s.cfg.SocketPath
	if err := socketdir.Prepare(filepath.Dir(sock), s.cfg.SocketGroup); err != nil {
		return fmt.Errorf("dmi: %w", err)
	}
	if fi, err := os.Lstat(sock); err == nil && fi.Mode()&os.ModeSocket != 0 {
		_ = os.Remove(sock) // left by an agent that did not stop cleanly
	}
	lis, err := net.Listen("unix", sock)
	if err != nil {
		return fmt.Errorf("dmi: listen on %s: %w", sock, err)
	}
	defer os.Remove(sock)
	if err := socketdir.Socket(sock, s.cfg.SocketGroup); err != nil {
		lis.Close()
		return fmt.Errorf("dmi: %w", err)
	}
	gs := grpc.NewServer(grpc.Creds(peercred.Creds{}))
	dmiv1beta1.RegisterDeviceManagerServiceServer(gs, s)
	mapperv1.RegisterDeviceConditionsServer(gs, conditions{s: s})
	reflection.Register(gs) // as edgecore does: grpcurl -unix <socket> list

	s.mu.Lock()
	s.runCtx, s.log = ctx, log
	for _, m := range s.mappers {
		s.startLocked(ctx, m)
	}
	s.updateConnectedLocked()
	n := len(s.mappers)
	s.mu.Unlock()
	log.Info("serving the mapper API", "socket", sock, "rememberedMappers", n)

	served := make(chan error, 1)
	go func() { served <- gs.Serve(lis) }()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		every := s.cfg.UnservedInterval
		if every <= 0 {
			every = 5 * time.Second
		}
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				s.reportUnserved(ctx)
			}
		}
	}()
	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-served:
	}
	stopped := make(chan struct{})
	go func() { gs.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(2 * time.Second):
		gs.Stop()
		<-stopped
	}
	s.mu.Lock()
	for _, m := range s.mappers {
		m.cancel()
	}
	s.mu.Unlock()
	s.wg.Wait()
	s.mu.Lock()
	for _, m := range s.mappers {
		_ = m.conn.Close()
	}
	s.mu.Unlock()
	if serveErr != nil && !errors.Is(serveErr, grpc.ErrServerStopped) {
		return fmt.Errorf("dmi: %w", serveErr)
	}
	return nil
}

func (s *Server) updateConnectedLocked() {
	n := 0
	for _, m := range s.mappers {
		if m.healthy.Load() {
			n++
		}
	}
	s.metrics.setConnected(n)
}
