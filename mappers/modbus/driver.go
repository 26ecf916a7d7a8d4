// Package modbus is Dowse's Modbus mapper, TCP and RTU (serial lines): a
// Driver for the mapper SDK (mappers/mapper) that reads coils, discrete
// inputs, holding and input
// registers, writes coils and holding registers, and reads the registers of
// one device that share a collect cycle in as few requests as the protocol
// allows (adjacent addresses of one unit and table in one request).
//
// Protocol configData (Device spec.protocol.configData, or the model's
// protocolConfigData):
//
//	address     "host:port" (port defaults to 502); or KubeEdge's ip and port
//	serialPort  Modbus RTU instead: the serial device, e.g. /dev/ttyUSB0
//	            (also address "rtu:///dev/ttyUSB0"), with baudRate (19200),
//	            dataBits (8), parity (even; none, odd or N, E, O) and
//	            stopBits (1), the Modbus serial line defaults
//	unitId      default unit id, 0-255 (default 1; KubeEdge's slaveID too)
//	timeout     per request: "1s" or milliseconds (default 1s)
//	maxGap      registers (or bits) of a gap that one request may bridge
//	            when reading neighbours together (default 0: adjacent only)
//
// Visitor configData (each property's visitors.configData):
//
//	register    holding (default), input, coil or discreteInput; KubeEdge's
//	            HoldingRegister, InputRegister, CoilRegister and
//	            DiscreteInputRegister too
//	address     0-based address (KubeEdge's "offset" when no address is set,
//	            in which case "offset" is not a transform)
//	unitId      overrides the device's
//	dataType    int16, uint16 (default), int32, uint32, int64, uint64,
//	            float32, float64, bool, string (registers only)
//	byteOrder, wordOrder, bitMask, length: see mapper.RegisterCodec
//	scale, offset, deadband: see the mapper SDK
package modbus

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/goburrow/modbus"

	"github.com/dowse-dev/dowse/mappers/mapper"
	"github.com/dowse-dev/dowse/shared/twinvalue"
)

// Protocol is the protocol name the mapper registers.
const Protocol = "modbus"

// Register tables.
const (
	Coil          = "coil"
	DiscreteInput = "discreteInput"
	Holding       = "holding"
	Input         = "input"
)

const (
	maxRegisters = 125  // per read request
	maxBits      = 2000 // per read request
	maxWriteRegs = 123
)

type deviceConfig struct {
	address string        // TCP host:port
	serial  *serialConfig // RTU: a serial line instead of address
	unit    byte
	timeout time.Duration
	maxGap  int
}

type serialConfig struct {
	device                   string
	baud, dataBits, stopBits int
	parity                   string // N, E or O
}

// handler is the library's TCP or RTU client handler.
type handler interface {
	Connect() error
	Close() error
}

// Driver is one Modbus device (one TCP connection or serial line; unit ids
// per property).
type Driver struct {
	cfg     deviceConfig
	handler handler
	setUnit func(byte) // the unit id of the next request
	client  modbus.Client
	noMerge map[spanKey]bool // spans a merged read of which the device refused

	// Request plans of the batches the SDK hands (one slice per collect
	// cycle, the same until the properties change), by the slice.
	plans map[**mapper.Property]*batchPlan
}

type batchPlan struct {
	ps    []*mapper.Property
	pts   []*point
	spans []span
}

// spanKey names a merged read.
type spanKey struct {
	unit   byte
	table  string
	lo, hi int
}

// NewDriver is the mapper.NewDriver of Modbus TCP and RTU.
func NewDriver(dev mapper.DeviceInfo) (mapper.Driver, error) {
	cfg, err := parseDevice(dev.Protocol)
	if err != nil {
		return nil, err
	}
	return &Driver{cfg: cfg}, nil
}

