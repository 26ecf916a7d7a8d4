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

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/time/rate"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	dmiv1beta1 "github.com/dowse-dev/dowse/proto/dmi/v1beta1"
	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
	mapperv1 "github.com/dowse-dev/dowse/proto/mapper/v1"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/shared/twinvalue"
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
	// (<StateDir>/dmi.sock), mode 0660.
	SocketPath string
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

	mu       sync.Mutex
	devices  map[string]*linkv1.EdgeDevice
	models   map[string]*linkv1.EdgeDeviceModel
	asked    map[string]bool // see askedLocked; nil when devices changed
	mappers  map[string]*mapper
	pending  map[string]time.Time // device -> when its update reached the edge
	limiters map[string]*rate.Limiter
	unserved map[string]bool // Devices told to the cloud as served by no mapper
	refused  map[string]*refusals
	condMu   sync.Mutex // orders the condition messages of noteRefusals
	// runCtx is Start's context, under which the workers of mappers that
	// register later run: a registration's call ends long before its
	// mapper's worker does. Nil until Start.
	runCtx context.Context
	log    logr.Logger // Start's
	wg     sync.WaitGroup
	unsub  func()
}

// refusals are the properties of one Device whose latest report was
// refused (property -> why), and whether the cloud was told since start.
type refusals struct {
	props map[string]string
	told  bool
}

// New builds a Server on edge, follows the edge store's changes from then
// on (edge.Subscribe), and restores the mappers remembered in
// cfg.StateDir. metrics may be nil.
func New(cfg Config, edge Edge, metrics *Metrics) (*Server, error) {
	if cfg.StateDir == "" || edge == nil {
		return nil, errors.New("dmi: state directory and edge are required")
	}
	if cfg.SocketPath == "" {
		cfg.SocketPath = filepath.Join(cfg.StateDir, "dmi.sock")
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
		m.poke()
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
	if err := os.MkdirAll(filepath.Dir(sock), 0o750); err != nil {
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
	if err := os.Chmod(sock, 0o660); err != nil {
		lis.Close()
		return fmt.Errorf("dmi: %w", err)
	}
	gs := grpc.NewServer(grpc.Creds(peerCreds{}))
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

// reportUnserved tells the cloud, once each time it happens, of every
// Device that no mapper on this node serves (no mapper of its name or
// protocol is registered): state "unknown" with no mapper.
func (s *Server) reportUnserved(ctx context.Context) {
	s.mu.Lock()
	asked := s.askedLocked()
	var now []*linkv1.DeviceRef
	for key, d := range s.devices {
		if _, ok := s.ownerLocked(d, asked); ok {
			delete(s.unserved, key)
			continue
		}
		if !s.unserved[key] {
			s.unserved[key] = true
			now = append(now, d.GetRef())
		}
	}
	for key := range s.unserved {
		if s.devices[key] == nil {
			delete(s.unserved, key)
		}
	}
	s.mu.Unlock()
	for _, ref := range now {
		if _, err := s.edge.ReportState(ref, "unknown", "", s.cfg.Now()); err != nil {
			logr.FromContextOrDiscard(ctx).Error(err, "reporting a device no mapper serves", "device", refKey(ref))
			s.mu.Lock()
			delete(s.unserved, refKey(ref))
			s.mu.Unlock()
		}
	}
}

// MapperRegister records the mapper (replacing one of the same name) and,
// withData, answers with its Devices and the models they name.
func (s *Server) MapperRegister(ctx context.Context, req *dmiv1beta1.MapperRegisterRequest) (*dmiv1beta1.MapperRegisterResponse, error) {
	info := req.GetMapper()
	if info.GetProtocol() == "" {
		return nil, status.Errorf(codes.InvalidArgument, "mapper %q registers without a protocol", info.GetName())
	}
	if mapperAddress(info) == "" {
		return nil, status.Errorf(codes.InvalidArgument, "mapper %q registers without an address (its DeviceMapperService socket)", info.GetName())
	}
	if err := checkAddress(mapperAddress(info)); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "mapper %q: %v", info.GetName(), err)
	}
	m, err := s.newMapper(info)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "mapper %q: %v", info.GetName(), err)
	}
	who := callerFrom(ctx)
	m.registrant = who
	resp := &dmiv1beta1.MapperRegisterResponse{}
	s.mu.Lock()
	if s.runCtx == nil {
		s.mu.Unlock()
		_ = m.conn.Close()
		return nil, status.Error(codes.Unavailable, "the mapper API is starting")
	}
	old := s.mappers[info.GetName()]
	s.mappers[info.GetName()] = m
	if req.GetWithData() {
		devs, models := s.assignedLocked(info.GetName())
		sigs := map[string]string{}
		for _, md := range models {
			dm := toDMIModel(md)
			resp.ModelList = append(resp.ModelList, dm)
			sigs[refKey(md.GetRef())] = signature(dm)
			m.set(m.models, refKey(md.GetRef()), sigs[refKey(md.GetRef())])
		}
		now := s.cfg.Now()
		for _, d := range devs {
			dd := toDMIDevice(d)
			resp.DeviceList = append(resp.DeviceList, dd)
			k := refKey(d.GetRef())
			m.set(m.devices, k, signature(dd)+sigs[modelKey(d)])
			if t, ok := s.pending[k]; ok {
				s.metrics.delivered(now.Sub(t))
				delete(s.pending, k)
			}
		}
	}
	for _, o := range s.mappers {
		o.poke() // assignments may have moved
	}
	// A mapper registering again may have been fixed: its Devices' refused
	// properties are judged afresh.
	asked := s.askedLocked()
	for key, d := range s.devices {
		if owner, ok := s.ownerLocked(d, asked); ok && owner == info.GetName() {
			delete(s.refused, key)
		}
	}
	s.startLocked(s.runCtx, m) //nolint:contextcheck // the worker outlives this call: it runs under the server's context
	s.updateConnectedLocked()
	log := s.log
	s.mu.Unlock()
	if old != nil {
		old.cancel()
		<-old.done
		_ = old.conn.Close()
	}
	if err := s.writeMappers(); err != nil {
		log.Error(err, "cannot remember the mapper; it is told again only when it registers again", "mapper", info.GetName())
	}
	log.Info("mapper registered", "mapper", info.GetName(), "protocol", info.GetProtocol(), "address", mapperAddress(info),
		"withData", req.GetWithData(), "devices", len(resp.DeviceList), "again", old != nil, "caller", who.String())
	if !who.distinct() {
		log.Info("this mapper is known by its uid alone (another pid namespace, and a kernel without pidfs): mappers of the same uid can report for each other's devices; give each mapper its own uid or run the agent with hostPID",
			"mapper", info.GetName(), "uid", who.UID)
	}
	return resp, nil
}

