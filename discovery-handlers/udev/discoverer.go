package udev

import (
	"context"

	"github.com/go-logr/logr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
	"github.com/dowse-dev/dowse/shared/handler"
)

// Source is where devices come from: libudev on the real machine (see
// NewLibudevSource), fakes in tests.
type Source interface {
	// Open starts following device events, then enumerates the devices
	// present, so that no event between the two is lost (an event for a
	// device already enumerated is harmless: applying it again is
	// idempotent). Events arrive on the channel until ctx ends; the
	// channel is closed then, or earlier if monitoring fails. mode says
	// what is followed, "udev" or "kernel".
	Open(ctx context.Context) (devices []Device, events <-chan Event, mode string, err error)
}

// discoverer serves Discover streams; each stream follows the source on its
// own, with its own rules.
type discoverer struct {
	source Source
}

// NewDiscoverer returns the udev handler.Discoverer over source, for callers
// that build their own handler.Server.
func NewDiscoverer(source Source) handler.Discoverer { return &discoverer{source: source} }

// Announce implements handler.Announcer: it says whether the udev daemon's
// events are followed, or only the kernel's (when its source tells).
func (d *discoverer) Announce(log logr.Logger) {
	m, ok := d.source.(interface{ Mode() string })
	if !ok {
		return
	}
	switch m.Mode() {
	case ModeKernel:
		log.Info("no udev daemon runs: following kernel uevents, so udev properties (ENV{ID_*}) are only those the kernel sends", "controlSocket", DefaultControlSocket)
	case ModeUdev:
		log.Info("following the udev daemon's events")
	}
}

// Discover implements handler.Discoverer.
func (d *discoverer) Discover(ctx context.Context, req *discoveryv1.DiscoverRequest, send func([]*discoveryv1.Device) error) error {
	details, err := ParseDetails(req.GetDiscoveryDetails())
	if err != nil {
		return err
	}
	log := logr.FromContextOrDiscard(ctx)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	devs, events, mode, err := d.source.Open(ctx)
	if err != nil {
		return status.Errorf(codes.Unavailable, "udev: %v", err)
	}
	t := newTracker(details)
	for _, dev := range devs {
		t.evaluate(dev)
	}
	log.Info("udev devices enumerated", "follows", mode, "devices", len(devs), "matched", len(t.matched))

	handler.SetSkipped(ctx, t.skipped())
	if err := send(t.list()); err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-events:
			if !ok {
				if ctx.Err() != nil {
					return nil
				}
				return status.Error(codes.Unavailable, "udev: the device monitor stopped")
			}
			changed := t.apply(ev)
			// Apply what else is already queued before sending, so that
			// a burst (a USB hub, a disk and its partitions) is one list.
		drain:
			for {
				select {
				case ev, ok := <-events:
					if !ok {
						break drain
					}
					changed = t.apply(ev) || changed
				default:
					break drain
				}
			}
			if !changed {
				continue
			}
			log.V(1).Info("udev matched devices changed", "action", ev.Action, "devpath", ev.Device.Devpath(), "matched", len(t.matched))
			handler.SetSkipped(ctx, t.skipped())
			if err := send(t.list()); err != nil {
				return err
			}
		}
	}
}
