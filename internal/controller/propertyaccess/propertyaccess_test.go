package propertyaccess

import (
	"context"
	"reflect"
	"testing"

	"github.com/go-logr/logr/testr"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/dowse-dev/dowse/internal/scheme"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

func configuration(ns, name string, refs ...v1alpha1.DiscoveryPropertySource) *v1alpha1.Configuration {
	c := &v1alpha1.Configuration{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	for i := range refs {
		c.Spec.DiscoveryHandler.DiscoveryProperties = append(c.Spec.DiscoveryHandler.DiscoveryProperties,
			v1alpha1.DiscoveryProperty{Name: string(rune('a' + i)), ValueFrom: &refs[i]})
	}
	return c
}

func secret(ns, name string) v1alpha1.DiscoveryPropertySource {
	return v1alpha1.DiscoveryPropertySource{SecretKeyRef: &v1alpha1.ObjectKeyRef{Namespace: ns, Name: name, Key: "k"}}
}

func configMap(ns, name string) v1alpha1.DiscoveryPropertySource {
	return v1alpha1.DiscoveryPropertySource{ConfigMapKeyRef: &v1alpha1.ObjectKeyRef{Namespace: ns, Name: name, Key: "k"}}
}

func TestRulesNeverGrantEverything(t *testing.T) {
	if r := Rules(nil, nil); len(r) != 0 {
		t.Fatalf("rules without names: %v", r)
	}
	got := Rules([]string{"a"}, nil)
	if len(got) != 1 || got[0].Resources[0] != "secrets" || !reflect.DeepEqual(got[0].ResourceNames, []string{"a"}) {
		t.Fatalf("rules %v", got)
	}
	got = Rules([]string{"a", "b"}, []string{"c"})
	want := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get", "list", "watch"}, ResourceNames: []string{"a", "b"}},
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch"}, ResourceNames: []string{"c"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("rules %v, want %v", got, want)
	}
}

func TestWanted(t *testing.T) {
	cfgs := []v1alpha1.Configuration{
		*configuration("plant", "a", secret("", "s2"), secret("", "s1"), configMap("", "c1"), secret("other", "x")),
		*configuration("other", "b", secret("plant", "s1"), configMap("", "c9")),
	}
	// Each namespace grants only what its own Configurations name: plant's
	// reference to other/x and other's to plant/s1 are refused.
	s, c, refused := Wanted("plant", cfgs, nil)
	if !reflect.DeepEqual(s, []string{"s1", "s2"}) || !reflect.DeepEqual(c, []string{"c1"}) || refused != 1 {
		t.Errorf("plant: secrets %v, configmaps %v, refused %d", s, c, refused)
	}
	s, c, refused = Wanted("other", cfgs, nil)
	if s != nil || !reflect.DeepEqual(c, []string{"c9"}) || refused != 1 {
		t.Errorf("other: secrets %v, configmaps %v, refused %d", s, c, refused)
	}
	// A namespace an administrator allows serves every Configuration.
	s, c, refused = Wanted("other", cfgs, []string{"other"})
	if !reflect.DeepEqual(s, []string{"x"}) || !reflect.DeepEqual(c, []string{"c9"}) || refused != 0 {
		t.Errorf("other, allowed: secrets %v, configmaps %v, refused %d", s, c, refused)
	}
	if s, c, _ := Wanted("nowhere", cfgs, nil); s != nil || c != nil {
		t.Errorf("nowhere: %v %v", s, c)
	}
}

func TestParseServiceAccounts(t *testing.T) {
	got, err := ParseServiceAccounts([]string{" dowse-agent", "edge/agent", "", "edge/agent"}, "dowse-system")
	want := []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: "dowse-system", Name: "dowse-agent"}, {Kind: "ServiceAccount", Namespace: "edge", Name: "agent"}}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("%v %v, want %v", got, err, want)
	}
	if _, err := ParseServiceAccounts([]string{"a/b/c"}, "x"); err == nil {
		t.Fatal("a/b/c accepted")
	}
	if _, err := NewReconciler(nil, nil, nil, nil, testr.New(t)); err == nil {
		t.Fatal("a reconciler granting nobody")
	}
}