// ReportDeviceStatus takes property values a mapper read. A device not
// assigned to this node, or another process's mapper's, refuses the whole
// request. Otherwise each twin stands alone: one whose property the model
// lacks, or whose reported (or observed desired) value does not parse as
// the property's type, is refused and counted, the others are stored, and
// the answer is InvalidArgument naming each refused twin (a BadRequest
// detail per twin) and saying how many were taken. mapper-framework logs
// such an answer and goes on, as with edgecore's. The Device's
// ReportsAccepted condition names the properties refused.
func (s *Server) ReportDeviceStatus(ctx context.Context, req *dmiv1beta1.ReportDeviceStatusRequest) (*dmiv1beta1.ReportDeviceStatusResponse, error) {
	twins := req.GetReportedDevice().GetTwins()
	s.metrics.receive("twin", max(len(twins), 1))
	d, model, owner, err := s.lookup(req.GetDeviceNamespace(), req.GetDeviceName())
	if err != nil {
		s.metrics.refuse("twin", reasonUnknownDevice, max(len(twins), 1))
		return nil, err
	}
	if err := s.mayReport(ctx, d, owner); err != nil {
		s.metrics.refuse("twin", reasonNotYours, max(len(twins), 1))
		return nil, err
	}
	if len(twins) == 0 {
		s.metrics.refuse("twin", reasonEmpty, 1)
		return nil, status.Errorf(codes.InvalidArgument, "report for device %s carries no twins", refKey(d.GetRef()))
	}
	type item struct {
		prop  string
		v, od *linkv1.TwinValue
		at    time.Time
	}
	items := make([]item, 0, len(twins))
	refused := map[string]string{} // property -> why
	var violations []*errdetails.BadRequest_FieldViolation
	refuse := func(i int, prop, reason, why string) {
		s.metrics.refuse("twin", reason, 1)
		refused[prop] = why
		violations = append(violations, &errdetails.BadRequest_FieldViolation{Field: fmt.Sprintf("reportedDevice.twins[%d]", i), Description: fmt.Sprintf("property %q: %s", prop, why)})
	}
	for i, t := range twins {
		prop := t.GetPropertyName()
		p := modelProperty(model, prop)
		if p == nil {
			refuse(i, prop, reasonUnknownProperty, fmt.Sprintf("model %s has no such property", refKey(model.GetRef())))
			continue
		}
		if t.GetReported() == nil {
			refuse(i, prop, reasonEmpty, "no reported value")
			continue
		}
		v, err := twinvalue.Canonical(twinvalue.Type(p.GetType()), t.GetReported().GetValue())
		if err != nil {
			refuse(i, prop, reasonBadValue, fmt.Sprintf("reported value %v", err))
			continue
		}
		var od *linkv1.TwinValue
		if ov := t.GetObservedDesired().GetValue(); ov != "" {
			odv, err := twinvalue.Canonical(twinvalue.Type(p.GetType()), ov)
			if err != nil {
				refuse(i, prop, reasonBadValue, fmt.Sprintf("observed desired value %v", err))
				continue
			}
			od = &linkv1.TwinValue{Value: odv}
		}
		items = append(items, item{prop: prop, v: &linkv1.TwinValue{Value: v, Metadata: t.GetReported().GetMetadata()}, od: od,
			at: s.reportTime(t.GetReported().GetMetadata())})
	}
	if len(items) > 0 {
		if !s.allow(owner, len(items)) {
			s.metrics.refuse("twin", reasonRateLimited, len(items))
			return nil, status.Errorf(codes.ResourceExhausted, "reports for the devices of mapper %q exceed %g a second", owner, s.cfg.ReportRate)
		}
		reports := make([]*linkv1.TwinReportedUpdate, len(items))
		for i, it := range items {
			reports[i] = &linkv1.TwinReportedUpdate{Device: d.GetRef(), Property: it.prop, Reported: it.v, Time: timestamppb.New(it.at),
				ObservedDesired: it.od}
		}
		if err := s.edge.ReportMany(reports); err != nil {
			s.metrics.refuse("twin", reasonStore, len(items))
			return nil, status.Errorf(codes.Unavailable, "edge store: %v", err)
		}
	}
	taken := make([]string, len(items))
	for i, it := range items {
		taken[i] = it.prop
	}
	s.noteRefusals(ctx, d, owner, taken, refused)
	if len(violations) == 0 {
		return &dmiv1beta1.ReportDeviceStatusResponse{}, nil
	}
	// One answer for the whole call (DMI's response carries nothing):
	// InvalidArgument, which no mapper retries, saying what was taken, with
	// a BadRequest detail per refused twin.
	descs := make([]string, len(violations))
	for i, v := range violations {
		descs[i] = v.Description
	}
	st := status.Newf(codes.InvalidArgument, "report for device %s: %d of %d twins refused (%s); the other %d taken",
		refKey(d.GetRef()), len(violations), len(twins), strings.Join(descs, "; "), len(items))
	if wd, err := st.WithDetails(&errdetails.BadRequest{FieldViolations: violations}); err == nil {
		st = wd
	}
	return nil, st.Err()
}

