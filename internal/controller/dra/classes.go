// Package dra is the controller's part of Dynamic Resource Allocation: a
// DeviceClass per Configuration whose spec.allocation is DRA or Both
// (Classes), and the ResourceSlices of shared devices (Publisher), which
// only the controller can publish because only it sees every node. Names
// and device contents come from internal/dra; the agents publish their
// nodes' local devices and prepare claims (agent/dra).
package dra

import (
	"context"

	"github.com/go-logr/logr"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	resourceac "k8s.io/client-go/applyconfigurations/resource/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	shareddra "github.com/dowse-dev/dowse/internal/dra"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// FieldManager writes the DeviceClasses.
const FieldManager = "dowse-controller-dra"

// Classes keeps one DeviceClass per DRA Configuration, named
// internal/dra.DeviceClassName, selecting the Configuration's devices by CEL
// on the driver and the namespace and configuration attributes. A class
// goes when its Configuration goes or stops using DRA; classes are
// cluster-scoped, so a namespaced Configuration cannot own them and the
// labels dowse.dev/configuration and dowse.dev/namespace say whose a class
// is (a class whose Configuration is gone while the controller was down is
// deleted when the controller's cache lists it). Reconcile is idempotent.
type Classes struct {
	client client.Client
	log    logr.Logger
}

// NewClasses wires Classes; c reads from the manager's cache.
func NewClasses(c client.Client, log logr.Logger) *Classes { return &Classes{client: c, log: log} }

// SetupWithManager registers the controller: Configurations, and the
// classes it made (so that one deleted by hand comes back).
func (r *Classes) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("dra-classes").
		For(&v1alpha1.Configuration{}).
		Watches(&resourceapi.DeviceClass{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			l := o.GetLabels()
			cfg, ns := l[v1alpha1.LabelConfiguration], l[shareddra.LabelNamespace]
			if cfg == "" || ns == "" {
				return nil
			}
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: ns, Name: cfg}}}
		})).
		Complete(r)
}

// Reconcile applies or deletes the DeviceClass of one Configuration.
func (r *Classes) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	name := shareddra.DeviceClassName(req.Namespace, req.Name)
	var cfg v1alpha1.Configuration
	err := r.client.Get(ctx, req.NamespacedName, &cfg)
	if err != nil && !apierrors.IsNotFound(err) {
		return reconcile.Result{}, err
	}
	if err != nil || cfg.DeletionTimestamp != nil || !cfg.Spec.UsesDRA() {
		var class resourceapi.DeviceClass
		if err := r.client.Get(ctx, types.NamespacedName{Name: name}, &class); err != nil {
			return reconcile.Result{}, client.IgnoreNotFound(err)
		}
		if class.Labels[v1alpha1.LabelConfiguration] != req.Name || class.Labels[shareddra.LabelNamespace] != req.Namespace {
			return reconcile.Result{}, nil // not ours
		}
		if err := r.client.Delete(ctx, &class, client.Preconditions{UID: &class.UID}); client.IgnoreNotFound(err) != nil {
			return reconcile.Result{}, err
		}
		r.log.Info("device class deleted", "class", name, "configuration", req.NamespacedName)
		return reconcile.Result{}, nil
	}
	ac := resourceac.DeviceClass(name).
		WithLabels(map[string]string{v1alpha1.LabelConfiguration: req.Name, shareddra.LabelNamespace: req.Namespace}).
		WithSpec(resourceac.DeviceClassSpec().WithSelectors(
			resourceac.DeviceSelector().WithCEL(resourceac.CELDeviceSelector().WithExpression(shareddra.ClassSelector(req.Namespace, req.Name))),
		))
	if err := r.client.Apply(ctx, ac, client.FieldOwner(FieldManager), client.ForceOwnership); err != nil {
		return reconcile.Result{}, err
	}
	return reconcile.Result{}, nil
}
