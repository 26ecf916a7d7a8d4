package sparkplug

// Sparkplug 3.0's array data types (Int8Array ... DateTimeArray, carried in
// a metric's bytes_value) and DataSet (a table in dataset_value). Decode
// keeps both as bytes (a DataSet as DataSetKind); DecodeArray and
// DecodeDataSet read them, so that what only lists a payload's metrics
// (the discovery handler) never pays for them.

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
)

// MaxElements bounds the values of one array, and the cells of one DataSet.
const MaxElements = 16384

// MaxColumns bounds a DataSet's columns (its rows are bounded by
// MaxElements too, empty or not).
const MaxColumns = 1024

// IsArray says whether t is one of the array data types.
func (t DataType) IsArray() bool { return t >= Int8Array && t <= DateTimeArray }

// elementSize is the packed size of one element of a fixed-size array type.
func elementSize(t DataType) int {
	switch t {
	case Int8Array, UInt8Array:
		return 1
	case Int16Array, UInt16Array:
		return 2
	case Int32Array, UInt32Array, FloatArray:
		return 4
	case Int64Array, UInt64Array, DoubleArray, DateTimeArray:
		return 8
	}
	return 0
}

// DecodeArray reads an array metric's bytes_value as the specification
// lays them out (little-endian packed elements; a BooleanArray as a
// little-endian uint32 count followed by the bits, the first value in the
// most significant bit of the first byte; a StringArray as UTF-8 strings
// each ended by a NUL). It returns []int64 (Int8Array ... Int64Array, and
// DateTimeArray: milliseconds since the epoch), []uint64 (UInt8Array ...
// UInt64Array), []float64 (FloatArray, DoubleArray), []bool or []string,
// at most MaxElements of them. Errors wrap ErrMalformed.
func DecodeArray(t DataType, b []byte) (any, error) {
	switch t {
	case BooleanArray:
		if len(b) < 4 {
			return nil, malformed("a BooleanArray of %d bytes has no count (4 bytes)", len(b))
		}
		n := binary.LittleEndian.Uint32(b)
		if n > MaxElements {
			return nil, malformed("a BooleanArray of %d values, more than %d", n, MaxElements)
		}
		bits := b[4:]
		if want := (int(n) + 7) / 8; len(bits) != want {
			return nil, malformed("a BooleanArray of %d values in %d bytes, want %d", n, len(bits), want)
		}
		out := make([]bool, n)
		for i := range out {
			out[i] = bits[i/8]&(0x80>>(i%8)) != 0
		}
		return out, nil
	case StringArray:
		if len(b) == 0 {
			return []string{}, nil
		}
		if b[len(b)-1] != 0 {
			return nil, malformed("a StringArray does not end with a NUL")
		}
		if n := bytes.Count(b, []byte{0}); n > MaxElements {
			return nil, malformed("a StringArray of %d values, more than %d", n, MaxElements)
		}
		parts := bytes.Split(b[:len(b)-1], []byte{0})
		out := make([]string, len(parts))
		for i, p := range parts {
			if len(p) > MaxString || !utf8.Valid(p) {
				return nil, malformed("StringArray value %d is not UTF-8 of at most %d bytes", i, MaxString)
			}
			out[i] = string(p)
		}
		return out, nil
	}
	size := elementSize(t)
	if size == 0 {
		return nil, malformed("%s is not an array data type", t)
	}
	if len(b)%size != 0 {
		return nil, malformed("a %s of %d bytes is not a whole number of %d-byte values", t, len(b), size)
	}
	n := len(b) / size
	if n > MaxElements {
		return nil, malformed("a %s of %d values, more than %d", t, n, MaxElements)
	}
	word := func(i int) uint64 {
		p := b[i*size:]
		switch size {
		case 1:
			return uint64(p[0])
		case 2:
			return uint64(binary.LittleEndian.Uint16(p))
		case 4:
			return uint64(binary.LittleEndian.Uint32(p))
		}
		return binary.LittleEndian.Uint64(p)
	}
	switch t {
	case UInt8Array, UInt16Array, UInt32Array, UInt64Array:
		out := make([]uint64, n)
		for i := range out {
			out[i] = word(i)
		}
		return out, nil
	case FloatArray, DoubleArray:
		out := make([]float64, n)
		for i := range out {
			if size == 4 {
				out[i] = float64(math.Float32frombits(uint32(word(i))))
			} else {
				out[i] = math.Float64frombits(word(i))
			}
		}
		return out, nil
	}
	out := make([]int64, n)
	for i := range out {
		w := word(i)
		switch size { // sign-extend
		case 1:
			out[i] = int64(int8(w))
		case 2:
			out[i] = int64(int16(w))
		case 4:
			out[i] = int64(int32(w))
		default:
			out[i] = int64(w)
		}
	}
	return out, nil
}

