package modbus

import (
	"context"
	"errors"
	"math"
	"testing"

	"github.com/goburrow/modbus"

	"github.com/dowse-dev/dowse/mappers/mapper"
	"github.com/dowse-dev/dowse/shared/twinvalue"
)

// answering is a device whose read answers are the fuzzer's bytes: each
// answer is a length byte and that many bytes (an empty input, a refusal).
type answering struct {
	modbus.Client // other calls are not made
	in            []byte
}

func (a *answering) next() ([]byte, error) {
	if len(a.in) == 0 {
		return nil, &modbus.ModbusError{FunctionCode: 3, ExceptionCode: modbus.ExceptionCodeIllegalDataAddress}
	}
	n := min(int(a.in[0]), len(a.in)-1)
	b := a.in[1 : 1+n]
	a.in = a.in[1+n:]
	return b, nil
}

func (a *answering) ReadCoils(_, _ uint16) ([]byte, error)            { return a.next() }
func (a *answering) ReadDiscreteInputs(_, _ uint16) ([]byte, error)   { return a.next() }
func (a *answering) ReadInputRegisters(_, _ uint16) ([]byte, error)   { return a.next() }
func (a *answering) ReadHoldingRegisters(_, _ uint16) ([]byte, error) { return a.next() }

// FuzzAnswers: whatever a device answers (short, long, refused, any
// bytes), a read gives each property a value of its type or an error,
// never a panic, and merged reads split when refused.
func FuzzAnswers(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{4, 0, 1, 0, 2, 2, 0x41, 0x20, 1, 0xff})
	f.Add([]byte{40, 0x41, 0x42, 0x43, 0x44, 0x45, 0x46, 0x47, 0x48, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{1, 0, 0, 3, 1, 2, 3})
	props := []struct {
		typ twinvalue.Type
		v   mapper.Params
	}{
		{twinvalue.Int, mapper.Params{"address": int64(0)}},
		{twinvalue.Int, mapper.Params{"address": int64(1), "dataType": "int16"}},
		{twinvalue.Float, mapper.Params{"address": int64(2), "dataType": "float32", "byteOrder": "little"}},
		{twinvalue.Float, mapper.Params{"address": int64(4), "dataType": "float64", "wordOrder": "little"}},
		{twinvalue.Int, mapper.Params{"address": int64(8), "dataType": "int64"}},
		{twinvalue.Int, mapper.Params{"address": int64(12), "dataType": "uint32"}},
		{twinvalue.String, mapper.Params{"address": int64(14), "length": int64(4)}},
		{twinvalue.Int, mapper.Params{"register": "input", "address": int64(0), "dataType": "int32"}},
		{twinvalue.Boolean, mapper.Params{"register": "coil", "address": int64(0)}},
		{twinvalue.Boolean, mapper.Params{"register": "coil", "address": int64(9)}},
		{twinvalue.Boolean, mapper.Params{"register": "discrete", "address": int64(3)}},
		{twinvalue.Float, mapper.Params{"address": int64(30), "scale": 0.1}},
	}
	f.Fuzz(func(t *testing.T, answers []byte) {
		dev := &answering{in: answers}
		d := &Driver{cfg: deviceConfig{unit: 1}, client: dev, setUnit: func(byte) {}}
		ps := make([]*mapper.Property, len(props))
		for i, p := range props {
			ps[i] = &mapper.Property{Name: "p", Type: p.typ, Visitor: p.v}
			if err := d.Prepare(ps[i]); err != nil {
				t.Fatalf("Prepare(%v): %v", p.v, err)
			}
		}
		// Twice: the second time after refused merges were split.
		for range 2 {
			for i, r := range d.ReadBatch(context.Background(), ps) {
				if r.Err != nil {
					continue
				}
				if err := fits(ps[i].Type, r.Value); err != nil {
					t.Fatalf("property %v read %v (%T): %v", props[i].v, r.Value, r.Value, err)
				}
			}
		}
	})
}

// fits says whether v is a value of typ as the mapper SDK takes it.
func fits(typ twinvalue.Type, v any) error {
	switch x := v.(type) {
	case bool:
		if typ == twinvalue.Boolean {
			return nil
		}
	case string:
		if typ == twinvalue.String {
			return nil
		}
	case int64, uint64, int32, uint32, int16, uint16:
		if typ == twinvalue.Int || typ == twinvalue.Float {
			return nil
		}
	case float64:
		if typ == twinvalue.Float || typ == twinvalue.Int {
			return nil
		}
	case float32:
		if math.IsNaN(float64(x)) || typ == twinvalue.Float {
			return nil
		}
	}
	return errors.New("not of the property's type")
}
