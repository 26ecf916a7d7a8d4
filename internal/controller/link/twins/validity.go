package twins

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// Check says whether d is to be sent to its node: its edge form and model
// when it fits the model; else invalid says why it does not (nil when it
// names no model or is being deleted: nothing to say). err is a failure to
// read the model (retry). The twin sync on every replica and Validity on
// the leader decide with it, so they agree.
//
// A pushMethod that cannot work (checked with PushMethodProblems;
// secretExists nil: Secrets unchecked) makes invalid a *PushMethodError
// while ed is still given: the twin works on, and the properties it names
// go without their pushMethod.
func Check(ctx context.Context, reader client.Reader, secretExists func(ctx context.Context, namespace, name string) (bool, error), d *v1alpha1.Device) (ed *linkv1.EdgeDevice, model *v1alpha1.DeviceModel, invalid, err error) {
	if d.DeletionTimestamp != nil || d.Spec.DeviceModelRef == nil {
		return nil, nil, nil, nil
	}
	var m v1alpha1.DeviceModel
	err = reader.Get(ctx, types.NamespacedName{Namespace: d.Namespace, Name: d.Spec.DeviceModelRef.Name}, &m)
	if apierrors.IsNotFound(err) {
		return nil, nil, fmt.Errorf("DeviceModel %s does not exist", d.Spec.DeviceModelRef.Name), nil
	}
	if err != nil {
		return nil, nil, nil, err
	}
	if err := d.Validate(&m); err != nil {
		return nil, nil, err, nil
	}
	if ed, err = EdgeDevice(d, &m); err != nil {
		return nil, nil, err, nil
	}
	pmErr, err := PushMethodProblems(ctx, d, secretExists)
	if err != nil {
		return nil, nil, nil, err
	}
	if pmErr != nil {
		for _, p := range ed.Properties {
			if pmErr.Properties[p.Name] {
				p.PushMethod = nil
			}
		}
		return ed, &m, pmErr, nil
	}
	return ed, &m, nil, nil
}

// Validity keeps each Device's Valid condition (whether its spec fits its
// DeviceModel, and why not) and status.observedGeneration. It runs on the
// leader: unlike the twins, it is not any one node's, and a Device whose
// node no replica serves still needs it. Its write is conditional on the
// resourceVersion read, so it never undoes a replica's status write of the
// same Device (a conflict is retried on the newer object).
type Validity struct {
	client  client.Client
	reader  client.Reader // the cache, with ModelIndex
	secrets client.Reader
	log     logr.Logger
}

// NewValidity makes a Validity. secrets (uncached) checks that the
// Secrets pushMethods name exist; nil: not checked.
func NewValidity(c client.Client, reader, secrets client.Reader, log logr.Logger) *Validity {
	return &Validity{client: c, reader: reader, secrets: secrets, log: log}
}

// SetupWithManager reconciles Devices, and the Devices of a DeviceModel
// when it changes. ModelIndex must be registered.
func (v *Validity) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("device-validity").
		For(&v1alpha1.Device{}).
		Watches(&v1alpha1.DeviceModel{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			var list v1alpha1.DeviceList
			if err := v.reader.List(ctx, &list, client.InNamespace(o.GetNamespace()), client.MatchingFields{ModelIndex: o.GetName()}); err != nil {
				v.log.Error(err, "listing the devices of a model", "model", o.GetNamespace()+"/"+o.GetName())
				return nil
			}
			out := make([]reconcile.Request, len(list.Items))
			for i := range list.Items {
				out[i].NamespacedName = client.ObjectKeyFromObject(&list.Items[i])
			}
			return out
		})).
		// A few at once: each is a read of the model and at most one
		// patch, and a fleet's Devices made at once all need one.
		WithOptions(controller.Options{MaxConcurrentReconciles: 4}).
		Complete(v)
}

// Reconcile records whether the Device fits its model. Idempotent.
func (v *Validity) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var d v1alpha1.Device
	if err := v.reader.Get(ctx, req.NamespacedName, &d); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if d.DeletionTimestamp != nil || d.Spec.DeviceModelRef == nil {
		return reconcile.Result{}, nil
	}
	_, _, invalid, err := Check(ctx, v.reader, secretExists(v.secrets), &d)
	if err != nil {
		return reconcile.Result{}, err
	}
	c := metav1.Condition{Type: v1alpha1.ConditionDeviceValid, Status: metav1.ConditionTrue, Reason: "FitsModel",
		Message: "the spec fits DeviceModel " + d.Spec.DeviceModelRef.Name, ObservedGeneration: d.Generation}
	var pmErr *PushMethodError
	switch {
	case errors.As(invalid, &pmErr):
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, "InvalidPushMethod", "pushMethod not used: "+invalid.Error()
	case invalid != nil:
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, "Invalid", invalid.Error()
	}
	// A new desired value changes status.differing and DesiredApplied
	// (Pending) before any report does: here, in the write the spec's
	// change costs anyway, once; the twins' writes bring DesiredApplied
	// to True with the node's acknowledgement.
	diff := differing(&d, &d.Status)
	next := d.Status.DeepCopy()
	desiredApplied(&d, next)
	applied := meta.FindStatusCondition(next.Conditions, v1alpha1.ConditionDesiredApplied)
	old := meta.FindStatusCondition(d.Status.Conditions, c.Type)
	if old != nil && old.Status == c.Status && old.Message == c.Message && old.ObservedGeneration == c.ObservedGeneration &&
		d.Status.ObservedGeneration == d.Generation && d.Status.Differing == diff &&
		sameCondition(meta.FindStatusCondition(d.Status.Conditions, v1alpha1.ConditionDesiredApplied), applied) {
		return reconcile.Result{}, nil
	}
	orig := d.DeepCopy()
	meta.SetStatusCondition(&d.Status.Conditions, c)
	d.Status.ObservedGeneration = d.Generation
	d.Status.Differing = diff
	desiredApplied(&d, &d.Status)
	err = v.client.Status().Patch(ctx, &d, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{}))
	switch {
	case apierrors.IsNotFound(err):
		return reconcile.Result{}, nil
	case apierrors.IsConflict(err):
		// Another writer (a replica's status write) got there first: read
		// the newer object again, soon.
		return reconcile.Result{RequeueAfter: 100 * time.Millisecond}, nil
	}
	return reconcile.Result{}, err
}
