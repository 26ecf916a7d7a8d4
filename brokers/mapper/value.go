package mapper

import (
	"encoding/base64"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Property types of a DeviceModel (shared/api/v1alpha1.PropertyType).
const (
	TypeInt     = "INT"
	TypeFloat   = "FLOAT"
	TypeDouble  = "DOUBLE"
	TypeString  = "STRING"
	TypeBoolean = "BOOLEAN"
	TypeBytes   = "BYTES"
)

// A raw value is what a Driver reads and writes: int64, uint64, float64,
// bool, string or []byte. The SDK turns it into the model's type (after the
// Transform) and formats it as the twin's text; for a write it parses the
// desired text, checks minimum and maximum, applies the inverse Transform
// and hands the Driver a raw value of the same kinds.

// NormalizeType upper-cases a model type and maps KubeEdge's lower-case
// spellings ("int", "float", "double", "string", "boolean", "bytes"); an
// empty type is STRING.
func NormalizeType(t string) (string, error) {
	switch u := strings.ToUpper(strings.TrimSpace(t)); u {
	case "":
		return TypeString, nil
	case TypeInt, TypeFloat, TypeDouble, TypeString, TypeBoolean, TypeBytes:
		return u, nil
	case "BOOL":
		return TypeBoolean, nil
	default:
		return "", fmt.Errorf("unknown property type %q (want INT, FLOAT, DOUBLE, STRING, BOOLEAN or BYTES)", t)
	}
}

func numericType(t string) bool { return t == TypeInt || t == TypeFloat || t == TypeDouble }

// Transform maps a raw number to the model's value: value = raw*Scale +
// Offset. The zero Transform (Scale 0) is the identity.
type Transform struct {
	Scale  float64
	Offset float64
}

func (t Transform) identity() bool { return (t.Scale == 0 || t.Scale == 1) && t.Offset == 0 }

func (t Transform) scale() float64 {
	if t.Scale == 0 {
		return 1
	}
	return t.Scale
}

// Apply transforms a raw value; non-numbers pass through.
func (t Transform) Apply(raw any) any {
	if t.identity() {
		return raw
	}
	f, ok := toFloat(raw)
	if !ok {
		return raw
	}
	return f*t.scale() + t.Offset
}

// Inverse undoes Apply for a value to write; non-numbers pass through.
func (t Transform) Inverse(v any) any {
	if t.identity() {
		return v
	}
	f, ok := toFloat(v)
	if !ok {
		return v
	}
	return (f - t.Offset) / t.scale()
}

// ParseTransform reads the visitor keys "scale" and "offset".
func ParseTransform(p Params) (Transform, error) {
	var t Transform
	var err error
	if t.Scale, err = p.Float("scale", 0); err != nil {
		return t, err
	}
	if t.Offset, err = p.Float("offset", 0); err != nil {
		return t, err
	}
	return t, nil
}

func toFloat(v any) (float64, bool) {
	switch x := v.(type) {
	case int64:
		return float64(x), true
	case uint64:
		return float64(x), true
	case float64:
		return x, true
	case float32:
		return float64(x), true
	case int:
		return float64(x), true
	case bool:
		if x {
			return 1, true
		}
		return 0, true
	}
	return 0, false
}

// FormatValue turns a (transformed) raw value into the twin text of the
// model type typ. A fractional number read into an INT property is rounded
// to the nearest integer.
func FormatValue(typ string, v any) (string, error) {
	switch typ {
	case TypeInt:
		switch x := v.(type) {
		case int64:
			return strconv.FormatInt(x, 10), nil
		case uint64:
			return strconv.FormatUint(x, 10), nil
		case string:
			n, err := strconv.ParseInt(strings.TrimSpace(x), 10, 64)
			if err != nil {
				return "", fmt.Errorf("device value %q is not an INT", x)
			}
			return strconv.FormatInt(n, 10), nil
		}
		f, ok := toFloat(v)
		if !ok || math.IsNaN(f) || math.IsInf(f, 0) {
			return "", fmt.Errorf("device value %v (%T) is not an INT", v, v)
		}
		return strconv.FormatInt(int64(math.Round(f)), 10), nil
	case TypeFloat, TypeDouble:
		bits := 64
		if typ == TypeFloat {
			bits = 32
		}
		if s, ok := v.(string); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(s), bits)
			if err != nil {
				return "", fmt.Errorf("device value %q is not a %s", s, typ)
			}
			return strconv.FormatFloat(f, 'g', -1, bits), nil
		}
		f, ok := toFloat(v)
		if !ok {
			return "", fmt.Errorf("device value %v (%T) is not a %s", v, v, typ)
		}
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return "", fmt.Errorf("device value %v is not a finite number", f)
		}
		return strconv.FormatFloat(f, 'g', -1, bits), nil
	case TypeBoolean:
		switch x := v.(type) {
		case bool:
			return strconv.FormatBool(x), nil
		case string:
			b, err := strconv.ParseBool(strings.TrimSpace(x))
			if err != nil {
				return "", fmt.Errorf("device value %q is not a BOOLEAN", x)
			}
			return strconv.FormatBool(b), nil
		}
		f, ok := toFloat(v)
		if !ok {
			return "", fmt.Errorf("device value %v (%T) is not a BOOLEAN", v, v)
		}
		return strconv.FormatBool(f != 0), nil
	case TypeBytes:
		switch x := v.(type) {
		case []byte:
			return base64.StdEncoding.EncodeToString(x), nil
		case string:
			return base64.StdEncoding.EncodeToString([]byte(x)), nil
		}
		return "", fmt.Errorf("device value %v (%T) is not BYTES", v, v)
	default: // STRING
		switch x := v.(type) {
		case string:
			return x, nil
		case []byte:
			return string(x), nil
		case bool:
			return strconv.FormatBool(x), nil
		case int64:
			return strconv.FormatInt(x, 10), nil
		case uint64:
			return strconv.FormatUint(x, 10), nil
		case float64:
			return strconv.FormatFloat(x, 'g', -1, 64), nil
		}
		return fmt.Sprint(v), nil
	}
}

