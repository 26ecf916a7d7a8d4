package mapper

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	dmiv1beta1 "github.com/dowse-dev/dowse/proto/dmi/v1beta1"
	"github.com/dowse-dev/dowse/shared/twinvalue"
)

// snapshot is what GetDevice returns: the spec served and the twins last
// reported, built on demand (GetDevice is rare; reports are not).
func (d *device) snapshot() *dmiv1beta1.Device {
	d.mu.Lock()
	defer d.mu.Unlock()
	dev := d.snapDevLocked()
	if dev == nil {
		dev = &dmiv1beta1.Device{Name: d.name, Namespace: d.ns}
	}
	dev.Status = &dmiv1beta1.DeviceStatus{ReportToCloud: true}
	for _, p := range dev.GetSpec().GetProperties() {
		sp, ok := d.snapProps[p.GetName()]
		if !ok {
			continue
		}
		// Unlike a report, GetDevice shows properties never read too, with
		// an empty value and their error.
		meta := map[string]string{twinvalue.MetaType: string(sp.typ)}
		if sp.hasValue {
			meta[twinvalue.MetaTimestamp] = twinvalue.Timestamp(sp.readAt)
		}
		if sp.readErr != "" {
			meta[twinvalue.MetaError] = sp.readErr
		}
		if sp.desError != "" {
			meta[twinvalue.MetaDesiredError] = sp.desError
		}
		tw := &dmiv1beta1.Twin{PropertyName: p.GetName(), Reported: &dmiv1beta1.TwinProperty{Value: sp.value, Metadata: meta}}
		if sp.observed != nil {
			tw.ObservedDesired = proto.CloneOf(sp.observed)
		}
		dev.Status.Twins = append(dev.Status.Twins, tw)
	}
	return dev
}

func (d *device) setState(s string, err error) {
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	if s != d.state {
		d.log.Info("device state", "state", s, "reason", msg)
		d.m.cfg.Metrics.state(d.state, s)
	}
	d.state, d.stateErr = s, msg
}

func (d *device) sendState(ctx context.Context) {
	if d.state == d.stateSent || ctx.Err() != nil {
		return
	}
	cctx, cancel := d.callCtx(ctx)
	defer cancel()
	req := &dmiv1beta1.ReportDeviceStatesRequest{DeviceName: d.name, DeviceNamespace: d.ns, State: d.state}
	err := d.m.agentCall(cctx, func(ctx context.Context) error {
		_, err := d.m.agent.ReportDeviceStates(ctx, req)
		return err
	})
	d.m.cfg.Metrics.report("states", err)
	if err != nil {
		if ctx.Err() == nil {
			d.log.V(1).Info("reporting the device state failed; retrying", "err", err)
		}
		return
	}
	d.stateSent = d.state
}

// flush sends one ReportDeviceStatus with every property that changed, has
// a new error or observed desired value, or is due a heartbeat. Only
// properties with a value are sent (see the package doc).
func (d *device) flush(ctx context.Context, now time.Time) {
	defer d.updateSnapProps()
	twins, sent := d.flushTwins[:0], d.flushSent[:0]
	for _, ps := range d.order {
		if !ps.hasValue {
			continue
		}
		heartbeat := ps.hasReported && now.Sub(ps.reportedAt) >= d.reportCycle(ps) && !now.Before(d.flushRetryAt)
		if !ps.dirty && !heartbeat && (ps.observed == nil || ps.observedSent) {
			continue
		}
		twins = append(twins, d.m.twinFor(ps))
		sent = append(sent, ps)
	}
	d.flushTwins, d.flushSent = twins, sent
	defer func() {
		for i, tw := range twins {
			tw.ObservedDesired = nil
			d.m.twins.Put(tw)
			twins[i] = nil
		}
	}()
	if len(twins) == 0 || ctx.Err() != nil {
		return
	}
	cctx, cancel := d.callCtx(ctx)
	defer cancel()
	if d.flushReq == nil {
		d.flushReq = &dmiv1beta1.ReportDeviceStatusRequest{DeviceName: d.name, DeviceNamespace: d.ns,
			ReportedDevice: &dmiv1beta1.DeviceStatus{ReportToCloud: true}}
	}
	req := d.flushReq
	req.ReportedDevice.Twins = twins
	err := d.m.agentCall(cctx, func(ctx context.Context) error {
		_, err := d.m.agent.ReportDeviceStatus(ctx, req)
		return err
	})
	d.m.cfg.Metrics.report("status", err)
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		if status.Code(err) != codes.InvalidArgument {
			// Changed values go again with the next read; heartbeats wait
			// for a retry time, with backoff, instead of spinning.
			if d.flushDelay == 0 {
				d.flushDelay = d.m.cfg.ReconnectInitial
			}
			d.flushRetryAt = now.Add(d.flushDelay)
			d.flushDelay = min(2*d.flushDelay, d.m.cfg.ReconnectMax)
			d.log.V(1).Info("reporting device status failed; retrying", "err", err)
			return
		}
		// Refused as wrong: sending it again would be refused again (the
		// agent kept the valid twins; its message names the others).
		d.log.Error(err, "the device manager refused twins of a report; they are dropped")
	}
	d.flushRetryAt, d.flushDelay = time.Time{}, 0
	for _, ps := range sent {
		ps.dirty = false
		ps.observedSent = true
		ps.reported, ps.hasReported, ps.reportedErr, ps.reportedDesiredErr, ps.reportedAt = ps.value, true, ps.readErr, ps.desiredErr, now
	}
}

// twinFor is ps's twin as a report sends it, from the pool of report
// twins: a busy device reports every cycle, and a map and two messages per
// property each time were most of a mapper's garbage; a pool keeps only
// those of the reports in flight (kept per property, they were 1 MiB more
// live heap for 100 devices of ten properties).
func (m *Mapper) twinFor(ps *propState) *dmiv1beta1.Twin {
	tw, _ := m.twins.Get().(*dmiv1beta1.Twin)
	if tw == nil {
		tw = &dmiv1beta1.Twin{Reported: &dmiv1beta1.TwinProperty{Metadata: make(map[string]string, 2)}}
	}
	tw.PropertyName, tw.ObservedDesired = ps.p.Name, ps.observed
	tw.Reported.Value = ps.value
	meta := tw.Reported.Metadata
	clear(meta)
	meta[twinvalue.MetaType] = string(ps.p.Type)
	meta[twinvalue.MetaTimestamp] = twinvalue.Timestamp(ps.readAt)
	if ps.readErr != "" {
		meta[twinvalue.MetaError] = ps.readErr
	}
	if ps.desiredErr != "" {
		meta[twinvalue.MetaDesiredError] = ps.desiredErr
	}
	return tw
}

// snapProp is one property as GetDevice shows it.
type snapProp struct {
	value             string
	hasValue          bool
	readAt            time.Time
	typ               twinvalue.Type
	readErr, desError string
	observed          *dmiv1beta1.TwinProperty
}

// updateSnapProps records every property's state for GetDevice.
func (d *device) updateSnapProps() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.snapProps == nil {
		d.snapProps = map[string]snapProp{}
	}
	for _, ps := range d.order {
		d.snapProps[ps.p.Name] = snapProp{value: ps.value, hasValue: ps.hasValue, readAt: ps.readAt, typ: ps.p.Type,
			readErr: ps.readErr, desError: ps.desiredErr, observed: ps.observed}
	}
}
