package sparkplug

import (
	"errors"
	"math"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
)

func TestRoundTrip(t *testing.T) {
	in := &Payload{Timestamp: 1700000000000, HasTimestamp: true, Seq: 3, HasSeq: true, UUID: "u", Metrics: []Metric{
		{Name: "bdSeq", HasName: true, Datatype: UInt64, Kind: LongValue, Uint: 7},
		{Name: "Temperature", HasName: true, Alias: 2, HasAlias: true, Datatype: Double, Kind: DoubleValue, Float: 21.5},
		{Name: "Level", HasName: true, Datatype: Float, Kind: FloatValue, Float: 0.25},
		{Name: "Relay", HasName: true, Datatype: Boolean, Kind: BoolValue, Bool: true},
		{Name: "Count", HasName: true, Datatype: Int32, Kind: IntValue, Uint: uint64(uint32(0xFFFFFFFF))},
		{Name: "Label", HasName: true, Datatype: String, Kind: StringValue, String: "hé"},
		{Alias: 9, HasAlias: true, Datatype: Bytes, Kind: BytesValue, Bytes: []byte{1, 2}, IsNull: false},
	}}
	out, err := Decode(Encode(in), -1)
	if err != nil {
		t.Fatal(err)
	}
	if out.MetricCount != len(in.Metrics) || len(out.Metrics) != len(in.Metrics) || out.Seq != 3 || out.Timestamp != in.Timestamp || out.UUID != "u" {
		t.Fatalf("decoded %+v", out)
	}
	for i := range in.Metrics {
		a, b := in.Metrics[i], out.Metrics[i]
		if a.Name != b.Name || a.Alias != b.Alias || a.Datatype != b.Datatype || a.Kind != b.Kind || a.Uint != b.Uint ||
			a.Float != b.Float || a.Bool != b.Bool || a.String != b.String || string(a.Bytes) != string(b.Bytes) {
			t.Errorf("metric %d: %+v, want %+v", i, b, a)
		}
	}
	if m, ok := out.Metric("bdSeq"); !ok || m.Uint != 7 {
		t.Errorf("bdSeq %+v %v", m, ok)
	}
	if int32(uint32(out.Metrics[4].Uint)) != -1 {
		t.Errorf("Int32 -1 read as %d", out.Metrics[4].Uint)
	}
	// The bound keeps the first metrics and counts the rest.
	short, err := Decode(Encode(in), 2)
	if err != nil || len(short.Metrics) != 2 || short.MetricCount != 7 {
		t.Fatalf("bounded: %+v %v", short, err)
	}
}

// TestKnownEncoding decodes bytes laid out by hand from sparkplug_b.proto's
// field numbers, so that the codec cannot agree only with itself.
func TestKnownEncoding(t *testing.T) {
	var metric []byte
	metric = protowire.AppendTag(metric, 1, protowire.BytesType)
	metric = protowire.AppendString(metric, "Pressure")
	metric = protowire.AppendTag(metric, 4, protowire.VarintType)
	metric = protowire.AppendVarint(metric, 9) // Float
	metric = protowire.AppendTag(metric, 12, protowire.Fixed32Type)
	metric = protowire.AppendFixed32(metric, math.Float32bits(1.5))
	metric = protowire.AppendTag(metric, 9, protowire.BytesType) // properties: skipped
	metric = protowire.AppendBytes(metric, []byte{0x0a, 0x01, 'x'})
	var b []byte
	b = protowire.AppendTag(b, 1, protowire.VarintType)
	b = protowire.AppendVarint(b, 42)
	b = protowire.AppendTag(b, 2, protowire.BytesType)
	b = protowire.AppendBytes(b, metric)
	b = protowire.AppendTag(b, 99, protowire.VarintType) // an extension
	b = protowire.AppendVarint(b, 1)
	p, err := Decode(b, 10)
	if err != nil {
		t.Fatal(err)
	}
	if p.Timestamp != 42 || len(p.Metrics) != 1 || p.Metrics[0].Name != "Pressure" || p.Metrics[0].Datatype != Float ||
		p.Metrics[0].Kind != FloatValue || p.Metrics[0].Float != 1.5 {
		t.Fatalf("%+v", p)
	}
	if Float.String() != "Float" || DataType(200).String() != "DataType(200)" {
		t.Error("type names")
	}
}