// EncodeArray lays out v (as DecodeArray returns it, of t's Go type) as
// t's bytes_value; a value that does not fit t's elements is an error.
func EncodeArray(t DataType, v any) ([]byte, error) {
	var b []byte
	switch vs := v.(type) {
	case []bool:
		if t != BooleanArray {
			break
		}
		b = binary.LittleEndian.AppendUint32(b, uint32(len(vs)))
		bits := make([]byte, (len(vs)+7)/8)
		for i, x := range vs {
			if x {
				bits[i/8] |= 0x80 >> (i % 8)
			}
		}
		return append(b, bits...), nil
	case []string:
		if t != StringArray {
			break
		}
		for i, s := range vs {
			if !utf8.ValidString(s) || bytes.IndexByte([]byte(s), 0) >= 0 {
				return nil, malformed("StringArray value %d is not UTF-8 without NUL", i)
			}
			b = append(append(b, s...), 0)
		}
		return b, nil
	case []float64:
		if t != FloatArray && t != DoubleArray {
			break
		}
		for _, f := range vs {
			if t == FloatArray {
				b = binary.LittleEndian.AppendUint32(b, math.Float32bits(float32(f)))
			} else {
				b = binary.LittleEndian.AppendUint64(b, math.Float64bits(f))
			}
		}
		return b, nil
	case []int64:
		size := elementSize(t)
		if t != Int8Array && t != Int16Array && t != Int32Array && t != Int64Array && t != DateTimeArray {
			break
		}
		for i, n := range vs {
			if bits := 8 * size; bits < 64 && (n < -1<<(bits-1) || n >= 1<<(bits-1)) {
				return nil, malformed("%s value %d (%d) does not fit", t, i, n)
			}
			b = appendWord(b, size, uint64(n))
		}
		return b, nil
	case []uint64:
		size := elementSize(t)
		if t != UInt8Array && t != UInt16Array && t != UInt32Array && t != UInt64Array {
			break
		}
		for i, n := range vs {
			if bits := 8 * size; bits < 64 && n >= 1<<bits {
				return nil, malformed("%s value %d (%d) does not fit", t, i, n)
			}
			b = appendWord(b, size, n)
		}
		return b, nil
	}
	return nil, malformed("a %T is not a %s", v, t)
}

func appendWord(b []byte, size int, w uint64) []byte {
	switch size {
	case 1:
		return append(b, byte(w))
	case 2:
		return binary.LittleEndian.AppendUint16(b, uint16(w))
	case 4:
		return binary.LittleEndian.AppendUint32(b, uint32(w))
	}
	return binary.LittleEndian.AppendUint64(b, w)
}

// DataSet field numbers (message Payload.DataSet, its Row and
// DataSetValue).
const (
	dataSetNumColumns = 1
	dataSetColumns    = 2
	dataSetTypes      = 3
	dataSetRows       = 4
	rowElements       = 1
	cellInt           = 1
	cellLong          = 2
	cellFloat         = 3
	cellDouble        = 4
	cellBool          = 5
	cellString        = 6
)

// Table is a DataSet's value: named, typed columns and rows of cells.
type Table struct {
	Columns []string
	Types   []DataType
	Rows    [][]Cell
}

// Cell is one value of a DataSet. Kind says which field was set (NoValue:
// none, a null); Uint holds int_value and long_value, as in a Metric.
type Cell struct {
	Kind   ValueKind
	Uint   uint64
	Float  float64
	Bool   bool
	String string
}

