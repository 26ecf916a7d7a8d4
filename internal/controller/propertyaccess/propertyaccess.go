// Package propertyaccess grants the agents read of exactly the Secrets and
// ConfigMaps that Configurations' discoveryProperties name, and of nothing
// else. In each namespace that holds such objects it keeps a Role,
// v1alpha1.PropertyAccessRole, whose rules allow get, list and watch on
// those objects by name (Kubernetes authorizes a list or watch against
// resourceNames when it selects metadata.name, which is how
// internal/agent/propertyrefs reads them), and a RoleBinding of that Role to the
// agents' service accounts. When the last reference in a namespace goes,
// both are deleted: a rule without resourceNames would grant every object.
//
// A Configuration may read objects in its own namespace, and in the
// namespaces an administrator allows (--property-namespaces): its author
// may not be able to read anywhere else, and granting the agents read there
// would read it for them. A reference elsewhere is refused at admission by
// the chart's policy (templates/configuration-policy.yaml) and, should it get
// in without that policy, granted nothing here.
//
// The controller must itself hold get, list and watch on secrets and
// configmaps for the API server to let it grant them (RBAC's escalation
// check), and roles/rolebindings get, list, watch, create, patch, delete.
package propertyaccess

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/go-logr/logr"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	rbacv1ac "k8s.io/client-go/applyconfigurations/rbac/v1"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

const (
	// FieldManager applies the Roles and RoleBindings.
	FieldManager = "dowse-controller/property-access"
	// LabelManaged marks the Roles and RoleBindings this package keeps; the
	// controller caches only those.
	LabelManaged = v1alpha1.Domain + "/property-access"
	// namespaceIndex indexes Configurations by the namespaces of the
	// objects their discoveryProperties read.
	namespaceIndex = "dowse.dev/property-namespaces"
)

// Managed selects the Roles and RoleBindings this package keeps (for the
// manager's cache).
var Managed = labels.SelectorFromSet(labels.Set{LabelManaged: "true"})

// Verbs are what the Role grants on each named object: get for a read,
// list and watch (with a metadata.name field selector) to follow it.
var Verbs = []string{"get", "list", "watch"}

// ParseServiceAccounts turns "namespace/name" strings (a bare name is in
// defaultNamespace) into RoleBinding subjects, sorted.
func ParseServiceAccounts(list []string, defaultNamespace string) ([]rbacv1.Subject, error) {
	var out []rbacv1.Subject
	var errs []error
	for _, s := range list {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		ns, name, ok := strings.Cut(s, "/")
		if !ok {
			ns, name = defaultNamespace, s
		}
		if len(validation.IsDNS1123Label(ns)) > 0 || len(validation.IsDNS1123Subdomain(name)) > 0 {
			errs = append(errs, fmt.Errorf("agent service account %q is not namespace/name", s))
			continue
		}
		out = append(out, rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: name})
	}
	slices.SortFunc(out, func(a, b rbacv1.Subject) int { return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name) })
	return slices.Compact(out), errors.Join(errs...)
}

// Reconciler keeps one namespace's Role and RoleBinding per request
// (namespace, v1alpha1.PropertyAccessRole). Reconcile is idempotent and
// writes nothing when the cached objects already say what it would.
type Reconciler struct {
	client   client.Client
	subjects []rbacv1.Subject
	allowed  []string
	served   []string
	log      logr.Logger
}

// NewReconciler grants subjects (the agents' service accounts, at least
// one) read of the objects discoveryProperties name in their
// Configuration's own namespace or in one of allowed, for the
// Configurations in served (empty: in any namespace). Outside served and
// allowed the controller may hold no read of Secrets at all (the chart's
// rbac.configurationNamespaces), so it grants nothing there.
func NewReconciler(c client.Client, subjects []rbacv1.Subject, allowed, served []string, log logr.Logger) (*Reconciler, error) {
	if len(subjects) == 0 {
		return nil, errors.New("property access needs the agents' service accounts")
	}
	for _, ns := range slices.Concat(allowed, served) {
		if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
			return nil, fmt.Errorf("namespace %q: %s", ns, strings.Join(errs, "; "))
		}
	}
	return &Reconciler{client: c, subjects: subjects, allowed: allowed, served: served, log: log}, nil
}

