package modbus

import (
	"strconv"
	"testing"

	"github.com/dowse-dev/dowse/mappers/mapper"
	"github.com/dowse-dev/dowse/shared/twinvalue"
)

func TestParseDevice(t *testing.T) {
	for _, tc := range []struct {
		p    mapper.Params
		addr string
		unit byte
	}{
		{mapper.Params{"address": "10.0.0.1:1502", "unitId": int64(7)}, "10.0.0.1:1502", 7},
		{mapper.Params{"address": "tcp://10.0.0.1"}, "10.0.0.1:502", 1},
		// KubeEdge's Modbus protocol config, numbers as edgecore sends them.
		{mapper.Params{"ip": "10.0.0.2", "port": 5020.0, "slaveID": 3.0}, "10.0.0.2:5020", 3},
	} {
		c, err := parseDevice(tc.p)
		if err != nil || c.address != tc.addr || c.unit != tc.unit {
			t.Errorf("parseDevice(%v) = %+v, %v; want %s unit %d", tc.p, c, err, tc.addr, tc.unit)
		}
	}
	// Modbus RTU: a serial device and its line settings.
	for _, tc := range []struct {
		p    mapper.Params
		want serialConfig
	}{
		{mapper.Params{"serialPort": "/dev/ttyUSB0"}, serialConfig{device: "/dev/ttyUSB0", baud: 19200, dataBits: 8, stopBits: 1, parity: "E"}},
		{mapper.Params{"address": "rtu:///dev/ttyS1", "baudRate": 9600.0, "parity": "none", "stopBits": int64(2), "slaveID": 4.0},
			serialConfig{device: "/dev/ttyS1", baud: 9600, dataBits: 8, stopBits: 2, parity: "N"}},
	} {
		c, err := parseDevice(tc.p)
		if err != nil || c.serial == nil || *c.serial != tc.want || c.address != "" {
			t.Errorf("parseDevice(%v) = %+v (serial %+v), %v; want %+v", tc.p, c, c.serial, err, tc.want)
		}
	}
	for _, p := range []mapper.Params{{"serialPort": "ttyUSB0"}, {"serialPort": "/dev/x", "parity": "mark"},
		{"serialPort": "/dev/x", "stopBits": int64(3)}, {"serialPort": "/dev/x", "baudRate": int64(0)}, {"serialPort": "/dev/x", "dataBits": int64(9)}} {
		if _, err := parseDevice(p); err == nil {
			t.Errorf("parseDevice(%v) did not fail", p)
		}
	}
	for _, p := range []mapper.Params{{}, {"address": "h:0"}, {"address": "h:1", "unitId": int64(256)}, {"address": "h:1", "timeout": "soon"}} {
		if _, err := parseDevice(p); err == nil {
			t.Errorf("parseDevice(%v) did not fail", p)
		}
	}
}

func TestPrepare(t *testing.T) {
	d := &Driver{cfg: deviceConfig{unit: 1}}
	ok := []struct {
		typ   twinvalue.Type
		v     mapper.Params
		table string
		addr  uint16
		count uint16
	}{
		{twinvalue.Int, mapper.Params{"address": int64(4)}, Holding, 4, 1},
		{twinvalue.Float, mapper.Params{"register": "input", "address": int64(2), "dataType": "float32"}, Input, 2, 2},
		{twinvalue.Boolean, mapper.Params{"register": "coil", "address": int64(9)}, Coil, 9, 1},
		{twinvalue.String, mapper.Params{"register": "holding", "address": int64(0), "length": int64(8)}, Holding, 0, 8},
		// KubeEdge's visitor: offset is the address.
		{twinvalue.Int, mapper.Params{"register": "HoldingRegister", "offset": int64(12), "scale": 1.0}, Holding, 12, 1},
	}
	for _, tc := range ok {
		p := &mapper.Property{Name: "x", Type: tc.typ, Visitor: tc.v, Transform: mapper.Transform{Offset: 12}}
		if err := d.Prepare(p); err != nil {
			t.Errorf("Prepare(%v): %v", tc.v, err)
			continue
		}
		pt := p.Data.(*point)
		if pt.table != tc.table || pt.address != tc.addr || pt.count != tc.count {
			t.Errorf("Prepare(%v) = %+v", tc.v, pt)
		}
		if _, kubeedge := tc.v["offset"]; kubeedge && p.Transform.Offset != 0 {
			t.Errorf("KubeEdge offset kept as a transform")
		}
	}
	for _, tc := range []struct {
		typ twinvalue.Type
		v   mapper.Params
	}{
		{twinvalue.Int, mapper.Params{}},
		{twinvalue.Int, mapper.Params{"register": "flags", "address": int64(1)}},
		{twinvalue.Int, mapper.Params{"address": int64(70000)}},
		{twinvalue.Int, mapper.Params{"address": int64(65535), "dataType": "float32"}},
		{twinvalue.Float, mapper.Params{"register": "coil", "address": int64(1)}},
		{twinvalue.Int, mapper.Params{"register": "coil", "address": int64(1), "dataType": "int16"}},
		{twinvalue.Int, mapper.Params{"address": int64(1), "dataType": "string"}},
	} {
		if err := d.Prepare(&mapper.Property{Name: "x", Type: tc.typ, Visitor: tc.v}); err == nil {
			t.Errorf("Prepare(%s %v) did not fail", tc.typ, tc.v)
		}
	}
}

