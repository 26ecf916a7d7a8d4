package handler

import (
	"context"
	"time"

	"github.com/go-logr/logr"

	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
)

// Rescan is a scanning handler's Discover loop: a round at once, then one
// interval after each round ended (never overlapping, so a slow round slows
// the scan instead of piling up), sending each round's devices and
// publishing what it skipped. It returns nil when ctx ends and send's error
// when the agent stops listening.
func Rescan(ctx context.Context, interval time.Duration, round func(context.Context) []*discoveryv1.Device, skipped func() *Skipped, send func([]*discoveryv1.Device) error) error {
	log := logr.FromContextOrDiscard(ctx)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		}
		start := time.Now()
		devs := round(ctx)
		if ctx.Err() != nil {
			return nil
		}
		SetSkipped(ctx, skipped())
		log.V(1).Info("scan round done", "devices", len(devs), "duration", time.Since(start).String())
		if err := send(devs); err != nil {
			return err
		}
		timer.Reset(interval)
	}
}
