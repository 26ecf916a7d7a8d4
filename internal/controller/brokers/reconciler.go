package brokers

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	"github.com/dowse-dev/dowse/internal/backoff"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// Refusals remembers, per Configuration, the API server's message for the
// last broker object it refused, so that the Configuration's status can say
// why (BrokersDeployed False, reason Refused).
type Refusals struct {
	mu      sync.Mutex
	m       map[types.NamespacedName]string
	changes chan event.TypedGenericEvent[*v1alpha1.Configuration]
}

// NewRefusals makes an empty store.
func NewRefusals() *Refusals {
	return &Refusals{m: map[types.NamespacedName]string{}, changes: make(chan event.TypedGenericEvent[*v1alpha1.Configuration], 1024)}
}

// Set records (msg != "") or clears the refusal of a Configuration and says
// whether it changed.
func (e *Refusals) Set(cfg types.NamespacedName, msg string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.m[cfg] == msg {
		return false
	}
	if msg == "" {
		delete(e.m, cfg)
	} else {
		e.m[cfg] = msg
	}
	// Tell the status reconciler; a full buffer only delays the status to
	// its next reconcile.
	select {
	case e.changes <- event.TypedGenericEvent[*v1alpha1.Configuration]{Object: &v1alpha1.Configuration{ObjectMeta: metav1.ObjectMeta{Namespace: cfg.Namespace, Name: cfg.Name}}}:
	default:
	}
	return true
}

// Get returns a Configuration's recorded refusal ("" when none).
func (e *Refusals) Get(cfg types.NamespacedName) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.m[cfg]
}

// InstanceReconciler keeps the broker Pods, Job and Instance Service of
// each Instance as its Configuration asks. It reads from the cache and
// writes only what differs, so a steady state costs no requests.
type InstanceReconciler struct {
	client   client.Client
	indexes  *Indexes
	recorder recorder.EventRecorder
	refusals *Refusals
	log      logr.Logger

	mu      sync.Mutex
	backoff map[types.NamespacedName]*restart // per broker Pod
	// templates are the Instances (namespace/name: UID) whose broker
	// ResourceClaimTemplate exists (DRA Configurations).
	templates sync.Map
}

// restart is a broker Pod's restart backoff: 1s, 2s, 4s ... capped at 5
// minutes, like the kubelet's crash backoff.
type restart struct {
	instance types.NamespacedName // forgotten with it
	delay    backoff.Backoff
	notUntil time.Time
}

// NewInstanceReconciler wires an InstanceReconciler.
func NewInstanceReconciler(c client.Client, idx *Indexes, rec recorder.EventRecorder, refusals *Refusals, log logr.Logger) *InstanceReconciler {
	return &InstanceReconciler{client: c, indexes: idx, recorder: rec, refusals: refusals, log: log, backoff: map[types.NamespacedName]*restart{}}
}

// SetupWithManager registers the controller.
func (r *InstanceReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("broker").
		For(&v1alpha1.Instance{}).
		Owns(&BrokerPod{}).
		Owns(&batchv1.Job{}).
		Owns(&corev1.Service{}).
		Watches(&v1alpha1.Configuration{}, handler.EnqueueRequestsFromMapFunc(r.instancesOf)).
		WithOptions(controller.Options{MaxConcurrentReconciles: 8}).
		Complete(r)
}

func (r *InstanceReconciler) instancesOf(_ context.Context, o client.Object) []reconcile.Request {
	insts, err := r.indexes.InstancesByConfiguration.Objects(o.GetNamespace(), o.GetName())
	if err != nil {
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(insts))
	for _, inst := range insts {
		reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(inst)})
	}
	return reqs
}

