package sparkplug

import (
	"bytes"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
)

// Bytes laid out by hand as Sparkplug 3.0 says (its examples where it
// gives one: Int32Array, BooleanArray, StringArray).
func TestDecodeArray(t *testing.T) {
	for _, c := range []struct {
		t    DataType
		b    []byte
		want any
	}{
		{Int8Array, []byte{0xE9, 0x7B}, []int64{-23, 123}},
		{Int16Array, []byte{0xD0, 0x8A, 0x30, 0x75}, []int64{-30000, 30000}},
		{Int32Array, []byte{0x15, 0xCD, 0x5B, 0x07, 0xB1, 0x68, 0xDE, 0x3A}, []int64{123456789, 987654321}},
		{Int64Array, []byte{0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF}, []int64{-1}},
		{UInt8Array, []byte{0xFF, 0x00}, []uint64{255, 0}},
		{UInt16Array, []byte{0x1E, 0x00, 0x88, 0xCC}, []uint64{30, 52360}},
		{UInt32Array, []byte{0xFF, 0xFF, 0xFF, 0xFF}, []uint64{math.MaxUint32}},
		{UInt64Array, []byte{0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF}, []uint64{math.MaxUint64}},
		{FloatArray, []byte{0x00, 0x00, 0xC0, 0x3F, 0x00, 0x00, 0x00, 0xC0}, []float64{1.5, -2}},
		{DoubleArray, []byte{0, 0, 0, 0, 0, 0, 0xF0, 0x3F}, []float64{1}},
		{DateTimeArray, []byte{0xC7, 0xD0, 0x90, 0x75, 0x24, 0x01, 0x00, 0x00}, []int64{1256102875335}},
		{BooleanArray, []byte{0x0C, 0x00, 0x00, 0x00, 0x34, 0xD0},
			[]bool{false, false, true, true, false, true, false, false, true, true, false, true}},
		{BooleanArray, []byte{0, 0, 0, 0}, []bool{}},
		{StringArray, []byte{0x41, 0x42, 0x43, 0x00, 0x68, 0x65, 0x6C, 0x6C, 0x6F, 0x00}, []string{"ABC", "hello"}},
		{StringArray, []byte{0x00, 0x00}, []string{"", ""}},
		{StringArray, nil, []string{}},
		{Int32Array, nil, []int64{}},
	} {
		got, err := DecodeArray(c.t, c.b)
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s % x: %#v %v, want %#v", c.t, c.b, got, err, c.want)
			continue
		}
		// And back to the same bytes.
		if b, err := EncodeArray(c.t, got); err != nil || !bytes.Equal(b, c.b) {
			t.Errorf("%s %v encodes to % x %v, want % x", c.t, got, b, err, c.b)
		}
	}
	for _, c := range []struct {
		t    DataType
		b    []byte
		want string
	}{
		{Int16Array, []byte{1, 2, 3}, "not a whole number of 2-byte values"},
		{DoubleArray, make([]byte, 12), "not a whole number of 8-byte values"},
		{BooleanArray, []byte{9, 0, 0}, "has no count"},
		{BooleanArray, []byte{9, 0, 0, 0, 0xFF}, "9 values in 1 bytes, want 2"},
		{BooleanArray, []byte{0xFF, 0xFF, 0xFF, 0xFF}, "more than 16384"},
		{StringArray, []byte("abc"), "does not end with a NUL"},
		{StringArray, []byte{0xFF, 0}, "not UTF-8"},
		{StringArray, bytes.Repeat([]byte{0}, MaxElements+1), "more than 16384"},
		{Int8Array, make([]byte, MaxElements+1), "more than 16384"},
		{Int32, []byte{1, 2, 3, 4}, "Int32 is not an array data type"},
		{DataSet, nil, "not an array data type"},
	} {
		_, err := DecodeArray(c.t, c.b)
		if err == nil || !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s % x: %v, want an ErrMalformed with %q", c.t, c.b, err, c.want)
		}
	}
	if _, err := EncodeArray(Int8Array, []int64{128}); err == nil {
		t.Error("Int8Array 128 encoded")
	}
	if _, err := EncodeArray(UInt16Array, []int64{1}); err == nil {
		t.Error("an []int64 encoded as a UInt16Array")
	}
}