func TestGarbage(t *testing.T) {
	for name, b := range map[string][]byte{
		"truncated varint": {0x08, 0xff},
		"short metric":     {0x12, 0x05, 0x0a},
		"bad name":         append([]byte{0x12, 0x04, 0x0a, 0x02}, 0xff, 0xfe),
		"group tag":        {0x0b},
		"text":             []byte("{\"temperature\": 21}"),
	} {
		if _, err := Decode(b, 10); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestParseTopic(t *testing.T) {
	for topic, want := range map[string]Topic{
		"spBv1.0/G/NBIRTH/E":    {Group: "G", Type: NBIRTH, EdgeNode: "E"},
		"spBv1.0/G/DBIRTH/E/D":  {Group: "G", Type: DBIRTH, EdgeNode: "E", Device: "D"},
		"spBv1.0/G/DBIRTH/E":    {},
		"spBv1.0/G/NBIRTH/E/D":  {},
		"spBv1.0/STATE/host":    {},
		"spBv1.0/G/FOO/E":       {},
		"spAv1.0/G/NBIRTH/E":    {},
		"spBv1.0//NBIRTH/E":     {},
		"spBv1.0/G/DDEATH/E/D/": {},
	} {
		got, ok := ParseTopic(topic)
		if ok != (want.Type != "") || got != want {
			t.Errorf("%s: %+v %v, want %+v", topic, got, ok, want)
		}
		if ok && got.String() != topic {
			t.Errorf("%s: String %s", topic, got.String())
		}
	}
}

func FuzzPayload(f *testing.F) {
	f.Add(Encode(&Payload{Timestamp: 1, HasTimestamp: true, Metrics: []Metric{{Name: "a", HasName: true, Datatype: Int32, Kind: IntValue, Uint: 5}}}))
	f.Add([]byte{0x12, 0x05, 0x0a})
	f.Add([]byte{})
	f.Add(Encode(&Payload{Metrics: []Metric{
		{Name: "b", HasName: true, Datatype: BooleanArray, Kind: BytesValue, Bytes: []byte{0x0C, 0x00, 0x00, 0x00, 0x34, 0xD0}},
		{Name: "s", HasName: true, Datatype: StringArray, Kind: BytesValue, Bytes: []byte("ABC\x00hello\x00")},
		{Name: "t", HasName: true, Datatype: DataSet, Kind: DataSetKind, Bytes: EncodeDataSet(&Table{Columns: []string{"a"}, Types: []DataType{Int32},
			Rows: [][]Cell{{{Kind: IntValue, Uint: 7}}}})},
	}}))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := Decode(b, 4)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v is not ErrMalformed", err)
			}
			return
		}
		if len(p.Metrics) > 4 || p.MetricCount < len(p.Metrics) {
			t.Fatalf("%d metrics kept of %d", len(p.Metrics), p.MetricCount)
		}
		// What decodes encodes and decodes to the same metrics.
		q, err := Decode(Encode(p), -1)
		if err != nil {
			t.Fatalf("re-encoded payload: %v", err)
		}
		if len(q.Metrics) != len(p.Metrics) {
			t.Fatalf("%d metrics after a round trip, want %d", len(q.Metrics), len(p.Metrics))
		}
		for i := range q.Metrics {
			if q.Metrics[i].Name != p.Metrics[i].Name || q.Metrics[i].Datatype != p.Metrics[i].Datatype {
				t.Fatalf("metric %d: %+v, want %+v", i, q.Metrics[i], p.Metrics[i])
			}
			// Arrays and DataSets read on demand: values or ErrMalformed.
			m := p.Metrics[i]
			var err error
			switch {
			case m.Kind == BytesValue && m.Datatype.IsArray():
				_, err = DecodeArray(m.Datatype, m.Bytes)
			case m.Kind == DataSetKind:
				_, err = DecodeDataSet(m.Bytes)
			}
			if err != nil && !errors.Is(err, ErrMalformed) {
				t.Fatalf("metric %d: error %v is not ErrMalformed", i, err)
			}
		}
	})
}