func parseDevice(p mapper.Params) (deviceConfig, error) {
	var c deviceConfig
	addr, err := p.String("address", "")
	if err != nil {
		return c, err
	}
	dev, err := p.String("serialPort", "")
	if err != nil {
		return c, err
	}
	if rest, ok := strings.CutPrefix(addr, "rtu://"); ok && dev == "" {
		dev = rest
	}
	if dev != "" {
		if c.serial, err = parseSerial(p, dev); err != nil {
			return c, err
		}
		return deviceCommon(p, c)
	}
	if addr == "" {
		host, err := p.String("ip", "")
		if err != nil {
			return c, err
		}
		if host == "" {
			if host, err = p.String("host", ""); err != nil {
				return c, err
			}
		}
		if host == "" {
			return c, errors.New("address (host:port) is required")
		}
		port, err := p.Int("port", 502)
		if err != nil {
			return c, err
		}
		addr = net.JoinHostPort(host, strconv.FormatInt(port, 10))
	}
	addr = strings.TrimPrefix(addr, "tcp://")
	if _, _, err := net.SplitHostPort(addr); err != nil {
		addr = net.JoinHostPort(addr, "502")
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return c, fmt.Errorf("address %q: want host:port", addr)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return c, fmt.Errorf("address %q: bad port", addr)
	}
	c.address = addr
	return deviceCommon(p, c)
}

// parseSerial reads an RTU device's line settings.
func parseSerial(p mapper.Params, dev string) (*serialConfig, error) {
	if !strings.HasPrefix(dev, "/") {
		return nil, fmt.Errorf("serialPort %q: want a device path such as /dev/ttyUSB0", dev)
	}
	sc := &serialConfig{device: dev}
	var err error
	num := func(key string, def int64, ok func(int64) bool) int {
		if err != nil {
			return 0
		}
		var n int64
		if n, err = p.Int(key, def); err == nil && !ok(n) {
			err = fmt.Errorf("%s %d is out of range", key, n)
		}
		return int(n)
	}
	sc.baud = num("baudRate", 19200, func(n int64) bool { return n > 0 && n <= 4000000 })
	sc.dataBits = num("dataBits", 8, func(n int64) bool { return n >= 5 && n <= 8 })
	sc.stopBits = num("stopBits", 1, func(n int64) bool { return n == 1 || n == 2 })
	if err != nil {
		return nil, err
	}
	parity, err := p.String("parity", "even")
	if err != nil {
		return nil, err
	}
	switch strings.ToLower(parity) {
	case "n", "none":
		sc.parity = "N"
	case "e", "even":
		sc.parity = "E"
	case "o", "odd":
		sc.parity = "O"
	default:
		return nil, fmt.Errorf("parity %q: want none, even or odd", parity)
	}
	return sc, nil
}

// deviceCommon reads the settings of TCP and RTU devices alike.
func deviceCommon(p mapper.Params, c deviceConfig) (deviceConfig, error) {
	unit, err := unitID(p, 1)
	if err != nil {
		return c, err
	}
	c.unit = unit
	if c.timeout, err = p.Duration("timeout", time.Second); err != nil {
		return c, err
	}
	if c.timeout <= 0 {
		c.timeout = time.Second
	}
	gap, err := p.Int("maxGap", 0)
	if err != nil || gap < 0 || gap > maxRegisters {
		return c, fmt.Errorf("maxGap: want 0 to %d", maxRegisters)
	}
	c.maxGap = int(gap)
	return c, nil
}

func unitID(p mapper.Params, def byte) (byte, error) {
	key := "unitId"
	if !p.Has(key) {
		key = "slaveID"
	}
	n, err := p.Int(key, int64(def))
	if err != nil {
		return 0, err
	}
	if n < 0 || n > 255 {
		return 0, fmt.Errorf("%s %d: want 0 to 255", key, n)
	}
	return byte(n), nil
}

// point is a prepared property.
type point struct {
	table   string
	address uint16
	unit    byte
	codec   mapper.RegisterCodec
	count   uint16 // registers or bits
}

func (pt *point) bits() bool { return pt.table == Coil || pt.table == DiscreteInput }