// A DataSet laid out by hand (sparkplug_b.proto's Payload.DataSet: types
// packed here, unpacked as Encode lays them), with a null cell.
func TestDecodeDataSet(t *testing.T) {
	b := []byte{
		0x08, 0x02, // num_of_columns 2
		0x12, 0x02, 'i', 'd', 0x12, 0x04, 'n', 'a', 'm', 'e', // columns
		0x1A, 0x02, 0x03, 0x0C, // types [Int32, String], packed
		0x22, 0x09, 0x0A, 0x02, 0x08, 0x01, 0x0A, 0x03, 0x32, 0x01, 'a', // row [1, "a"]
		0x22, 0x0A, 0x0A, 0x06, 0x08, 0xFB, 0xFF, 0xFF, 0xFF, 0x0F, 0x0A, 0x00, // row [-5 (Int32), null]
	}
	ds, err := DecodeDataSet(b)
	if err != nil {
		t.Fatal(err)
	}
	want := &Table{Columns: []string{"id", "name"}, Types: []DataType{Int32, String}, Rows: [][]Cell{
		{{Kind: IntValue, Uint: 1}, {Kind: StringValue, String: "a"}},
		{{Kind: IntValue, Uint: 0xFFFFFFFB}, {}},
	}}
	if !reflect.DeepEqual(ds, want) {
		t.Fatalf("%+v, want %+v", ds, want)
	}
	again, err := DecodeDataSet(EncodeDataSet(ds))
	if err != nil || !reflect.DeepEqual(again, want) {
		t.Errorf("round trip: %+v %v", again, err)
	}
	// In a metric, through a payload.
	p, err := Decode(Encode(&Payload{Metrics: []Metric{{Name: "t", HasName: true, Datatype: DataSet, Kind: DataSetKind, Bytes: b}}}), -1)
	if err != nil || p.Metrics[0].Kind != DataSetKind || !bytes.Equal(p.Metrics[0].Bytes, b) {
		t.Errorf("a DataSet metric: %+v %v", p, err)
	}

	for _, c := range []struct {
		b    []byte
		want string
	}{
		{[]byte{0x08, 0x03, 0x12, 0x01, 'a', 0x18, 0x03}, "3 columns names 1"},
		{[]byte{0x12, 0x01, 'a', 0x12, 0x01, 'b', 0x18, 0x03}, "2 columns has 1 types"},
		{[]byte{0x12, 0x01, 'a', 0x18, 0x03, 0x22, 0x00}, "row 0 has 0 values, want 1"},
		{[]byte{0x12, 0x01, 0xFF, 0x18, 0x03}, "not UTF-8"},
		{[]byte{0x08, 0x80, 0x10}, "2048 columns, more than 1024"},
		{[]byte{0x22, 0x05, 0x0A, 0x03, 0x32, 0x05, 'a'}, "row 0"},
		{[]byte{0x1A, 0x01, 0x80}, "DataSet types"},
		{[]byte{0x22}, "DataSet field 4"},
	} {
		_, err := DecodeDataSet(c.b)
		if err == nil || !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("% x: %v, want an ErrMalformed with %q", c.b, err, c.want)
		}
	}
	// Bounded: two columns, MaxElements/2+1 rows; MaxElements+1 empty rows.
	big := &Table{Columns: []string{"x", "y"}, Types: []DataType{Boolean, Boolean}}
	for range MaxElements/2 + 1 {
		big.Rows = append(big.Rows, []Cell{{Kind: BoolValue}, {}})
	}
	if _, err := DecodeDataSet(EncodeDataSet(big)); err == nil || !strings.Contains(err.Error(), "more than 16384 cells") {
		t.Errorf("%d cells: %v", MaxElements+2, err)
	}
	empty := &Table{Rows: make([][]Cell, MaxElements+1)}
	if _, err := DecodeDataSet(EncodeDataSet(empty)); err == nil || !strings.Contains(err.Error(), "more than 16384 rows") {
		t.Errorf("%d empty rows: %v", MaxElements+1, err)
	}
}

func FuzzArray(f *testing.F) {
	f.Add(uint8(BooleanArray), []byte{0x0C, 0x00, 0x00, 0x00, 0x34, 0xD0})
	f.Add(uint8(StringArray), []byte("ABC\x00hello\x00"))
	f.Add(uint8(Int16Array), []byte{0xD0, 0x8A, 0x30, 0x75})
	f.Add(uint8(FloatArray), []byte{0x00, 0x00, 0xC0, 0x3F})
	f.Fuzz(func(t *testing.T, dt uint8, b []byte) {
		typ := DataType(dt)
		v, err := DecodeArray(typ, b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v is not ErrMalformed", err)
			}
			return
		}
		if n := reflect.ValueOf(v).Len(); n > MaxElements {
			t.Fatalf("%d values", n)
		}
		// What decodes encodes to what decodes the same (floats compared
		// by their bits: a NaN stays a NaN).
		e, err := EncodeArray(typ, v)
		if err != nil {
			t.Fatalf("%s %v: %v", typ, v, err)
		}
		w, err := DecodeArray(typ, e)
		if err != nil {
			t.Fatalf("%s re-encoded: %v", typ, err)
		}
		if fs, ok := v.([]float64); ok {
			ws := w.([]float64)
			for i := range fs {
				if math.Float64bits(fs[i]) != math.Float64bits(ws[i]) && !(math.IsNaN(fs[i]) && math.IsNaN(ws[i])) {
					t.Fatalf("%s value %d: %v, then %v", typ, i, fs[i], ws[i])
				}
			}
			return
		}
		if !reflect.DeepEqual(v, w) {
			t.Fatalf("%s: %v, then %v", typ, v, w)
		}
	})
}

func FuzzDataSet(f *testing.F) {
	f.Add(EncodeDataSet(&Table{Columns: []string{"a", "b"}, Types: []DataType{Int32, String},
		Rows: [][]Cell{{{Kind: IntValue, Uint: 1}, {Kind: StringValue, String: "x"}}, {{}, {Kind: DoubleValue, Float: 2}}}}))
	f.Add([]byte{0x08, 0x01, 0x12, 0x01, 'a', 0x1A, 0x01, 0x03})
	f.Fuzz(func(t *testing.T, b []byte) {
		ds, err := DecodeDataSet(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v is not ErrMalformed", err)
			}
			return
		}
		cells := 0
		for _, r := range ds.Rows {
			if len(r) != len(ds.Columns) {
				t.Fatalf("a row of %d cells, %d columns", len(r), len(ds.Columns))
			}
			cells += len(r)
		}
		if cells > MaxElements || len(ds.Columns) > MaxColumns || len(ds.Types) != len(ds.Columns) {
			t.Fatalf("%d cells, %d columns, %d types", cells, len(ds.Columns), len(ds.Types))
		}
		again, err := DecodeDataSet(EncodeDataSet(ds))
		if err != nil || len(again.Rows) != len(ds.Rows) || !reflect.DeepEqual(again.Columns, ds.Columns) {
			t.Fatalf("re-encoded: %+v %v", again, err)
		}
	})
}
