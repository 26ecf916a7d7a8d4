package dmi

import (
	"context"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
	mapperv1 "github.com/dowse-dev/dowse/proto/mapper/v1"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// mapperConditions are the condition types a mapper sets
// (ReportDeviceCondition); ReportsAccepted is the agent's own.
var mapperConditions = map[string]bool{v1alpha1.ConditionAuthenticated: true}

// conditions serves Dowse's DeviceConditions beside DMI on dmi.sock.
type conditions struct {
	mapperv1.UnimplementedDeviceConditionsServer
	s *Server
}

// ReportDeviceCondition passes a mapper's condition of one of its Devices
// to the cloud (DeviceCondition), after the checks a report gets: the
// Device is the node's and the caller's mapper serves it.
func (c conditions) ReportDeviceCondition(ctx context.Context, req *mapperv1.ReportDeviceConditionRequest) (*mapperv1.ReportDeviceConditionResponse, error) {
	s := c.s
	s.metrics.receive("condition", 1)
	d, _, owner, err := s.lookup(req.GetDeviceNamespace(), req.GetDeviceName())
	if err != nil {
		s.metrics.refuse("condition", reasonUnknownDevice, 1)
		return nil, err
	}
	if err := s.mayReport(ctx, d, owner); err != nil {
		s.metrics.refuse("condition", reasonNotYours, 1)
		return nil, err
	}
	if !mapperConditions[req.GetType()] {
		s.metrics.refuse("condition", reasonBadCondition, 1)
		return nil, status.Errorf(codes.InvalidArgument, "device %s: condition %q is not one a mapper sets (%s)", refKey(d.GetRef()), req.GetType(), strings.Join(keys(mapperConditions), ", "))
	}
	if !s.allow(owner, 1) {
		s.metrics.refuse("condition", reasonRateLimited, 1)
		return nil, status.Errorf(codes.ResourceExhausted, "reports for the devices of mapper %q exceed %g a second", owner, s.cfg.ReportRate)
	}
	cond := &linkv1.DeviceCondition{Device: d.GetRef(), Type: req.GetType(), Status: req.GetStatus(), Reason: req.GetReason(),
		Message: req.GetMessage(), Time: timestamppb.New(s.cfg.Now()), Mapper: owner}
	if _, err := s.edge.ReportCondition(cond); err != nil {
		s.metrics.refuse("condition", reasonStore, 1)
		return nil, status.Errorf(codes.Unavailable, "edge store: %v", err)
	}
	return &mapperv1.ReportDeviceConditionResponse{}, nil
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
