package modbus

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/dowse-dev/dowse/discovery-handlers/udev"
	"github.com/dowse-dev/dowse/shared/handler"
)

// Properties of a Modbus RTU device, beside UnitIDProperty and the
// identification ones: the serial line it answered on, in the mapper's
// terms (its serialPort, baudRate, dataBits, parity and stopBits).
const (
	SerialPortProperty = "MODBUS_SERIAL_PORT"
	BaudRateProperty   = "MODBUS_BAUD_RATE"
	DataBitsProperty   = "MODBUS_DATA_BITS"
	ParityProperty     = "MODBUS_PARITY" // none, even or odd
	StopBitsProperty   = "MODBUS_STOP_BITS"
)

// Defaults and bounds of RTUDetails.
const (
	DefaultRTUBaudRate = 19200
	// DefaultFraming is the Modbus serial line default: 8 data bits, even
	// parity, 1 stop bit.
	DefaultFraming       = "8E1"
	DefaultMaxPorts      = 8
	MaxMaxPorts          = 64
	DefaultMaxUnitIDs    = 32
	MaxRTUUnitID         = 247 // 0 is broadcast, 248-255 are reserved
	MaxBaudRates         = 8
	MaxFramings          = 6
	DefaultRTUTimeout    = 300 * time.Millisecond
	MaxRTUTimeout        = 10 * time.Second
	DefaultRTURescan     = time.Minute
	MaxRTUProbesPerRound = 4096
)

// rtuBaudRates are the speeds a serial port can be set to (termios'
// standard rates from 300 baud).
var rtuBaudRates = []int{300, 600, 1200, 2400, 4800, 9600, 19200, 38400, 57600, 115200, 230400, 460800, 500000, 576000, 921600, 1000000}

// RTUDetails are a Configuration's discoveryDetails for Modbus RTU (the
// modbus-rtu handler), e.g.
//
//	serialPorts: ["/dev/serial/by-id/usb-FTDI_*"]
//	udevRules: ['SUBSYSTEM=="tty", ENV{ID_VENDOR_ID}=="0403"']
//	baudRates: [9600, 19200]
//	framings: ["8E1", "8N2"]
//	unitIds: [1, "10-20"]
//	probe: {function: holdingRegisters, address: 0, count: 2}
//	match: {registers: [{offset: 0, equals: 4711}]}
type RTUDetails struct {
	// SerialPorts are device paths or shell patterns of them
	// (/dev/ttyUSB*, /dev/serial/by-id/*), probed as they are named.
	SerialPorts []string `json:"serialPorts,omitempty"`
	// UdevRules select serial ports by their udev properties: each is a
	// rule's match keys in udev syntax, as the udev handler takes them,
	// tested against the node's tty devices; a device that any rule
	// accepts is probed at its device node. SerialPorts or UdevRules (or
	// both) are required.
	UdevRules []string `json:"udevRules,omitempty"`
	// MaxPorts bounds the ports probed; the ports past it (in name order)
	// are skipped and said so. Default 8, at most 64.
	MaxPorts int `json:"maxPorts,omitempty"`
	// BaudRates are the speeds to try, in order. Default [19200].
	BaudRates []int `json:"baudRates,omitempty"`
	// Framings are the data bits, parity (N, E or O) and stop bits to try
	// at each speed, e.g. "8E1" (the default), "8N1", "8N2". At most 6.
	Framings []string `json:"framings,omitempty"`
	// UnitIDs are the unit ids to probe, 1-247: numbers and "from-to"
	// ranges. Default [1].
	UnitIDs UnitIDs `json:"unitIds,omitempty"`
	// MaxUnitIDs refuses details whose unit ids are more than this.
	// Default 32, at most 247.
	MaxUnitIDs int `json:"maxUnitIds,omitempty"`
	// Probe is the request a device must answer, as for Modbus TCP.
	Probe Probe `json:"probe,omitempty"`
	// Match keeps only the devices whose answers pass it, as for Modbus
	// TCP.
	Match *Match `json:"match,omitempty"`
	// Timeout bounds each request, a Go duration. A unit that does not
	// answer costs this much. Default 300ms, at most 10s.
	Timeout string `json:"timeout,omitempty"`
	// RescanInterval is the pause between the end of a round and the next.
	// Default 1m, at least 100ms.
	RescanInterval string `json:"rescanInterval,omitempty"`
	// FailureThreshold is how many rounds in a row a known device must go
	// unanswered before it is dropped. Default 2.
	FailureThreshold int `json:"failureThreshold,omitempty"`

	settings []lineSettings
	units    []int
	rules    []udev.Rule
	timeout  time.Duration
	interval time.Duration
	chk      *check
}