// SetupWithManager registers the index and the controller. The manager's
// cache should hold only Managed Roles and RoleBindings (cache.ByObject).
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	if err := mgr.GetFieldIndexer().IndexField(ctx, &v1alpha1.Configuration{}, namespaceIndex, func(o client.Object) []string {
		if c, ok := o.(*v1alpha1.Configuration); ok {
			return Namespaces(c)
		}
		return nil
	}); err != nil {
		return err
	}
	toRole := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		return []reconcile.Request{request(o.GetNamespace())}
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("property-access").
		For(&rbacv1.Role{}).
		Watches(&rbacv1.RoleBinding{}, toRole).
		Watches(&v1alpha1.Configuration{}, configurationHandler{}).
		WithOptions(controller.Options{MaxConcurrentReconciles: 2}).
		Complete(r)
}

func request(namespace string) reconcile.Request {
	return reconcile.Request{NamespacedName: types.NamespacedName{Namespace: namespace, Name: v1alpha1.PropertyAccessRole}}
}

// Namespaces are the namespaces of the objects c's discoveryProperties
// read, sorted.
func Namespaces(c *v1alpha1.Configuration) []string {
	secrets, configMaps := c.PropertyObjects()
	var out []string
	for _, o := range append(secrets, configMaps...) {
		out = append(out, o.Namespace)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// configurationHandler enqueues the namespaces a Configuration reads from,
// before and after a change, and only when what it reads changed (status
// writes, the most frequent updates, change nothing here).
type configurationHandler struct{}

type queue = workqueue.TypedRateLimitingInterface[reconcile.Request]

func (configurationHandler) Create(_ context.Context, e event.CreateEvent, q queue) {
	enqueue(q, e.Object)
}

func (configurationHandler) Update(_ context.Context, e event.UpdateEvent, q queue) {
	o, okOld := e.ObjectOld.(*v1alpha1.Configuration)
	n, okNew := e.ObjectNew.(*v1alpha1.Configuration)
	if !okOld || !okNew {
		return
	}
	os, oc := o.PropertyObjects()
	ns, nc := n.PropertyObjects()
	if slices.Equal(os, ns) && slices.Equal(oc, nc) {
		return
	}
	enqueue(q, e.ObjectOld)
	enqueue(q, e.ObjectNew)
}

func (configurationHandler) Delete(_ context.Context, e event.DeleteEvent, q queue) {
	// A Configuration deleted outright (no finalizer) read what its last
	// state names; PropertyObjects of one being deleted is empty.
	old, ok := e.Object.(*v1alpha1.Configuration)
	if !ok {
		return
	}
	c := old.DeepCopy()
	c.DeletionTimestamp = nil
	enqueue(q, c)
}

func (configurationHandler) Generic(_ context.Context, e event.GenericEvent, q queue) {
	enqueue(q, e.Object)
}

func enqueue(q queue, o client.Object) {
	c, ok := o.(*v1alpha1.Configuration)
	if !ok {
		return
	}
	for _, ns := range Namespaces(c) {
		q.Add(request(ns))
	}
}

// Wanted returns the names, sorted, of the Secrets and of the ConfigMaps
// in namespace that cfgs may read: those of Configurations in namespace,
// and of any when namespace is one of allowed. refused counts the
// references into namespace from Configurations elsewhere that are not.
func Wanted(namespace string, cfgs []v1alpha1.Configuration, allowed []string) (secrets, configMaps []string, refused int) {
	open := slices.Contains(allowed, namespace)
	for i := range cfgs {
		s, c := cfgs[i].PropertyObjects()
		if cfgs[i].Namespace != namespace && !open {
			for _, o := range append(s, c...) {
				if o.Namespace == namespace {
					refused++
				}
			}
			continue
		}
		for _, o := range s {
			if o.Namespace == namespace {
				secrets = append(secrets, o.Name)
			}
		}
		for _, o := range c {
			if o.Namespace == namespace {
				configMaps = append(configMaps, o.Name)
			}
		}
	}
	slices.Sort(secrets)
	slices.Sort(configMaps)
	return slices.Compact(secrets), slices.Compact(configMaps), refused
}

// Rules are the Role's rules for these names: one per kind that has names,
// never one without resourceNames.
func Rules(secrets, configMaps []string) []rbacv1.PolicyRule {
	var rules []rbacv1.PolicyRule
	for _, k := range []struct {
		resource string
		names    []string
	}{{"secrets", secrets}, {"configmaps", configMaps}} {
		if len(k.names) == 0 {
			continue
		}
		rules = append(rules, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{k.resource}, Verbs: Verbs, ResourceNames: k.names})
	}
	return rules
}

// Reconcile makes req's namespace hold the Role and RoleBinding its
// references need, or neither.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	if req.Name != v1alpha1.PropertyAccessRole {
		return reconcile.Result{}, nil // another Role carrying our label
	}
	ns := req.Namespace
	var cfgs v1alpha1.ConfigurationList
	if err := r.client.List(ctx, &cfgs, client.MatchingFields{namespaceIndex: ns}); err != nil {
		return reconcile.Result{}, err
	}
	kept := cfgs.Items[:0]
	for _, c := range cfgs.Items {
		if len(r.served) == 0 || slices.Contains(r.served, c.Namespace) {
			kept = append(kept, c)
			continue
		}
		r.log.Info("not granting the agents read for a Configuration outside the namespaces Configurations are served in (--configuration-namespaces)", "configuration", c.Namespace+"/"+c.Name, "served", r.served)
	}
	secrets, configMaps, refused := Wanted(ns, kept, r.allowed)
	if refused > 0 {
		r.log.Info("not granting the agents read of objects that Configurations of other namespaces name: a Configuration reads only its own namespace and those allowed (--property-namespaces)", "namespace", ns, "references", refused)
	}
	rules := Rules(secrets, configMaps)
	key := client.ObjectKey{Namespace: ns, Name: v1alpha1.PropertyAccessRole}
	var role rbacv1.Role
	roleErr := r.client.Get(ctx, key, &role)
	if roleErr != nil && !apierrors.IsNotFound(roleErr) {
		return reconcile.Result{}, roleErr
	}
	var binding rbacv1.RoleBinding
	bindingErr := r.client.Get(ctx, key, &binding)
	if bindingErr != nil && !apierrors.IsNotFound(bindingErr) {
		return reconcile.Result{}, bindingErr
	}

	if len(rules) == 0 {
		for _, o := range []struct {
			obj     client.Object
			present bool
		}{{&binding, bindingErr == nil}, {&role, roleErr == nil}} {
			if !o.present {
				continue
			}
			if err := r.client.Delete(ctx, o.obj); err != nil && !apierrors.IsNotFound(err) {
				return reconcile.Result{}, err
			}
		}
		if roleErr == nil {
			r.log.Info("removed the agents' read of discovery property objects", "namespace", ns)
		}
		return reconcile.Result{}, nil
	}

	if roleErr != nil || role.Labels[LabelManaged] != "true" || !equality.Semantic.DeepEqual(role.Rules, rules) {
		ac := rbacv1ac.Role(v1alpha1.PropertyAccessRole, ns).WithLabels(map[string]string{LabelManaged: "true"})
		for _, rule := range rules {
			ac.WithRules(rbacv1ac.PolicyRule().WithAPIGroups(rule.APIGroups...).WithResources(rule.Resources...).
				WithVerbs(rule.Verbs...).WithResourceNames(rule.ResourceNames...))
		}
		if err := r.client.Apply(ctx, ac, client.FieldOwner(FieldManager), client.ForceOwnership); err != nil {
			return reconcile.Result{}, fmt.Errorf("applying Role %s/%s: %w", ns, v1alpha1.PropertyAccessRole, err)
		}
		r.log.Info("granted the agents read of discovery property objects", "namespace", ns, "rules", rules)
	}
	wantRef := rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: v1alpha1.PropertyAccessRole}
	if bindingErr != nil || binding.Labels[LabelManaged] != "true" || binding.RoleRef != wantRef || !equality.Semantic.DeepEqual(binding.Subjects, r.subjects) {
		if bindingErr == nil && binding.RoleRef != wantRef {
			// roleRef cannot change: replace the binding.
			if err := r.client.Delete(ctx, &binding); err != nil && !apierrors.IsNotFound(err) {
				return reconcile.Result{}, err
			}
		}
		ac := rbacv1ac.RoleBinding(v1alpha1.PropertyAccessRole, ns).WithLabels(map[string]string{LabelManaged: "true"}).
			WithRoleRef(rbacv1ac.RoleRef().WithAPIGroup(wantRef.APIGroup).WithKind(wantRef.Kind).WithName(wantRef.Name))
		for _, s := range r.subjects {
			ac.WithSubjects(rbacv1ac.Subject().WithKind(s.Kind).WithNamespace(s.Namespace).WithName(s.Name))
		}
		if err := r.client.Apply(ctx, ac, client.FieldOwner(FieldManager), client.ForceOwnership); err != nil {
			return reconcile.Result{}, fmt.Errorf("applying RoleBinding %s/%s: %w", ns, v1alpha1.PropertyAccessRole, err)
		}
	}
	return reconcile.Result{}, nil
}
