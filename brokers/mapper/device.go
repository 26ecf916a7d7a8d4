package mapper

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	dmiv1beta1 "github.com/dowse-dev/dowse/proto/dmi/v1beta1"
	"github.com/dowse-dev/dowse/shared/twinvalue"
)

// ErrDisconnected, wrapped in a driver's error, says the connection is gone
// (reset, closed by the peer): the SDK reconnects at once instead of after
// UnhealthyAfter failed rounds.
var ErrDisconnected = errors.New("connection lost")

// propState is one property of a running device.
type propState struct {
	p   *Property
	bad error // from the model or Prepare: never read

	value    string
	hasValue bool
	readAt   time.Time
	readErr  string // last read error, "" after a good read

	reported           string
	hasReported        bool
	reportedErr        string
	reportedDesiredErr string
	reportedAt         time.Time
	dirty              bool // something to report

	desiredErr string // the last desired value's failure, "" once applied

	desired      *dmiv1beta1.TwinProperty
	desiredKey   string    // value and timestamp of the desired value
	desiredAt    time.Time // when a new desired value arrived, until its first write
	appliedKey   string
	failedKey    string // a desired value that failed permanently
	retryAt      time.Time
	observed     *dmiv1beta1.TwinProperty
	observedSent bool
}

type group struct {
	cycle time.Duration
	next  time.Time
	props []*propState
	ps    []*Property // props' Property, handed to the driver every cycle
}

type pending struct {
	dev   *dmiv1beta1.Device
	model *dmiv1beta1.DeviceModel
	at    time.Time // when it was handed over
}

type push struct {
	p   *Property
	v   any
	err error
}

// device runs one device: its goroutine owns everything but mu's fields.
type device struct {
	m         *Mapper
	seq       uint64 // Mapper.seq of its last change; under Mapper.mu
	ns, name  string
	log       logr.Logger
	notify    chan struct{}
	pushes    chan push          // made by the first subscription: most devices never push
	cancelRun context.CancelFunc // under mu
	stopped   bool               // under mu

	mu        sync.Mutex
	next      *pending
	resyncing bool
	// snapSpec is the spec served, marshalled: GetDevice and a model
	// change unmarshal it (both are rare), so no device keeps its spec's
	// messages (about 7 KiB a device of ten properties) for them.
	snapSpec  []byte
	snapProps map[string]snapProp // per property, as of the last flush

	// The goroutine's own.
	hasSpec      bool
	specKeys     specKeys // of the spec served
	model        *dmiv1beta1.DeviceModel
	driver       Driver
	driverErr    error
	connected    bool
	props        map[string]*propState
	order        []*propState
	groups       []*group
	failures     int
	lastErr      error
	backoff      time.Duration
	state        string
	stateSent    string
	stateErr     string
	subCancel    context.CancelFunc
	resubAt      time.Time     // when to subscribe again (an item failed)
	flushRetryAt time.Time     // heartbeats wait for it while reports fail
	flushDelay   time.Duration // backoff of flushRetryAt
	resubDelay   time.Duration // backoff of resubAt
}

func newDevice(m *Mapper, ns, name string) *device {
	return &device{
		m: m, ns: ns, name: name,
		log:    m.log.WithValues("device", key(ns, name)),
		notify: make(chan struct{}, 1),
		props:  map[string]*propState{},
		state:  twinvalue.StateUnknown,
	}
}

func (d *device) wake() {
	select {
	case d.notify <- struct{}{}:
	default:
	}
}

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
	d.next = &pending{dev: cur.dev, model: proto.Clone(mod).(*dmiv1beta1.DeviceModel), at: time.Now()}
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

func (d *device) stop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.stopped = true
	if d.cancelRun != nil {
		d.cancelRun()
	}
}

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
			tw.ObservedDesired = proto.Clone(sp.observed).(*dmiv1beta1.TwinProperty)
		}
		dev.Status.Twins = append(dev.Status.Twins, tw)
	}
	return dev
}

