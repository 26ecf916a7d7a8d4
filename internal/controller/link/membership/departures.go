package membership

import (
	"context"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// Forgetter is what Departures needs of the cloudhub.
type Forgetter interface {
	Forget(node string)
}

// Departures ends the link of a node that leaves the cluster. Its client
// certificate stays valid until it expires (nothing revokes it), so a
// deleted Node object is what counts: the node's connection is closed, its
// session and membership forgotten (no memory kept for departed nodes), and
// Allowed keeps it out.
type Departures struct {
	reader client.Reader // the cache
	hub    Forgetter
	log    logr.Logger
}

// NewDepartures makes a Departures. hub's Forget tells the parts that keep
// state per node (cloudhub.SessionObserver's Departed).
func NewDepartures(reader client.Reader, hub Forgetter, log logr.Logger) *Departures {
	return &Departures{reader: reader, hub: hub, log: log}
}

// SetupWithManager reconciles Nodes as they are deleted.
func (d *Departures) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("edge-departures").
		// On every replica: whichever holds the node's session closes it.
		WithOptions(controller.Options{NeedLeaderElection: ptr.To(false)}).
		For(&corev1.Node{}, builder.WithPredicates(predicate.Funcs{
			CreateFunc:  func(event.CreateEvent) bool { return false },
			UpdateFunc:  func(event.UpdateEvent) bool { return false },
			GenericFunc: func(event.GenericEvent) bool { return false },
		})).
		Complete(d)
}

// Reconcile forgets the node if its Node object is gone.
func (d *Departures) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	_, ok, err := NodeUID(d.reader)(ctx, req.Name)
	if err != nil || ok {
		return reconcile.Result{}, err
	}
	d.hub.Forget(req.Name)
	d.log.Info("node left the cluster: its link is closed and forgotten", "node", req.Name)
	return reconcile.Result{}, nil
}

// NodeUID is the UID of a node's Node object read through reader, and
// whether it is in the cluster: the cloudhub's and the bootstrap
// endpoint's NodeUID.
func NodeUID(reader client.Reader) func(ctx context.Context, node string) (string, bool, error) {
	return func(ctx context.Context, node string) (string, bool, error) {
		var n corev1.Node
		err := reader.Get(ctx, client.ObjectKey{Name: node}, &n)
		if apierrors.IsNotFound(err) {
			return "", false, nil
		}
		if err != nil {
			return "", false, err
		}
		return string(n.UID), true, nil
	}
}
