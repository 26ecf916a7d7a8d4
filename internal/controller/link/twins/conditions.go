package twins

// The conditions of Device.status: those a node sets (DeviceCondition),
// Valid, and DesiredApplied.

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/shared/twinvalue"
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

// SetValid records whether d fits its model (the Valid condition, and the
// generation it was checked for): a read-modify-write of that condition
// alone, apart from the reports, so that one replica (the leader) can own
// it while others write twins. err nil means d fits. Idempotent.
func (s *Status) SetValid(ctx context.Context, d *v1alpha1.Device, err error) error {
	c := metav1.Condition{Type: v1alpha1.ConditionDeviceValid, Status: metav1.ConditionTrue, Reason: "FitsModel",
		Message: "the spec fits DeviceModel " + d.Spec.DeviceModelRef.Name, ObservedGeneration: d.Generation}
	var pmErr *PushMethodError
	switch {
	case errors.As(err, &pmErr):
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, "InvalidPushMethod", "pushMethod not used: "+err.Error()
	case err != nil:
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, "Invalid", err.Error()
	}
	key := client.ObjectKeyFromObject(d)
	reader := s.reader
	for attempt := 0; ; attempt++ {
		var cur v1alpha1.Device
		if err := reader.Get(ctx, key, &cur); err != nil {
			return client.IgnoreNotFound(err)
		}
		if cur.Generation != d.Generation {
			return nil // a newer spec is on its way to be checked
		}
		old := meta.FindStatusCondition(cur.Status.Conditions, c.Type)
		if old != nil && old.Status == c.Status && old.Message == c.Message && old.ObservedGeneration == c.ObservedGeneration &&
			cur.Status.ObservedGeneration == d.Generation {
			return nil
		}
		orig := cur.DeepCopy()
		meta.SetStatusCondition(&cur.Status.Conditions, c)
		cur.Status.ObservedGeneration = d.Generation
		err := s.client.Status().Patch(ctx, &cur, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{}))
		switch {
		case err == nil:
			s.metrics.Writes.WithLabelValues("ok").Inc()
			return nil
		case apierrors.IsConflict(err) && attempt < 10:
			s.metrics.Writes.WithLabelValues("conflict").Inc()
			reader = s.live
		default:
			s.metrics.Writes.WithLabelValues("error").Inc()
			return client.IgnoreNotFound(err)
		}
	}
}

// desiredApplied sets DesiredApplied: True once every desired value of the
// spec has come back as observedDesired; False with the mapper's error when
// it reports one for a desired write, else Pending.
func desiredApplied(d *v1alpha1.Device, st *v1alpha1.DeviceStatus) {
	var waiting, failed []string
	some := false
	for _, p := range d.Spec.Properties {
		if p.Desired == nil {
			continue
		}
		some = true
		var observed, writeErr string
		for _, t := range st.Twins {
			if t.PropertyName != p.Name {
				continue
			}
			if t.ObservedDesired != nil {
				observed = t.ObservedDesired.Value
			}
			if t.Reported != nil {
				writeErr = t.Reported.Metadata[twinvalue.MetaDesiredError]
			}
		}
		switch {
		case twinvalue.Equal(observed, p.Desired.Value):
		case writeErr != "":
			failed = append(failed, fmt.Sprintf("%s: %s", p.Name, writeErr))
		default:
			waiting = append(waiting, p.Name)
		}
	}
	if !some {
		meta.RemoveStatusCondition(&st.Conditions, v1alpha1.ConditionDesiredApplied)
		return
	}
	c := metav1.Condition{Type: v1alpha1.ConditionDesiredApplied, Status: metav1.ConditionTrue, Reason: "Applied",
		Message: "every desired value is observed on the device", ObservedGeneration: d.Generation}
	switch {
	case len(failed) > 0:
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, "MapperError", "the mapper could not write: "+strings.Join(failed, "; ")
	case len(waiting) > 0:
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, "Pending", fmt.Sprintf("not yet observed: %v", waiting)
	}
	meta.SetStatusCondition(&st.Conditions, c)
}

// sameCondition says whether a and b (either may be nil) say the same.
func sameCondition(a, b *metav1.Condition) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Status == b.Status && a.Reason == b.Reason && a.Message == b.Message && a.ObservedGeneration == b.ObservedGeneration
}