func (d *device) run(parent context.Context) {
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	d.mu.Lock()
	d.cancelRun = cancel
	stopped := d.stopped
	d.mu.Unlock()
	if stopped {
		return
	}
	defer d.closeDriver()
	d.backoff = d.m.cfg.ReconnectInitial
	deferred := false // the last round's report waits for an update's write
	for ctx.Err() == nil {
		d.takePending(ctx)
		if !d.hasSpec {
			d.wait(ctx, time.Time{}) // the first spec is on its way
			continue
		}
		if d.driver == nil {
			d.setState(twinvalue.StateOffline, d.driverErr)
			d.failAll(d.driverErr)
			d.sendState(ctx)
			d.flush(ctx, time.Now())
			d.wait(ctx, time.Time{})
			continue
		}
		if !d.connected {
			if !d.connect(ctx) {
				d.sendState(ctx)
				d.flush(ctx, time.Now())
				d.wait(ctx, time.Now().Add(d.backoff))
				d.backoff = min(d.backoff*2, d.m.cfg.ReconnectMax)
				continue
			}
		}
		now := time.Now()
		if !d.resubAt.IsZero() && !now.Before(d.resubAt) {
			if err := d.subscribe(ctx); err != nil {
				d.failures, d.lastErr = d.m.cfg.UnhealthyAfter, err
			}
		}
		d.applyDesired(ctx, now)
		d.readDue(ctx, now)
		if d.connected && d.failures >= d.m.cfg.UnhealthyAfter {
			d.setState(twinvalue.StateUnhealthy, fmt.Errorf("reads keep failing: %w", d.lastErr))
			d.sendState(ctx)
			d.closeDriver()
		}
		if d.connected && !deferred && d.hasNext() {
			// An update (a desired value, most likely) came during the
			// reads: write it before reporting them, so it never waits for
			// a report's round trip too. Once in a row, so a stream of
			// updates cannot hold reports back.
			deferred = true
			continue
		}
		deferred = false
		d.sendState(ctx)
		d.flush(ctx, time.Now())
		if !d.connected {
			// Dropped as unhealthy: reconnect after the backoff, which
			// only a good read resets (a peer that accepts and fails at
			// once must not be redialled in a loop).
			d.wait(ctx, time.Now().Add(d.backoff))
			d.backoff = min(d.backoff*2, d.m.cfg.ReconnectMax)
			continue
		}
		d.wait(ctx, d.nextDue())
	}
}

// wait sleeps until at (zero: until woken), an update, a push or the end.
func (d *device) wait(ctx context.Context, at time.Time) {
	var timer <-chan time.Time
	if !at.IsZero() {
		dur := time.Until(at)
		if dur <= 0 {
			return
		}
		t := time.NewTimer(dur)
		defer t.Stop()
		timer = t.C
	}
	select {
	case <-ctx.Done():
	case <-d.notify:
	case <-timer:
	case p := <-d.pushes:
		d.handlePush(p)
		// Take whatever else arrived with it before reporting once.
	more:
		for {
			select {
			case p := <-d.pushes:
				d.handlePush(p)
			default:
				break more
			}
		}
	}
}

func (d *device) nextDue() time.Time {
	var at time.Time
	earlier := func(t time.Time) {
		if !t.IsZero() && (at.IsZero() || t.Before(at)) {
			at = t
		}
	}
	for _, g := range d.groups {
		earlier(g.next)
	}
	earlier(d.resubAt)
	for _, ps := range d.order {
		if ps.hasReported && ps.bad == nil {
			// While reports fail, a heartbeat waits for the retry.
			earlier(later(ps.reportedAt.Add(d.reportCycle(ps)), d.flushRetryAt))
		}
		if !ps.retryAt.IsZero() {
			earlier(ps.retryAt)
		}
	}
	return at
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func (d *device) reportCycle(ps *propState) time.Duration {
	if ps.p.ReportCycle > 0 {
		return ps.p.ReportCycle
	}
	return d.m.cfg.DefaultReportCycle
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
	c := proto.Clone(dev).(*dmiv1beta1.Device)
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
				appliedKey: old.appliedKey, observed: old.observed, observedSent: old.observedSent}
		}
		ps.p, ps.bad = d.prepare(dp, modelProps[dp.GetName()])
		if ps.bad != nil {
			ps.readErr = ps.bad.Error()
			ps.dirty = ps.reportedErr != ps.readErr || !ps.hasReported
			d.log.Info("property is invalid; it is not read", "property", dp.GetName(), "err", ps.bad)
		}
		d.props[dp.GetName()] = ps
		d.order = append(d.order, ps)
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

