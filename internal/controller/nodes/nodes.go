// Package nodes removes nodes that died from the Instances that name them,
// so that shared devices move to the nodes that still see them, and drops
// a gone node's agent finalizer from Configurations.
package nodes

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/dowse-dev/dowse/internal/instancestore"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// Reconciler handles one node name at a time. A node is dead when it was
// deleted, when it has been NotReady for longer than the grace period, or,
// for a name no Node object ever had, when it has been missing for the
// grace period (an agent started with a wrong name keeps re-adding it, so
// removing it at once would fight that agent in a tight loop).
type Reconciler struct {
	client client.Client
	// live reads Instances from the API server before rewriting them: the
	// cache holds them trimmed to what the controller reads.
	live  client.Reader
	grace time.Duration
	log   logr.Logger
	now   func() time.Time

	mu           sync.Mutex
	seen         map[string]bool
	missingSince map[string]time.Time
}

// NewReconciler wires a Reconciler.
func NewReconciler(c client.Client, live client.Reader, grace time.Duration, log logr.Logger) *Reconciler {
	return &Reconciler{client: c, live: live, grace: grace, log: log, now: time.Now, seen: map[string]bool{}, missingSince: map[string]time.Time{}}
}

// SetupWithManager registers the controller; Instances enqueue the nodes
// they name, so that a node deleted while the controller was down is
// noticed too.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("nodes").
		For(&corev1.Node{}).
		Watches(&v1alpha1.Instance{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			inst, ok := o.(*v1alpha1.Instance)
			if !ok {
				return nil
			}
			var reqs []reconcile.Request
			for _, n := range inst.Status.Nodes {
				reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Name: n.Name}})
			}
			return reqs
		})).
		WithOptions(controller.Options{MaxConcurrentReconciles: 2}).
		Complete(r)
}

// Reconcile removes a dead node everywhere, or looks again when it could
// become dead.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	name := req.Name
	var node corev1.Node
	err := r.client.Get(ctx, req.NamespacedName, &node)
	if err != nil && !apierrors.IsNotFound(err) {
		return reconcile.Result{}, err
	}
	now := r.now()
	r.mu.Lock()
	var wait time.Duration
	deleted := false
	switch {
	case err == nil:
		r.seen[name] = true
		delete(r.missingSince, name)
		if ready := readySince(&node); ready.IsZero() {
			wait = 0 // Ready
		} else if left := r.grace - now.Sub(ready); left > 0 {
			wait = left
		} else {
			wait = -1
		}
	case r.seen[name]:
		deleted, wait = true, -1
	default:
		since, ok := r.missingSince[name]
		if !ok {
			since = now
			r.missingSince[name] = now
		}
		if left := r.grace - now.Sub(since); left > 0 {
			wait = left
		} else {
			wait = -1
		}
	}
	r.mu.Unlock()
	switch {
	case wait == 0:
		return reconcile.Result{}, nil
	case wait > 0:
		return reconcile.Result{RequeueAfter: wait}, nil
	}
	removed, err := r.removeFromInstances(ctx, name)
	if err != nil {
		return reconcile.Result{}, err
	}
	if removed > 0 {
		r.log.Info("removed dead node from instances", "node", name, "instances", removed, "deleted", deleted)
	}
	if deleted || !r.seenNode(name) {
		if err := r.dropFinalizers(ctx, name); err != nil {
			return reconcile.Result{}, err
		}
	}
	return reconcile.Result{}, nil
}

// readySince returns when a NotReady node stopped being Ready, or zero for
// a Ready node.
func readySince(n *corev1.Node) time.Time {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			if c.Status == corev1.ConditionTrue {
				return time.Time{}
			}
			return c.LastTransitionTime.Time
		}
	}
	return n.CreationTimestamp.Time // never reported: count from its creation
}

func (r *Reconciler) removeFromInstances(ctx context.Context, node string) (int, error) {
	var list v1alpha1.InstanceList
	if err := r.client.List(ctx, &list); err != nil {
		return 0, err
	}
	removed := 0
	for i := range list.Items {
		inst := &list.Items[i]
		if !inst.HasNode(node) {
			continue
		}
		if _, err := instancestore.DropNode(ctx, r.client, r.live, client.ObjectKeyFromObject(inst), node); err != nil {
			return removed, err
		}
		removed++
	}
	return removed, nil
}

func (r *Reconciler) dropFinalizers(ctx context.Context, node string) error {
	fin := v1alpha1.AgentFinalizer(node)
	var cfgs v1alpha1.ConfigurationList
	if err := r.client.List(ctx, &cfgs); err != nil {
		return err
	}
	for i := range cfgs.Items {
		c := &cfgs.Items[i]
		if !slices.Contains(c.Finalizers, fin) {
			continue
		}
		// An optimistic lock: another agent's finalizer may change meanwhile.
		patch := client.MergeFromWithOptions(c.DeepCopy(), client.MergeFromWithOptimisticLock{})
		c.Finalizers = slices.DeleteFunc(c.Finalizers, func(f string) bool { return f == fin })
		if err := r.client.Patch(ctx, c, patch); client.IgnoreNotFound(err) != nil {
			return err
		}
	}
	return nil
}

func (r *Reconciler) seenNode(name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seen[name]
}
