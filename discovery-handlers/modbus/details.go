package modbus

import (
	"math"
	"regexp"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/dowse-dev/dowse/shared/handler"
)

// Device properties, handed to brokers as environment variables. The
// identification ones are set only when the device answered Read Device
// Identification with that object.
const (
	AddressProperty             = "MODBUS_TCP_ADDRESS" // host:port
	UnitIDProperty              = "MODBUS_UNIT_ID"
	VendorNameProperty          = "MODBUS_VENDOR_NAME"
	ProductCodeProperty         = "MODBUS_PRODUCT_CODE"
	RevisionProperty            = "MODBUS_REVISION"
	VendorURLProperty           = "MODBUS_VENDOR_URL"
	ProductNameProperty         = "MODBUS_PRODUCT_NAME"
	ModelNameProperty           = "MODBUS_MODEL_NAME"
	UserApplicationNameProperty = "MODBUS_USER_APPLICATION_NAME"
	SerialNumberProperty        = "MODBUS_SERIAL_NUMBER"
)

// Probe functions.
const (
	HoldingRegisters     = "holdingRegisters"
	InputRegisters       = "inputRegisters"
	DeviceIdentification = "deviceIdentification"
)

// Defaults and bounds of Details.
const (
	DefaultPort       = 502
	DefaultMaxTargets = 1024
	MaxMaxTargets     = 65536
	DefaultTimeout    = time.Second
	// MinDefaultConcurrency is the least of the default bound on probes
	// in flight, which otherwise is what the rate and the timeout need
	// (Details.Concurrency).
	MinDefaultConcurrency   = 16
	MaxConcurrency          = 256
	DefaultProbesPerSecond  = 100
	MaxProbesPerSecond      = 1000
	DefaultRescanInterval   = 30 * time.Second
	MinRescanInterval       = 100 * time.Millisecond
	DefaultFailureThreshold = 2
	// MaxBackoffRounds caps the exponential backoff of a target that times
	// out: it is probed at least every MaxBackoffRounds rounds.
	MaxBackoffRounds = 16
)

// identificationFields names the identification objects in match and in
// properties, by object id (Modbus Application Protocol 6.21). The serial
// number has no standard object; probe.serialObjectId names a private one.
var identificationFields = map[string]byte{
	"vendorName":          0x00,
	"productCode":         0x01,
	"revision":            0x02,
	"vendorUrl":           0x03,
	"productName":         0x04,
	"modelName":           0x05,
	"userApplicationName": 0x06,
}

const serialNumberField = "serialNumber"

var identificationProperties = map[byte]string{
	0x00: VendorNameProperty,
	0x01: ProductCodeProperty,
	0x02: RevisionProperty,
	0x03: VendorURLProperty,
	0x04: ProductNameProperty,
	0x05: ModelNameProperty,
	0x06: UserApplicationNameProperty,
}

// Details are a Configuration's discoveryDetails for Modbus TCP, e.g.
//
//	targets: ["10.0.4.0/24", "plc-7.plant.local:5020"]
//	unitIds: [1, 2]
//	probe: {function: holdingRegisters, address: 0, count: 2}
//	match: {registers: [{offset: 0, equals: 4711}]}
type Details struct {
	// Targets are "host:port", "host" (on each of Ports) or an IPv4/IPv6
	// CIDR range (every host address in it, on each of Ports). Required.
	Targets []string `json:"targets"`
	// Ports are the ports of targets given without one. Default [502].
	Ports []int `json:"ports,omitempty"`
	// MaxTargets refuses details whose targets expand to more host:port
	// pairs than this. Default 1024, at most 65536.
	MaxTargets int `json:"maxTargets,omitempty"`
	// UnitIDs are the unit ids to probe on each target, 0-255. Default [1].
	UnitIDs []int `json:"unitIds,omitempty"`
	// Probe is the request a device must answer.
	Probe Probe `json:"probe,omitempty"`
	// Match, when set, keeps only devices whose probed values or
	// identification pass it.
	Match *Match `json:"match,omitempty"`
	// Timeout bounds the connection and each request, a Go duration.
	// Default 1s.
	Timeout string `json:"timeout,omitempty"`
	// Concurrency bounds the targets probed at once. A silent address
	// holds a slot for the whole timeout, so the default is what lets
	// probesPerSecond pace a scan of silent addresses: probesPerSecond ×
	// timeout + 1, at least 16; at most 256.
	Concurrency int `json:"concurrency,omitempty"`
	// ProbesPerSecond bounds the connection attempts per second of one
	// Configuration. Default 100, at most 1000.
	ProbesPerSecond int `json:"probesPerSecond,omitempty"`
	// RescanInterval is the pause between the end of a round and the next.
	// Default 30s, at least 100ms.
	RescanInterval string `json:"rescanInterval,omitempty"`
	// FailureThreshold is how many rounds in a row a known device must go
	// unanswered before it is dropped. Default 2.
	FailureThreshold int `json:"failureThreshold,omitempty"`

	targets  []string // expanded host:port pairs, in order
	timeout  time.Duration
	interval time.Duration
	idMatch  map[byte]*regexp.Regexp
	serialRe *regexp.Regexp
}

