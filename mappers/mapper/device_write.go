package mapper

import (
	"context"
	"errors"
	"fmt"
	"time"

	dmiv1beta1 "github.com/dowse-dev/dowse/proto/dmi/v1beta1"
	"github.com/dowse-dev/dowse/shared/twinvalue"
)

// applyDesired writes desired values not yet applied, then reads them back.
func (d *device) applyDesired(ctx context.Context, now time.Time) {
	var back []*propState
	for _, ps := range d.order {
		if ps.desired == nil || ps.desiredKey == ps.appliedKey || ps.desiredKey == ps.failedKey {
			continue
		}
		if !ps.retryAt.IsZero() && now.Before(ps.retryAt) {
			continue
		}
		ps.retryAt = time.Time{}
		if !ps.desiredAt.IsZero() {
			d.m.cfg.Metrics.desiredWait(time.Since(ps.desiredAt))
			ps.desiredAt = time.Time{}
		}
		err := d.write(ctx, ps)
		ps.dirty = true
		if err != nil {
			ps.desiredErr = fmt.Sprintf("desired value %q: %v", ps.desired.GetValue(), err)
			d.log.Info("writing a desired value failed", "property", ps.p.Name, "value", ps.desired.GetValue(), "err", err)
			if IsPermanent(err) {
				ps.failedKey = ps.desiredKey
			} else {
				ps.retryAt = now.Add(min(ps.p.CollectCycle, time.Second))
				d.failures++
				d.lastErr = err
				if errors.Is(err, ErrDisconnected) {
					d.failures = d.m.cfg.UnhealthyAfter
				}
			}
			continue
		}
		meta := map[string]string{twinvalue.MetaType: string(ps.p.Type)}
		for k, v := range ps.desired.GetMetadata() {
			if k != twinvalue.MetaError && k != twinvalue.MetaDesiredError {
				meta[k] = v
			}
		}
		if meta[twinvalue.MetaTimestamp] == "" {
			meta[twinvalue.MetaTimestamp] = twinvalue.Timestamp(time.Now())
		}
		ps.appliedKey, ps.failedKey, ps.desiredErr = ps.desiredKey, "", ""
		ps.observed = &dmiv1beta1.TwinProperty{Value: ps.desired.GetValue(), Metadata: meta}
		ps.observedSent = false
		back = append(back, ps)
	}
	if len(back) > 0 && d.connected {
		props := make([]*Property, len(back))
		for i, ps := range back {
			props[i] = ps.p
		}
		for i, r := range d.read(ctx, props) {
			d.record(back[i], r.Value, r.Err, time.Now())
		}
	}
}

func (d *device) write(ctx context.Context, ps *propState) error {
	p := ps.p
	if ps.bad != nil {
		return Permanentf("property is invalid: %v", ps.bad)
	}
	v, err := p.model.ParseDesired(ps.desired.GetValue())
	if err != nil {
		return Permanent(err)
	}
	if !d.connected {
		return fmt.Errorf("not connected")
	}
	cctx, cancel := d.callCtx(ctx)
	defer cancel()
	start := time.Now()
	err = d.driver.Write(cctx, p, p.Transform.Inverse(v))
	d.m.cfg.Metrics.write(readResult(err), time.Since(start))
	return err
}
