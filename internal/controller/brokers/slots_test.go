package brokers

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

func TestSlimSlotsMarksCountsOff(t *testing.T) {
	slot := v1alpha1.InstanceSlot{ID: "a-0", Node: "n"}
	for _, tc := range []struct {
		name   string
		slots  []v1alpha1.InstanceSlot
		inUse  int32
		off    bool
		length int
	}{
		{"counted", []v1alpha1.InstanceSlot{slot}, 1, false, 0},
		{"none, none counted", nil, 0, false, 0},
		{"a new slot", []v1alpha1.InstanceSlot{slot}, 0, true, 1},
		{"the last slot freed", nil, 1, true, 0},
	} {
		inst := &v1alpha1.Instance{Status: v1alpha1.InstanceStatus{Slots: tc.slots, SlotsInUse: tc.inUse}}
		inst.Status.Slots = SlimSlots(inst)
		if slotsOff(inst) != tc.off || len(inst.Status.Slots) != tc.length {
			t.Errorf("%s: off %v with %d slots cached, want %v with %d", tc.name, slotsOff(inst), len(inst.Status.Slots), tc.off, tc.length)
		}
	}
}

func TestNodeCounts(t *testing.T) {
	cond := func(typ string, s metav1.ConditionStatus) metav1.Condition {
		return metav1.Condition{Type: typ, Status: s}
	}
	ready := []metav1.Condition{cond(v1alpha1.ConditionHandlerAvailable, metav1.ConditionTrue), cond(v1alpha1.ConditionDiscovering, metav1.ConditionTrue)}
	refused := []metav1.Condition{cond(v1alpha1.ConditionHandlerAvailable, metav1.ConditionTrue), cond(v1alpha1.ConditionDiscovering, metav1.ConditionFalse)}
	seeing, readyN := nodeCounts([]v1alpha1.ConfigurationNodeStatus{
		{NodeName: "a", Devices: 2, Conditions: ready},
		{NodeName: "b", Devices: 0, Conditions: ready},
		{NodeName: "c", Devices: 1, Conditions: refused},
		{NodeName: "d"},
	})
	if seeing != 2 || readyN != 2 {
		t.Errorf("seeing %d ready %d, want 2 and 2", seeing, readyN)
	}
}