// Prepare parses a property's visitor.
func (d *Driver) Prepare(p *mapper.Property) error {
	v := p.Visitor
	table, err := v.String("register", Holding)
	if err != nil {
		return err
	}
	pt := &point{}
	switch strings.ToLower(strings.TrimSpace(table)) {
	case "holding", "holdingregister", "holdingregisters", "4":
		pt.table = Holding
	case "input", "inputregister", "inputregisters", "3":
		pt.table = Input
	case "coil", "coils", "coilregister", "0":
		pt.table = Coil
	case "discreteinput", "discreteinputs", "discreteinputregister", "discrete", "1":
		pt.table = DiscreteInput
	default:
		return fmt.Errorf("register %q: want holding, input, coil or discreteInput", table)
	}
	addrKey := "address"
	if !v.Has("address") && v.Has("offset") {
		// KubeEdge's Modbus visitor: offset is the address, not a transform.
		addrKey = "offset"
		p.Transform.Offset = 0
	}
	if !v.Has(addrKey) {
		return errors.New("address is required")
	}
	addr, err := v.Int(addrKey, 0)
	if err != nil {
		return err
	}
	if addr < 0 || addr > 65535 {
		return fmt.Errorf("address %d: want 0 to 65535", addr)
	}
	pt.address = uint16(addr)
	if pt.unit, err = unitID(v, d.cfg.unit); err != nil {
		return err
	}
	if pt.bits() {
		if dt, _ := v.String("dataType", "bool"); dt != "bool" && dt != "boolean" {
			return fmt.Errorf("dataType %q: a %s holds one bit (bool)", dt, pt.table)
		}
		pt.count = 1
		if p.Type != twinvalue.Boolean && p.Type != twinvalue.Int && p.Type != twinvalue.String {
			return fmt.Errorf("a %s is a bit; the model's type %s cannot hold it (use BOOLEAN or INT)", pt.table, p.Type)
		}
	} else {
		def := mapper.DataUint16
		switch p.Type {
		case twinvalue.Boolean:
			def = mapper.DataBool
		case twinvalue.String:
			def = mapper.DataString
		}
		if !v.Has("length") && v.Has("limit") && def == mapper.DataString {
			v["length"] = v["limit"]
		}
		if pt.codec, err = mapper.ParseRegisterCodec(v, def); err != nil {
			return err
		}
		if pt.codec.DataType == mapper.DataString && p.Type != twinvalue.String && p.Type != twinvalue.Bytes {
			return fmt.Errorf("dataType string needs a STRING or BYTES property, not %s", p.Type)
		}
		pt.count = uint16(pt.codec.Registers())
	}
	if int(pt.address)+int(pt.count) > 65536 {
		return fmt.Errorf("address %d plus %d registers runs past 65535", pt.address, pt.count)
	}
	p.Data = pt
	return nil
}

// Connect opens the TCP connection, or the serial line.
func (d *Driver) Connect(ctx context.Context) error {
	if sc := d.cfg.serial; sc != nil {
		h := modbus.NewRTUClientHandler(sc.device)
		h.BaudRate, h.DataBits, h.StopBits, h.Parity = sc.baud, sc.dataBits, sc.stopBits, sc.parity
		h.Timeout = d.cfg.timeout
		h.IdleTimeout = 0 // the SDK keeps the line busy, or closes it
		h.SlaveId = d.cfg.unit
		if err := h.Connect(); err != nil {
			return fmt.Errorf("opening %s: %w", sc.device, err)
		}
		d.handler, d.setUnit, d.client = h, func(u byte) { h.SlaveId = u }, modbus.NewClient(h)
		return nil
	}
	h := modbus.NewTCPClientHandler(d.cfg.address)
	h.Timeout = d.cfg.timeout
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < h.Timeout {
		h.Timeout = max(time.Until(dl), time.Millisecond)
	}
	h.IdleTimeout = 0 // the SDK keeps the connection busy, or closes it
	h.SlaveId = d.cfg.unit
	if err := h.Connect(); err != nil {
		return fmt.Errorf("connecting to %s: %w", d.cfg.address, err)
	}
	h.Timeout = d.cfg.timeout
	d.handler, d.setUnit, d.client = h, func(u byte) { h.SlaveId = u }, modbus.NewClient(h)
	return nil
}

// Close closes the connection.
func (d *Driver) Close() error {
	if d.handler == nil {
		return nil
	}
	err := d.handler.Close()
	d.handler, d.setUnit, d.client = nil, nil, nil
	return err
}

