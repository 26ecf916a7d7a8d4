package mapper

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dowse-dev/dowse/shared/twinvalue"
)

// NewDriver makes the Driver of one device from its protocol configuration.
// It must not do I/O (Connect does). An error means the configuration is
// wrong: the device is reported offline with the error and is not retried
// until an UpdateDevice changes it.
type NewDriver func(dev DeviceInfo) (Driver, error)

// DeviceInfo is what a NewDriver is given.
type DeviceInfo struct {
	Name, Namespace string
	// ProtocolName is the device's spec.protocol.protocolName.
	ProtocolName string
	// Protocol is the decoded spec.protocol.configData.
	Protocol Params
}

// Driver talks to one device over one connection. The SDK calls it from a
// single goroutine per device, so a Driver needs no locking of its own,
// except Subscribe's push, which may be called from any goroutine.
//
// Errors: an error wrapped with Permanent (a register past the end, a wrong
// type, a value the device refuses) concerns one property and leaves the
// device's health alone; any other error from Read or Write counts as a
// failed exchange, and after Config.UnhealthyAfter of them in a row the
// device is unhealthy and the SDK reconnects (Close, then Connect with
// backoff). Drivers bound every exchange by a timeout of their own (or ctx's
// deadline), so a peer that hangs costs a timeout, never a stuck device.
type Driver interface {
	// Prepare parses one property's visitor (p.Visitor), may set p.Data
	// for its own use and adjust p.Transform and p.Deadband. It does no
	// I/O. An error marks the property bad: it is reported with the error
	// and never read; the other properties go on.
	Prepare(p *Property) error
	// Connect opens the connection. The SDK calls it again, after Close,
	// to reconnect.
	Connect(ctx context.Context) error
	// Read returns a raw value of p (int64, uint64, float64, bool, string
	// or []byte).
	Read(ctx context.Context, p *Property) (any, error)
	// Write writes a raw value (after the inverse transform) to p.
	Write(ctx context.Context, p *Property, v any) error
	// Close ends the connection; it is called before a reconnect and when
	// the device is removed.
	Close() error
}

// BatchReader is implemented by drivers that read several properties in
// fewer exchanges (Modbus: one request for adjacent registers). The SDK
// hands it every property due at one time, all with the same collect
// cycle; it returns one Result per property, in order. ps is the SDK's:
// the same slice comes back every cycle until the properties change (a
// driver may key a cached request plan on it), and must not be modified.
type BatchReader interface {
	ReadBatch(ctx context.Context, ps []*Property) []Result
}

// Result is one property's reading.
type Result struct {
	Value any
	Err   error
}

// Subscriber is implemented by drivers of protocols that push values (OPC
// UA monitored items). Properties whose visitor says "subscribe": true are
// not polled: after each Connect the SDK calls Subscribe with them; push
// may be called from any goroutine until ctx ends (at Close or removal).
// Subscribe returns once the subscription is set up.
type Subscriber interface {
	Subscribe(ctx context.Context, ps []*Property, push func(p *Property, v any, err error)) error
}

// Property is one property of a device, as a Driver sees it.
type Property struct {
	Name string
	// Type is the model's property type (twinvalue.Int, ...).
	Type twinvalue.Type
	// Writable is true for ReadWrite properties.
	Writable bool
	// Min and Max bound desired values (model units), when set.
	Min, Max *float64
	// model is the model's property, for the checks of desired values.
	model twinvalue.Property
	// Visitor is the decoded visitors.configData, during Prepare only: the
	// SDK drops it once the property is prepared (a driver keeps what it
	// needs in Data), as a hundred devices' decoded visitors are a
	// mapper's memory.
	Visitor Params
	// VisitorProtocol is visitors.protocolName.
	VisitorProtocol string
	// CollectCycle is the time between reads; ReportCycle the longest time
	// between reports (a heartbeat).
	CollectCycle, ReportCycle time.Duration
	// Transform maps raw readings to the model's value; the SDK reads it
	// from the visitor's "scale" and "offset" before Prepare.
	Transform Transform
	// Deadband: a numeric reading is reported when it moved by more than
	// this since the last report (visitor "deadband"; 0 reports any change).
	Deadband float64
	// Subscribe is true when the property is pushed rather than polled
	// (visitor "subscribe").
	Subscribe bool
	// Data is the driver's own (set in Prepare).
	Data any
}

// PermanentError marks an error about one property's configuration or
// value, as opposed to the connection.
type PermanentError struct{ Err error }

func (e *PermanentError) Error() string { return e.Err.Error() }
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent wraps err as a PermanentError (nil stays nil).
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &PermanentError{Err: err}
}

// Permanentf is Permanent(fmt.Errorf(...)).
func Permanentf(format string, args ...any) error { return Permanent(fmt.Errorf(format, args...)) }

// IsPermanent says whether err is (or wraps) a PermanentError.
func IsPermanent(err error) bool {
	var p *PermanentError
	return errors.As(err, &p)
}
