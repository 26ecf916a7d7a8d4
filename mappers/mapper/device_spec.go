package mapper

import (
	"context"
	"crypto/sha256"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

	dmiv1beta1 "github.com/dowse-dev/dowse/proto/dmi/v1beta1"
	"github.com/dowse-dev/dowse/shared/twinvalue"
)

// update hands the goroutine a new spec (and its model, nil if unknown).
func (d *device) update(dev *dmiv1beta1.Device, model *dmiv1beta1.DeviceModel) {
	d.mu.Lock()
	d.next = &pending{dev: dev, model: model, at: time.Now()}
	d.mu.Unlock()
	d.wake()
}

func (d *device) modelChanged(mod *dmiv1beta1.DeviceModel) {
	d.mu.Lock()
	defer d.mu.Unlock()
	cur := d.next
	if cur == nil {
		cur = &pending{dev: d.snapDevLocked()}
	}
	if cur.dev == nil || cur.dev.GetSpec().GetDeviceModelReference() != mod.GetName() || cur.dev.GetNamespace() != mod.GetNamespace() {
		return
	}
	d.next = &pending{dev: cur.dev, model: proto.CloneOf(mod), at: time.Now()}
	d.wake()
}

// snapDevLocked returns the spec served (nil before the first); d.mu is
// held.
func (d *device) snapDevLocked() *dmiv1beta1.Device {
	if d.snapSpec == nil {
		return nil
	}
	dev := &dmiv1beta1.Device{}
	if err := proto.Unmarshal(d.snapSpec, dev); err != nil {
		return nil // it was marshalled here
	}
	return dev
}

// hasNext says whether an update waits for the device's goroutine.
func (d *device) hasNext() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.next != nil
}

// resync makes the device report its state and every value again (after a
// registration: the manager may have restarted).
func (d *device) resync() {
	d.mu.Lock()
	d.resyncing = true
	d.mu.Unlock()
	d.wake()
}

// takePending applies the newest spec handed to the device, if any.
func (d *device) takePending(ctx context.Context) {
	d.mu.Lock()
	next := d.next
	d.next = nil
	resync := d.resyncing
	d.resyncing = false
	d.mu.Unlock()
	if resync {
		d.stateSent = ""
		for _, ps := range d.order {
			if ps.hasValue || ps.readErr != "" || ps.bad != nil {
				ps.dirty = true
			}
			ps.observedSent = false
		}
	}
	if next == nil {
		return
	}
	// The spec is used here and dropped: what later updates are compared
	// with is its keys, what GetDevice shows its marshalled copy.
	spec := next.dev
	first, old, oldModel := !d.hasSpec, d.specKeys, d.model
	d.hasSpec, d.specKeys, d.model = true, keysOf(spec), next.model
	d.updateSnap(spec)
	switch {
	case d.model == nil:
		d.closeDriver()
		d.driver = nil
		d.driverErr = fmt.Errorf("device model %q is not known to the mapper", spec.GetSpec().GetDeviceModelReference())
		d.log.Info("waiting for the device's model", "model", spec.GetSpec().GetDeviceModelReference())
	case d.driver == nil || first || old.protocol != d.specKeys.protocol:
		d.closeDriver()
		d.driver, d.driverErr = nil, nil
		params, err := DecodeConfig(spec.GetSpec().GetProtocol().GetConfigData())
		if err == nil {
			d.driver, err = d.m.cfg.NewDriver(DeviceInfo{Name: d.name, Namespace: d.ns,
				ProtocolName: spec.GetSpec().GetProtocol().GetProtocolName(), Protocol: params})
		}
		if err != nil {
			d.driver, d.driverErr = nil, fmt.Errorf("protocol config: %w", err)
			d.log.Error(err, "device protocol config is invalid")
		}
		d.backoff = d.m.cfg.ReconnectInitial
		d.buildProps(spec, next.at)
	case old.shape != d.specKeys.shape || !proto.Equal(oldModel, d.model):
		d.buildProps(spec, next.at)
		if d.connected {
			if err := d.subscribe(ctx); err != nil {
				d.log.Info("subscribing failed; reconnecting", "err", err)
				d.failures, d.lastErr = d.m.cfg.UnhealthyAfter, err
			}
		}
	default:
		d.takeDesired(spec, next.at)
	}
}

// specKeys tell which parts of a device's spec changed: its protocol (a
// reconnect) and the rest but desired values and status (properties
// prepared again).
type specKeys struct{ protocol, shape [sha256.Size]byte }

func keysOf(dev *dmiv1beta1.Device) specKeys {
	c := proto.CloneOf(dev)
	c.Status = nil
	for _, p := range c.GetSpec().GetProperties() {
		p.Desired = nil
	}
	return specKeys{protocol: digest(dev.GetSpec().GetProtocol()), shape: digest(c)}
}

// digest hashes m's deterministic encoding; equal messages hash equal (an
// unequal pair that hashed equal would need a SHA-256 collision).
func digest(m proto.Message) [sha256.Size]byte {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		b = nil // cannot fail for a message that was unmarshalled
	}
	return sha256.Sum256(b)
}