// Probe is the request that tells a device is there.
type Probe struct {
	// Function is holdingRegisters (the default), inputRegisters or
	// deviceIdentification (function 43/14).
	Function string `json:"function,omitempty"`
	// Address is the first register to read, 0-65535.
	Address int `json:"address,omitempty"`
	// Count is the number of registers to read, 1-125. Default 1.
	Count int `json:"count,omitempty"`
	// Identify also asks a device that answered a register probe for its
	// identification; a device that does not support it is still a device.
	Identify bool `json:"identify,omitempty"`
	// SerialObjectID is the private identification object (128-255) in
	// which the device keeps its serial number. With a vendor name,
	// product code and serial the device id is vendor/product/serial, which
	// survives an address change; otherwise it is host:port/unit.
	SerialObjectID *int `json:"serialObjectId,omitempty"`
}

// Match keeps only the devices whose answers pass every condition.
type Match struct {
	// Registers are conditions on the probed registers.
	Registers []RegisterMatch `json:"registers,omitempty"`
	// Identification maps identification fields (vendorName, productCode,
	// revision, vendorUrl, productName, modelName, userApplicationName,
	// serialNumber) to RE2 regular expressions the value must match.
	Identification map[string]string `json:"identification,omitempty"`
}

// RegisterMatch is a condition on one probed register, read as an unsigned
// 16-bit value.
type RegisterMatch struct {
	// Offset is the register's index in the probed block (0 is
	// probe.address).
	Offset int  `json:"offset"`
	Equals *int `json:"equals,omitempty"`
	Min    *int `json:"min,omitempty"`
	Max    *int `json:"max,omitempty"`
}

func (m RegisterMatch) accepts(v uint16) bool {
	x := int(v)
	return (m.Equals == nil || x == *m.Equals) && (m.Min == nil || x >= *m.Min) && (m.Max == nil || x <= *m.Max)
}

// AddressList returns the expanded host:port targets, in order.
func (d *Details) AddressList() []string { return d.targets }

// ProbeTimeout returns the parsed timeout.
func (d *Details) ProbeTimeout() time.Duration { return d.timeout }

// Interval returns the parsed rescan interval.
func (d *Details) Interval() time.Duration { return d.interval }

// ParseDetails parses and validates discovery_details (JSON or YAML), fills
// in defaults and expands the targets. Unknown fields are errors. Its errors
// are InvalidArgument statuses naming the bad field, ready to return from
// Discover.
func ParseDetails(s string) (*Details, error) {
	var d Details
	if err := yaml.UnmarshalStrict([]byte(s), &d); err != nil {
		return nil, handler.InvalidDetails("%v", err)
	}
	if err := d.defaultAndValidate(); err != nil {
		return nil, err
	}
	return &d, nil
}

func (d *Details) defaultAndValidate() error {
	if d.MaxTargets == 0 {
		d.MaxTargets = DefaultMaxTargets
	}
	if d.MaxTargets < 0 || d.MaxTargets > MaxMaxTargets {
		return handler.InvalidDetails("maxTargets: %d is not between 1 and %d", d.MaxTargets, MaxMaxTargets)
	}
	if len(d.Ports) == 0 {
		d.Ports = []int{DefaultPort}
	}
	for i, p := range d.Ports {
		if p < 1 || p > 65535 {
			return handler.InvalidDetails("ports[%d]: %d is not a TCP port", i, p)
		}
	}
	if len(d.Targets) == 0 {
		return handler.InvalidDetails("targets: at least one target is required")
	}
	if err := d.expandTargets(); err != nil {
		return err
	}

	if len(d.UnitIDs) == 0 {
		d.UnitIDs = []int{1}
	}
	seenUnit := map[int]int{}
	for i, u := range d.UnitIDs {
		if u < 0 || u > 255 {
			return handler.InvalidDetails("unitIds[%d]: %d is not between 0 and 255", i, u)
		}
		if j, dup := seenUnit[u]; dup {
			return handler.InvalidDetails("unitIds[%d]: %d duplicates unitIds[%d]", i, u, j)
		}
		seenUnit[u] = i
	}

	var err error
	if d.idMatch, d.serialRe, err = validateProbe(&d.Probe, d.Match); err != nil {
		return err
	}
	if d.timeout, err = handler.ParseDuration("timeout", d.Timeout, DefaultTimeout, time.Millisecond); err != nil {
		return err
	}
	if d.interval, err = handler.ParseDuration("rescanInterval", d.RescanInterval, DefaultRescanInterval, MinRescanInterval); err != nil {
		return err
	}
	if err := handler.ParseInt("probesPerSecond", &d.ProbesPerSecond, DefaultProbesPerSecond, MaxProbesPerSecond); err != nil {
		return err
	}
	if err := handler.ParseInt("concurrency", &d.Concurrency, handler.PacedConcurrency(d.ProbesPerSecond, d.timeout, MinDefaultConcurrency, MaxConcurrency), MaxConcurrency); err != nil {
		return err
	}
	return handler.ParseInt("failureThreshold", &d.FailureThreshold, DefaultFailureThreshold, 1000)
}

