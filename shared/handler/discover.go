package handler

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
)

// discoveryService adapts a Discoverer to the generated DiscoveryHandler
// service.
type discoveryService struct {
	discoveryv1.UnimplementedDiscoveryHandlerServer

	server *Server
	// runCtx is the context Start runs under; when it ends every stream ends
	// too, so that shutdown does not wait on streams only the agent would
	// close.
	runCtx context.Context
}

func (d *discoveryService) Discover(req *discoveryv1.DiscoverRequest, stream grpc.ServerStreamingServer[discoveryv1.DiscoverResponse]) error {
	streamCtx := stream.Context()
	ctx, cancel := context.WithCancel(streamCtx)
	defer cancel()
	stopOnShutdown := context.AfterFunc(d.runCtx, cancel)
	defer stopOnShutdown()

	m := d.server.metrics
	m.streamsOpened.Add(1)
	m.streamsOpen.Add(1)
	defer m.streamsOpen.Add(-1)
	log := d.server.log.WithValues("stream", d.server.streams.Add(1))
	log.Info("discover stream opened")
	ctx = logr.NewContext(ctx, log)
	skips := &skipState{}
	ctx = context.WithValue(ctx, skipKey{}, skips)

	s := &dedupingSender{send: stream.Send, metrics: m, skips: skips}
	err := d.server.cfg.Discoverer.Discover(ctx, req, s.Send)

	switch {
	case d.runCtx.Err() != nil:
		// The agent retries Unavailable, which is what a handler that is
		// going away should tell it, whatever the Discoverer returned.
		log.Info("discover stream ended", "why", "handler shutting down")
		return status.Error(codes.Unavailable, "discovery handler is shutting down")
	case streamCtx.Err() != nil:
		// The agent cancelled the stream: its Configuration changed or went
		// away, or the agent itself went away. The registration is checked
		// in case it was the last; registering again is idempotent.
		log.Info("discover stream ended", "why", "closed by the agent")
		d.server.requestRegistration(reasonStreamGone)
		return status.FromContextError(streamCtx.Err()).Err()
	case err != nil:
		log.Info("discover stream ended", "why", "discoverer failed", "code", status.Code(err).String(), "err", err)
		m.streamFailed(status.Code(err))
		return err
	default:
		// The contract is to send until the stream ends; a Discoverer that
		// stops early is a bug, and Internal makes the agent retry it.
		log.Info("discover stream ended", "why", "discoverer returned early")
		m.streamFailed(codes.Internal)
		return status.Error(codes.Internal, "discoverer returned before the stream ended")
	}
}

// dedupingSender sends device lists on a stream, dropping a list that equals
// the one sent before. It is done here, once, so that no handler has to. It
// keeps only a digest of the last list, not the list: a handler with
// thousands of devices would otherwise hold a second copy per stream.
type dedupingSender struct {
	// mu serialises Send: a gRPC stream must not be sent on concurrently and
	// a Discoverer may call send from several goroutines.
	mu      sync.Mutex
	send    func(*discoveryv1.DiscoverResponse) error
	metrics *metrics   // nil: not counted
	skips   *skipState // nil: none reported
	sent    bool
	last    [sha256.Size]byte
}

// Send checks devs against the protocol, sorts a shallow copy by id and
// sends it, with the stream's skipped candidates (SetSkipped), unless both
// equal what was sent before. It keeps no reference to devs once it returns.
func (d *dedupingSender) Send(devs []*discoveryv1.Device) error {
	list := make([]*discoveryv1.Device, 0, len(devs))
	for i, dev := range devs {
		if dev == nil {
			return status.Errorf(codes.Internal, "device %d is nil", i)
		}
		list = append(list, dev)
	}
	slices.SortFunc(list, func(a, b *discoveryv1.Device) int { return cmp.Compare(a.GetId(), b.GetId()) })
	if err := checkDevices(list); err != nil {
		return err
	}
	skipped := d.skips.current()
	sum, err := digest(list, skipped)
	if err != nil {
		return status.Errorf(codes.Internal, "hashing the device list: %v", err)
	}

	d.mu.Lock()
	defer d.mu.Unlock()
	if d.sent && sum == d.last {
		if d.metrics != nil {
			d.metrics.listsUnchanged.Add(1)
		}
		return nil
	}
	if err := d.send(&discoveryv1.DiscoverResponse{Devices: list, Skipped: skipped}); err != nil {
		return err
	}
	if d.metrics != nil {
		d.metrics.listsSent.Add(1)
		d.metrics.devices.Store(int64(len(list)))
		d.metrics.setSkipped(skipped)
	}
	d.sent = true
	d.last = sum
	return nil
}

// digest hashes a sorted list and the skipped reasons (sorted by
// SetSkipped) through the deterministic wire encoding of each (maps sorted),
// so equal lists hash alike.
func digest(list []*discoveryv1.Device, skipped []*discoveryv1.SkippedReason) ([sha256.Size]byte, error) {
	h := sha256.New()
	opts := proto.MarshalOptions{Deterministic: true}
	var buf []byte
	msgs := make([]proto.Message, 0, len(list)+len(skipped)+1)
	for _, dev := range list {
		msgs = append(msgs, dev)
	}
	// A separator, so that a device can never read as a reason.
	msgs = append(msgs, &discoveryv1.Empty{})
	for _, r := range skipped {
		msgs = append(msgs, r)
	}
	for _, dev := range msgs {
		var err error
		buf, err = opts.MarshalAppend(buf[:0], dev)
		if err != nil {
			return [sha256.Size]byte{}, err
		}
		// Length-prefix each device so that boundaries cannot shift.
		h.Write(binary.AppendUvarint(nil, uint64(len(buf))))
		h.Write(buf)
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum, nil
}

// checkDevices enforces what discovery.proto promises the agent about a
// sorted list: every id is set and appears once.
func checkDevices(sorted []*discoveryv1.Device) error {
	var errs []error
	for i, dev := range sorted {
		if dev.GetId() == "" {
			errs = append(errs, errors.New("a device has an empty id"))
		} else if i > 0 && sorted[i-1].GetId() == dev.GetId() {
			errs = append(errs, fmt.Errorf("device id %q appears more than once", dev.GetId()))
		}
	}
	if len(errs) > 0 {
		return status.Error(codes.Internal, "discoverer sent an invalid device list: "+errors.Join(errs...).Error())
	}
	return nil
}
