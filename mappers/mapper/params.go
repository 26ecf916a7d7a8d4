package mapper

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	dmiv1beta1 "github.com/dowse-dev/dowse/proto/dmi/v1beta1"
)

// Params is a decoded protocol or visitor configData: string keys to plain
// Go values (string, int64, uint64, float64, bool, []byte, nil,
// map[string]any, []any).
//
// The getters are lenient on purpose, because device managers pack the same
// JSON differently: KubeEdge's edgecore sends every JSON number as a
// google.protobuf.FloatValue (float32) and cannot send nested objects at
// all, other managers send Int64Value, DoubleValue, a Struct, or nested JSON
// inside a StringValue. So a getter takes an integer from any integral
// number or numeric string, a number from a numeric string, a boolean from
// "true"/"false", and an object from a Struct or a JSON string. Keys match
// exactly first, then case-insensitively ("slaveID" finds "slaveId").
type Params map[string]any

// DecodeConfig decodes a CustomizedValue. Every google.protobuf wrapper
// type, Struct, ListValue and Value are accepted; another message type is an
// error naming the key.
func DecodeConfig(cv *dmiv1beta1.CustomizedValue) (Params, error) {
	p := Params{}
	for k, v := range cv.GetData() {
		val, err := DecodeAny(v)
		if err != nil {
			return nil, fmt.Errorf("configData %q: %w", k, err)
		}
		p[k] = val
	}
	return p, nil
}

// DecodeAny unpacks one google.protobuf.Any configData value.
func DecodeAny(a *anypb.Any) (any, error) {
	if a == nil {
		return nil, nil
	}
	name := a.GetTypeUrl()
	if i := strings.LastIndexByte(name, '/'); i >= 0 {
		name = name[i+1:]
	}
	switch name {
	case "google.protobuf.StringValue":
		var w wrapperspb.StringValue
		if err := a.UnmarshalTo(&w); err != nil {
			return nil, err
		}
		return w.GetValue(), nil
	case "google.protobuf.BoolValue":
		var w wrapperspb.BoolValue
		if err := a.UnmarshalTo(&w); err != nil {
			return nil, err
		}
		return w.GetValue(), nil
	case "google.protobuf.Int64Value":
		var w wrapperspb.Int64Value
		if err := a.UnmarshalTo(&w); err != nil {
			return nil, err
		}
		return w.GetValue(), nil
	case "google.protobuf.Int32Value":
		var w wrapperspb.Int32Value
		if err := a.UnmarshalTo(&w); err != nil {
			return nil, err
		}
		return int64(w.GetValue()), nil
	case "google.protobuf.UInt64Value":
		var w wrapperspb.UInt64Value
		if err := a.UnmarshalTo(&w); err != nil {
			return nil, err
		}
		return w.GetValue(), nil
	case "google.protobuf.UInt32Value":
		var w wrapperspb.UInt32Value
		if err := a.UnmarshalTo(&w); err != nil {
			return nil, err
		}
		return int64(w.GetValue()), nil
	case "google.protobuf.DoubleValue":
		var w wrapperspb.DoubleValue
		if err := a.UnmarshalTo(&w); err != nil {
			return nil, err
		}
		return w.GetValue(), nil
	case "google.protobuf.FloatValue":
		var w wrapperspb.FloatValue
		if err := a.UnmarshalTo(&w); err != nil {
			return nil, err
		}
		// edgecore turns every JSON number into a float32; its shortest
		// decimal form is what the user wrote (0.1, not 0.10000000149).
		f, _ := strconv.ParseFloat(strconv.FormatFloat(float64(w.GetValue()), 'g', -1, 32), 64)
		return f, nil
	case "google.protobuf.BytesValue":
		var w wrapperspb.BytesValue
		if err := a.UnmarshalTo(&w); err != nil {
			return nil, err
		}
		return w.GetValue(), nil
	case "google.protobuf.Struct":
		var w structpb.Struct
		if err := a.UnmarshalTo(&w); err != nil {
			return nil, err
		}
		return w.AsMap(), nil
	case "google.protobuf.ListValue":
		var w structpb.ListValue
		if err := a.UnmarshalTo(&w); err != nil {
			return nil, err
		}
		return w.AsSlice(), nil
	case "google.protobuf.Value":
		var w structpb.Value
		if err := a.UnmarshalTo(&w); err != nil {
			return nil, err
		}
		return w.AsInterface(), nil
	case "google.protobuf.Empty":
		return nil, nil
	}
	return nil, fmt.Errorf("unsupported value type %q (want a google.protobuf wrapper, Struct, ListValue or Value)", a.GetTypeUrl())
}

