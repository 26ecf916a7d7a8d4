// Package discovery runs this node's side of every Configuration: it opens a
// Discover stream to the Configuration's handler when that handler is
// registered here, and keeps the Instances and the Configuration's status in
// step with what the handler reports.
package discovery

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	toolscache "k8s.io/client-go/tools/cache"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/dowse-dev/dowse/internal/agent/instances"
	"github.com/dowse-dev/dowse/internal/agent/propertyrefs"
	"github.com/dowse-dev/dowse/internal/agent/registry"
	"github.com/dowse-dev/dowse/internal/apply"
	"github.com/dowse-dev/dowse/internal/instancestore"
	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	acv1alpha1 "github.com/dowse-dev/dowse/shared/api/v1alpha1/applyconfiguration/api/v1alpha1"
)

// Options tune the reconciler.
type Options struct {
	NodeName string
	// GracePeriod is how long a handler may be gone (dead, unreachable,
	// unregistered) before this node stops claiming its devices.
	GracePeriod time.Duration
	// MaxDevices caps the devices taken from one list (0: no cap).
	MaxDevices int
	// HostPaths are the host paths handlers may hand out.
	HostPaths HostPaths
	// PropertyMetrics counts the watches of discovery property objects
	// (nil: not counted).
	PropertyMetrics *propertyrefs.Metrics
	// Metrics are the devices and skipped-candidates gauges (nil: none).
	Metrics *Metrics
	// Recorder emits an Event on a Configuration when its handler skips
	// candidates for a new reason (nil: no Events).
	Recorder EventRecorder
}

// Reconciler reconciles Configurations for one node. It is also a manager
// Runnable: its Start owns the discovery sessions' lifetime.
type Reconciler struct {
	client    client.Client
	cache     cache.Cache
	registry  *registry.Registry
	writer    *instances.Writer
	refs      *propertyrefs.Watcher
	opts      Options
	finalizer string
	log       logr.Logger

	events     chan event.TypedGenericEvent[*v1alpha1.Configuration]
	skipEvents *skipEvents
	started    chan struct{}
	runCtx     context.Context

	mu       sync.Mutex
	sessions map[types.NamespacedName]*session
}

// NewReconciler wires a Reconciler; call SetupWithManager to run it. c
// reads Configurations and Instances (through the manager's cache); cs
// reads the Secrets and ConfigMaps that discoveryProperties name, each by
// name and only while a Configuration handled here names it (never through
// the cache: the agent may not list them).
func NewReconciler(c client.Client, cs kubernetes.Interface, reg *registry.Registry, w *instances.Writer, opts Options, log logr.Logger) *Reconciler {
	r := &Reconciler{
		client: c, registry: reg, writer: w, opts: opts, log: log,
		finalizer:  v1alpha1.AgentFinalizer(opts.NodeName),
		events:     make(chan event.TypedGenericEvent[*v1alpha1.Configuration], 1024),
		skipEvents: newSkipEvents(opts.Recorder, opts.NodeName),
		started:    make(chan struct{}),
		sessions:   map[types.NamespacedName]*session{},
	}
	r.refs = propertyrefs.New(cs, r.propertiesChanged, opts.PropertyMetrics, log.WithName("properties"))
	return r
}

// propertiesChanged re-resolves the Configurations that read an object
// that changed (or could be read at last).
func (r *Reconciler) propertiesChanged(owners []types.NamespacedName) {
	for _, o := range owners {
		r.enqueue(r.runCtx, &v1alpha1.Configuration{ObjectMeta: metav1.ObjectMeta{Namespace: o.Namespace, Name: o.Name}})
	}
}