// DecodeDataSet reads a DataSet metric's value (Metric.Bytes of a
// DataSetKind metric): columns as many as num_of_columns says (at most
// MaxColumns), a type per column, each row a cell per column, at most
// MaxElements cells. Unknown fields are skipped. Errors wrap ErrMalformed.
func DecodeDataSet(b []byte) (*Table, error) {
	ds := &Table{}
	var num uint64
	hasNum := false
	cells := 0
	for len(b) > 0 {
		f, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, malformed("DataSet: %v", protowire.ParseError(n))
		}
		b = b[n:]
		switch {
		case f == dataSetNumColumns && typ == protowire.VarintType:
			num, n = protowire.ConsumeVarint(b)
			hasNum = true
			if n >= 0 && num > MaxColumns {
				return nil, malformed("a DataSet of %d columns, more than %d", num, MaxColumns)
			}
		case f == dataSetColumns && typ == protowire.BytesType:
			var v []byte
			v, n = protowire.ConsumeBytes(b)
			if n < 0 {
				break
			}
			if len(ds.Columns) >= MaxColumns {
				return nil, malformed("a DataSet of more than %d columns", MaxColumns)
			}
			var s string
			if s, n = checkString(v, n); n < 0 {
				return nil, malformed("DataSet column %d is not UTF-8 of at most %d bytes", len(ds.Columns), MaxString)
			}
			ds.Columns = append(ds.Columns, s)
		case f == dataSetTypes && typ == protowire.VarintType:
			var v uint64
			v, n = protowire.ConsumeVarint(b)
			if n >= 0 {
				if err := ds.addType(v); err != nil {
					return nil, err
				}
			}
		case f == dataSetTypes && typ == protowire.BytesType: // packed
			var v []byte
			v, n = protowire.ConsumeBytes(b)
			for len(v) > 0 && n >= 0 {
				t, m := protowire.ConsumeVarint(v)
				if m < 0 {
					return nil, malformed("DataSet types: %v", protowire.ParseError(m))
				}
				if err := ds.addType(t); err != nil {
					return nil, err
				}
				v = v[m:]
			}
		case f == dataSetRows && typ == protowire.BytesType:
			var v []byte
			v, n = protowire.ConsumeBytes(b)
			if n < 0 {
				break
			}
			if len(ds.Rows) >= MaxElements {
				return nil, malformed("a DataSet of more than %d rows", MaxElements)
			}
			row, err := decodeRow(v, MaxElements-cells)
			if err != nil {
				return nil, malformed("DataSet row %d: %v", len(ds.Rows), err)
			}
			cells += len(row)
			ds.Rows = append(ds.Rows, row)
		default:
			n = protowire.ConsumeFieldValue(f, typ, b)
		}
		if n < 0 {
			return nil, malformed("DataSet field %d: %v", f, protowire.ParseError(n))
		}
		b = b[n:]
	}
	cols := len(ds.Columns)
	if hasNum && num != uint64(cols) {
		return nil, malformed("a DataSet of %d columns names %d", num, cols)
	}
	if len(ds.Types) != cols {
		return nil, malformed("a DataSet of %d columns has %d types", cols, len(ds.Types))
	}
	for i, r := range ds.Rows {
		if len(r) != cols {
			return nil, malformed("DataSet row %d has %d values, want %d", i, len(r), cols)
		}
	}
	return ds, nil
}

func (ds *Table) addType(v uint64) error {
	if len(ds.Types) >= MaxColumns {
		return malformed("a DataSet of more than %d types", MaxColumns)
	}
	if v > math.MaxUint32 {
		return malformed("DataSet type %d", v)
	}
	ds.Types = append(ds.Types, DataType(v))
	return nil
}

// errTooMany is a row past the cells left.
var errTooMany = fmt.Errorf("more than %d cells in the DataSet", MaxElements)

func decodeRow(b []byte, left int) ([]Cell, error) {
	var row []Cell
	for len(b) > 0 {
		f, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		b = b[n:]
		if f == rowElements && typ == protowire.BytesType {
			var v []byte
			v, n = protowire.ConsumeBytes(b)
			if n < 0 {
				return nil, protowire.ParseError(n)
			}
			if len(row) >= left {
				return nil, errTooMany
			}
			c, err := decodeCell(v)
			if err != nil {
				return nil, err
			}
			row = append(row, c)
		} else {
			n = protowire.ConsumeFieldValue(f, typ, b)
		}
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		b = b[n:]
	}
	return row, nil
}