// Reconcile makes the Instance's broker objects match its Configuration
// and the nodes that see it. It is idempotent.
func (r *InstanceReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var inst v1alpha1.Instance
	if err := r.client.Get(ctx, req.NamespacedName, &inst); err != nil {
		if apierrors.IsNotFound(err) {
			// Owner references collect these on a real cluster; deleting
			// them here too keeps clusters without a garbage collector clean.
			r.forgetFailures(req.NamespacedName)
			return reconcile.Result{}, errors.Join(r.removeAll(ctx, req.Namespace, req.Name), r.removeClaimTemplate(ctx, req.Namespace, req.Name))
		}
		return reconcile.Result{}, err
	}
	var cfg v1alpha1.Configuration
	if err := r.client.Get(ctx, types.NamespacedName{Namespace: inst.Namespace, Name: inst.Spec.ConfigurationName}, &cfg); err != nil {
		if apierrors.IsNotFound(err) {
			r.forgetFailures(req.NamespacedName)
			return reconcile.Result{}, r.removeAll(ctx, inst.Namespace, inst.Name)
		}
		return reconcile.Result{}, err
	}
	cfgKey := client.ObjectKeyFromObject(&cfg)

	objs, err := r.indexes.PodsByInstance.Objects(inst.Namespace, inst.Name)
	if err != nil {
		return reconcile.Result{}, err
	}
	pods := make([]*BrokerPod, 0, len(objs))
	for _, o := range objs {
		if p, ok := o.(*BrokerPod); ok {
			pods = append(pods, p)
		}
	}
	templateRefused := ""
	if cfg.Spec.BrokerSpec != nil && usesClaims(&cfg) {
		if templateRefused, err = r.ensureClaimTemplate(ctx, &inst); err != nil {
			return reconcile.Result{}, err
		}
	}
	requeue, refused, err := r.reconcilePods(ctx, &inst, &cfg, pods)
	if err != nil {
		return reconcile.Result{}, err
	}
	if refused == "" {
		refused = templateRefused
	}
	jobRefused, err := r.reconcileJob(ctx, &inst, &cfg)
	if err != nil {
		return reconcile.Result{}, err
	}
	if refused == "" {
		refused = jobRefused
	}
	if refused != "" || r.refusals.Get(cfgKey) != "" {
		r.refusals.Set(cfgKey, refused)
	}
	running := false
	for _, p := range pods {
		running = running || p.Status.Phase == corev1.PodRunning
	}
	if err := r.reconcileService(ctx, &inst, &cfg, running); err != nil {
		return reconcile.Result{}, err
	}
	return reconcile.Result{RequeueAfter: requeue}, nil
}