func TestPlan(t *testing.T) {
	h := func(unit byte, addr, count uint16) *point {
		return &point{table: Holding, unit: unit, address: addr, count: count}
	}
	pts := []*point{
		h(1, 10, 2), h(1, 0, 1), h(1, 1, 2), h(1, 3, 1), // 0-3 adjacent, 10-11 apart
		h(2, 0, 1), // another unit
		{table: Input, unit: 1, address: 0, count: 1}, // another table
		{table: Coil, unit: 1, address: 5, count: 1}, {table: Coil, unit: 1, address: 6, count: 1},
		h(1, 200, 100), h(1, 300, 100), // 200 registers: more than one request carries
	}
	got := map[string][]int{}
	for _, sp := range plan(pts, 0) {
		p := pts[sp.idx[0]]
		got[string(rune('0'+p.unit))+p.table+":"+itoa(sp.lo)+"-"+itoa(sp.hi)] = sp.idx
	}
	want := []string{"1holding:0-4", "1holding:10-12", "2holding:0-1", "1input:0-1", "1coil:5-7", "1holding:200-300", "1holding:300-400"}
	if len(got) != len(want) {
		t.Errorf("plan = %v, want spans %v", got, want)
	}
	for _, w := range want {
		if _, ok := got[w]; !ok {
			t.Errorf("no span %s in %v", w, got)
		}
	}
	if n := len(got["1holding:0-4"]); n != 3 {
		t.Errorf("span 0-4 has %d points, want 3", n)
	}
	// A gap of 6 registers is bridged with maxGap 6.
	if spans := plan([]*point{h(1, 0, 4), h(1, 10, 2)}, 6); len(spans) != 1 || spans[0].hi != 12 {
		t.Errorf("maxGap 6: %+v", spans)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// The request plan of a batch is computed once per slice the SDK hands
// (one per collect cycle), and again when the slice or a property changes.
func TestPlanCached(t *testing.T) {
	d := &Driver{}
	prop := func(addr int) *mapper.Property {
		p := &mapper.Property{Name: "p" + strconv.Itoa(addr), Type: twinvalue.Int, Visitor: mapper.Params{"address": int64(addr)}}
		if err := d.Prepare(p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	a := []*mapper.Property{prop(0), prop(1), prop(5)}
	b := []*mapper.Property{prop(10), prop(11)}
	_, spansA := d.plan(a)
	_, spansB := d.plan(b)
	if len(spansA) != 2 || len(spansB) != 1 {
		t.Fatalf("plans: %d and %d requests, want 2 and 1", len(spansA), len(spansB))
	}
	if _, again := d.plan(a); &again[0] != &spansA[0] {
		t.Error("the same slice was planned again")
	}
	a[2] = prop(2) // now adjacent: one request
	if _, again := d.plan(a); len(again) != 1 {
		t.Errorf("a changed property kept the old plan: %d requests", len(again))
	}
}