// ParseValue reads a desired twin text as the model type typ: int64,
// float64, bool, string or []byte.
func ParseValue(typ, s string) (any, error) {
	s0 := s
	s = strings.TrimSpace(s)
	switch typ {
	case TypeInt:
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%q is not an INT", s0)
		}
		return n, nil
	case TypeFloat, TypeDouble:
		f, err := strconv.ParseFloat(s, 64)
		if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
			return nil, fmt.Errorf("%q is not a %s", s0, typ)
		}
		return f, nil
	case TypeBoolean:
		b, err := strconv.ParseBool(s)
		if err != nil {
			return nil, fmt.Errorf("%q is not a BOOLEAN (true or false)", s0)
		}
		return b, nil
	case TypeBytes:
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			return nil, fmt.Errorf("%q is not BYTES (standard base64)", s0)
		}
		return b, nil
	default:
		return s0, nil
	}
}

// changed says whether a new reading differs from the last reported one
// by more than deadband (numbers) or at all (everything else).
func changed(typ, prev, next string, deadband float64) bool {
	if prev == next {
		return false
	}
	if deadband > 0 && numericType(typ) {
		a, err1 := strconv.ParseFloat(prev, 64)
		b, err2 := strconv.ParseFloat(next, 64)
		if err1 == nil && err2 == nil {
			return math.Abs(a-b) > deadband
		}
	}
	return true
}

// RawInt converts a raw value to write into an integer, refusing fractions
// and values outside [min, max]. Drivers use it for integer registers.
func RawInt(v any, min, max float64) (int64, error) {
	f, ok := toFloat(v)
	if !ok {
		return 0, fmt.Errorf("%v (%T) is not a number", v, v)
	}
	r := math.Round(f)
	if math.Abs(f-r) > 1e-9*math.Max(1, math.Abs(f)) {
		return 0, fmt.Errorf("%v is not an integer (after the inverse transform)", f)
	}
	if r < min || r > max {
		return 0, fmt.Errorf("%v does not fit the register (%v to %v)", r, min, max)
	}
	return int64(r), nil
}