func TestConfigurationEvents(t *testing.T) {
	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
	defer q.ShutDown()
	drain := func() map[string]bool {
		got := map[string]bool{}
		for q.Len() > 0 {
			r, _ := q.Get()
			got[r.Namespace] = r.Name == v1alpha1.PropertyAccessRole
			q.Done(r)
			q.Forget(r)
		}
		return got
	}
	h := configurationHandler{}
	old := configuration("plant", "a", secret("", "s"), configMap("other", "c"))
	h.Create(context.Background(), event.CreateEvent{Object: old}, q)
	if got := drain(); !reflect.DeepEqual(got, map[string]bool{"plant": true, "other": true}) {
		t.Errorf("create enqueued %v", got)
	}
	// A status write changes no reference: nothing to do.
	same := old.DeepCopy()
	same.Status.Nodes = []v1alpha1.ConfigurationNodeStatus{{NodeName: "n"}}
	h.Update(context.Background(), event.UpdateEvent{ObjectOld: old, ObjectNew: same}, q)
	if got := drain(); len(got) != 0 {
		t.Errorf("status update enqueued %v", got)
	}
	// A reference moved: both namespaces, before and after.
	moved := configuration("plant", "a", secret("", "s"), configMap("third", "c"))
	h.Update(context.Background(), event.UpdateEvent{ObjectOld: old, ObjectNew: moved}, q)
	if got := drain(); !reflect.DeepEqual(got, map[string]bool{"plant": true, "other": true, "third": true}) {
		t.Errorf("update enqueued %v", got)
	}
	deleting := moved.DeepCopy()
	deleting.DeletionTimestamp = &metav1.Time{}
	h.Delete(context.Background(), event.DeleteEvent{Object: deleting}, q)
	if got := drain(); !reflect.DeepEqual(got, map[string]bool{"plant": true, "third": true}) {
		t.Errorf("delete enqueued %v", got)
	}
}

// Reconcile against controller-runtime's fake client: the Role follows the
// references and goes with the last one.
func TestReconcile(t *testing.T) {
	sch, err := scheme.New()
	if err != nil {
		t.Fatal(err)
	}
	cfg := configuration("plant", "a", secret("", "s1"), configMap("", "c1"))
	c := fake.NewClientBuilder().WithScheme(sch).WithObjects(cfg).
		WithIndex(&v1alpha1.Configuration{}, namespaceIndex, func(o client.Object) []string { return Namespaces(o.(*v1alpha1.Configuration)) }).
		Build()
	agents := []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: "dowse-system", Name: "dowse-agent"}}
	r, err := NewReconciler(c, agents, nil, nil, testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	key := client.ObjectKey{Namespace: "plant", Name: v1alpha1.PropertyAccessRole}
	if _, err := r.Reconcile(ctx, request("plant")); err != nil {
		t.Fatal(err)
	}
	var role rbacv1.Role
	if err := c.Get(ctx, key, &role); err != nil {
		t.Fatal(err)
	}
	if want := Rules([]string{"s1"}, []string{"c1"}); !reflect.DeepEqual(role.Rules, want) || role.Labels[LabelManaged] != "true" {
		t.Fatalf("role %+v, want rules %v", role, want)
	}
	var rb rbacv1.RoleBinding
	if err := c.Get(ctx, key, &rb); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(rb.Subjects, agents) || rb.RoleRef.Name != v1alpha1.PropertyAccessRole || rb.RoleRef.Kind != "Role" {
		t.Fatalf("binding %+v", rb)
	}

	// Nothing left to read: both go.
	cfg.Spec.DiscoveryHandler.DiscoveryProperties = nil
	if err := c.Update(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Reconcile(ctx, request("plant")); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, key, &role); !apierrors.IsNotFound(err) {
		t.Fatalf("role still there: %v", err)
	}
	if err := c.Get(ctx, key, &rb); !apierrors.IsNotFound(err) {
		t.Fatalf("binding still there: %v", err)
	}
}
