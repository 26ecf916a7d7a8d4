package dmi

// The reports mappers send (ReportDeviceStatus, ReportDeviceStates): who
// may report for a Device, what is taken, and what the cloud is told of
// what is refused.

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	dmiv1beta1 "github.com/dowse-dev/dowse/proto/dmi/v1beta1"
	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/shared/twinvalue"
)

// refusals are the properties of one Device whose latest report was
// refused (property -> why), and whether the cloud was told since start.
type refusals struct {
	props map[string]string
	told  bool
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

// reportTime is the metadata "timestamp" (Unix milliseconds, as
// mapper-framework writes it) or, without one, now.
func (s *Server) reportTime(md map[string]string) time.Time {
	if at, ok := twinvalue.TimestampOf(md); ok {
		return at
	}
	return s.cfg.Now()
}

func modelProperty(m *linkv1.EdgeDeviceModel, name string) *linkv1.EdgeModelProperty {
	for _, p := range m.GetProperties() {
		if p.GetName() == name {
			return p
		}
	}
	return nil
}
