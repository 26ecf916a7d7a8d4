package brokers

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/dowse-dev/dowse/internal/apply"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	acv1alpha1 "github.com/dowse-dev/dowse/shared/api/v1alpha1/applyconfiguration/api/v1alpha1"
)

// ConfigurationReconciler keeps a Configuration's Service and the
// controller's part of its status: Instance and running-broker counts and
// the BrokersDeployed condition.
type ConfigurationReconciler struct {
	client   client.Client
	indexes  *Indexes
	refusals *Refusals
}

// NewConfigurationReconciler wires a ConfigurationReconciler.
func NewConfigurationReconciler(c client.Client, idx *Indexes, refusals *Refusals) *ConfigurationReconciler {
	return &ConfigurationReconciler{client: c, indexes: idx, refusals: refusals}
}

// SetupWithManager registers the controller.
func (r *ConfigurationReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("configuration-status").
		For(&v1alpha1.Configuration{}).
		Owns(&corev1.Service{}).
		Watches(&v1alpha1.Instance{}, debounced(func(_ context.Context, o client.Object) []reconcile.Request {
			inst, ok := o.(*v1alpha1.Instance)
			if !ok {
				return nil
			}
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: inst.Spec.ConfigurationName}}}
		})).
		Watches(&BrokerPod{}, debounced(r.configurationOfPod)).
		WatchesRawSource(source.Channel(r.refusals.changes, &handler.TypedEnqueueRequestForObject[*v1alpha1.Configuration]{})).
		WithOptions(controller.Options{MaxConcurrentReconciles: 2}).
		Complete(r)
}

// statusDelay coalesces the Instance and Pod events of a burst into one
// status update per Configuration per interval: each update counts every
// Instance and Pod of the Configuration.
const statusDelay = time.Second

// debounced enqueues what mapFn returns after statusDelay; the delaying
// queue keeps one entry per Configuration meanwhile.
func debounced(mapFn handler.MapFunc) handler.EventHandler {
	add := func(ctx context.Context, o client.Object, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		for _, req := range mapFn(ctx, o) {
			q.AddAfter(req, statusDelay)
		}
	}
	return handler.Funcs{
		CreateFunc: func(ctx context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			add(ctx, e.Object, q)
		},
		UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			add(ctx, e.ObjectNew, q)
		},
		DeleteFunc: func(ctx context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			add(ctx, e.Object, q)
		},
		GenericFunc: func(ctx context.Context, e event.GenericEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			add(ctx, e.Object, q)
		},
	}
}

func (r *ConfigurationReconciler) configurationOfPod(ctx context.Context, o client.Object) []reconcile.Request {
	name := o.GetLabels()[v1alpha1.LabelInstance]
	if name == "" {
		return nil
	}
	var inst v1alpha1.Instance
	if err := r.client.Get(ctx, types.NamespacedName{Namespace: o.GetNamespace(), Name: name}, &inst); err != nil {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: inst.Namespace, Name: inst.Spec.ConfigurationName}}}
}

// Reconcile is idempotent and writes only what differs from the cache.
func (r *ConfigurationReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var cfg v1alpha1.Configuration
	if err := r.client.Get(ctx, req.NamespacedName, &cfg); err != nil {
		if apierrors.IsNotFound(err) {
			r.refusals.Set(req.NamespacedName, "")
			return reconcile.Result{}, ensureService(ctx, r.client, types.NamespacedName{Namespace: req.Namespace, Name: v1alpha1.ConfigurationServiceName(req.Name)}, nil)
		}
		return reconcile.Result{}, err
	}
	insts, err := r.indexes.InstancesByConfiguration.Objects(cfg.Namespace, cfg.Name)
	if err != nil {
		return reconcile.Result{}, err
	}
	pods, err := r.indexes.PodsByConfiguration.Objects(cfg.Namespace, v1alpha1.LabelValue(cfg.Name))
	if err != nil {
		return reconcile.Result{}, err
	}
	running := int32(0)
	for _, o := range pods {
		if p, ok := o.(*BrokerPod); ok && p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp.IsZero() {
			running++
		}
	}

	var want *corev1.Service
	if cfg.Spec.ConfigurationServiceSpec != nil && running > 0 {
		t := true
		lbls := map[string]string{v1alpha1.LabelConfiguration: v1alpha1.LabelValue(cfg.Name)}
		if cfg.Spec.ReachFromCloud {
			lbls[v1alpha1.LabelReachFromCloud] = "true"
		}
		want = service(v1alpha1.ConfigurationServiceName(cfg.Name), cfg.Namespace, cfg.Spec.ConfigurationServiceSpec,
			lbls,
			map[string]string{v1alpha1.LabelConfiguration: v1alpha1.LabelValue(cfg.Name)},
			[]metav1.OwnerReference{{APIVersion: v1alpha1.GroupVersion.String(), Kind: "Configuration", Name: cfg.Name, UID: cfg.UID, Controller: &t}})
	}
	if err := ensureService(ctx, r.client, types.NamespacedName{Namespace: cfg.Namespace, Name: v1alpha1.ConfigurationServiceName(cfg.Name)}, want); err != nil {
		return reconcile.Result{}, err
	}
	return reconcile.Result{}, r.writeStatus(ctx, &cfg, int32(len(insts)), running)
}

func (r *ConfigurationReconciler) writeStatus(ctx context.Context, cfg *v1alpha1.Configuration, instances, brokers int32) error {
	conds := append([]metav1.Condition(nil), cfg.Status.Conditions...)
	c := metav1.Condition{Type: v1alpha1.ConditionBrokersDeployed, Status: metav1.ConditionTrue, Reason: "Deployed",
		Message: "every broker the Configuration asks for was accepted", ObservedGeneration: cfg.Generation}
	if cfg.Spec.BrokerSpec == nil {
		c.Reason, c.Message = "NoBroker", "the Configuration asks for no broker"
	}
	if msg := r.refusals.Get(client.ObjectKeyFromObject(cfg)); msg != "" {
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, "Refused", msg
	}
	meta.SetStatusCondition(&conds, c)
	seeing, ready := nodeCounts(cfg.Status.Nodes)
	if cfg.Status.Instances == instances && cfg.Status.Brokers == brokers && cfg.Status.NodesSeeing == seeing && cfg.Status.NodesReady == ready &&
		equality.Semantic.DeepEqual(conds, cfg.Status.Conditions) {
		return nil
	}
	ac := acv1alpha1.Configuration(cfg.Name, cfg.Namespace).WithStatus(acv1alpha1.ConfigurationStatus().
		WithInstances(instances).WithBrokers(brokers).WithNodesSeeing(seeing).WithNodesReady(ready).WithConditions(apply.Conditions(conds)...))
	err := r.client.Status().Apply(ctx, ac, client.FieldOwner(FieldManager), client.ForceOwnership)
	return client.IgnoreNotFound(err)
}

// nodeCounts counts the agents' entries that see a device and those whose
// handler is registered and discovering, for the printer columns.
func nodeCounts(nodes []v1alpha1.ConfigurationNodeStatus) (seeing, ready int32) {
	for _, n := range nodes {
		if n.Devices > 0 {
			seeing++
		}
		if meta.IsStatusConditionTrue(n.Conditions, v1alpha1.ConditionHandlerAvailable) && meta.IsStatusConditionTrue(n.Conditions, v1alpha1.ConditionDiscovering) {
			ready++
		}
	}
	return seeing, ready
}