// SetupWithManager registers the controller, its indexes and this Runnable.
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	if err := mgr.GetFieldIndexer().IndexField(ctx, &v1alpha1.Configuration{}, handlerIndex, func(o client.Object) []string {
		if c, ok := o.(*v1alpha1.Configuration); ok {
			return []string{c.Spec.DiscoveryHandler.Name}
		}
		return nil
	}); err != nil {
		return err
	}
	r.cache = mgr.GetCache()
	if err := mgr.Add(r); err != nil {
		return err
	}
	if err := mgr.Add(r.refs); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("configuration").
		For(&v1alpha1.Configuration{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		WatchesRawSource(source.Channel(r.events, &handler.TypedEnqueueRequestForObject[*v1alpha1.Configuration]{})).
		// Several agents may share a process in tests; names are per manager.
		WithOptions(controller.Options{MaxConcurrentReconciles: 4}).
		Complete(r)
}

const handlerIndex = "spec.discoveryHandler.name"

// pendingRecheck looks again at a Configuration whose property objects are
// being read, should the watcher's notice be lost.
const pendingRecheck = 30 * time.Second

// Start runs until ctx ends: it forwards handler registrations to the
// reconciler, watches Instances for deletions that need a resync, and stops
// every session on the way out (leaving Instances as they are: the devices
// are still there when the agent comes back).
func (r *Reconciler) Start(ctx context.Context) error {
	r.runCtx = ctx
	inf, err := r.cache.GetInformer(ctx, &v1alpha1.Instance{})
	if err != nil {
		return fmt.Errorf("getting instance informer: %w", err)
	}
	reg, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		UpdateFunc: func(oldObj, newObj any) {
			o, ok1 := oldObj.(*v1alpha1.Instance)
			n, ok2 := newObj.(*v1alpha1.Instance)
			if ok1 && ok2 && o.HasNode(r.opts.NodeName) && !n.HasNode(r.opts.NodeName) {
				r.instanceLost(n)
			}
		},
		DeleteFunc: func(obj any) {
			if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			if inst, ok := obj.(*v1alpha1.Instance); ok {
				r.instanceLost(inst)
			}
		},
	})
	if err != nil {
		return err
	}
	defer func() { _ = inf.RemoveEventHandler(reg) }()
	close(r.started)

	changes, cancel := r.registry.Watch()
	defer cancel()
	for {
		select {
		case <-ctx.Done():
			r.mu.Lock()
			all := r.sessions
			r.sessions = map[types.NamespacedName]*session{}
			r.mu.Unlock()
			for _, s := range all {
				s.stop()
			}
			return nil
		case name := <-changes:
			var cfgs v1alpha1.ConfigurationList
			if err := r.client.List(ctx, &cfgs, client.MatchingFields{handlerIndex: name}); err != nil {
				r.log.Error(err, "listing configurations for a handler", "handler", name)
				continue
			}
			for i := range cfgs.Items {
				r.enqueue(ctx, &cfgs.Items[i])
			}
		}
	}
}

func (r *Reconciler) enqueue(ctx context.Context, cfg *v1alpha1.Configuration) {
	select {
	case r.events <- event.TypedGenericEvent[*v1alpha1.Configuration]{Object: cfg}:
	case <-ctx.Done():
	}
}

func (r *Reconciler) instanceLost(inst *v1alpha1.Instance) {
	r.writer.Forget(client.ObjectKeyFromObject(inst))
	r.mu.Lock()
	s := r.sessions[types.NamespacedName{Namespace: inst.Namespace, Name: inst.Spec.ConfigurationName}]
	r.mu.Unlock()
	if s != nil {
		s.requestResync()
	}
}

