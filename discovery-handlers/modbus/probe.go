package modbus

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"

	"github.com/goburrow/modbus"
)

// outcome is what one probe of one (target, unit) learnt.
type outcome int

const (
	// noAnswer: nothing definite (refused, timed out, broken reply). A
	// known device counts a failure.
	noAnswer outcome = iota
	// notDevice: the unit answered, with an exception or values that fail
	// the match. A known device is dropped at once.
	notDevice
	// device: the unit answered the probe and passed the match.
	device
)

// unitResult is the probe of one unit id on a target.
type unitResult struct {
	unit    int
	outcome outcome
	ident   map[byte]string // identification objects, when asked and given
	why     string          // what the unit did, when it is no device
}

// targetResult is the probe of one host:port.
type targetResult struct {
	address string
	units   []unitResult
	// slow is set when the target timed out and nothing on it answered:
	// it is backed off rather than probed every round.
	slow bool
	// connectErr is why the connection failed, "" when it did not.
	connectErr string
}

const (
	fcReadDeviceIdentification  = 0x2B
	meiReadDeviceIdentification = 0x0E
	readDevIDBasic              = 0x01
	readDevIDRegular            = 0x02
	readDevIDIndividual         = 0x04
)

// probeTarget connects to one host:port and probes each unit id on one
// connection. A unit that times out costs a new connection for the next, as
// its late answer would otherwise be read as the next unit's.
func probeTarget(d *Details, address string) targetResult {
	res := targetResult{address: address}
	h := modbus.NewTCPClientHandler(address)
	h.Timeout = d.timeout
	// The connection is closed below; goburrow's idle timer would only add
	// a goroutine per target.
	h.IdleTimeout = 0
	defer h.Close()
	if err := h.Connect(); err != nil {
		res.slow = isTimeout(err)
		res.connectErr = err.Error()
		for _, u := range d.UnitIDs {
			res.units = append(res.units, unitResult{unit: u, outcome: noAnswer, why: res.connectErr})
		}
		return res
	}
	timedOut, answered := false, false
	for _, u := range d.UnitIDs {
		r := probeUnit(d.check(), h, func(u byte) { h.SlaveId = u }, u)
		if r.outcome != noAnswer {
			answered = true
		}
		if r.timedOut {
			timedOut = true
			h.Close() // the next Send reconnects
		}
		res.units = append(res.units, r.unitResult)
	}
	res.slow = timedOut && !answered
	return res
}

type unitProbe struct {
	unitResult
	timedOut bool
}

// probeUnit probes one unit id on h (TCP or RTU), setting the unit id
// with setUnit.
func probeUnit(d *check, h modbus.ClientHandler, setUnit func(byte), unit int) unitProbe {
	setUnit(byte(unit))
	r := unitProbe{unitResult: unitResult{unit: unit}}
	p := d.probe
	if p.Function != DeviceIdentification {
		client := modbus.NewClient(h)
		var (
			b   []byte
			err error
		)
		if p.Function == InputRegisters {
			b, err = client.ReadInputRegisters(uint16(p.Address), uint16(p.Count))
		} else {
			b, err = client.ReadHoldingRegisters(uint16(p.Address), uint16(p.Count))
		}
		if err != nil {
			r.outcome, r.timedOut = classify(err)
			r.why = err.Error()
			return r
		}
		if len(b) != 2*p.Count {
			r.why = fmt.Sprintf("a broken answer: %d bytes for %d registers", len(b), p.Count)
			return r // a broken answer proves nothing
		}
		if d.match != nil {
			for _, m := range d.match.Registers {
				if v := binary.BigEndian.Uint16(b[2*m.Offset:]); !m.accepts(v) {
					r.outcome = notDevice
					r.why = fmt.Sprintf("register %d is %d, which fails the match", p.Address+m.Offset, v)
					return r
				}
			}
		}
	}
	if p.Identify {
		ident, err := readIdentification(h, p.SerialObjectID)
		if err != nil {
			if p.Function == DeviceIdentification {
				r.outcome, r.timedOut = classify(err)
				r.why = err.Error()
				return r
			}
			// A register probe already proved the device; identification
			// is a bonus the device may not support. A timeout, though,
			// leaves a late answer on the connection.
			_, r.timedOut = classify(err)
		}
		r.ident = ident
		if !d.identMatches(ident) {
			r.outcome = notDevice
			r.why = fmt.Sprintf("its identification %v fails the match", ident)
			return r
		}
	}
	r.outcome = device
	return r
}

