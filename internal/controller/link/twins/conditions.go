package twins

import (
	"regexp"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// edgeConditions are the condition types a node sets on its Devices
// (DeviceCondition); it does not speak for the cloud's own (Valid).
var edgeConditions = map[string]bool{v1alpha1.ConditionReportsAccepted: true, v1alpha1.ConditionAuthenticated: true}

// What metav1.Condition accepts (its validation markers).
var conditionReason = regexp.MustCompile(`^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`)

const maxConditionMessage = 32768

// applyEdgeCondition records a node's DeviceCondition in st; false when
// its type is not one a node sets. A reason the API server would refuse
// becomes "Reported" and a message is cut to the API's limit, so that one
// node's odd words cannot block the Device's status writes.
func applyEdgeCondition(st *v1alpha1.DeviceStatus, c *linkv1.DeviceCondition, generation int64) bool {
	if !edgeConditions[c.GetType()] {
		return false
	}
	cond := metav1.Condition{Type: c.GetType(), Status: metav1.ConditionFalse, Reason: c.GetReason(), Message: c.GetMessage(), ObservedGeneration: generation}
	if c.GetStatus() {
		cond.Status = metav1.ConditionTrue
	}
	if len(cond.Reason) > 1024 || !conditionReason.MatchString(cond.Reason) {
		cond.Reason = "Reported"
	}
	if len(cond.Message) > maxConditionMessage {
		cond.Message = cond.Message[:maxConditionMessage]
	}
	if t := c.GetTime(); t != nil {
		cond.LastTransitionTime = metav1.NewTime(t.AsTime())
	}
	meta.SetStatusCondition(&st.Conditions, cond)
	return true
}