// buildProps (re)prepares every property from the spec and model, keeping
// what is known of properties that stay.
func (d *device) buildProps(spec *dmiv1beta1.Device, at time.Time) {
	modelProps := map[string]*dmiv1beta1.ModelProperty{}
	for _, mp := range d.model.GetSpec().GetProperties() {
		modelProps[mp.GetName()] = mp
	}
	oldProps := d.props
	d.props = map[string]*propState{}
	d.order = nil
	for _, dp := range spec.GetSpec().GetProperties() {
		if dp.GetName() == "" || d.props[dp.GetName()] != nil {
			continue
		}
		ps := &propState{}
		if old := oldProps[dp.GetName()]; old != nil {
			*ps = propState{value: old.value, hasValue: old.hasValue, readAt: old.readAt, reported: old.reported,
				hasReported: old.hasReported, reportedAt: old.reportedAt, reportedErr: old.reportedErr,
				reportedDesiredErr: old.reportedDesiredErr, desiredErr: old.desiredErr,
				appliedKey: old.appliedKey, observed: old.observed, observedSent: old.observedSent,
				pushed: old.pushed, hasPushed: old.hasPushed, pushedAt: old.pushedAt}
		}
		ps.p, ps.bad = d.prepare(dp, modelProps[dp.GetName()])
		if dp.GetPushMethod() != nil {
			var err error
			if ps.sinks, err = d.m.sinks.targets(d.m.runCtx, d.ns, d.name, dp.GetName(), dp.GetPushMethod()); err != nil {
				d.log.Info("the property's pushMethod is not used", "property", dp.GetName(), "err", err)
			}
		}
		if ps.bad != nil {
			ps.readErr = ps.bad.Error()
			ps.dirty = ps.reportedErr != ps.readErr || !ps.hasReported
			d.log.Info("property is invalid; it is not read", "property", dp.GetName(), "err", ps.bad)
		}
		d.props[dp.GetName()] = ps
		d.order = append(d.order, ps)
	}
	// The new properties hold their sinks: a sink both use stays up.
	for _, old := range oldProps {
		d.m.sinks.release(old.sinks)
	}
	d.takeDesired(spec, at)
	d.regroup()
}

func (d *device) prepare(dp *dmiv1beta1.DeviceProperty, mp *dmiv1beta1.ModelProperty) (*Property, error) {
	p := &Property{Name: dp.GetName(), Type: twinvalue.String, VisitorProtocol: dp.GetVisitors().GetProtocolName()}
	if mp == nil {
		return p, fmt.Errorf("property %q is not in device model %q", dp.GetName(), d.model.GetName())
	}
	var err error
	if p.Type, err = twinvalue.ParseType(mp.GetType()); err != nil {
		return p, err
	}
	p.model = twinvalue.Property{Name: p.Name, Type: p.Type, AccessMode: twinvalue.AccessMode(mp.GetAccessMode()),
		Minimum: mp.GetMinimum(), Maximum: mp.GetMaximum()}
	p.Writable = p.model.AccessMode == twinvalue.ReadWrite
	if p.Min, p.Max, err = p.model.Range(); err != nil {
		return p, err
	}
	if p.Visitor, err = DecodeConfig(dp.GetVisitors().GetConfigData()); err != nil {
		return p, fmt.Errorf("visitor: %w", err)
	}
	if p.Transform, err = ParseTransform(p.Visitor); err != nil {
		return p, fmt.Errorf("visitor: %w", err)
	}
	if p.Deadband, err = p.Visitor.Float("deadband", 0); err != nil || p.Deadband < 0 {
		return p, fmt.Errorf("visitor: deadband must be a number, zero or more")
	}
	if p.Subscribe, err = p.Visitor.Bool("subscribe", false); err != nil {
		return p, fmt.Errorf("visitor: %w", err)
	}
	p.CollectCycle = time.Duration(dp.GetCollectCycle()) * time.Millisecond
	if p.CollectCycle <= 0 {
		p.CollectCycle = d.m.cfg.DefaultCollectCycle
	}
	p.ReportCycle = time.Duration(dp.GetReportCycle()) * time.Millisecond
	if p.Subscribe {
		if _, ok := d.driver.(Subscriber); !ok {
			return p, fmt.Errorf("visitor asks to subscribe, but the %s mapper cannot subscribe", d.m.cfg.Protocol)
		}
	}
	if d.driver != nil {
		if err := d.driver.Prepare(p); err != nil {
			return p, fmt.Errorf("visitor: %w", err)
		}
	}
	p.Visitor = nil
	return p, nil
}

// takeDesired notes the spec's desired values; applyDesired writes new ones.
func (d *device) takeDesired(spec *dmiv1beta1.Device, at time.Time) {
	for _, dp := range spec.GetSpec().GetProperties() {
		ps := d.props[dp.GetName()]
		if ps == nil {
			continue
		}
		des := dp.GetDesired()
		if des == nil || (des.GetValue() == "" && ps.p.Type != twinvalue.String) {
			ps.desired, ps.desiredKey = nil, ""
		} else {
			key := des.GetValue() + "\x00" + des.GetMetadata()[twinvalue.MetaTimestamp]
			if key != ps.desiredKey && key != ps.appliedKey {
				ps.desiredAt = at
			}
			ps.desired, ps.desiredKey = des, key
		}
		if ps.desiredErr != "" && (ps.desired == nil || ps.desiredKey == ps.appliedKey) {
			// The failed value is no longer wanted.
			ps.desiredErr, ps.dirty = "", true
		}
	}
}

// updateSnap records the spec served for GetDevice.
func (d *device) updateSnap(spec *dmiv1beta1.Device) {
	b, err := proto.Marshal(spec)
	if err != nil {
		b = nil // cannot fail for a message that was unmarshalled
	}
	d.mu.Lock()
	d.snapSpec = b
	d.mu.Unlock()
}