// Reconcile is idempotent and makes no request when nothing changed: it
// reads from the cache, and writes the finalizer and status only when they
// differ from what the cache shows.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	select {
	case <-r.started:
	case <-ctx.Done():
		return reconcile.Result{}, ctx.Err()
	}
	log := logr.FromContextOrDiscard(ctx)
	var cfg v1alpha1.Configuration
	if err := r.client.Get(ctx, req.NamespacedName, &cfg); err != nil {
		if apierrors.IsNotFound(err) {
			r.stopSession(req.NamespacedName)
			r.refs.Set(req.NamespacedName, nil)
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, err
	}

	if !cfg.DeletionTimestamp.IsZero() {
		r.stopSession(req.NamespacedName)
		r.refs.Set(req.NamespacedName, nil)
		if !controllerutil.ContainsFinalizer(&cfg, r.finalizer) {
			return reconcile.Result{}, nil
		}
		if _, err := r.writer.ReleaseAll(ctx, &cfg); err != nil {
			return reconcile.Result{}, fmt.Errorf("releasing instances of a deleted configuration: %w", err)
		}
		log.Info("released instances of deleted configuration")
		return reconcile.Result{}, r.applyFinalizer(ctx, &cfg, false)
	}

	_, registered := r.registry.Get(cfg.Spec.DiscoveryHandler.Name)
	s := r.session(req.NamespacedName)
	if !registered && s == nil {
		holds, err := r.writer.Holds(ctx, &cfg)
		if err != nil {
			return reconcile.Result{}, err
		}
		if !holds {
			r.refs.Set(req.NamespacedName, nil)
			return reconcile.Result{}, nil // not this node's business (yet)
		}
	}
	if !controllerutil.ContainsFinalizer(&cfg, r.finalizer) {
		if err := r.applyFinalizer(ctx, &cfg, true); err != nil {
			return reconcile.Result{}, err
		}
	}

	r.refs.Set(req.NamespacedName, propertyRefs(&cfg))
	props, perr := resolveProperties(r.refs, &cfg)
	if errors.Is(perr, propertyrefs.ErrPending) {
		// Read in a moment (the watcher enqueues this Configuration then):
		// a session started now would flap the status to unresolved.
		log.V(1).Info("waiting for discovery property objects", "err", perr)
		return reconcile.Result{RequeueAfter: pendingRecheck}, nil
	}
	blocked := ""
	if perr != nil {
		blocked = perr.Error()
	}
	key, err := sessionKey(&cfg, props, blocked)
	if err != nil {
		return reconcile.Result{}, err
	}
	if s == nil || s.key != key {
		s = r.replaceSession(&cfg, key, props, blocked)
	}
	return reconcile.Result{}, r.writeStatus(ctx, &cfg, s.snapshot())
}

func sessionKey(cfg *v1alpha1.Configuration, props map[string]*discoveryv1.ByteData, blocked string) (string, error) {
	names := make([]string, 0, len(props))
	for n := range props {
		names = append(names, n)
	}
	sort.Strings(names)
	type prop struct {
		Name string
		Set  bool
		Val  []byte
	}
	ps := make([]prop, 0, len(names))
	for _, n := range names {
		ps = append(ps, prop{n, props[n].Vec != nil, props[n].Vec})
	}
	b, err := json.Marshal(struct {
		UID     types.UID
		Spec    v1alpha1.ConfigurationSpec
		Props   []prop
		Blocked string
	}{cfg.UID, cfg.Spec, ps, blocked})
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), nil
}

func (r *Reconciler) session(key types.NamespacedName) *session {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sessions[key]
}

func (r *Reconciler) stopSession(key types.NamespacedName) {
	r.mu.Lock()
	s := r.sessions[key]
	delete(r.sessions, key)
	r.mu.Unlock()
	if s != nil {
		s.stop()
	}
	r.opts.Metrics.forget(key)
}