// UnitIDs are unit ids given as numbers or "from-to" ranges.
type UnitIDs []UnitIDEntry

// UnitIDEntry is one number or range of UnitIDs.
type UnitIDEntry struct {
	From, To int
}

// UnmarshalJSON reads a number or a "from-to" string.
func (e *UnitIDEntry) UnmarshalJSON(b []byte) error {
	var n int
	if err := json.Unmarshal(b, &n); err == nil {
		e.From, e.To = n, n
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("a unit id is a number or a \"from-to\" range, not %s", b)
	}
	from, to, ok := strings.Cut(s, "-")
	var err1, err2 error
	e.From, err1 = strconv.Atoi(strings.TrimSpace(from))
	e.To, err2 = strconv.Atoi(strings.TrimSpace(to))
	if !ok || err1 != nil || err2 != nil {
		return fmt.Errorf("unit id range %q is not \"from-to\"", s)
	}
	return nil
}

// MarshalJSON writes a number or a "from-to" string.
func (e UnitIDEntry) MarshalJSON() ([]byte, error) {
	if e.From == e.To {
		return json.Marshal(e.From)
	}
	return json.Marshal(fmt.Sprintf("%d-%d", e.From, e.To))
}

// lineSettings are one way to speak on a serial line.
type lineSettings struct {
	baud     int
	dataBits int
	parity   string // N, E or O, as goburrow/serial takes it
	stopBits int
}

func (l lineSettings) String() string {
	return fmt.Sprintf("%d %d%s%d", l.baud, l.dataBits, l.parity, l.stopBits)
}

// parityName is the mapper's name of a parity.
func (l lineSettings) parityName() string {
	switch l.parity {
	case "E":
		return "even"
	case "O":
		return "odd"
	}
	return "none"
}

var framingRe = regexp.MustCompile(`^([78])([NEO])([12])$`)

// Units returns the expanded unit ids, in order.
func (d *RTUDetails) Units() []int { return d.units }

// ParseRTUDetails parses and validates a modbus-rtu Configuration's
// discovery_details (JSON or YAML) and fills in defaults. Unknown fields are
// errors. Its errors are InvalidArgument statuses naming the bad field.
func ParseRTUDetails(s string) (*RTUDetails, error) {
	var d RTUDetails
	if err := yaml.UnmarshalStrict([]byte(s), &d); err != nil {
		return nil, handler.InvalidDetails("%v", err)
	}
	if err := d.defaultAndValidate(); err != nil {
		return nil, err
	}
	return &d, nil
}

