package mapper

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dowse-dev/dowse/shared/twinvalue"
)

func (d *device) closeDriver() {
	if d.subCancel != nil {
		d.subCancel()
		d.subCancel = nil
	}
	if d.driver != nil && d.connected {
		_ = d.driver.Close()
	}
	d.connected = false
}

func (d *device) connect(ctx context.Context) bool {
	// The credentials this attempt signs in with, as read before it: a
	// change while it is under way is a change after a refusal.
	creds := d.credentialDigest()
	cctx, cancel := d.callCtx(ctx)
	err := d.driver.Connect(cctx)
	cancel()
	d.m.cfg.Metrics.connect(err)
	if err != nil {
		if ctx.Err() == nil {
			if d.state != twinvalue.StateOffline {
				d.log.Info("cannot connect to the device", "err", err)
			}
			d.setState(twinvalue.StateOffline, err)
			d.failAll(fmt.Errorf("cannot connect to the device: %w", err))
			if errors.Is(err, ErrAuthFailed) {
				d.authFailed(err, creds)
			}
		}
		return false
	}
	d.connected = true
	d.signedIn()
	d.failures = 0
	d.log.Info("connected to the device")
	for _, ps := range d.order {
		if ps.failedKey != "" && ps.retryAt.IsZero() {
			ps.failedKey = "" // try a refused desired value again on a new connection
		}
	}
	now := time.Now()
	for _, g := range d.groups {
		g.next = now
	}
	if err := d.subscribe(ctx); err != nil {
		// The session is no good for pushes: start over, with backoff.
		d.log.Info("subscribing failed; reconnecting", "err", err)
		d.closeDriver()
		d.setState(twinvalue.StateUnhealthy, fmt.Errorf("subscribing: %w", err))
		return false
	}
	if d.offlineErr != nil {
		// A device that said it is offline (ErrDeviceOffline) stays so on
		// a new connection until it sends a value.
		d.setState(twinvalue.StateOffline, d.offlineErr)
	} else if d.state != twinvalue.StateUnhealthy {
		// An unhealthy device stays so until a read succeeds: a peer that
		// accepts connections but never answers must not flap to ok.
		d.setState(twinvalue.StateOK, nil)
	}
	return true
}

// subscribe sets up the pushed properties (after a connect, or when the
// properties were rebuilt on an open connection), replacing an earlier
// subscription.
func (d *device) subscribe(ctx context.Context) error {
	d.resubAt = time.Time{}
	if d.subCancel != nil {
		d.subCancel()
		d.subCancel = nil
	}
	sub, ok := d.driver.(Subscriber)
	if !ok {
		return nil
	}
	var ps []*Property
	for _, s := range d.order {
		if s.bad == nil && s.p.Subscribe {
			ps = append(ps, s.p)
		}
	}
	if len(ps) == 0 {
		return nil
	}
	if d.pushes == nil {
		d.pushes = make(chan push, 64)
	}
	pushes := d.pushes
	sctx, cancel := context.WithCancel(ctx)
	d.subCancel = cancel
	err := sub.Subscribe(sctx, ps, func(p *Property, v any, err error) {
		select {
		case pushes <- push{p: p, v: v, err: err}:
		case <-sctx.Done():
		}
	})
	if err != nil {
		cancel()
		d.subCancel = nil
		for _, p := range ps {
			d.record(d.props[p.Name], nil, err, time.Now())
		}
	}
	return err
}

// failAll puts err on every property that has no error of its own (a
// device that cannot be reached, or whose protocol config is wrong), so the
// reason reaches the twins and not only the log. It is reported once.
func (d *device) failAll(err error) {
	if err == nil {
		return
	}
	for _, ps := range d.order {
		if ps.bad != nil || ps.readErr == err.Error() {
			continue
		}
		ps.readErr = err.Error()
		if ps.reportedErr != ps.readErr {
			ps.dirty = true
		}
	}
}
