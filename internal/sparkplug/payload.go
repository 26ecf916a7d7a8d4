// Package sparkplug is Dowse's own codec of the Eclipse Sparkplug B
// payload (Sparkplug 3.0, sparkplug_b.proto: org.eclipse.tahu.protobuf.Payload)
// and its topic namespace, written against the published field numbers with
// protowire; no generated or vendored Tahu code. The discovery handler reads
// births and deaths with it, the mapper data and commands.
//
// Decode is built for what comes from a broker: it never panics, keeps at
// most a caller's number of metrics (counting the rest), refuses names and
// strings that are not UTF-8 or longer than MaxString, and skips what it
// does not read (templates, property sets, extensions) without descending
// into it. Arrays (in bytes_value) and DataSets are kept as bytes, read on
// demand by DecodeArray and DecodeDataSet (array.go), bounded by
// MaxElements.
package sparkplug

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
)

// Payload field numbers (sparkplug_b.proto, message Payload).
const (
	fieldTimestamp = 1
	fieldMetrics   = 2
	fieldSeq       = 3
	fieldUUID      = 4
	fieldBody      = 5
)

// Metric field numbers (message Payload.Metric).
const (
	metricName         = 1
	metricAlias        = 2
	metricTimestamp    = 3
	metricDatatype     = 4
	metricIsHistorical = 5
	metricIsTransient  = 6
	metricIsNull       = 7
	metricMetadata     = 8
	metricProperties   = 9
	metricIntValue     = 10
	metricLongValue    = 11
	metricFloatValue   = 12
	metricDoubleValue  = 13
	metricBooleanValue = 14
	metricStringValue  = 15
	metricBytesValue   = 16
	metricDatasetValue = 17
	metricTemplate     = 18
	metricExtension    = 19
)

// MaxString bounds a metric's name and string value, in bytes.
const MaxString = 64 << 10

// DataType is a Sparkplug B data type (the DataType enum).
type DataType uint32

// The data types of Sparkplug 3.0.
const (
	Unknown DataType = iota
	Int8
	Int16
	Int32
	Int64
	UInt8
	UInt16
	UInt32
	UInt64
	Float
	Double
	Boolean
	String
	DateTime
	Text
	UUID
	DataSet
	Bytes
	File
	Template
	PropertySet
	PropertySetList
	Int8Array
	Int16Array
	Int32Array
	Int64Array
	UInt8Array
	UInt16Array
	UInt32Array
	UInt64Array
	FloatArray
	DoubleArray
	BooleanArray
	StringArray
	DateTimeArray
)

var typeNames = [...]string{"Unknown", "Int8", "Int16", "Int32", "Int64", "UInt8", "UInt16", "UInt32", "UInt64", "Float", "Double",
	"Boolean", "String", "DateTime", "Text", "UUID", "DataSet", "Bytes", "File", "Template", "PropertySet", "PropertySetList",
	"Int8Array", "Int16Array", "Int32Array", "Int64Array", "UInt8Array", "UInt16Array", "UInt32Array", "UInt64Array",
	"FloatArray", "DoubleArray", "BooleanArray", "StringArray", "DateTimeArray"}

// String is the type's name in the specification ("Int32", "Double"), or
// "DataType(N)" for a number it does not define.
func (t DataType) String() string {
	if int(t) < len(typeNames) {
		return typeNames[t]
	}
	return "DataType(" + strconv.FormatUint(uint64(t), 10) + ")"
}

// ValueKind says which member of a metric's value oneof was set.
type ValueKind uint8

// The value kinds; Other is a template or extension (not read).
const (
	NoValue ValueKind = iota
	IntValue
	LongValue
	FloatValue
	DoubleValue
	BoolValue
	StringValue
	BytesValue
	OtherValue
	// DataSetKind is a DataSet, kept as its encoded bytes in Bytes
	// (DecodeDataSet reads them).
	DataSetKind
)

// Metric is one metric of a payload.
type Metric struct {
	Name         string
	HasName      bool
	Alias        uint64
	HasAlias     bool
	Timestamp    uint64
	Datatype     DataType
	IsHistorical bool
	IsTransient  bool
	IsNull       bool
	// Kind says which value field was set: Uint holds int_value and
	// long_value (two's complement for signed types), Float float_value and
	// double_value, Bool, String and Bytes the others (Bytes also an
	// array's packed values, and a DataSet's message).
	Kind   ValueKind
	Uint   uint64
	Float  float64
	Bool   bool
	String string
	Bytes  []byte
}

