package mapper

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
	"strings"

	"github.com/dowse-dev/dowse/shared/twinvalue"
)

// Register data types of a RegisterCodec.
const (
	DataInt16   = "int16"
	DataUint16  = "uint16"
	DataInt32   = "int32"
	DataUint32  = "uint32"
	DataInt64   = "int64"
	DataUint64  = "uint64"
	DataFloat32 = "float32"
	DataFloat64 = "float64"
	DataBool    = "bool"
	DataString  = "string"
)

// RegisterCodec turns 16-bit registers (Modbus holding and input registers,
// or any protocol that reads words) into raw values and back.
//
// Visitor keys (ParseRegisterCodec): dataType (default uint16), byteOrder
// "big" (default, the Modbus convention) or "little" (bytes swapped inside
// each register), wordOrder "big" (default, most significant register
// first) or "little", bitMask (an integer, or a string such as "0x00f0":
// the value is the masked bits shifted down), length (registers of a
// string, default 1). KubeEdge's isSwap and isRegisterSwap are read as
// byteOrder and wordOrder little.
type RegisterCodec struct {
	DataType    string
	LittleBytes bool
	LittleWords bool
	BitMask     uint64
	// StringRegisters is the number of registers of a string.
	StringRegisters int
}

// ParseRegisterCodec reads a codec from visitor parameters; dataType
// defaults to def.
func ParseRegisterCodec(p Params, def string) (RegisterCodec, error) {
	var c RegisterCodec
	dt, err := p.String("dataType", def)
	if err != nil {
		return c, err
	}
	c.DataType = strings.ToLower(strings.TrimSpace(dt))
	switch c.DataType {
	case "short":
		c.DataType = DataInt16
	case "ushort", "word":
		c.DataType = DataUint16
	case "int", "long":
		c.DataType = DataInt32
	case "uint", "ulong", "dword":
		c.DataType = DataUint32
	case "float", "real":
		c.DataType = DataFloat32
	case "double", "lreal":
		c.DataType = DataFloat64
	case "boolean":
		c.DataType = DataBool
	case DataInt16, DataUint16, DataInt32, DataUint32, DataInt64, DataUint64, DataFloat32, DataFloat64, DataBool, DataString:
	default:
		return c, fmt.Errorf("dataType %q: want int16, uint16, int32, uint32, int64, uint64, float32, float64, bool or string", dt)
	}
	order := func(key, swapKey string) (bool, error) {
		s, err := p.String(key, "")
		if err != nil {
			return false, err
		}
		switch strings.ToLower(s) {
		case "", "big", "bigendian", "big-endian", "abcd", "ab":
		case "little", "littleendian", "little-endian", "swap", "swapped", "dcba", "ba":
			return true, nil
		default:
			return false, fmt.Errorf("%s %q: want big or little", key, s)
		}
		return p.Bool(swapKey, false)
	}
	if c.LittleBytes, err = order("byteOrder", "isSwap"); err != nil {
		return c, err
	}
	if c.LittleWords, err = order("wordOrder", "isRegisterSwap"); err != nil {
		return c, err
	}
	if p.Has("bitMask") {
		m, err := p.Int("bitMask", 0)
		if err != nil || m <= 0 {
			return c, fmt.Errorf("bitMask: want a positive integer such as 4 or \"0x0f00\"")
		}
		c.BitMask = uint64(m)
		if c.DataType == DataFloat32 || c.DataType == DataFloat64 || c.DataType == DataString {
			return c, fmt.Errorf("bitMask applies to integer and bool data types, not %s", c.DataType)
		}
	}
	n, err := p.Int("length", 1)
	if err != nil || n < 1 || n > 125 {
		return c, fmt.Errorf("length: want 1 to 125 registers")
	}
	c.StringRegisters = int(n)
	return c, nil
}

// Registers is how many 16-bit registers a value takes.
func (c RegisterCodec) Registers() int {
	switch c.DataType {
	case DataInt32, DataUint32, DataFloat32:
		return 2
	case DataInt64, DataUint64, DataFloat64:
		return 4
	case DataString:
		return c.StringRegisters
	}
	return 1
}

// order returns the value's bytes in big-endian order from the wire's.
func (c RegisterCodec) order(b []byte) []byte {
	out := make([]byte, len(b))
	copy(out, b)
	if c.LittleBytes {
		for i := 0; i+1 < len(out); i += 2 {
			out[i], out[i+1] = out[i+1], out[i]
		}
	}
	if c.LittleWords && c.DataType != DataString {
		n := len(out) / 2
		for i := 0; i < n/2; i++ {
			j := n - 1 - i
			out[2*i], out[2*j] = out[2*j], out[2*i]
			out[2*i+1], out[2*j+1] = out[2*j+1], out[2*i+1]
		}
	}
	return out
}

