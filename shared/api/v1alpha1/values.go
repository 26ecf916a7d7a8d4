package v1alpha1

import (
	"errors"
	"fmt"

	"github.com/dowse-dev/dowse/shared/twinvalue"
)

// TwinValue is the property as twinvalue's checks take it.
func (p *ModelProperty) TwinValue() twinvalue.Property {
	return twinvalue.Property{Name: p.Name, Type: twinvalue.Type(p.Type), AccessMode: twinvalue.AccessMode(p.AccessMode),
		Minimum: p.Minimum, Maximum: p.Maximum}
}

// CheckDesired says why text may not be the property's desired value
// (twinvalue.Property.ParseDesired: ReadOnly, not of its type, outside
// minimum and maximum). The controller and dowsectl check with it, and the
// mapper SDK with the same rules.
func (p *ModelProperty) CheckDesired(text string) error {
	_, err := p.TwinValue().ParseDesired(text)
	return err
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