// Payload is a decoded Sparkplug B payload.
type Payload struct {
	Timestamp    uint64
	HasTimestamp bool
	Seq          uint64
	HasSeq       bool
	UUID         string
	Body         []byte
	// Metrics are the first metrics of the payload, at most the bound given
	// to Decode; MetricCount counts them all.
	Metrics     []Metric
	MetricCount int
}

// Metric returns the metric named name, if the payload holds it.
func (p *Payload) Metric(name string) (Metric, bool) {
	for _, m := range p.Metrics {
		if m.HasName && m.Name == name {
			return m, true
		}
	}
	return Metric{}, false
}

// ErrMalformed wraps every decoding error.
var ErrMalformed = errors.New("not a Sparkplug B payload")

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, args...))
}

// Decode decodes b, keeping at most maxMetrics metrics (all when
// maxMetrics < 0). Unknown fields are skipped, as protobuf requires.
func Decode(b []byte, maxMetrics int) (*Payload, error) {
	p := &Payload{}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, malformed("payload: %v", protowire.ParseError(n))
		}
		b = b[n:]
		switch {
		case num == fieldTimestamp && typ == protowire.VarintType:
			p.Timestamp, n = protowire.ConsumeVarint(b)
			p.HasTimestamp = true
		case num == fieldSeq && typ == protowire.VarintType:
			p.Seq, n = protowire.ConsumeVarint(b)
			p.HasSeq = true
		case num == fieldUUID && typ == protowire.BytesType:
			var v []byte
			v, n = protowire.ConsumeBytes(b)
			if n >= 0 {
				if p.UUID, n = checkString(v, n); n < 0 {
					return nil, malformed("payload uuid is not UTF-8 of at most %d bytes", MaxString)
				}
			}
		case num == fieldBody && typ == protowire.BytesType:
			var v []byte
			v, n = protowire.ConsumeBytes(b)
			p.Body = v
		case num == fieldMetrics && typ == protowire.BytesType:
			var v []byte
			v, n = protowire.ConsumeBytes(b)
			if n < 0 {
				break
			}
			p.MetricCount++
			if maxMetrics >= 0 && len(p.Metrics) >= maxMetrics {
				// Checked, not kept.
				if _, err := decodeMetric(v); err != nil {
					return nil, fmt.Errorf("metric %d: %w", p.MetricCount-1, err)
				}
				break
			}
			m, err := decodeMetric(v)
			if err != nil {
				return nil, fmt.Errorf("metric %d: %w", p.MetricCount-1, err)
			}
			p.Metrics = append(p.Metrics, m)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return nil, malformed("payload field %d: %v", num, protowire.ParseError(n))
		}
		b = b[n:]
	}
	return p, nil
}

func checkString(v []byte, n int) (string, int) {
	if len(v) > MaxString || !utf8.Valid(v) {
		return "", -1
	}
	return string(v), n
}

func decodeMetric(b []byte) (Metric, error) {
	var m Metric
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return m, malformed("%v", protowire.ParseError(n))
		}
		b = b[n:]
		var v uint64
		switch {
		case typ == protowire.VarintType && (num == metricAlias || num == metricTimestamp || num == metricDatatype ||
			num == metricIsHistorical || num == metricIsTransient || num == metricIsNull || num == metricIntValue ||
			num == metricLongValue || num == metricBooleanValue):
			v, n = protowire.ConsumeVarint(b)
			switch num {
			case metricAlias:
				m.Alias, m.HasAlias = v, true
			case metricTimestamp:
				m.Timestamp = v
			case metricDatatype:
				if v > math.MaxUint32 {
					return m, malformed("datatype %d", v)
				}
				m.Datatype = DataType(v)
			case metricIsHistorical:
				m.IsHistorical = v != 0
			case metricIsTransient:
				m.IsTransient = v != 0
			case metricIsNull:
				m.IsNull = v != 0
			case metricIntValue:
				m.Kind, m.Uint = IntValue, uint64(uint32(v))
			case metricLongValue:
				m.Kind, m.Uint = LongValue, v
			case metricBooleanValue:
				m.Kind, m.Bool = BoolValue, v != 0
			}
		case num == metricFloatValue && typ == protowire.Fixed32Type:
			var f uint32
			f, n = protowire.ConsumeFixed32(b)
			m.Kind, m.Float = FloatValue, float64(math.Float32frombits(f))
		case num == metricDoubleValue && typ == protowire.Fixed64Type:
			v, n = protowire.ConsumeFixed64(b)
			m.Kind, m.Float = DoubleValue, math.Float64frombits(v)
		case (num == metricName || num == metricStringValue) && typ == protowire.BytesType:
			var s []byte
			s, n = protowire.ConsumeBytes(b)
			if n < 0 {
				break
			}
			var str string
			if str, n = checkString(s, n); n < 0 {
				return m, malformed("field %d is not UTF-8 of at most %d bytes", num, MaxString)
			}
			if num == metricName {
				m.Name, m.HasName = str, true
			} else {
				m.Kind, m.String = StringValue, str
			}
		case num == metricBytesValue && typ == protowire.BytesType:
			var s []byte
			s, n = protowire.ConsumeBytes(b)
			m.Kind, m.Bytes = BytesValue, s
		case num == metricDatasetValue && typ == protowire.BytesType:
			var s []byte
			s, n = protowire.ConsumeBytes(b)
			m.Kind, m.Bytes = DataSetKind, s
		case (num == metricTemplate || num == metricExtension) && typ == protowire.BytesType:
			n = protowire.ConsumeFieldValue(num, typ, b)
			m.Kind = OtherValue
		default:
			// metadata, properties and unknown fields.
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return m, malformed("metric field %d: %v", num, protowire.ParseError(n))
		}
		b = b[n:]
	}
	return m, nil
}