// Decode reads a raw value from exactly Registers()*2 bytes as they came off
// the wire.
func (c RegisterCodec) Decode(wire []byte) (any, error) {
	if len(wire) != 2*c.Registers() {
		return nil, fmt.Errorf("got %d bytes for a %s, want %d", len(wire), c.DataType, 2*c.Registers())
	}
	b := c.order(wire) // order is its own inverse
	var u uint64
	switch c.DataType {
	case DataString:
		return strings.TrimRight(string(b), "\x00 "), nil
	case DataFloat32:
		return float64(math.Float32frombits(binary.BigEndian.Uint32(b))), nil
	case DataFloat64:
		return math.Float64frombits(binary.BigEndian.Uint64(b)), nil
	}
	for _, x := range b {
		u = u<<8 | uint64(x)
	}
	if c.BitMask != 0 {
		u = (u & c.BitMask) >> bits.TrailingZeros64(c.BitMask)
		if c.DataType != DataBool {
			return int64(u), nil
		}
	}
	switch c.DataType {
	case DataInt16:
		return int64(int16(u)), nil
	case DataInt32:
		return int64(int32(u)), nil
	case DataInt64:
		return int64(u), nil
	case DataUint64:
		return u, nil
	case DataBool:
		return u != 0, nil
	}
	return int64(u), nil
}

// NeedsCurrent says whether Encode needs the register's current contents
// (a masked write changes only the masked bits).
func (c RegisterCodec) NeedsCurrent() bool { return c.BitMask != 0 }

// Encode writes a raw value as wire bytes. current is the register's
// present contents (wire order), needed when NeedsCurrent.
func (c RegisterCodec) Encode(v any, current []byte) ([]byte, error) {
	n := 2 * c.Registers()
	b := make([]byte, n)
	switch c.DataType {
	case DataString:
		s, ok := v.(string)
		if !ok {
			return nil, fmt.Errorf("%v (%T) is not a string", v, v)
		}
		if len(s) > n {
			return nil, fmt.Errorf("%q is longer than %d bytes (%d registers)", s, n, c.Registers())
		}
		copy(b, s)
		return c.order(b), nil
	case DataFloat32:
		f, ok := twinvalue.AsFloat(v)
		if !ok {
			return nil, fmt.Errorf("%v (%T) is not a number", v, v)
		}
		if math.Abs(f) > math.MaxFloat32 {
			return nil, fmt.Errorf("%v does not fit a float32", f)
		}
		binary.BigEndian.PutUint32(b, math.Float32bits(float32(f)))
		return c.order(b), nil
	case DataFloat64:
		f, ok := twinvalue.AsFloat(v)
		if !ok {
			return nil, fmt.Errorf("%v (%T) is not a number", v, v)
		}
		binary.BigEndian.PutUint64(b, math.Float64bits(f))
		return c.order(b), nil
	}
	var u uint64
	if c.BitMask != 0 {
		shift := bits.TrailingZeros64(c.BitMask)
		field := c.BitMask >> shift
		x, err := RawInt(v, 0, float64(field))
		if err != nil {
			return nil, fmt.Errorf("bit field %#x: %w", c.BitMask, err)
		}
		if len(current) != n {
			return nil, fmt.Errorf("a masked write needs the register's current value")
		}
		cur := c.order(current)
		for _, x := range cur {
			u = u<<8 | uint64(x)
		}
		u = u&^c.BitMask | uint64(x)<<shift
	} else {
		var lo, hi float64
		switch c.DataType {
		case DataInt16:
			lo, hi = math.MinInt16, math.MaxInt16
		case DataUint16:
			lo, hi = 0, math.MaxUint16
		case DataInt32:
			lo, hi = math.MinInt32, math.MaxInt32
		case DataUint32:
			lo, hi = 0, math.MaxUint32
		case DataInt64:
			lo, hi = math.MinInt64, math.MaxInt64
		case DataUint64:
			lo, hi = 0, math.MaxUint64
		case DataBool:
			lo, hi = 0, 1
		}
		if uv, ok := v.(uint64); ok && c.DataType == DataUint64 {
			u = uv
		} else {
			x, err := RawInt(v, lo, hi)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", c.DataType, err)
			}
			u = uint64(x)
		}
	}
	for i := n - 1; i >= 0; i-- {
		b[i] = byte(u)
		u >>= 8
	}
	return c.order(b), nil
}
