// Package twinvalue is the one contract of a twin's values that every
// process reading or writing them shares: the controller and dowsectl
// (desired values against the model, reported values into Device.status),
// the agent's mapper API (mappers' reports) and the mapper SDK (readings
// and desired writes). Values travel as text, as in KubeEdge; the model's
// property type says how to read them. The package holds the types, Parse
// and Format, the metadata keys and device states mappers report, and the
// checks of a desired value against its model. It imports the standard
// library alone, so the mapper SDK (which links no Kubernetes or gRPC
// package for it) and the CRD types can both use it.
//
// The rules, where the copies it replaces disagreed:
//   - Numbers are finite: NaN and ±Inf are refused (no device register
//     holds them meaningfully, and no bound can be checked against NaN).
//   - A FLOAT is a number within float32's range; its value is kept as the
//     text's float64, so "0.1" stays 0.1 on the way to Device.status rather
//     than becoming float32's 0.10000000149011612.
//   - INT, FLOAT, DOUBLE, BOOLEAN and BYTES ignore surrounding whitespace
//     (never part of a number, a boolean or base64); STRING is taken as is.
//   - BYTES is standard base64 with padding, as Kubernetes writes bytes in
//     JSON.
//   - STRING and every other text is UTF-8, as protobuf's strings must be.
//   - Format produces only text Parse accepts: a reading that cannot be a
//     value of its type is an error of that property, never a report the
//     receiver refuses whole.
package twinvalue

import (
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Type is a property's type.
type Type string

// The property types of a DeviceModel.
const (
	Int    Type = "INT"
	Float  Type = "FLOAT"
	Double Type = "DOUBLE"
	String Type = "STRING"
	// Boolean values are true or false (Parse also takes strconv.ParseBool's
	// 1, 0, t, f and their capitals).
	Boolean Type = "BOOLEAN"
	// Bytes values are standard base64.
	Bytes Type = "BYTES"
)

// Numeric says whether minimum and maximum apply to the type.
func (t Type) Numeric() bool { return t == Int || t == Float || t == Double }

// ParseType reads a model's type as KubeEdge's and Dowse's models spell it:
// case-insensitively, "" as STRING, "BOOL" as BOOLEAN and "INTEGER" as INT.
func ParseType(s string) (Type, error) {
	switch u := Type(strings.ToUpper(strings.TrimSpace(s))); u {
	case "":
		return String, nil
	case Int, Float, Double, String, Boolean, Bytes:
		return u, nil
	case "BOOL":
		return Boolean, nil
	case "INTEGER":
		return Int, nil
	}
	return "", fmt.Errorf("unknown property type %q (want INT, FLOAT, DOUBLE, STRING, BOOLEAN or BYTES)", s)
}

// canonical is t as ParseType spells it.
func canonical(t Type) (Type, error) {
	switch t {
	case Int, Float, Double, String, Boolean, Bytes:
		return t, nil
	}
	return ParseType(string(t))
}

// Parse reads text as a value of type t (any spelling ParseType takes): an
// int64 (INT), a float64 (FLOAT, DOUBLE), a bool, a []byte (BYTES) or the
// string itself.
func Parse(t Type, text string) (any, error) {
	t, err := canonical(t)
	if err != nil {
		return nil, err
	}
	s := strings.TrimSpace(text)
	switch t {
	case Int:
		n, err := strconv.ParseInt(s, 10, 64)
		if errors.Is(err, strconv.ErrRange) {
			return nil, fmt.Errorf("%q does not fit an INT (64 bits)", text)
		}
		if err != nil {
			return nil, fmt.Errorf("%q is not an INT", text)
		}
		return n, nil
	case Float, Double:
		f, err := strconv.ParseFloat(s, 64)
		if err == nil && t == Float {
			_, err = strconv.ParseFloat(s, 32)
		}
		switch {
		case errors.Is(err, strconv.ErrRange):
			if t == Float {
				return nil, fmt.Errorf("%q does not fit a FLOAT (32 bits)", text)
			}
			return nil, fmt.Errorf("%q does not fit a DOUBLE (64 bits)", text)
		case err != nil:
			return nil, fmt.Errorf("%q is not a %s", text, t)
		case math.IsNaN(f) || math.IsInf(f, 0):
			return nil, fmt.Errorf("%q is not a finite %s", text, t)
		}
		return f, nil
	case Boolean:
		b, err := strconv.ParseBool(s)
		if err != nil {
			return nil, fmt.Errorf("%q is not a BOOLEAN (true or false)", text)
		}
		return b, nil
	case Bytes:
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			return nil, fmt.Errorf("%q is not BYTES (standard base64)", text)
		}
		return b, nil
	}
	if !utf8.ValidString(text) {
		return nil, fmt.Errorf("%q is not UTF-8 text", text)
	}
	return text, nil
}

