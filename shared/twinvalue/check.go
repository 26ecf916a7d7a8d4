package twinvalue

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// AccessMode says whether a property takes desired values.
type AccessMode string

// Access modes of a model's property; "" is ReadOnly.
const (
	ReadWrite AccessMode = "ReadWrite"
	ReadOnly  AccessMode = "ReadOnly"
)

// Property is what the checks need of a model's property.
type Property struct {
	Name string
	Type Type
	// AccessMode is ReadOnly when empty.
	AccessMode AccessMode
	// Minimum and Maximum bound a numeric property's desired values, as
	// text ("" for none); a non-numeric property's are ignored.
	Minimum, Maximum string
}

// ParseDesired reads text as p's desired value, or says why it cannot be
// one: p is ReadOnly, text does not parse as p's type, it lies outside
// minimum and maximum, or a bound is not a number. An INT is compared with
// integer bounds exactly, everything else as float64.
func (p Property) ParseDesired(text string) (any, error) {
	if p.AccessMode != ReadWrite {
		mode := p.AccessMode
		if mode == "" {
			mode = ReadOnly
		}
		return nil, fmt.Errorf("property %s is %s: it takes no desired value", p.Name, mode)
	}
	v, err := Parse(p.Type, text)
	if err != nil {
		return nil, fmt.Errorf("property %s: %w", p.Name, err)
	}
	t, _ := canonical(p.Type) // Parse took it
	if !t.Numeric() {
		return v, nil
	}
	lo, hi, err := p.bounds()
	if err != nil {
		return nil, err
	}
	shown := strings.TrimSpace(text)
	if lo.set && lo.cmp(v) > 0 {
		return nil, fmt.Errorf("property %s: %s is below the minimum %s", p.Name, shown, p.Minimum)
	}
	if hi.set && hi.cmp(v) < 0 {
		return nil, fmt.Errorf("property %s: %s is above the maximum %s", p.Name, shown, p.Maximum)
	}
	return v, nil
}

// Range returns p's minimum and maximum as numbers (nil where unset, and
// both nil for a non-numeric property), or says which is not a number.
func (p Property) Range() (minimum, maximum *float64, err error) {
	if t, err := canonical(p.Type); err != nil || !t.Numeric() {
		return nil, nil, err
	}
	lo, hi, err := p.bounds()
	if err != nil {
		return nil, nil, err
	}
	if lo.set {
		minimum = &lo.f
	}
	if hi.set {
		maximum = &hi.f
	}
	return minimum, maximum, nil
}

// bound is a minimum or maximum: a float64, and an int64 when the text is
// an integer.
type bound struct {
	set   bool
	f     float64
	i     int64
	isInt bool
}

func (p Property) bounds() (lo, hi bound, err error) {
	if lo, err = parseBound(p.Name, "minimum", p.Minimum); err != nil {
		return lo, hi, err
	}
	hi, err = parseBound(p.Name, "maximum", p.Maximum)
	return lo, hi, err
}

func parseBound(name, what, s string) (bound, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return bound{}, nil
	}
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		return bound{set: true, f: float64(n), i: n, isInt: true}, nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return bound{}, fmt.Errorf("property %s: the model's %s %q is not a number", name, what, s)
	}
	return bound{set: true, f: f}, nil
}

// cmp compares the bound with a value Parse returned for a numeric type:
// -1 when the bound is less, 0 when equal, 1 when greater.
func (b bound) cmp(v any) int {
	if n, ok := v.(int64); ok && b.isInt {
		switch {
		case b.i < n:
			return -1
		case b.i > n:
			return 1
		}
		return 0
	}
	f, _ := AsFloat(v)
	switch {
	case b.f < f:
		return -1
	case b.f > f:
		return 1
	}
	return 0
}
