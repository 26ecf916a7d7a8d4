package twins

import (
	"testing"

	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

func TestDiffering(t *testing.T) {
	d := &v1alpha1.Device{Spec: v1alpha1.DeviceSpec{Properties: []v1alpha1.DeviceProperty{
		{Name: "applied", Desired: &v1alpha1.TwinProperty{Value: "1.50"}},
		{Name: "other", Desired: &v1alpha1.TwinProperty{Value: "2"}},
		{Name: "unread", Desired: &v1alpha1.TwinProperty{Value: "on"}},
		{Name: "no desired"},
	}}}
	st := &v1alpha1.DeviceStatus{Twins: []v1alpha1.Twin{
		{PropertyName: "applied", Reported: &v1alpha1.TwinProperty{Value: "1.5"}},
		{PropertyName: "other", Reported: &v1alpha1.TwinProperty{Value: "3"}},
		{PropertyName: "no desired", Reported: &v1alpha1.TwinProperty{Value: "9"}},
	}}
	if n := differing(d, st); n != 2 {
		t.Errorf("differing %d, want 2 (other reports 3, unread reports nothing)", n)
	}
}
