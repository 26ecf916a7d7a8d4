package mapper

import (
	"fmt"
	"math"
	"strconv"

	"github.com/dowse-dev/dowse/shared/twinvalue"
)

// A raw value is what a Driver reads and writes: int64, uint64, float64,
// bool, string or []byte. The SDK turns it into the model's type (after the
// Transform) and formats it as the twin's text (twinvalue.Format); for a
// write it checks the desired text against the model
// (twinvalue.Property.ParseDesired), applies the inverse Transform and
// hands the Driver a raw value of the same kinds.

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

// Apply transforms a raw value; non-numbers pass through. An integer's
// value has no more decimals than the scale and offset have, so it is
// rounded to them: a register's 224 with scale 0.1 is 22.4, not float64's
// 22.400000000000002.
func (t Transform) Apply(raw any) any {
	if t.identity() {
		return raw
	}
	f, ok := twinvalue.AsFloat(raw)
	if !ok {
		return raw
	}
	v := f*t.scale() + t.Offset
	switch raw.(type) {
	case int64, uint64:
		if p := math.Pow10(max(decimals(t.scale()), decimals(t.Offset))); !math.IsInf(v*p, 0) {
			return math.Round(v*p) / p
		}
	}
	return v
}

// decimals is how many digits x has after the decimal point, written
// shortest (at most 15).
func decimals(x float64) int {
	s := strconv.FormatFloat(math.Abs(x), 'f', -1, 64)
	for i := range len(s) {
		if s[i] == '.' {
			return min(len(s)-i-1, 15)
		}
	}
	return 0
}

// Inverse undoes Apply for a value to write; non-numbers pass through.
func (t Transform) Inverse(v any) any {
	if t.identity() {
		return v
	}
	f, ok := twinvalue.AsFloat(v)
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

// changed says whether a new reading differs from the last reported one
// by more than deadband (numbers) or at all (everything else).
func changed(typ twinvalue.Type, prev, next string, deadband float64) bool {
	if prev == next {
		return false
	}
	if deadband > 0 && typ.Numeric() {
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
	f, ok := twinvalue.AsFloat(v)
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
