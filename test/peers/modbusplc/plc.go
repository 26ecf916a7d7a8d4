// Package modbusplc is a Modbus TCP controller laid out as
// samples/modbus-plc-model.yaml says a modbus-plc is, served on loopback by
// github.com/simonvetter/modbus: the demo's, and the real node's tests'.
package modbusplc

import (
	"io"
	"log"
	"math"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/simonvetter/modbus"

	"github.com/dowse-dev/dowse/test/framework/procs"
)

// PLC is a Modbus TCP controller, served on loopback by
// github.com/simonvetter/modbus, laid out as samples/modbus-plc-model.yaml
// says a modbus-plc is: the setpoint in holding register 0, the process
// temperature in input register 0 (tenths of a degree above -40), the flow
// as a float32 in holding registers 1-2 (low word first), the mode in bits
// 8-11 of holding register 3, the pump on coil 0, the alarm on discrete
// input 0, and the plant's model code 4711 in holding register 100, which
// the sample's scan matches. The temperature follows the setpoint, half a
// degree every 200 ms, so a desired setpoint shows as a reading moving.
// Input register 1 is a counter (not in the sample's model; tests add a
// property for it) that goes up by one every 200 ms unless held
// (HoldCounter), so a reader can tell a report lost or gone back.
type PLC struct {
	// Addr is host:port of its Modbus TCP server.
	Addr string
	srv  *modbus.ModbusServer

	mu       sync.Mutex
	setpoint int16
	temp     float64
	pump     bool
	mode     uint16
	counter  uint16
	held     bool
	onWrite  func(setpoint int16)
	stop     chan struct{}
	stopOnce sync.Once
}

// ModelCode is what holding register 100 holds, which the sample's scan
// matches.
const ModelCode = 4711

// Start serves a PLC on a free loopback port; onWrite (nil: none) is told
// each setpoint written.
func Start(onWrite func(setpoint int16)) (*PLC, error) {
	return StartOn("127.0.0.1", onWrite)
}

// StartOn serves a PLC on a free port of host, an address of this machine
// (where a test node's pod network reaches it, say).
func StartOn(host string, onWrite func(setpoint int16)) (*PLC, error) {
	port, err := procs.FreePort()
	if err != nil {
		return nil, err
	}
	p := &PLC{Addr: net.JoinHostPort(host, strconv.Itoa(port)), setpoint: 18, temp: 18, pump: true, mode: 2 << 8, onWrite: onWrite, stop: make(chan struct{})}
	p.srv, err = modbus.NewServer(&modbus.ServerConfiguration{URL: "tcp://" + p.Addr, Timeout: time.Minute, MaxClients: 8,
		Logger: log.New(io.Discard, "", 0)}, p)
	if err != nil {
		return nil, err
	}
	if err := p.srv.Start(); err != nil {
		return nil, err
	}
	go p.follow()
	return p, nil
}

// Stop stops the server and the temperature's drift.
func (p *PLC) Stop() {
	p.stopOnce.Do(func() {
		close(p.stop)
		_ = p.srv.Stop()
	})
}

func (p *PLC) follow() {
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
		}
		p.mu.Lock()
		if !p.held {
			p.counter++
		}
		if d := float64(p.setpoint) - p.temp; math.Abs(d) <= 0.5 {
			p.temp = float64(p.setpoint)
		} else {
			p.temp += math.Copysign(0.5, d)
		}
		p.mu.Unlock()
	}
}

func (p *PLC) HandleCoils(req *modbus.CoilsRequest) ([]bool, error) {
	if req.Addr != 0 || req.Quantity != 1 {
		return nil, modbus.ErrIllegalDataAddress
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if req.IsWrite {
		p.pump = req.Args[0]
	}
	return []bool{p.pump}, nil
}

func (p *PLC) HandleDiscreteInputs(req *modbus.DiscreteInputsRequest) ([]bool, error) {
	if req.Addr != 0 || req.Quantity != 1 {
		return nil, modbus.ErrIllegalDataAddress
	}
	return []bool{false}, nil
}

func (p *PLC) HandleHoldingRegisters(req *modbus.HoldingRegistersRequest) ([]uint16, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	flow := math.Float32bits(3.5)
	var out []uint16
	var written *int16
	for i := range int(req.Quantity) {
		a := int(req.Addr) + i
		if req.IsWrite {
			v := req.Args[i]
			switch a {
			case 0:
				p.setpoint = int16(v)
				written = &p.setpoint
			case 3:
				p.mode = v
			default:
				return nil, modbus.ErrIllegalDataAddress
			}
		}
		switch a {
		case 0:
			out = append(out, uint16(p.setpoint))
		case 1:
			out = append(out, uint16(flow))
		case 2:
			out = append(out, uint16(flow>>16))
		case 3:
			out = append(out, p.mode)
		case 100:
			out = append(out, ModelCode)
		default:
			return nil, modbus.ErrIllegalDataAddress
		}
	}
	if written != nil && p.onWrite != nil {
		p.onWrite(*written)
	}
	return out, nil
}

func (p *PLC) HandleInputRegisters(req *modbus.InputRegistersRequest) ([]uint16, error) {
	if req.Quantity != 1 {
		return nil, modbus.ErrIllegalDataAddress
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	switch req.Addr {
	case 0:
		return []uint16{uint16(math.Round((p.temp + 40) * 10))}, nil
	case 1:
		return []uint16{p.counter}, nil
	}
	return nil, modbus.ErrIllegalDataAddress
}

// Counter is input register 1's value now.
func (p *PLC) Counter() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return int(p.counter)
}

// HoldCounter stops (true) or restarts (false) the counter; held, it
// returns its value.
func (p *PLC) HoldCounter(held bool) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.held = held
	return int(p.counter)
}