// noteRefusals keeps, per Device, the properties whose latest report was
// refused, and tells the cloud (the Device's ReportsAccepted condition)
// when that set changes, and at the first report after the agent starts or
// after the Device, its model or its mapper's registration changed (each
// forgets what was refused: a fix is judged by the next reports).
func (s *Server) noteRefusals(ctx context.Context, d *linkv1.EdgeDevice, mapperName string, taken []string, refused map[string]string) {
	key := refKey(d.GetRef())
	s.condMu.Lock()
	defer s.condMu.Unlock()
	s.mu.Lock()
	rs := s.refused[key]
	if rs == nil {
		rs = &refusals{props: map[string]string{}}
		s.refused[key] = rs
	}
	changed := !rs.told
	for _, p := range taken {
		if _, ok := rs.props[p]; ok {
			delete(rs.props, p)
			changed = true
		}
	}
	for p, why := range refused {
		if rs.props[p] != why {
			rs.props[p] = why
			changed = true
		}
	}
	if !changed {
		s.mu.Unlock()
		return
	}
	c := &linkv1.DeviceCondition{Device: d.GetRef(), Type: v1alpha1.ConditionReportsAccepted, Status: len(rs.props) == 0,
		Reason: "Accepted", Message: "the latest report of every property was taken", Time: timestamppb.New(s.cfg.Now()), Mapper: mapperName}
	if len(rs.props) > 0 {
		props := slices.Sorted(maps.Keys(rs.props))
		msgs := make([]string, len(props))
		for i, p := range props {
			msgs[i] = fmt.Sprintf("property %q: %s", p, rs.props[p])
		}
		c.Reason, c.Message = "TwinRefused", "refused by node "+s.cfg.Node+": "+strings.Join(msgs, "; ")
	}
	rs.told = true
	s.mu.Unlock()
	if _, err := s.edge.ReportCondition(c); err != nil {
		logr.FromContextOrDiscard(ctx).Error(err, "cannot store the device's ReportsAccepted condition; it is sent with the next change", "device", key)
		s.mu.Lock()
		rs.told = false
		s.mu.Unlock()
	}
}