// reconcilePods returns how soon to look again (for a broker in restart
// backoff) and the API server's message when it refused a Pod.
func (r *InstanceReconciler) reconcilePods(ctx context.Context, inst *v1alpha1.Instance, cfg *v1alpha1.Configuration, existing []*BrokerPod) (time.Duration, string, error) {
	desired := map[string]*corev1.Pod{}
	if cfg.Spec.BrokerSpec != nil && cfg.Spec.BrokerSpec.BrokerPodSpec != nil {
		for _, n := range inst.Status.Nodes {
			var node corev1.Node
			if err := r.client.Get(ctx, types.NamespacedName{Name: n.Name}, &node); err != nil {
				if apierrors.IsNotFound(err) {
					r.recorder.Eventf(inst, nil, corev1.EventTypeWarning, "NodeNotFound", "DeployBroker",
						"no broker for node %q: the cluster has no such node", n.Name)
					continue
				}
				return 0, "", err
			}
			p := brokerPod(inst, cfg, n.Name)
			desired[p.Name] = p
		}
	}
	have := map[string]bool{}
	// The cache's own objects: read, never changed.
	for _, p := range existing {
		// Job brokers' pods carry the Instance's labels too, but are their
		// Job's to manage.
		if !metav1.IsControlledBy(p, inst) {
			continue
		}
		want := desired[p.Name]
		key := client.ObjectKeyFromObject(p)
		reason := ""
		switch {
		case !p.DeletionTimestamp.IsZero():
			have[p.Name] = true // wait until it is gone
			continue
		case want == nil:
			reason = "BrokerRemoved"
		case p.Annotations[v1alpha1.AnnotationSpecHash] != want.Annotations[v1alpha1.AnnotationSpecHash]:
			reason = "BrokerRolled"
		case p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded:
			reason = "BrokerRestarted"
			r.noteFailure(client.ObjectKeyFromObject(inst), key)
		default:
			if p.Status.Phase == corev1.PodRunning {
				r.clearFailures(key)
			}
			have[p.Name] = true
			continue
		}
		if err := deletePod(ctx, r.client, p); client.IgnoreNotFound(err) != nil {
			return 0, "", err
		}
		r.recorder.Eventf(inst, &corev1.Pod{ObjectMeta: p.ObjectMeta}, corev1.EventTypeNormal, reason, "DeleteBroker", "deleted broker pod %s", p.Name)
	}
	var requeue time.Duration
	refused := ""
	for name, p := range desired {
		if have[name] {
			continue
		}
		if wait := r.waitBeforeRestart(client.ObjectKeyFromObject(p)); wait > 0 {
			if requeue == 0 || wait < requeue {
				requeue = wait
			}
			continue
		}
		if err := r.client.Create(ctx, p); err != nil {
			if apierrors.IsAlreadyExists(err) {
				continue
			}
			if apierrors.IsInvalid(err) || apierrors.IsForbidden(err) || apierrors.IsBadRequest(err) {
				refused = fmt.Sprintf("broker pod %s refused: %v", p.Name, err)
				r.recorder.Eventf(inst, nil, corev1.EventTypeWarning, "BrokerRefused", "CreateBroker", "%s", refused)
				continue
			}
			return 0, "", err
		}
		r.recorder.Eventf(inst, p, corev1.EventTypeNormal, "BrokerCreated", "CreateBroker", "created broker pod %s", p.Name)
	}
	return requeue, refused, nil
}

func (r *InstanceReconciler) noteFailure(instance, pod types.NamespacedName) {
	r.mu.Lock()
	defer r.mu.Unlock()
	b := r.backoff[pod]
	if b == nil {
		b = &restart{instance: instance, delay: backoff.Backoff{Initial: time.Second, Max: 5 * time.Minute}}
		r.backoff[pod] = b
	}
	b.notUntil = time.Now().Add(b.delay.Next())
}

// forgetFailures drops the restart backoff of every broker Pod of a gone
// Instance.
func (r *InstanceReconciler) forgetFailures(instance types.NamespacedName) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for pod, b := range r.backoff {
		if b.instance == instance {
			delete(r.backoff, pod)
		}
	}
}

func (r *InstanceReconciler) clearFailures(key types.NamespacedName) {
	r.mu.Lock()
	delete(r.backoff, key)
	r.mu.Unlock()
}

func (r *InstanceReconciler) waitBeforeRestart(key types.NamespacedName) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	if b := r.backoff[key]; b != nil {
		return time.Until(b.notUntil)
	}
	return 0
}

