package brokers

import (
	"context"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// SlotsReconciler keeps an Instance's status.slotsInUse equal to the
// number of its slots, for the printer columns. The count is the
// controller's because the slots are not one writer's: each agent states
// only its own node's.
type SlotsReconciler struct {
	client client.Client
}

// NewSlotsReconciler wires a SlotsReconciler.
func NewSlotsReconciler(c client.Client) *SlotsReconciler { return &SlotsReconciler{client: c} }

// SlimSlots is what the controller's cache keeps of an Instance's slots:
// nothing (nil) when slotsInUse counts them, else the slots (an empty,
// non-nil list when none are left), so that the count can be written
// without keeping every slot of every Instance in memory.
func SlimSlots(inst *v1alpha1.Instance) []v1alpha1.InstanceSlot {
	if inst.Status.SlotsInUse == int32(len(inst.Status.Slots)) {
		return nil
	}
	if inst.Status.Slots == nil {
		return []v1alpha1.InstanceSlot{}
	}
	return inst.Status.Slots
}

// SetupWithManager registers the controller. Only Instances whose count is
// off are queued, so a burst of new Instances (no slots yet) costs nothing.
func (r *SlotsReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("instance-slots").
		For(&v1alpha1.Instance{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
			inst, ok := o.(*v1alpha1.Instance)
			return ok && slotsOff(inst)
		}))).
		WithOptions(controller.Options{MaxConcurrentReconciles: 2}).
		Complete(r)
}

// slotsOff reads a cached Instance (see SlimSlots).
func slotsOff(inst *v1alpha1.Instance) bool { return inst.Status.Slots != nil }

// Reconcile writes the count with a merge patch that carries the
// resourceVersion it read. A conflict means an agent changed the Instance
// meanwhile: its watch event brings the newer Instance here again.
func (r *SlotsReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var inst v1alpha1.Instance
	if err := r.client.Get(ctx, req.NamespacedName, &inst); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !slotsOff(&inst) {
		return reconcile.Result{}, nil
	}
	orig := inst.DeepCopy()
	inst.Status.SlotsInUse = int32(len(inst.Status.Slots))
	err := r.client.Patch(ctx, &inst, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{}), client.FieldOwner(FieldManager))
	if apierrors.IsConflict(err) {
		return reconcile.Result{}, nil
	}
	return reconcile.Result{}, client.IgnoreNotFound(err)
}