// Encode encodes p (its Metrics; MetricCount is ignored).
func Encode(p *Payload) []byte {
	var b []byte
	if p.HasTimestamp {
		b = protowire.AppendTag(b, fieldTimestamp, protowire.VarintType)
		b = protowire.AppendVarint(b, p.Timestamp)
	}
	for i := range p.Metrics {
		b = protowire.AppendTag(b, fieldMetrics, protowire.BytesType)
		b = protowire.AppendBytes(b, encodeMetric(&p.Metrics[i]))
	}
	if p.HasSeq {
		b = protowire.AppendTag(b, fieldSeq, protowire.VarintType)
		b = protowire.AppendVarint(b, p.Seq)
	}
	if p.UUID != "" {
		b = protowire.AppendTag(b, fieldUUID, protowire.BytesType)
		b = protowire.AppendString(b, p.UUID)
	}
	if p.Body != nil {
		b = protowire.AppendTag(b, fieldBody, protowire.BytesType)
		b = protowire.AppendBytes(b, p.Body)
	}
	return b
}

func encodeMetric(m *Metric) []byte {
	var b []byte
	varint := func(num protowire.Number, v uint64) {
		b = protowire.AppendTag(b, num, protowire.VarintType)
		b = protowire.AppendVarint(b, v)
	}
	boolean := func(x bool) uint64 {
		if x {
			return 1
		}
		return 0
	}
	if m.HasName {
		b = protowire.AppendTag(b, metricName, protowire.BytesType)
		b = protowire.AppendString(b, m.Name)
	}
	if m.HasAlias {
		varint(metricAlias, m.Alias)
	}
	if m.Timestamp != 0 {
		varint(metricTimestamp, m.Timestamp)
	}
	varint(metricDatatype, uint64(m.Datatype))
	if m.IsHistorical {
		varint(metricIsHistorical, 1)
	}
	if m.IsTransient {
		varint(metricIsTransient, 1)
	}
	if m.IsNull {
		varint(metricIsNull, 1)
	}
	switch m.Kind {
	case IntValue:
		varint(metricIntValue, uint64(uint32(m.Uint)))
	case LongValue:
		varint(metricLongValue, m.Uint)
	case FloatValue:
		b = protowire.AppendTag(b, metricFloatValue, protowire.Fixed32Type)
		b = protowire.AppendFixed32(b, math.Float32bits(float32(m.Float)))
	case DoubleValue:
		b = protowire.AppendTag(b, metricDoubleValue, protowire.Fixed64Type)
		b = protowire.AppendFixed64(b, math.Float64bits(m.Float))
	case BoolValue:
		varint(metricBooleanValue, boolean(m.Bool))
	case StringValue:
		b = protowire.AppendTag(b, metricStringValue, protowire.BytesType)
		b = protowire.AppendString(b, m.String)
	case BytesValue:
		b = protowire.AppendTag(b, metricBytesValue, protowire.BytesType)
		b = protowire.AppendBytes(b, m.Bytes)
	case DataSetKind:
		b = protowire.AppendTag(b, metricDatasetValue, protowire.BytesType)
		b = protowire.AppendBytes(b, m.Bytes)
	}
	return b
}
