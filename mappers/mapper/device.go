package mapper

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"

	dmiv1beta1 "github.com/dowse-dev/dowse/proto/dmi/v1beta1"
	"github.com/dowse-dev/dowse/shared/twinvalue"
)

// ErrDisconnected, wrapped in a driver's error, says the connection is gone
// (reset, closed by the peer): the SDK reconnects at once instead of after
// UnhealthyAfter failed rounds.
var ErrDisconnected = errors.New("connection lost")

// ErrDeviceOffline, wrapped in an error a Subscriber pushes, says the
// device itself announced that it is gone while the connection that told
// it is fine (an MQTT Sparkplug death certificate: the broker is up, the
// device behind it is not). The SDK reports the device offline, with the
// error on every property it is pushed for, neither reconnects nor counts
// it as a failed exchange, and reports the device ok again with its next
// good value (also across a reconnect).
var ErrDeviceOffline = errors.New("the device is offline")

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

	// Sinks of its pushMethod, and what was last pushed to them.
	sinks     []sinkTarget
	pushed    string
	hasPushed bool
	pushedAt  time.Time
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
	offlineErr   error // the driver pushed ErrDeviceOffline; a good value clears it
	stateSent    string
	stateErr     string
	subCancel    context.CancelFunc
	resubAt      time.Time     // when to subscribe again (an item failed)
	flushRetryAt time.Time     // heartbeats wait for it while reports fail
	flushDelay   time.Duration // backoff of flushRetryAt
	resubDelay   time.Duration // backoff of resubAt
	auth         bool          // the last login was refused (device_auth.go)
	authBackoff  time.Duration
	authWant     *authCond // the Authenticated condition to tell
	authSent     *authCond // the last one told
	credDigest   string    // of the credential files at the refused login
	flushTwins   []*dmiv1beta1.Twin
	flushSent    []*propState
	flushReq     *dmiv1beta1.ReportDeviceStatusRequest
	pushBuf      []byte      // a reading's payload, copied by each sink
	waitTimer    *time.Timer // wait's, reused
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

func (d *device) stop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.stopped = true
	if d.cancelRun != nil {
		d.cancelRun()
	}
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
	defer d.releaseSinks()
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
				d.sendAuth(ctx)
				d.flush(ctx, time.Now())
				if d.auth {
					d.waitAuth(ctx)
					continue
				}
				d.wait(ctx, time.Now().Add(d.backoff))
				d.backoff = min(d.backoff*2, d.m.cfg.ReconnectMax)
				continue
			}
			d.sendAuth(ctx)
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

func (d *device) callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, d.m.cfg.CallTimeout)
}
