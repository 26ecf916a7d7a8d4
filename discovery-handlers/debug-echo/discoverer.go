package debugecho

import (
	"context"

	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
)

// discoverer reports the devices a Configuration describes while the
// availability file allows, and none otherwise.
type discoverer struct {
	availability *availability
}

// Discover implements handler.Discoverer. It ignores discovery_properties:
// debug-echo has none.
func (d *discoverer) Discover(ctx context.Context, req *discoveryv1.DiscoverRequest, send func([]*discoveryv1.Device) error) error {
	details, err := ParseDetails(req.GetDiscoveryDetails())
	if err != nil {
		return err
	}
	devices := details.Devices()
	for {
		online, changed := d.availability.Online()
		list := devices
		if !online {
			list = nil
		}
		if err := send(list); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		}
	}
}