func (d *check) identMatches(ident map[byte]string) bool {
	for id, re := range d.idMatch {
		v, ok := ident[id]
		if !ok || !re.MatchString(v) {
			return false
		}
	}
	if d.serialRe != nil {
		v, ok := ident[byte(*d.probe.SerialObjectID)]
		if !ok || !d.serialRe.MatchString(v) {
			return false
		}
	}
	return true
}

// classify turns a probe error into an outcome: an exception is a definite
// "not this" from a live unit; anything else proves nothing.
func classify(err error) (o outcome, timedOut bool) {
	var mbErr *modbus.ModbusError
	if errors.As(err, &mbErr) {
		// 0x0A/0x0B: a gateway answered for a unit behind it that did not.
		if mbErr.ExceptionCode == modbus.ExceptionCodeGatewayPathUnavailable || mbErr.ExceptionCode == modbus.ExceptionCodeGatewayTargetDeviceFailedToRespond {
			return noAnswer, false
		}
		return notDevice, false
	}
	return noAnswer, isTimeout(err)
}

func isTimeout(err error) bool {
	var ne net.Error
	return (errors.As(err, &ne) && ne.Timeout()) || errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, syscall.ETIMEDOUT)
}

// readIdentification reads the regular identification objects (0-6) with
// Read Device Identification, falling back to the basic ones (0-2) for a
// device that supports only those, and the private serial object when one is
// named. goburrow/modbus v0.1.0 has no function 43, so the request is built
// on its TCP packager and transporter.
func readIdentification(h modbus.ClientHandler, serialObject *int) (map[byte]string, error) {
	objects := map[byte]string{}
	err := readDevIDStream(h, readDevIDRegular, objects)
	var mbErr *modbus.ModbusError
	if errors.As(err, &mbErr) {
		err = readDevIDStream(h, readDevIDBasic, objects)
	}
	if err != nil {
		return nil, err
	}
	if serialObject != nil {
		// A device without the object answers with an exception; the
		// device is still identified, without a serial.
		if _, _, _, err := readDevID(h, readDevIDIndividual, byte(*serialObject), objects); err != nil && !errors.As(err, &mbErr) {
			return objects, err
		}
	}
	return objects, nil
}

// readDevIDStream reads a stream access code to its end, following "more
// follows" for a device whose objects span several answers.
func readDevIDStream(h modbus.ClientHandler, code byte, objects map[byte]string) error {
	next := byte(0)
	for range 16 { // at most 256 objects, so a device that loops is cut short
		more, nextID, _, err := readDevID(h, code, next, objects)
		if err != nil {
			return err
		}
		if !more || nextID <= next {
			return nil
		}
		next = nextID
	}
	return nil
}

func readDevID(h modbus.ClientHandler, code, objectID byte, objects map[byte]string) (more bool, nextID byte, conformity byte, err error) {
	req, err := h.Encode(&modbus.ProtocolDataUnit{
		FunctionCode: fcReadDeviceIdentification,
		Data:         []byte{meiReadDeviceIdentification, code, objectID},
	})
	if err != nil {
		return false, 0, 0, err
	}
	resp, err := h.Send(req)
	if err != nil {
		return false, 0, 0, err
	}
	if err := h.Verify(req, resp); err != nil {
		return false, 0, 0, err
	}
	pdu, err := h.Decode(resp)
	if err != nil {
		return false, 0, 0, err
	}
	return parseDeviceIdentification(pdu, objects)
}

// parseDeviceIdentification reads a Read Device Identification answer's
// objects into objects; more says whether the device has others, from
// nextID on.
func parseDeviceIdentification(pdu *modbus.ProtocolDataUnit, objects map[byte]string) (more bool, nextID byte, conformity byte, err error) {
	if pdu.FunctionCode == fcReadDeviceIdentification|0x80 {
		e := &modbus.ModbusError{FunctionCode: pdu.FunctionCode}
		if len(pdu.Data) > 0 {
			e.ExceptionCode = pdu.Data[0]
		}
		return false, 0, 0, e
	}
	data := pdu.Data
	if pdu.FunctionCode != fcReadDeviceIdentification || len(data) < 6 || data[0] != meiReadDeviceIdentification {
		return false, 0, 0, fmt.Errorf("modbus: malformed Read Device Identification answer % x", data)
	}
	more, nextID, conformity = data[3] == 0xFF, data[4], data[2]
	n, rest := int(data[5]), data[6:]
	for range n {
		if len(rest) < 2 || len(rest) < 2+int(rest[1]) {
			return false, 0, 0, fmt.Errorf("modbus: truncated Read Device Identification object list")
		}
		id, l := rest[0], int(rest[1])
		objects[id] = string(rest[2 : 2+l])
		rest = rest[2+l:]
	}
	return more, nextID, conformity, nil
}
