package twins

import (
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/shared/twinvalue"
)

// differing counts d's properties with a desired value whose reported value
// in st differs from it or is missing: status.differing, which the
// Device's printer column shows (a column's JSONPath cannot compare).
func differing(d *v1alpha1.Device, st *v1alpha1.DeviceStatus) int32 {
	var n int32
	for _, p := range d.Spec.Properties {
		if p.Desired == nil {
			continue
		}
		reported, ok := "", false
		for _, t := range st.Twins {
			if t.PropertyName == p.Name && t.Reported != nil {
				reported, ok = t.Reported.Value, true
			}
		}
		if !ok || !twinvalue.Equal(reported, p.Desired.Value) {
			n++
		}
	}
	return n
}