// EncodeConfig packs plain values as a device manager would: strings as
// StringValue, integers as Int64Value, other numbers as DoubleValue,
// booleans as BoolValue, objects and lists as Struct and ListValue. Tests and
// fake agents use it.
func EncodeConfig(p map[string]any) (*dmiv1beta1.CustomizedValue, error) {
	cv := &dmiv1beta1.CustomizedValue{Data: map[string]*anypb.Any{}}
	for k, v := range p {
		a, err := EncodeAny(v)
		if err != nil {
			return nil, fmt.Errorf("configData %q: %w", k, err)
		}
		cv.Data[k] = a
	}
	return cv, nil
}

// EncodeAny packs one value (see EncodeConfig).
func EncodeAny(v any) (*anypb.Any, error) {
	switch x := v.(type) {
	case string:
		return anypb.New(wrapperspb.String(x))
	case bool:
		return anypb.New(wrapperspb.Bool(x))
	case int:
		return anypb.New(wrapperspb.Int64(int64(x)))
	case int32:
		return anypb.New(wrapperspb.Int64(int64(x)))
	case int64:
		return anypb.New(wrapperspb.Int64(x))
	case uint64:
		return anypb.New(wrapperspb.UInt64(x))
	case float32:
		return anypb.New(wrapperspb.Float(x))
	case float64:
		return anypb.New(wrapperspb.Double(x))
	case []byte:
		return anypb.New(wrapperspb.Bytes(x))
	case map[string]any:
		s, err := structpb.NewStruct(x)
		if err != nil {
			return nil, err
		}
		return anypb.New(s)
	case []any:
		l, err := structpb.NewList(x)
		if err != nil {
			return nil, err
		}
		return anypb.New(l)
	}
	return nil, fmt.Errorf("cannot encode %T", v)
}

// Lookup returns the value of key (exact, then case-insensitive).
func (p Params) Lookup(key string) (any, bool) {
	if v, ok := p[key]; ok {
		return plain(v), true
	}
	for k, v := range p {
		if strings.EqualFold(k, key) {
			return plain(v), true
		}
	}
	return nil, false
}

// plain maps Go's other number types (Params built by hand) to int64 and
// float64.
func plain(v any) any {
	switch x := v.(type) {
	case int:
		return int64(x)
	case int32:
		return int64(x)
	case uint32:
		return int64(x)
	case float32:
		return float64(x)
	}
	return v
}

// Has says whether key is set (to anything but null).
func (p Params) Has(key string) bool {
	v, ok := p.Lookup(key)
	return ok && v != nil
}

// String returns key as text: strings as they are, numbers and booleans
// formatted; def when absent.
func (p Params) String(key, def string) (string, error) {
	v, ok := p.Lookup(key)
	if !ok || v == nil {
		return def, nil
	}
	switch x := v.(type) {
	case string:
		return x, nil
	case bool:
		return strconv.FormatBool(x), nil
	case int64:
		return strconv.FormatInt(x, 10), nil
	case uint64:
		return strconv.FormatUint(x, 10), nil
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64), nil
	}
	return "", fmt.Errorf("%s: want a string, got %T", key, v)
}