// regroup puts the polled properties into groups by collect cycle.
func (d *device) regroup() {
	byCycle := map[time.Duration]*group{}
	now := time.Now()
	d.groups = nil
	for _, ps := range d.order {
		if ps.bad != nil || ps.p.Subscribe {
			continue
		}
		g := byCycle[ps.p.CollectCycle]
		if g == nil {
			g = &group{cycle: ps.p.CollectCycle, next: now}
			byCycle[g.cycle] = g
			d.groups = append(d.groups, g)
		}
		g.props = append(g.props, ps)
		g.ps = append(g.ps, ps.p)
	}
	slices.SortFunc(d.groups, func(a, b *group) int { return int(a.cycle - b.cycle) })
}

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

func (d *device) callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, d.m.cfg.CallTimeout)
}

func (d *device) connect(ctx context.Context) bool {
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
		}
		return false
	}
	d.connected = true
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
	if d.state != twinvalue.StateUnhealthy {
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

func (d *device) handlePush(p push) {
	ps := d.props[p.p.Name]
	if ps == nil || ps.p != p.p {
		return // from a property since rebuilt
	}
	d.m.cfg.Metrics.read(readResult(p.err), 1)
	d.record(ps, p.v, p.err, time.Now())
	if p.err != nil && d.resubAt.IsZero() {
		// A monitored item the server refused (a node not there yet) or a
		// failed publish: subscribe again later, with backoff.
		if d.resubDelay == 0 {
			d.resubDelay = d.m.cfg.ReconnectInitial
		}
		d.resubAt = time.Now().Add(d.resubDelay)
		d.resubDelay = min(2*d.resubDelay, d.m.cfg.ReconnectMax)
	} else if p.err == nil {
		d.resubDelay = 0
	}
	switch {
	case p.err == nil:
		d.failures = 0
		d.backoff = d.m.cfg.ReconnectInitial
		if d.state == twinvalue.StateUnhealthy {
			d.setState(twinvalue.StateOK, nil)
		}
	case errors.Is(p.err, ErrDisconnected):
		d.failures, d.lastErr = d.m.cfg.UnhealthyAfter, p.err
	case !IsPermanent(p.err):
		d.failures++
		d.lastErr = p.err
	}
}

func readResult(err error) string {
	switch {
	case err == nil:
		return "ok"
	case IsPermanent(err):
		return "invalid"
	}
	return "error"
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

// readDue reads the groups that are due.
func (d *device) readDue(ctx context.Context, now time.Time) {
	if !d.connected {
		return
	}
	attempted, failed := 0, 0
	for _, g := range d.groups {
		if g.next.After(now) {
			continue
		}
		if attempted > 0 && d.hasNext() {
			// An update came: the groups still due are read right after
			// it is applied (their next stays due).
			break
		}
		// The next read keeps to the cycle's grid, skipping missed beats.
		g.next = g.next.Add(g.cycle)
		if !g.next.After(now) {
			g.next = now.Add(g.cycle)
		}
		results := d.read(ctx, g.ps)
		at := time.Now()
		for i, r := range results {
			ps := g.props[i]
			d.record(ps, r.Value, r.Err, at)
			if r.Err == nil || !IsPermanent(r.Err) {
				attempted++
				if r.Err != nil {
					failed++
					d.lastErr = r.Err
					if errors.Is(r.Err, ErrDisconnected) {
						d.failures = d.m.cfg.UnhealthyAfter
					}
				}
			}
		}
		d.m.cfg.Metrics.read("ok", len(results)-countErr(results))
		for _, r := range results {
			if r.Err != nil {
				d.m.cfg.Metrics.read(readResult(r.Err), 1)
			}
		}
		if ctx.Err() != nil {
			return
		}
	}
	if attempted > 0 {
		if failed == attempted {
			d.failures++
		} else {
			d.failures = 0
			d.backoff = d.m.cfg.ReconnectInitial
			if d.state != twinvalue.StateOK {
				d.setState(twinvalue.StateOK, nil)
			}
		}
	}
}

func countErr(rs []Result) int {
	n := 0
	for _, r := range rs {
		if r.Err != nil {
			n++
		}
	}
	return n
}

func (d *device) read(ctx context.Context, props []*Property) []Result {
	cctx, cancel := d.callCtx(ctx)
	defer cancel()
	start := time.Now()
	defer func() { d.m.cfg.Metrics.readTook(time.Since(start)) }()
	if br, ok := d.driver.(BatchReader); ok && len(props) > 1 {
		rs := br.ReadBatch(cctx, props)
		if len(rs) != len(props) {
			rs = make([]Result, len(props))
			for i := range rs {
				rs[i].Err = fmt.Errorf("driver returned %d results for %d properties", len(rs), len(props))
			}
		}
		return rs
	}
	rs := make([]Result, len(props))
	for i, p := range props {
		rs[i].Value, rs[i].Err = d.driver.Read(cctx, p)
	}
	return rs
}

// record takes one reading (or its failure) and marks what is to report.
func (d *device) record(ps *propState, raw any, err error, at time.Time) {
	if ps == nil {
		return
	}
	if err == nil {
		var s string
		s, err = twinvalue.Format(ps.p.Type, ps.p.Transform.Apply(raw))
		if err == nil {
			ps.value, ps.hasValue, ps.readAt, ps.readErr = s, true, at, ""
			if !ps.hasReported || ps.reportedErr != "" || changed(ps.p.Type, ps.reported, s, ps.p.Deadband) {
				ps.dirty = true
			}
			return
		}
		err = Permanent(err)
	}
	if ps.readErr != err.Error() {
		d.log.Info("reading a property failed", "property", ps.p.Name, "err", err)
	}
	ps.readErr = err.Error()
	if ps.reportedErr != ps.readErr {
		ps.dirty = true
	}
}

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
	var twins []*dmiv1beta1.Twin
	var sent []*propState
	for _, ps := range d.order {
		if !ps.hasValue {
			continue
		}
		heartbeat := ps.hasReported && now.Sub(ps.reportedAt) >= d.reportCycle(ps) && !now.Before(d.flushRetryAt)
		if !ps.dirty && !heartbeat && (ps.observed == nil || ps.observedSent) {
			continue
		}
		meta := map[string]string{twinvalue.MetaType: string(ps.p.Type), twinvalue.MetaTimestamp: twinvalue.Timestamp(ps.readAt)}
		if ps.readErr != "" {
			meta[twinvalue.MetaError] = ps.readErr
		}
		if ps.desiredErr != "" {
			meta[twinvalue.MetaDesiredError] = ps.desiredErr
		}
		twins = append(twins, &dmiv1beta1.Twin{PropertyName: ps.p.Name, ObservedDesired: ps.observed,
			Reported: &dmiv1beta1.TwinProperty{Value: ps.value, Metadata: meta}})
		sent = append(sent, ps)
	}
	if len(twins) == 0 || ctx.Err() != nil {
		return
	}
	cctx, cancel := d.callCtx(ctx)
	defer cancel()
	req := &dmiv1beta1.ReportDeviceStatusRequest{
		DeviceName: d.name, DeviceNamespace: d.ns,
		ReportedDevice: &dmiv1beta1.DeviceStatus{Twins: twins, ReportToCloud: true},
	}
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
		// Refused as wrong: sending it again would be refused again.
		d.log.Error(err, "the device manager refused a report; its values are dropped")
	}
	d.flushRetryAt, d.flushDelay = time.Time{}, 0
	for _, ps := range sent {
		ps.dirty = false
		ps.observedSent = true
		ps.reported, ps.hasReported, ps.reportedErr, ps.reportedDesiredErr, ps.reportedAt = ps.value, true, ps.readErr, ps.desiredErr, now
	}
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
