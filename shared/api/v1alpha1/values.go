package v1alpha1

import (
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// ParseValue reads text as a value of the property's type: an int64, a
// float64, a bool, []byte (BYTES, base64) or the string itself. The agent
// uses it on mappers' reports, the controller and dowsectl on desired
// values, so that all three agree.
func (p *ModelProperty) ParseValue(text string) (any, error) {
	switch p.Type {
	case PropertyInt:
		v, err := strconv.ParseInt(strings.TrimSpace(text), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%q is not an INT", text)
		}
		return v, nil
	case PropertyFloat, PropertyDouble:
		bits := 64
		if p.Type == PropertyFloat {
			bits = 32
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(text), bits)
		if err != nil {
			return nil, fmt.Errorf("%q is not a %s", text, p.Type)
		}
		return v, nil
	case PropertyBoolean:
		v, err := strconv.ParseBool(strings.TrimSpace(text))
		if err != nil {
			return nil, fmt.Errorf("%q is not a BOOLEAN", text)
		}
		return v, nil
	case PropertyBytes:
		v, err := base64.StdEncoding.DecodeString(text)
		if err != nil {
			return nil, fmt.Errorf("%q is not BYTES (base64)", text)
		}
		return v, nil
	case PropertyString, "":
		return text, nil
	}
	return nil, fmt.Errorf("unknown property type %q", p.Type)
}

// CheckDesired says why text may not be the property's desired value: the
// property is ReadOnly, the text does not parse as its type, or it lies
// outside minimum and maximum.
func (p *ModelProperty) CheckDesired(text string) error {
	if p.AccessMode != ReadWrite {
		return fmt.Errorf("property %s is %s: it takes no desired value", p.Name, orReadOnly(p.AccessMode))
	}
	v, err := p.ParseValue(text)
	if err != nil {
		return fmt.Errorf("property %s: %w", p.Name, err)
	}
	if !p.Type.Numeric() {
		return nil
	}
	var f float64
	switch n := v.(type) {
	case int64:
		f = float64(n)
	case float64:
		f = n
	}
	if p.Minimum != "" {
		lo, err := strconv.ParseFloat(p.Minimum, 64)
		if err != nil {
			return fmt.Errorf("property %s: the model's minimum %q is not a number", p.Name, p.Minimum)
		}
		if f < lo {
			return fmt.Errorf("property %s: %s is below the minimum %s", p.Name, text, p.Minimum)
		}
	}
	if p.Maximum != "" {
		hi, err := strconv.ParseFloat(p.Maximum, 64)
		if err != nil {
			return fmt.Errorf("property %s: the model's maximum %q is not a number", p.Name, p.Maximum)
		}
		if f > hi {
			return fmt.Errorf("property %s: %s is above the maximum %s", p.Name, text, p.Maximum)
		}
	}
	return nil
}

func orReadOnly(m PropertyAccessMode) PropertyAccessMode {
	if m == "" {
		return ReadOnly
	}
	return m
}

// Validate says what in the Device's spec does not fit model: properties
// the model lacks, desired values on ReadOnly properties, desired values
// that do not parse or lie out of range, cycles that do not parse.
func (d *Device) Validate(model *DeviceModel) error {
	var errs []error
	if model == nil {
		return errors.New("the DeviceModel does not exist")
	}
	for i := range d.Spec.Properties {
		p := &d.Spec.Properties[i]
		mp := model.Property(p.Name)
		if mp == nil {
			errs = append(errs, fmt.Errorf("property %s is not in DeviceModel %s", p.Name, model.Name))
			continue
		}
		if p.Desired != nil {
			if err := mp.CheckDesired(p.Desired.Value); err != nil {
				errs = append(errs, err)
			}
		}
		if _, err := CycleDuration(p.CollectCycle); err != nil {
			errs = append(errs, fmt.Errorf("property %s collectCycle: %w", p.Name, err))
		}
		if _, err := CycleDuration(p.ReportCycle); err != nil {
			errs = append(errs, fmt.Errorf("property %s reportCycle: %w", p.Name, err))
		}
	}
	return errors.Join(errs...)
}
