package dmi

// Assignment policy: which registered mapper serves each Device of the
// node, and the Devices none serves.

import (
	"context"
	"sort"

	"github.com/go-logr/logr"

	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
)

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

func modelKey(d *linkv1.EdgeDevice) string { return d.GetRef().GetNamespace() + "/" + d.GetModel() }

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