// ReportDeviceStates takes a device's state (one of twinvalue.States).
func (s *Server) ReportDeviceStates(ctx context.Context, req *dmiv1beta1.ReportDeviceStatesRequest) (*dmiv1beta1.ReportDeviceStatesResponse, error) {
	s.metrics.receive("state", 1)
	d, _, owner, err := s.lookup(req.GetDeviceNamespace(), req.GetDeviceName())
	if err != nil {
		s.metrics.refuse("state", reasonUnknownDevice, 1)
		return nil, err
	}
	if err := s.mayReport(ctx, d, owner); err != nil {
		s.metrics.refuse("state", reasonNotYours, 1)
		return nil, err
	}
	st, err := twinvalue.ParseState(req.GetState())
	if err != nil {
		s.metrics.refuse("state", reasonBadState, 1)
		return nil, status.Errorf(codes.InvalidArgument, "device %s: %v", refKey(d.GetRef()), err)
	}
	if !s.allow(owner, 1) {
		s.metrics.refuse("state", reasonRateLimited, 1)
		return nil, status.Errorf(codes.ResourceExhausted, "reports for the devices of mapper %q exceed %g a second", owner, s.cfg.ReportRate)
	}
	if _, err := s.edge.ReportState(d.GetRef(), st, owner, s.cfg.Now()); err != nil {
		s.metrics.refuse("state", reasonStore, 1)
		return nil, status.Errorf(codes.Unavailable, "edge store: %v", err)
	}
	return &dmiv1beta1.ReportDeviceStatesResponse{}, nil
}

// lookup finds a reported device, its model and the mapper it is assigned
// to. An empty namespace (older mappers) matches a device of that name
// when the node has exactly one.
func (s *Server) lookup(ns, name string) (*linkv1.EdgeDevice, *linkv1.EdgeDeviceModel, string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	d := s.devices[ns+"/"+name]
	if d == nil && ns == "" {
		for _, c := range s.devices {
			if c.GetRef().GetName() == name {
				if d != nil {
					return nil, nil, "", status.Errorf(codes.InvalidArgument, "device %q: no namespace given and several devices of node %s have that name", name, s.cfg.Node)
				}
				d = c
			}
		}
	}
	if d == nil {
		return nil, nil, "", status.Errorf(codes.InvalidArgument, "device %s/%s is not assigned to node %s", ns, name, s.cfg.Node)
	}
	model := s.models[modelKey(d)]
	if model == nil {
		return nil, nil, "", status.Errorf(codes.InvalidArgument, "device %s: its model %s is not on node %s yet", refKey(d.GetRef()), modelKey(d), s.cfg.Node)
	}
	owner, _ := s.ownerLocked(d, s.askedLocked())
	return d, model, owner, nil
}