// reconcileJob keeps one Job per Instance and Configuration generation.
func (r *InstanceReconciler) reconcileJob(ctx context.Context, inst *v1alpha1.Instance, cfg *v1alpha1.Configuration) (string, error) {
	jobs, err := r.indexes.JobsByInstance.Objects(inst.Namespace, inst.Name)
	if err != nil {
		return "", err
	}
	want := ""
	if cfg.Spec.BrokerSpec != nil && cfg.Spec.BrokerSpec.BrokerJobSpec != nil {
		want = v1alpha1.BrokerJobName(inst.Name, cfg.Generation)
	}
	found := false
	for _, o := range jobs {
		if o.GetName() == want {
			found = true
			continue
		}
		if !o.GetDeletionTimestamp().IsZero() {
			continue
		}
		// The cache's own object is read, never handed to a write.
		j := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: o.GetNamespace(), Name: o.GetName()}}
		if err := r.client.Delete(ctx, j, client.PropagationPolicy(metav1.DeletePropagationBackground)); client.IgnoreNotFound(err) != nil {
			return "", err
		}
		r.recorder.Eventf(inst, j, corev1.EventTypeNormal, "BrokerRemoved", "DeleteBroker", "deleted broker job %s", j.Name)
	}
	if want == "" || found {
		return "", nil
	}
	spec := cfg.Spec.BrokerSpec.BrokerJobSpec.DeepCopy()
	if usesClaims(cfg) {
		spec.Template.Spec = *withClaim(&spec.Template.Spec, ClaimTemplateName(inst.Name))
	} else {
		spec.Template.Spec = *withDevice(&spec.Template.Spec, inst)
	}
	if spec.Template.Labels == nil {
		spec.Template.Labels = map[string]string{}
	}
	for k, v := range labels(inst, "") {
		spec.Template.Labels[k] = v
	}
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: want, Namespace: inst.Namespace, Labels: labels(inst, ""), OwnerReferences: owner(inst)},
		Spec:       *spec,
	}
	if err := r.client.Create(ctx, job); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return "", nil
		}
		if apierrors.IsInvalid(err) || apierrors.IsForbidden(err) || apierrors.IsBadRequest(err) {
			msg := fmt.Sprintf("broker job %s refused: %v", want, err)
			r.recorder.Eventf(inst, nil, corev1.EventTypeWarning, "BrokerRefused", "CreateBroker", "%s", msg)
			return msg, nil
		}
		return "", err
	}
	r.recorder.Eventf(inst, job, corev1.EventTypeNormal, "BrokerCreated", "CreateBroker", "created broker job %s", want)
	return "", nil
}

// reconcileService keeps the Instance Service while a broker runs.
func (r *InstanceReconciler) reconcileService(ctx context.Context, inst *v1alpha1.Instance, cfg *v1alpha1.Configuration, running bool) error {
	name := v1alpha1.InstanceServiceName(inst.Name)
	var want *corev1.Service
	if cfg.Spec.InstanceServiceSpec != nil && running {
		lbls := labels(inst, "")
		if cfg.Spec.ReachFromCloud {
			lbls[v1alpha1.LabelReachFromCloud] = "true"
		}
		want = service(name, inst.Namespace, cfg.Spec.InstanceServiceSpec, lbls,
			map[string]string{v1alpha1.LabelInstance: inst.Name}, owner(inst))
	}
	return ensureService(ctx, r.client, types.NamespacedName{Namespace: inst.Namespace, Name: name}, want)
}

// deletePod deletes the Pod p names (the client knows Pods as corev1.Pods),
// if it is still the same Pod.
func deletePod(ctx context.Context, c client.Client, p *BrokerPod) error {
	uid := p.UID
	return c.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name}}, client.Preconditions{UID: &uid})
}

// removeAll deletes every broker object of an Instance that is gone.
func (r *InstanceReconciler) removeAll(ctx context.Context, namespace, instance string) error {
	sel := client.MatchingLabels{v1alpha1.LabelInstance: instance}
	var errs []error
	for _, list := range []client.ObjectList{&BrokerPodList{}, &batchv1.JobList{}, &corev1.ServiceList{}} {
		if err := r.indexes.Cache.List(ctx, list, client.InNamespace(namespace), sel); err != nil {
			errs = append(errs, err)
			continue
		}
		var objs []client.Object
		switch l := list.(type) {
		case *BrokerPodList:
			for i := range l.Items {
				// The client writes Pods as corev1.Pods.
				objs = append(objs, &corev1.Pod{ObjectMeta: l.Items[i].ObjectMeta})
			}
		case *batchv1.JobList:
			for i := range l.Items {
				objs = append(objs, &l.Items[i])
			}
		case *corev1.ServiceList:
			for i := range l.Items {
				objs = append(objs, &l.Items[i])
			}
		}
		for _, o := range objs {
			if !o.GetDeletionTimestamp().IsZero() {
				continue
			}
			if err := r.client.Delete(ctx, o, client.PropagationPolicy(metav1.DeletePropagationBackground)); client.IgnoreNotFound(err) != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}
