package dmi

// Registrations: a mapper registering (MapperRegister), and forgotten when
// it stays unreachable.

import (
	"context"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dmiv1beta1 "github.com/dowse-dev/dowse/proto/dmi/v1beta1"
)

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
	s.mu.Lock()
	prev := s.mappers[info.GetName()]
	s.mu.Unlock()
	if err := mayReplace(ctx, prev, who); err != nil {
		_ = m.conn.Close()
		s.log.Info("refused a registration under a name another live process holds", "mapper", info.GetName(), "caller", who.String(), "reason", err.Error())
		return nil, status.Errorf(codes.PermissionDenied, "mapper %q: %v", info.GetName(), err)
	}
	resp := &dmiv1beta1.MapperRegisterResponse{}
	s.mu.Lock()
	if s.runCtx == nil {
		s.mu.Unlock()
		_ = m.conn.Close()
		return nil, status.Error(codes.Unavailable, "the mapper API is starting")
	}
	old := s.mappers[info.GetName()]
	if old != prev {
		s.mu.Unlock()
		_ = m.conn.Close()
		return nil, status.Errorf(codes.Aborted, "mapper %q registered meanwhile by another call; try again", info.GetName())
	}
	if old != nil {
		m.since = old.since
	} else {
		s.registered++
		m.since = s.registered
	}
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
		o.requestSync() // assignments may have moved
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
	if !who.Distinct() {
		log.Info("this mapper is known by its uid alone (another pid namespace, and a kernel without pidfs): mappers of the same uid can report for each other's devices; give each mapper its own uid or run the agent with hostPID",
			"mapper", info.GetName(), "uid", who.UID)
	}
	return resp, nil
}

// mayReplace says whether who may register under the name old holds (nil:
// a new name). A name stays with the process that registered it while that
// process lives: it may register again, and so may whoever serves the old
// registration's socket now (a restarted mapper); while the old socket is
// still served by another process, nobody else may take the name and the
// Devices that come with it. The agent's own process (tests) may.
func mayReplace(ctx context.Context, old *mapper, who caller) error {
	if old == nil || !who.Known {
		return nil
	}
	old.mu.Lock()
	reg := old.registrant
	old.mu.Unlock()
	if reg.Known && reg.Same(who) {
		return nil
	}
	lctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	served, err := listenerOf(lctx, mapperAddress(old.info))
	if err != nil {
		return nil // nobody serves the old registration's socket: it is gone
	}
	if served.Same(who) {
		return nil
	}
	return fmt.Errorf("the name is registered by %s, which still serves %s; a mapper's name stays with the process that registered it while it lives (give this mapper another name)", served.String(), mapperAddress(old.info))
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
		o.requestSync()
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