// mayReport refuses, with PermissionDenied naming the Device, a report by
// a process that did not register the mapper serving d (owner, "" when
// none does).
func (s *Server) mayReport(ctx context.Context, d *linkv1.EdgeDevice, owner string) error {
	who := callerFrom(ctx)
	if !who.Known {
		return nil
	}
	s.mu.Lock()
	m := s.mappers[owner]
	s.mu.Unlock()
	key := refKey(d.GetRef())
	if m == nil {
		return status.Errorf(codes.PermissionDenied, "device %s: no mapper registered on node %s serves it; a mapper reports for its Devices after MapperRegister", key, s.cfg.Node)
	}
	ok, adopted, err := m.speaksFor(ctx, who)
	if adopted {
		if werr := s.writeMappers(); werr != nil {
			logr.FromContextOrDiscard(ctx).Error(werr, "cannot remember the mapper's process", "mapper", owner)
		}
	}
	if err != nil {
		return status.Errorf(codes.PermissionDenied, "device %s is served by mapper %q, which cannot be checked to be %s: %v", key, owner, who, err)
	}
	if !ok {
		return status.Errorf(codes.PermissionDenied, "device %s is served by mapper %q, which another process registered; %s reports only for the Devices of mappers it registered", key, owner, who)
	}
	return nil
}

func (s *Server) allow(owner string, n int) bool {
	if s.cfg.ReportRate < 0 {
		return true
	}
	s.mu.Lock()
	l := s.limiters[owner]
	if l == nil {
		l = rate.NewLimiter(rate.Limit(s.cfg.ReportRate), s.cfg.ReportBurst)
		s.limiters[owner] = l
	}
	s.mu.Unlock()
	return l.AllowN(s.cfg.Now(), n)
}

// reportTime is the metadata "timestamp" (Unix milliseconds, as
// mapper-framework writes it) or, without one, now.
func (s *Server) reportTime(md map[string]string) time.Time {
	if at, ok := twinvalue.TimestampOf(md); ok {
		return at
	}
	return s.cfg.Now()
}

func modelKey(d *linkv1.EdgeDevice) string { return d.GetRef().GetNamespace() + "/" + d.GetModel() }

func modelProperty(m *linkv1.EdgeDeviceModel, name string) *linkv1.EdgeModelProperty {
	for _, p := range m.GetProperties() {
		if p.GetName() == name {
			return p
		}
	}
	return nil
}

func protocolOf(d *linkv1.EdgeDevice, models map[string]*linkv1.EdgeDeviceModel) string {
	if p := d.GetProtocolName(); p != "" {
		return p
	}
	return models[modelKey(d)].GetProtocol()
}

// askedLocked is the set of mapper names the node's Devices ask for
// (kept with the Devices: reports ask for it each time).
func (s *Server) askedLocked() map[string]bool {
	if s.asked == nil {
		s.asked = map[string]bool{}
		for _, d := range s.devices {
			if d.GetMapper() != "" {
				s.asked[d.GetMapper()] = true
			}
		}
	}
	return s.asked
}

// ownerLocked is the mapper d is assigned to; false when none serves it.
func (s *Server) ownerLocked(d *linkv1.EdgeDevice, asked map[string]bool) (string, bool) {
	if n := d.GetMapper(); n != "" {
		if _, ok := s.mappers[n]; ok {
			return n, true
		}
	}
	proto := protocolOf(d, s.models)
	best, found := "", false
	for name, m := range s.mappers {
		if m.info.GetProtocol() != proto || asked[name] {
			continue
		}
		if !found || name < best {
			best, found = name, true
		}
	}
	return best, found
}