// classify turns a library error into the SDK's kinds: an exception
// response is about the request (permanent), a broken connection is
// ErrDisconnected, anything else (a timeout, garbage) a failed exchange
// after which the connection is dropped, so a late answer is never taken
// for the next request's.
func (d *Driver) classify(err error, what string) error {
	if err == nil {
		return nil
	}
	var me *modbus.ModbusError
	if errors.As(err, &me) {
		if me.ExceptionCode == modbus.ExceptionCodeServerDeviceBusy || me.ExceptionCode == modbus.ExceptionCodeGatewayTargetDeviceFailedToRespond ||
			me.ExceptionCode == modbus.ExceptionCodeGatewayPathUnavailable {
			return fmt.Errorf("%s: %w", what, err)
		}
		return mapper.Permanentf("%s: %w", what, err)
	}
	if strings.Contains(err.Error(), "does not match count") {
		// A well-framed answer with fewer values than asked: the device's
		// memory ends before the address (jsmodbus answers so).
		return mapper.Permanentf("%s: the device answered with fewer values than asked (address past the end of its memory?): %w", what, err)
	}
	if d.handler != nil {
		_ = d.handler.Close() // Send reconnects on the next request
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("%s: %w: %w", what, mapper.ErrDisconnected, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

func (d *Driver) readRaw(pt *point, address, count uint16) ([]byte, error) {
	if d.client == nil {
		return nil, fmt.Errorf("%w: not connected", mapper.ErrDisconnected)
	}
	d.setUnit(pt.unit)
	var b []byte
	var err error
	switch pt.table {
	case Holding:
		b, err = d.client.ReadHoldingRegisters(address, count)
	case Input:
		b, err = d.client.ReadInputRegisters(address, count)
	case Coil:
		b, err = d.client.ReadCoils(address, count)
	case DiscreteInput:
		b, err = d.client.ReadDiscreteInputs(address, count)
	}
	if err != nil {
		return nil, d.classify(err, fmt.Sprintf("reading %d %s at %d (unit %d)", count, plural(pt.table), address, pt.unit))
	}
	want := int(count) * 2
	if pt.bits() {
		want = (int(count) + 7) / 8
	}
	if len(b) < want {
		return nil, d.classify(fmt.Errorf("short answer: %d bytes, want %d", len(b), want), "reading")
	}
	return b, nil
}

func plural(table string) string {
	switch table {
	case Holding:
		return "holding registers"
	case Input:
		return "input registers"
	case Coil:
		return "coils"
	}
	return "discrete inputs"
}

func (pt *point) decode(b []byte, base uint16) (any, error) {
	off := int(pt.address - base)
	if pt.bits() {
		return b[off/8]>>(off%8)&1 == 1, nil
	}
	v, err := pt.codec.Decode(b[2*off : 2*off+2*int(pt.count)])
	if err != nil {
		return nil, mapper.Permanent(err)
	}
	return v, nil
}

// Read reads one property.
func (d *Driver) Read(_ context.Context, p *mapper.Property) (any, error) {
	pt := p.Data.(*point)
	b, err := d.readRaw(pt, pt.address, pt.count)
	if err != nil {
		return nil, err
	}
	return pt.decode(b, pt.address)
}

// span is one read request: points of one unit and table whose addresses
// lie within [lo, hi).
type span struct {
	idx    []int // indexes into the points
	lo, hi int
}

// plan groups points into as few requests as the protocol allows: one unit
// and table, addresses adjacent or within maxGap, at most 125 registers or
// 2000 bits.
func plan(pts []*point, maxGap int) []span {
	idx := make([]int, len(pts))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int {
		pa, pb := pts[a], pts[b]
		if pa.unit != pb.unit {
			return int(pa.unit) - int(pb.unit)
		}
		if pa.table != pb.table {
			return strings.Compare(pa.table, pb.table)
		}
		return int(pa.address) - int(pb.address)
	})
	var out []span
	for start := 0; start < len(idx); {
		first := pts[idx[start]]
		lo, hi := int(first.address), int(first.address)+int(first.count)
		limit := maxRegisters
		if first.bits() {
			limit = maxBits
		}
		end := start + 1
		for ; end < len(idx); end++ {
			p := pts[idx[end]]
			if p.unit != first.unit || p.table != first.table || int(p.address) > hi+maxGap {
				break
			}
			nhi := max(hi, int(p.address)+int(p.count))
			if nhi-lo > limit {
				break
			}
			hi = nhi
		}
		out = append(out, span{idx: idx[start:end], lo: lo, hi: hi})
		start = end
	}
	return out
}

// ReadBatch reads properties of one unit and table whose addresses are
// adjacent (or within maxGap) in one request each. When a merged request
// is refused with an exception (one property past the end), its properties
// are read one by one so the others still get their values, and that span
// is not merged again.
func (d *Driver) ReadBatch(ctx context.Context, ps []*mapper.Property) []mapper.Result {
	rs := make([]mapper.Result, len(ps))
	pts, spans := d.plan(ps)
	for _, sp := range spans {
		first := pts[sp.idx[0]]
		key := spanKey{unit: first.unit, table: first.table, lo: sp.lo, hi: sp.hi}
		if len(sp.idx) == 1 || d.noMerge[key] {
			for _, i := range sp.idx {
				rs[i].Value, rs[i].Err = d.Read(ctx, ps[i])
			}
			continue
		}
		b, err := d.readRaw(first, uint16(sp.lo), uint16(sp.hi-sp.lo))
		if err != nil && mapper.IsPermanent(err) {
			if d.noMerge == nil {
				d.noMerge = map[spanKey]bool{}
			}
			d.noMerge[key] = true
			for _, i := range sp.idx {
				rs[i].Value, rs[i].Err = d.Read(ctx, ps[i])
			}
			continue
		}
		for _, i := range sp.idx {
			if err != nil {
				rs[i].Err = err
				continue
			}
			rs[i].Value, rs[i].Err = pts[i].decode(b, uint16(sp.lo))
		}
	}
	return rs
}

// plan returns ps's points and request plan, computed again only when ps is
// not the slice (and properties) of the last call.
func (d *Driver) plan(ps []*mapper.Property) ([]*point, []span) {
	if len(ps) == 0 {
		return nil, nil
	}
	if bp := d.plans[&ps[0]]; bp != nil && len(bp.ps) == len(ps) {
		same := true
		for i := 0; same && i < len(ps); i++ {
			same = ps[i] == bp.ps[i] && ps[i].Data == any(bp.pts[i])
		}
		if same {
			return bp.pts, bp.spans
		}
	}
	pts := make([]*point, len(ps))
	for i, p := range ps {
		pts[i] = p.Data.(*point)
	}
	if d.plans == nil || len(d.plans) >= 16 {
		d.plans = map[**mapper.Property]*batchPlan{} // stale ones go with the rest
	}
	bp := &batchPlan{ps: ps, pts: pts, spans: plan(pts, d.cfg.maxGap)}
	d.plans[&ps[0]] = bp
	return bp.pts, bp.spans
}

// Write writes a raw value to a coil or holding register(s).
func (d *Driver) Write(_ context.Context, p *mapper.Property, v any) error {
	pt := p.Data.(*point)
	if d.client == nil {
		return fmt.Errorf("%w: not connected", mapper.ErrDisconnected)
	}
	what := fmt.Sprintf("writing %s at %d (unit %d)", plural(pt.table), pt.address, pt.unit)
	switch pt.table {
	case Input, DiscreteInput:
		return mapper.Permanentf("%s: a Modbus %s cannot be written", what, plural(pt.table))
	case Coil:
		on, err := bit(v)
		if err != nil {
			return mapper.Permanentf("%s: %v", what, err)
		}
		val := uint16(0)
		if on {
			val = 0xFF00
		}
		d.setUnit(pt.unit)
		_, err = d.client.WriteSingleCoil(pt.address, val)
		return d.classify(err, what)
	}
	var cur []byte
	if pt.codec.NeedsCurrent() {
		b, err := d.readRaw(pt, pt.address, pt.count)
		if err != nil {
			return err
		}
		cur = b[:2*pt.count]
	}
	if s, ok := v.(string); ok && pt.codec.DataType != mapper.DataString {
		f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
		if err != nil {
			return mapper.Permanentf("%s: %q is not a number", what, s)
		}
		v = f
	}
	if b, ok := v.([]byte); ok {
		v = string(b)
	}
	b, err := pt.codec.Encode(v, cur)
	if err != nil {
		return mapper.Permanentf("%s: %v", what, err)
	}
	d.setUnit(pt.unit)
	if pt.count == 1 {
		_, err = d.client.WriteSingleRegister(pt.address, uint16(b[0])<<8|uint16(b[1]))
	} else {
		if pt.count > maxWriteRegs {
			return mapper.Permanentf("%s: %d registers is more than one write carries (%d)", what, pt.count, maxWriteRegs)
		}
		_, err = d.client.WriteMultipleRegisters(pt.address, pt.count, b)
	}
	return d.classify(err, what)
}

func bit(v any) (bool, error) {
	switch x := v.(type) {
	case bool:
		return x, nil
	case int64:
		if x == 0 || x == 1 {
			return x == 1, nil
		}
	case float64:
		if x == 0 || x == 1 {
			return x == 1, nil
		}
	case string:
		return strconv.ParseBool(x)
	}
	return false, fmt.Errorf("%v is not a bit (true/false or 0/1)", v)
}