// Format writes v as the text of a value of type t (any spelling ParseType
// takes). v is one of Parse's results or a reading as a driver returns it
// (int64, uint64, int, float64, float32, bool, string or []byte): a number
// read into an INT is rounded to the nearest integer, a number read into a
// BOOLEAN is true unless zero, a string read into a number or a BOOLEAN is
// parsed, bytes read into a STRING are its text. FLOAT is written with the
// fewest digits that read back as the same float32, DOUBLE as the same
// float64. The text is always one Parse(t, ·) accepts; a v that cannot give
// one is an error.
func Format(t Type, v any) (string, error) {
	t, err := canonical(t)
	if err != nil {
		return "", err
	}
	switch t {
	case Int:
		switch x := v.(type) {
		case int64:
			return strconv.FormatInt(x, 10), nil
		case uint64:
			if x > math.MaxInt64 {
				return "", fmt.Errorf("device value %d does not fit an INT (64 bits)", x)
			}
			return strconv.FormatUint(x, 10), nil
		case string:
			n, err := Parse(Int, x)
			if err != nil {
				return "", fmt.Errorf("device value: %w", err)
			}
			i, _ := n.(int64) // what Parse gives an INT
			return strconv.FormatInt(i, 10), nil
		}
		f, ok := AsFloat(v)
		if !ok || math.IsNaN(f) || math.IsInf(f, 0) {
			return "", fmt.Errorf("device value %v (%T) is not an INT", v, v)
		}
		r := math.Round(f)
		if r < math.MinInt64 || r >= math.MaxInt64 { // float64(MaxInt64) is 2^63, beyond it
			return "", fmt.Errorf("device value %v does not fit an INT (64 bits)", f)
		}
		return strconv.FormatInt(int64(r), 10), nil
	case Float, Double:
		bits := 64
		if t == Float {
			bits = 32
		}
		if s, ok := v.(string); ok {
			f, err := Parse(t, s)
			if err != nil {
				return "", fmt.Errorf("device value: %w", err)
			}
			x, _ := f.(float64) // what Parse gives a FLOAT or DOUBLE
			return strconv.FormatFloat(x, 'g', -1, bits), nil
		}
		f, ok := AsFloat(v)
		if !ok {
			return "", fmt.Errorf("device value %v (%T) is not a %s", v, v, t)
		}
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return "", fmt.Errorf("device value %v is not a finite number", f)
		}
		if t == Float && math.IsInf(float64(float32(f)), 0) {
			return "", fmt.Errorf("device value %v does not fit a FLOAT (32 bits)", f)
		}
		return strconv.FormatFloat(f, 'g', -1, bits), nil
	case Boolean:
		switch x := v.(type) {
		case bool:
			return strconv.FormatBool(x), nil
		case string:
			b, err := Parse(Boolean, x)
			if err != nil {
				return "", fmt.Errorf("device value: %w", err)
			}
			on, _ := b.(bool) // what Parse gives a BOOLEAN
			return strconv.FormatBool(on), nil
		}
		f, ok := AsFloat(v)
		if !ok || math.IsNaN(f) {
			return "", fmt.Errorf("device value %v (%T) is not a BOOLEAN", v, v)
		}
		return strconv.FormatBool(f != 0), nil
	case Bytes:
		switch x := v.(type) {
		case []byte:
			return base64.StdEncoding.EncodeToString(x), nil
		case string:
			return base64.StdEncoding.EncodeToString([]byte(x)), nil
		}
		return "", fmt.Errorf("device value %v (%T) is not BYTES", v, v)
	}
	var s string
	switch x := v.(type) {
	case string:
		s = x
	case []byte:
		s = string(x)
	case bool:
		s = strconv.FormatBool(x)
	case int64:
		s = strconv.FormatInt(x, 10)
	case uint64:
		s = strconv.FormatUint(x, 10)
	case float64:
		s = strconv.FormatFloat(x, 'g', -1, 64)
	default:
		s = fmt.Sprint(v)
	}
	if !utf8.ValidString(s) {
		return "", fmt.Errorf("device value %q is not UTF-8 text (a BYTES property holds any bytes)", s)
	}
	return s, nil
}

// Canonical reads text as a value of type t (any spelling ParseType takes)
// and writes it back in the one text of that value: a number's shortest
// digits ("1.50" as 1.5, " 21" as 21), a boolean as true or false, bytes
// in padded base64, a string as it is. A FLOAT keeps its text's float64
// digits, as Parse does. The link carries reported values in this form,
// so that Device.status shows one spelling of a value whatever its mapper
// sends.
func Canonical(t Type, text string) (string, error) {
	v, err := Parse(t, text)
	if err != nil {
		return "", err
	}
	if t, _ = canonical(t); t == Float { // Parse took t
		t = Double
	}
	return Format(t, v)
}

// AsFloat reads a number of any kind Format takes (or a bool, as 1 or 0)
// as a float64; ok is false for other kinds.
func AsFloat(v any) (float64, bool) {
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

// Equal says whether two texts are the same value: equal as text, or as
// numbers where both parse ("1.50" and "1.5"). A desired value is applied
// when the observed one is Equal to it, whatever formatting the mapper's
// side gave the number.
func Equal(a, b string) bool {
	if a == b {
		return true
	}
	fa, errA := strconv.ParseFloat(strings.TrimSpace(a), 64)
	fb, errB := strconv.ParseFloat(strings.TrimSpace(b), 64)
	return errA == nil && errB == nil && fa == fb
}