// assignedLocked is what mapper name should hold: its Devices whose model
// the node has, and those models, in name order.
func (s *Server) assignedLocked(name string) ([]*linkv1.EdgeDevice, []*linkv1.EdgeDeviceModel) {
	asked := s.askedLocked()
	var devs []*linkv1.EdgeDevice
	seen := map[string]bool{}
	var models []*linkv1.EdgeDeviceModel
	for _, d := range s.devices {
		if owner, ok := s.ownerLocked(d, asked); !ok || owner != name {
			continue
		}
		m := s.models[modelKey(d)]
		if m == nil {
			continue
		}
		devs = append(devs, d)
		if !seen[modelKey(d)] {
			seen[modelKey(d)] = true
			models = append(models, m)
		}
	}
	sort.Slice(devs, func(i, j int) bool { return refKey(devs[i].GetRef()) < refKey(devs[j].GetRef()) })
	sort.Slice(models, func(i, j int) bool { return refKey(models[i].GetRef()) < refKey(models[j].GetRef()) })
	return devs, models
}

// forget drops m if it is still the registration under its name.
func (s *Server) forget(ctx context.Context, m *mapper) {
	s.mu.Lock()
	if s.mappers[m.info.GetName()] != m {
		s.mu.Unlock()
		return
	}
	delete(s.mappers, m.info.GetName())
	for _, o := range s.mappers {
		o.poke()
	}
	s.updateConnectedLocked()
	s.mu.Unlock()
	_ = m.conn.Close()
	log := logr.FromContextOrDiscard(ctx)
	log.Info("forgetting a mapper that stayed unreachable; it is told again when it registers", "unreachableFor", s.cfg.ForgetAfter.String())
	if err := s.writeMappers(); err != nil {
		log.Error(err, "cannot write the mapper registry")
	}
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

// The registry file: the mappers that registered, so that a restarted
// agent tells them their devices again.

type savedMapper struct {
	Name       string `json:"name"`
	Version    string `json:"version,omitempty"`
	APIVersion string `json:"apiVersion,omitempty"`
	Protocol   string `json:"protocol"`
	// Address is MapperInfo.address as the mapper sent it.
	Address string `json:"address"`
	// Devices and Models it was sent (namespace/name), so that a restarted
	// agent removes from it what the node lost meanwhile.
	Devices []string `json:"devices,omitempty"`
	Models  []string `json:"models,omitempty"`
	// Caller is the process that registered it (absent from files of
	// agents before it was recorded).
	Caller *caller `json:"caller,omitempty"`
}

func (s *Server) mappersFile() string { return filepath.Join(s.cfg.StateDir, "dmi-mappers.json") }

func (s *Server) readMappers() ([]savedMapper, error) {
	data, err := os.ReadFile(s.mappersFile())
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("dmi: %w", err)
	}
	var saved []savedMapper
	if err := json.Unmarshal(data, &saved); err != nil {
		return nil, fmt.Errorf("dmi: %s: %w", s.mappersFile(), err)
	}
	return saved, nil
}

func (s *Server) writeMappers() error {
	s.fileMu.Lock()
	defer s.fileMu.Unlock()
	s.mu.Lock()
	ms := make([]*mapper, 0, len(s.mappers))
	for _, m := range s.mappers {
		ms = append(ms, m)
	}
	s.mu.Unlock()
	saved := make([]savedMapper, 0, len(ms))
	for _, m := range ms {
		i := m.info
		devs, models := m.held()
		sm := savedMapper{Name: i.GetName(), Version: i.GetVersion(), APIVersion: i.GetApiVersion(), Protocol: i.GetProtocol(), Address: string(i.GetAddress()),
			Devices: devs, Models: models}
		m.mu.Lock()
		if m.registrant.Known {
			c := m.registrant
			sm.Caller = &c
		}
		m.mu.Unlock()
		saved = append(saved, sm)
	}
	sort.Slice(saved, func(i, j int) bool { return saved[i].Name < saved[j].Name })
	data, err := json.MarshalIndent(saved, "", "  ")
	if err != nil {
		return err
	}
	tmp := s.mappersFile() + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, s.mappersFile())
}