func (r *Reconciler) replaceSession(cfg *v1alpha1.Configuration, key string, props map[string]*discoveryv1.ByteData, blocked string) *session {
	nn := client.ObjectKeyFromObject(cfg)
	r.stopSession(nn)
	details := DetailsText(cfg.Spec.DiscoveryHandler.DiscoveryDetails)
	cfgCopy := cfg.DeepCopy()
	s := &session{
		key:        key,
		cfg:        cfgCopy,
		request:    &discoveryv1.DiscoverRequest{DiscoveryDetails: details, DiscoveryProperties: props},
		blocked:    blocked,
		grace:      r.opts.GracePeriod,
		maxDevices: r.opts.MaxDevices,
		hostPaths:  r.opts.HostPaths,
		registry:   r.registry,
		writer:     r.writer,
		log:        r.log.WithValues("configuration", cfg.Name, "namespace", cfg.Namespace, "handler", cfg.Spec.DiscoveryHandler.Name),
		notify:     func() { r.enqueue(r.runCtx, cfgCopy) },
	}
	r.mu.Lock()
	r.sessions[nn] = s
	r.mu.Unlock()
	s.start(r.runCtx)
	s.log.Info("discovery session started")
	return s
}

// applyFinalizer states (or stops stating) this node's finalizer. The uid
// makes the apply fail rather than create a Configuration that is gone.
func (r *Reconciler) applyFinalizer(ctx context.Context, cfg *v1alpha1.Configuration, present bool) error {
	ac := acv1alpha1.Configuration(cfg.Name, cfg.Namespace).WithUID(cfg.UID)
	if present {
		ac.WithFinalizers(r.finalizer)
	}
	err := r.client.Apply(ctx, ac, client.FieldOwner(instancestore.FieldManager(r.opts.NodeName)), client.ForceOwnership)
	if apierrors.IsNotFound(err) || (apierrors.IsConflict(err) && !present) {
		return nil
	}
	return err
}

// writeStatus applies this node's entry of status.nodes when it differs
// from the cached one; LastTransitionTime moves only when a status does.
func (r *Reconciler) writeStatus(ctx context.Context, cfg *v1alpha1.Configuration, st sessionState) error {
	if st.discovering.Reason == reasonStarting && st.handler.Status != metav1.ConditionFalse {
		// No outcome yet; writing "Unknown" now would flap the status of an
		// agent that restarts into the same state it left.
		return nil
	}
	var cur *v1alpha1.ConfigurationNodeStatus
	for i := range cfg.Status.Nodes {
		if cfg.Status.Nodes[i].NodeName == r.opts.NodeName {
			cur = &cfg.Status.Nodes[i]
		}
	}
	r.opts.Metrics.observe(client.ObjectKeyFromObject(cfg), r.opts.NodeName, st)
	want := v1alpha1.ConfigurationNodeStatus{NodeName: r.opts.NodeName, Devices: st.devices, Skipped: st.skipped}
	var before []v1alpha1.SkippedReason
	if cur != nil {
		want.Conditions = append([]metav1.Condition(nil), cur.Conditions...)
		before = cur.Skipped
	}
	for _, c := range []metav1.Condition{st.handler, st.discovering} {
		c.ObservedGeneration = cfg.Generation
		meta.SetStatusCondition(&want.Conditions, c)
	}
	if cur != nil && equality.Semantic.DeepEqual(*cur, want) {
		return nil
	}
	entry := acv1alpha1.ConfigurationNodeStatus().WithNodeName(want.NodeName).WithDevices(want.Devices).WithConditions(apply.Conditions(want.Conditions)...)
	for _, sr := range want.Skipped {
		ar := acv1alpha1.SkippedReason().WithReason(sr.Reason).WithCount(sr.Count)
		for _, c := range sr.Candidates {
			ar.WithCandidates(acv1alpha1.SkippedCandidate().WithCandidate(c.Candidate).WithMessage(c.Message))
		}
		entry.WithSkipped(ar)
	}
	ac := acv1alpha1.Configuration(cfg.Name, cfg.Namespace).WithStatus(acv1alpha1.ConfigurationStatus().WithNodes(entry))
	err := r.client.Status().Apply(ctx, ac, client.FieldOwner(instancestore.FieldManager(r.opts.NodeName)), client.ForceOwnership)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err == nil {
		r.skipEvents.changed(cfg, before, want.Skipped)
	}
	return err
}
