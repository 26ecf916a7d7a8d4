package nodes

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/dowse-dev/dowse/internal/scheme"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

const grace = time.Minute

func node(name string, ready bool, since time.Time) *corev1.Node {
	st := corev1.ConditionTrue
	if !ready {
		st = corev1.ConditionFalse
	}
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: st, LastTransitionTime: metav1.NewTime(since)}}}}
}

func instance(name string, nodes ...string) *v1alpha1.Instance {
	inst := &v1alpha1.Instance{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns"}, Spec: v1alpha1.InstanceSpec{ConfigurationName: "c", DeviceID: name}}
	for _, n := range nodes {
		inst.Status.Nodes = append(inst.Status.Nodes, v1alpha1.InstanceNode{Name: n})
		if inst.Labels == nil {
			inst.Labels = map[string]string{}
		}
		inst.Labels[v1alpha1.NodeLabel(n)] = ""
	}
	return inst
}

func setup(t *testing.T, now time.Time, objs ...client.Object) (*Reconciler, client.Client) {
	t.Helper()
	s, err := scheme.New()
	if err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).Build()
	r := NewReconciler(c, c, grace, logr.Discard())
	r.now = func() time.Time { return now }
	return r, c
}

func nodesOf(t *testing.T, c client.Client, name string) []string {
	t.Helper()
	var inst v1alpha1.Instance
	err := c.Get(context.Background(), types.NamespacedName{Namespace: "ns", Name: name}, &inst)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, n := range inst.Status.Nodes {
		out = append(out, n.Name)
	}
	return out
}

// A Ready node, and one NotReady within the grace period, keep their
// Instances; one NotReady past it is removed from each, and an Instance it
// was the last node of is deleted.
func TestDeadNodesLeaveTheirInstances(t *testing.T) {
	now := time.Now()
	cfg := &v1alpha1.Configuration{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "ns",
		Finalizers: []string{v1alpha1.AgentFinalizer("dead"), v1alpha1.AgentFinalizer("ok")}}}
	r, c := setup(t, now,
		node("ok", true, now.Add(-time.Hour)), node("sick", false, now.Add(-grace/2)), node("dead", false, now.Add(-2*grace)),
		instance("shared", "ok", "sick", "dead"), instance("alone", "dead"), cfg)
	ctx := context.Background()
	for _, n := range []string{"ok", "sick", "dead"} {
		res, err := r.Reconcile(ctx, reconcile.Request{NamespacedName: types.NamespacedName{Name: n}})
		if err != nil {
			t.Fatalf("%s: %v", n, err)
		}
		if n == "sick" && (res.RequeueAfter <= 0 || res.RequeueAfter > grace/2) {
			t.Errorf("sick node looked at again after %v, want within its remaining grace", res.RequeueAfter)
		}
	}
	if got := nodesOf(t, c, "shared"); !slices.Equal(got, []string{"ok", "sick"}) {
		t.Errorf("shared Instance lists %v, want [ok sick]", got)
	}
	var shared v1alpha1.Instance
	if err := c.Get(ctx, types.NamespacedName{Namespace: "ns", Name: "shared"}, &shared); err != nil {
		t.Fatal(err)
	}
	if _, ok := shared.Labels[v1alpha1.NodeLabel("dead")]; ok || len(shared.Labels) != 2 {
		t.Errorf("shared Instance labels %v: the dead node's must go, the others' stay", shared.Labels)
	}
	if got := nodesOf(t, c, "alone"); got != nil {
		t.Errorf("the dead node's own Instance still lists %v", got)
	}
	// A NotReady node keeps its Configuration finalizer: it may come back.
	var got v1alpha1.Configuration
	if err := c.Get(ctx, client.ObjectKeyFromObject(cfg), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Finalizers) != 2 {
		t.Errorf("finalizers %v: a NotReady node's must stay", got.Finalizers)
	}
}

// A deleted node (seen before) is removed at once, with its finalizer.
func TestDeletedNodeIsRemovedAtOnceWithItsFinalizer(t *testing.T) {
	now := time.Now()
	gone := node("gone", true, now)
	cfg := &v1alpha1.Configuration{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "ns",
		Finalizers: []string{v1alpha1.AgentFinalizer("gone"), v1alpha1.AgentFinalizer("ok")}}}
	r, c := setup(t, now, gone, instance("shared", "ok", "gone"), cfg)
	ctx := context.Background()
	req := reconcile.Request{NamespacedName: types.NamespacedName{Name: "gone"}}
	if _, err := r.Reconcile(ctx, req); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, gone); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Reconcile(ctx, req); err != nil {
		t.Fatal(err)
	}
	if got := nodesOf(t, c, "shared"); !slices.Equal(got, []string{"ok"}) {
		t.Errorf("shared Instance lists %v, want [ok]", got)
	}
	var got v1alpha1.Configuration
	if err := c.Get(ctx, client.ObjectKeyFromObject(cfg), &got); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Finalizers, []string{v1alpha1.AgentFinalizer("ok")}) {
		t.Errorf("finalizers %v, want only ok's", got.Finalizers)
	}
}

// A name no Node ever had is removed only after the grace period.
func TestUnknownNodeWaitsForTheGracePeriod(t *testing.T) {
	now := time.Now()
	r, c := setup(t, now, instance("typo", "no-such-node"))
	ctx := context.Background()
	req := reconcile.Request{NamespacedName: types.NamespacedName{Name: "no-such-node"}}
	res, err := r.Reconcile(ctx, req)
	if err != nil || res.RequeueAfter != grace {
		t.Fatalf("first look: %v, %v; want a look again after %v", res, err, grace)
	}
	if got := nodesOf(t, c, "typo"); len(got) != 1 {
		t.Fatalf("removed before the grace period: %v", got)
	}
	r.now = func() time.Time { return now.Add(grace + time.Second) }
	if _, err := r.Reconcile(ctx, req); err != nil {
		t.Fatal(err)
	}
	if got := nodesOf(t, c, "typo"); got != nil {
		t.Fatalf("still listed after the grace period: %v", got)
	}
}
