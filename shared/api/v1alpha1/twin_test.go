package v1alpha1

import "testing"

func TestDeviceTwin(t *testing.T) {
	d := &Device{Status: DeviceStatus{Twins: []Twin{
		{PropertyName: "temperature", Reported: &TwinProperty{Value: "21.5"}},
		{PropertyName: "setpoint", Reported: &TwinProperty{Value: "5"}, ObservedDesired: &TwinProperty{Value: "6"}},
	}}}
	if rep, obs := d.Twin("setpoint").Values(); rep != "5" || obs != "6" {
		t.Errorf("setpoint: reported %q, observed %q, want 5 and 6", rep, obs)
	}
	if rep, obs := d.Twin("temperature").Values(); rep != "21.5" || obs != "" {
		t.Errorf("temperature: reported %q, observed %q, want 21.5 and nothing", rep, obs)
	}
	if tw := d.Twin("humidity"); tw != nil {
		t.Errorf("a property without a twin gave %+v", tw)
	}
	if rep, obs := d.Twin("humidity").Values(); rep != "" || obs != "" {
		t.Errorf("a missing twin's values: %q, %q", rep, obs)
	}
	d.Twin("temperature").Reported.Value = "22"
	if d.Status.Twins[0].Reported.Value != "22" {
		t.Error("Twin returned a copy, not the status's own twin")
	}
}