// Int returns key as an integer; def when absent.
func (p Params) Int(key string, def int64) (int64, error) {
	v, ok := p.Lookup(key)
	if !ok || v == nil {
		return def, nil
	}
	switch x := v.(type) {
	case int64:
		return x, nil
	case uint64:
		if x > math.MaxInt64 {
			return 0, fmt.Errorf("%s: %d is too large", key, x)
		}
		return int64(x), nil
	case float64:
		if x != math.Trunc(x) || math.Abs(x) > 1<<53 {
			return 0, fmt.Errorf("%s: want an integer, got %v", key, x)
		}
		return int64(x), nil
	case string:
		s := strings.TrimSpace(x)
		if n, err := strconv.ParseInt(s, 0, 64); err == nil {
			return n, nil
		}
		if f, err := strconv.ParseFloat(s, 64); err == nil && f == math.Trunc(f) {
			return int64(f), nil
		}
		return 0, fmt.Errorf("%s: want an integer, got %q", key, x)
	}
	return 0, fmt.Errorf("%s: want an integer, got %T", key, v)
}

// Float returns key as a number; def when absent.
func (p Params) Float(key string, def float64) (float64, error) {
	v, ok := p.Lookup(key)
	if !ok || v == nil {
		return def, nil
	}
	switch x := v.(type) {
	case int64:
		return float64(x), nil
	case uint64:
		return float64(x), nil
	case float64:
		return x, nil
	case string:
		f, err := strconv.ParseFloat(strings.TrimSpace(x), 64)
		if err != nil {
			return 0, fmt.Errorf("%s: want a number, got %q", key, x)
		}
		return f, nil
	}
	return 0, fmt.Errorf("%s: want a number, got %T", key, v)
}

// Bool returns key as a boolean; def when absent.
func (p Params) Bool(key string, def bool) (bool, error) {
	v, ok := p.Lookup(key)
	if !ok || v == nil {
		return def, nil
	}
	switch x := v.(type) {
	case bool:
		return x, nil
	case string:
		b, err := strconv.ParseBool(strings.TrimSpace(x))
		if err != nil {
			return false, fmt.Errorf("%s: want true or false, got %q", key, x)
		}
		return b, nil
	case int64:
		if x == 0 || x == 1 {
			return x == 1, nil
		}
	case float64:
		if x == 0 || x == 1 {
			return x == 1, nil
		}
	}
	return false, fmt.Errorf("%s: want true or false, got %v", key, v)
}

// Duration returns key as a duration: a Go duration string ("500ms") or a
// number of milliseconds (KubeEdge's habit); def when absent.
func (p Params) Duration(key string, def time.Duration) (time.Duration, error) {
	v, ok := p.Lookup(key)
	if !ok || v == nil {
		return def, nil
	}
	if s, isStr := v.(string); isStr {
		if d, err := time.ParseDuration(strings.TrimSpace(s)); err == nil {
			if d < 0 {
				return 0, fmt.Errorf("%s: %q is negative", key, s)
			}
			return d, nil
		}
	}
	ms, err := p.Float(key, 0)
	if err != nil || ms < 0 {
		return 0, fmt.Errorf("%s: want a duration such as \"2s\" or milliseconds, got %v", key, v)
	}
	return time.Duration(ms * float64(time.Millisecond)), nil
}

// Object returns key as nested Params: from a Struct, or a JSON object in a
// string; nil when absent.
func (p Params) Object(key string) (Params, error) {
	v, ok := p.Lookup(key)
	if !ok || v == nil {
		return nil, nil
	}
	switch x := v.(type) {
	case map[string]any:
		normalizeMap(x)
		return Params(x), nil
	case string:
		var m map[string]any
		if err := json.Unmarshal([]byte(x), &m); err != nil {
			return nil, fmt.Errorf("%s: want an object (or one as JSON text): %w", key, err)
		}
		normalizeMap(m)
		return Params(m), nil
	}
	return nil, fmt.Errorf("%s: want an object, got %T", key, v)
}

// normalize turns the float64 numbers of JSON and Struct into int64 where
// they are integral, so nested values read like top-level ones.
// normalizeMap normalizes m's values in place.
func normalizeMap(m map[string]any) {
	for k, e := range m {
		m[k] = normalize(e)
	}
}

func normalize(v any) any {
	switch x := v.(type) {
	case map[string]any:
		normalizeMap(x)
		return x
	case []any:
		for i, e := range x {
			x[i] = normalize(e)
		}
		return x
	case float64:
		if x == math.Trunc(x) && math.Abs(x) <= 1<<53 {
			return int64(x)
		}
	}
	return v
}
