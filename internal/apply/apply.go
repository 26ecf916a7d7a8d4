// Package apply turns typed values that several writers state into their
// generated server-side-apply configurations, field for field, so that an
// apply states exactly the fields the typed object would (an omitempty
// field left out, a zero value of a required field stated).
package apply

import (
	"encoding/json"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
)

// Condition is c's apply configuration.
func Condition(c metav1.Condition) *metav1ac.ConditionApplyConfiguration {
	ac := metav1ac.Condition().
		WithType(c.Type).WithStatus(c.Status).WithLastTransitionTime(c.LastTransitionTime).
		WithReason(c.Reason).WithMessage(c.Message)
	if c.ObservedGeneration != 0 {
		ac.WithObservedGeneration(c.ObservedGeneration)
	}
	return ac
}

// Conditions are cs's apply configurations, in order.
func Conditions(cs []metav1.Condition) []*metav1ac.ConditionApplyConfiguration {
	out := make([]*metav1ac.ConditionApplyConfiguration, 0, len(cs))
	for _, c := range cs {
		out = append(out, Condition(c))
	}
	return out
}

// OwnerReference is r's apply configuration.
func OwnerReference(r metav1.OwnerReference) *metav1ac.OwnerReferenceApplyConfiguration {
	ac := metav1ac.OwnerReference().WithAPIVersion(r.APIVersion).WithKind(r.Kind).WithName(r.Name).WithUID(r.UID)
	if r.Controller != nil {
		ac.WithController(*r.Controller)
	}
	if r.BlockOwnerDeletion != nil {
		ac.WithBlockOwnerDeletion(*r.BlockOwnerDeletion)
	}
	return ac
}

// OwnerReferences are rs's apply configurations, in order.
func OwnerReferences(rs []metav1.OwnerReference) []*metav1ac.OwnerReferenceApplyConfiguration {
	out := make([]*metav1ac.OwnerReferenceApplyConfiguration, 0, len(rs))
	for _, r := range rs {
		out = append(out, OwnerReference(r))
	}
	return out
}

// FromObject fills ac, a generated apply configuration, from obj, a typed
// object of the same kind, through their shared JSON form. It is for types
// too large to restate by hand that come whole from a user (a Service's
// spec): an apply configuration's fields and JSON names are its type's.
func FromObject(obj any, ac any) error {
	b, err := json.Marshal(obj)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, ac); err != nil {
		return fmt.Errorf("apply configuration %T from %T: %w", ac, obj, err)
	}
	return nil
}