func decodeCell(b []byte) (Cell, error) {
	var c Cell
	for len(b) > 0 {
		f, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return c, protowire.ParseError(n)
		}
		b = b[n:]
		switch {
		case (f == cellInt || f == cellLong || f == cellBool) && typ == protowire.VarintType:
			var v uint64
			v, n = protowire.ConsumeVarint(b)
			switch f {
			case cellInt:
				c.Kind, c.Uint = IntValue, uint64(uint32(v))
			case cellLong:
				c.Kind, c.Uint = LongValue, v
			default:
				c.Kind, c.Bool = BoolValue, v != 0
			}
		case f == cellFloat && typ == protowire.Fixed32Type:
			var v uint32
			v, n = protowire.ConsumeFixed32(b)
			c.Kind, c.Float = FloatValue, float64(math.Float32frombits(v))
		case f == cellDouble && typ == protowire.Fixed64Type:
			var v uint64
			v, n = protowire.ConsumeFixed64(b)
			c.Kind, c.Float = DoubleValue, math.Float64frombits(v)
		case f == cellString && typ == protowire.BytesType:
			var v []byte
			v, n = protowire.ConsumeBytes(b)
			if n >= 0 {
				var s string
				if s, n = checkString(v, n); n < 0 {
					return c, malformed("a string value is not UTF-8 of at most %d bytes", MaxString)
				}
				c.Kind, c.String = StringValue, s
			}
		default: // extension_value and unknown fields
			n = protowire.ConsumeFieldValue(f, typ, b)
		}
		if n < 0 {
			return c, protowire.ParseError(n)
		}
		b = b[n:]
	}
	return c, nil
}

// EncodeDataSet encodes ds as a DataSet message (types unpacked, as
// proto2 lays out sparkplug_b.proto's repeated uint32).
func EncodeDataSet(ds *Table) []byte {
	var b []byte
	b = protowire.AppendTag(b, dataSetNumColumns, protowire.VarintType)
	b = protowire.AppendVarint(b, uint64(len(ds.Columns)))
	for _, c := range ds.Columns {
		b = protowire.AppendTag(b, dataSetColumns, protowire.BytesType)
		b = protowire.AppendString(b, c)
	}
	for _, t := range ds.Types {
		b = protowire.AppendTag(b, dataSetTypes, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(t))
	}
	for _, r := range ds.Rows {
		var rb []byte
		for _, c := range r {
			var cb []byte
			switch c.Kind {
			case IntValue:
				cb = protowire.AppendTag(cb, cellInt, protowire.VarintType)
				cb = protowire.AppendVarint(cb, uint64(uint32(c.Uint)))
			case LongValue:
				cb = protowire.AppendTag(cb, cellLong, protowire.VarintType)
				cb = protowire.AppendVarint(cb, c.Uint)
			case FloatValue:
				cb = protowire.AppendTag(cb, cellFloat, protowire.Fixed32Type)
				cb = protowire.AppendFixed32(cb, math.Float32bits(float32(c.Float)))
			case DoubleValue:
				cb = protowire.AppendTag(cb, cellDouble, protowire.Fixed64Type)
				cb = protowire.AppendFixed64(cb, math.Float64bits(c.Float))
			case BoolValue:
				cb = protowire.AppendTag(cb, cellBool, protowire.VarintType)
				v := uint64(0)
				if c.Bool {
					v = 1
				}
				cb = protowire.AppendVarint(cb, v)
			case StringValue:
				cb = protowire.AppendTag(cb, cellString, protowire.BytesType)
				cb = protowire.AppendString(cb, c.String)
			}
			rb = protowire.AppendTag(rb, rowElements, protowire.BytesType)
			rb = protowire.AppendBytes(rb, cb)
		}
		b = protowire.AppendTag(b, dataSetRows, protowire.BytesType)
		b = protowire.AppendBytes(b, rb)
	}
	return b
}