// expandTargets turns Targets into host:port pairs (handler.ExpandTargets).
func (d *Details) expandTargets() error {
	hps, err := handler.ExpandTargets(d.Targets, d.Ports, d.MaxTargets, "TCP")
	if err != nil {
		return err
	}
	d.targets = make([]string, len(hps))
	for i, hp := range hps {
		d.targets[i] = hp.String()
	}
	return nil
}

// validateProbe checks and defaults a probe and its match, for TCP and RTU
// alike, and compiles the match's identification expressions.
func validateProbe(p *Probe, m *Match) (idMatch map[byte]*regexp.Regexp, serialRe *regexp.Regexp, err error) {
	switch p.Function {
	case "":
		p.Function = HoldingRegisters
	case HoldingRegisters, InputRegisters, DeviceIdentification:
	default:
		return nil, nil, handler.InvalidDetails("probe.function: %q is not one of %s, %s, %s", p.Function, HoldingRegisters, InputRegisters, DeviceIdentification)
	}
	if p.Function == DeviceIdentification {
		if p.Address != 0 || p.Count != 0 {
			return nil, nil, handler.InvalidDetails("probe.address/probe.count: not used by %s", DeviceIdentification)
		}
		p.Identify = true
	} else {
		if p.Count == 0 {
			p.Count = 1
		}
		if p.Count < 1 || p.Count > 125 {
			return nil, nil, handler.InvalidDetails("probe.count: %d is not between 1 and 125", p.Count)
		}
		if p.Address < 0 || p.Address+p.Count > 65536 {
			return nil, nil, handler.InvalidDetails("probe.address: %d (with count %d) is outside 0-65535", p.Address, p.Count)
		}
	}
	if p.SerialObjectID != nil {
		if *p.SerialObjectID < 0x80 || *p.SerialObjectID > 0xFF {
			return nil, nil, handler.InvalidDetails("probe.serialObjectId: %d is not a private object id (128-255)", *p.SerialObjectID)
		}
		if !p.Identify {
			return nil, nil, handler.InvalidDetails("probe.serialObjectId: needs probe.identify or function %s", DeviceIdentification)
		}
	}

	if m != nil {
		for i, r := range m.Registers {
			if p.Function == DeviceIdentification {
				return nil, nil, handler.InvalidDetails("match.registers: the %s probe reads no registers", DeviceIdentification)
			}
			if r.Offset < 0 || r.Offset >= p.Count {
				return nil, nil, handler.InvalidDetails("match.registers[%d].offset: %d is outside the %d probed registers", i, r.Offset, p.Count)
			}
			if r.Equals == nil && r.Min == nil && r.Max == nil {
				return nil, nil, handler.InvalidDetails("match.registers[%d]: needs equals, min or max", i)
			}
			for name, v := range map[string]*int{"equals": r.Equals, "min": r.Min, "max": r.Max} {
				if v != nil && (*v < 0 || *v > math.MaxUint16) {
					return nil, nil, handler.InvalidDetails("match.registers[%d].%s: %d is not between 0 and 65535", i, name, *v)
				}
			}
		}
		for field, expr := range m.Identification {
			if !p.Identify {
				return nil, nil, handler.InvalidDetails("match.identification: needs probe.identify or function %s", DeviceIdentification)
			}
			re, err := regexp.Compile(expr)
			if err != nil {
				return nil, nil, handler.InvalidDetails("match.identification.%s: %v", field, err)
			}
			if field == serialNumberField {
				if p.SerialObjectID == nil {
					return nil, nil, handler.InvalidDetails("match.identification.serialNumber: needs probe.serialObjectId")
				}
				serialRe = re
				continue
			}
			id, ok := identificationFields[field]
			if !ok {
				return nil, nil, handler.InvalidDetails("match.identification.%s: not an identification field", field)
			}
			if idMatch == nil {
				idMatch = map[byte]*regexp.Regexp{}
			}
			idMatch[id] = re
		}
	}

	return idMatch, serialRe, nil
}

// check is what a unit's probe needs of its details.
type check struct {
	probe    *Probe
	match    *Match
	idMatch  map[byte]*regexp.Regexp
	serialRe *regexp.Regexp
}

func (d *Details) check() *check {
	return &check{probe: &d.Probe, match: d.Match, idMatch: d.idMatch, serialRe: d.serialRe}
}