func (d *RTUDetails) defaultAndValidate() error {
	if len(d.SerialPorts) == 0 && len(d.UdevRules) == 0 {
		return handler.InvalidDetails("serialPorts, udevRules: name serial ports, or udev rules that select them")
	}
	for i, p := range d.SerialPorts {
		if !strings.HasPrefix(p, "/dev/") {
			return handler.InvalidDetails("serialPorts[%d]: %q is not a device path under /dev/", i, p)
		}
		if _, err := filepath.Match(p, ""); err != nil {
			return handler.InvalidDetails("serialPorts[%d]: %q: %v", i, p, err)
		}
	}
	for i, text := range d.UdevRules {
		r, err := udev.ParseRule(i, text)
		if err != nil {
			return handler.InvalidDetails("udevRules[%d]: %v", i, err)
		}
		d.rules = append(d.rules, r)
	}
	if err := handler.ParseInt("maxPorts", &d.MaxPorts, DefaultMaxPorts, MaxMaxPorts); err != nil {
		return err
	}

	if len(d.BaudRates) == 0 {
		d.BaudRates = []int{DefaultRTUBaudRate}
	}
	if len(d.BaudRates) > MaxBaudRates {
		return handler.InvalidDetails("baudRates: %d speeds, at most %d", len(d.BaudRates), MaxBaudRates)
	}
	for i, b := range d.BaudRates {
		if !slices.Contains(rtuBaudRates, b) {
			return handler.InvalidDetails("baudRates[%d]: %d is not one of %v", i, b, rtuBaudRates)
		}
		if j := slices.Index(d.BaudRates, b); j < i {
			return handler.InvalidDetails("baudRates[%d]: %d duplicates baudRates[%d]", i, b, j)
		}
	}
	if len(d.Framings) == 0 {
		d.Framings = []string{DefaultFraming}
	}
	if len(d.Framings) > MaxFramings {
		return handler.InvalidDetails("framings: %d framings, at most %d", len(d.Framings), MaxFramings)
	}
	for i, f := range d.Framings {
		m := framingRe.FindStringSubmatch(strings.ToUpper(f))
		if m == nil {
			return handler.InvalidDetails("framings[%d]: %q is not data bits (7 or 8), parity (N, E or O) and stop bits (1 or 2), e.g. 8E1", i, f)
		}
		if j := slices.IndexFunc(d.Framings, func(g string) bool { return strings.EqualFold(f, g) }); j < i {
			return handler.InvalidDetails("framings[%d]: %q duplicates framings[%d]", i, f, j)
		}
	}
	for _, b := range d.BaudRates {
		for _, f := range d.Framings {
			m := framingRe.FindStringSubmatch(strings.ToUpper(f))
			d.settings = append(d.settings, lineSettings{baud: b, dataBits: int(m[1][0] - '0'), parity: m[2], stopBits: int(m[3][0] - '0')})
		}
	}

	if err := handler.ParseInt("maxUnitIds", &d.MaxUnitIDs, DefaultMaxUnitIDs, MaxRTUUnitID); err != nil {
		return err
	}
	if len(d.UnitIDs) == 0 {
		d.UnitIDs = UnitIDs{{1, 1}}
	}
	seen := map[int]int{}
	for i, e := range d.UnitIDs {
		if e.From < 1 || e.To > MaxRTUUnitID || e.From > e.To {
			return handler.InvalidDetails("unitIds[%d]: %d-%d is not within 1-%d", i, e.From, e.To, MaxRTUUnitID)
		}
		for u := e.From; u <= e.To; u++ {
			if j, dup := seen[u]; dup {
				return handler.InvalidDetails("unitIds[%d]: %d is already in unitIds[%d]", i, u, j)
			}
			seen[u] = i
			d.units = append(d.units, u)
		}
		if len(d.units) > d.MaxUnitIDs {
			return handler.InvalidDetails("unitIds: more than maxUnitIds (%d) unit ids", d.MaxUnitIDs)
		}
	}
	if n := len(d.settings) * len(d.units); n > MaxRTUProbesPerRound {
		return handler.InvalidDetails("baudRates, framings, unitIds: %d probes of a port a round, at most %d", n, MaxRTUProbesPerRound)
	}

	idMatch, serialRe, err := validateProbe(&d.Probe, d.Match)
	if err != nil {
		return err
	}
	d.chk = &check{probe: &d.Probe, match: d.Match, idMatch: idMatch, serialRe: serialRe}
	if d.timeout, err = handler.ParseDuration("timeout", d.Timeout, DefaultRTUTimeout, 10*time.Millisecond); err != nil {
		return err
	}
	if d.timeout > MaxRTUTimeout {
		return handler.InvalidDetails("timeout: %v is more than %v", d.timeout, MaxRTUTimeout)
	}
	if d.interval, err = handler.ParseDuration("rescanInterval", d.RescanInterval, DefaultRTURescan, MinRescanInterval); err != nil {
		return err
	}
	return handler.ParseInt("failureThreshold", &d.FailureThreshold, DefaultFailureThreshold, 1000)
}
