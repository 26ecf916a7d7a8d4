package integration

import (
	"context"
	"errors"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/internal/instancestore"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// TestInstanceStoreWrites proves each write's field manager, force and
// preconditions, as instancestore's package comment states them, on the
// real API server.
func TestInstanceStoreWrites(t *testing.T) {
	ns := suite.Namespace(t)
	ctx := context.Background()
	view := func(name string, props map[string]string) *v1alpha1.Instance {
		return &v1alpha1.Instance{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec:       v1alpha1.InstanceSpec{ConfigurationName: "store", DeviceID: name, Shared: true, Capacity: 2, BrokerProperties: props},
		}
	}
	get := func(name string) (*v1alpha1.Instance, error) {
		var inst v1alpha1.Instance
		err := suite.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &inst)
		return &inst, err
	}
	nodes := func(inst *v1alpha1.Instance) []string {
		var out []string
		for _, n := range inst.Status.Nodes {
			out = append(out, n.Name)
		}
		return out
	}

	t.Run("apply is forced and each node owns its entry", func(t *testing.T) {
		if _, err := instancestore.Apply(ctx, suite.Client, "node-a", view("shared", map[string]string{"P": "a"})); err != nil {
			t.Fatal(err)
		}
		// Another node saw other properties: no conflict, the latest wins.
		if _, err := instancestore.Apply(ctx, suite.Client, "node-b", view("shared", map[string]string{"P": "b"})); err != nil {
			t.Fatal(err)
		}
		inst, err := get("shared")
		if err != nil {
			t.Fatal(err)
		}
		if inst.Spec.BrokerProperties["P"] != "b" || !inst.HasNode("node-a") || !inst.HasNode("node-b") {
			t.Fatalf("after two applies: properties %v, nodes %v", inst.Spec.BrokerProperties, nodes(inst))
		}
		// node-a leaves: node-b's entry and the Instance stay.
		deleted, err := instancestore.Release(ctx, suite.Client, "node-a", inst)
		if err != nil || deleted {
			t.Fatalf("release of one of two nodes: deleted %v, %v", deleted, err)
		}
		inst, err = get("shared")
		if err != nil {
			t.Fatal(err)
		}
		if got := nodes(inst); len(got) != 1 || got[0] != "node-b" {
			t.Fatalf("nodes after node-a left: %v", got)
		}
		// node-b, the last node, leaves: the Instance goes.
		if deleted, err := instancestore.Release(ctx, suite.Client, "node-b", inst); err != nil || !deleted {
			t.Fatalf("release of the last node: deleted %v, %v", deleted, err)
		}
		if _, err := get("shared"); !apierrors.IsNotFound(err) {
			t.Fatalf("the Instance outlived its last node: %v", err)
		}
	})

	t.Run("release keeps an Instance another node joined meanwhile", func(t *testing.T) {
		if _, err := instancestore.Apply(ctx, suite.Client, "node-a", view("joined", nil)); err != nil {
			t.Fatal(err)
		}
		stale, err := get("joined") // node-a's last read: it is alone
		if err != nil {
			t.Fatal(err)
		}
		if _, err := instancestore.Apply(ctx, suite.Client, "node-b", view("joined", nil)); err != nil {
			t.Fatal(err)
		}
		if deleted, err := instancestore.Release(ctx, suite.Client, "node-a", stale); err != nil || deleted {
			t.Fatalf("release from a stale read: deleted %v, %v", deleted, err)
		}
		inst, err := get("joined")
		if err != nil {
			t.Fatalf("the Instance node-b joined was deleted: %v", err)
		}
		if got := nodes(inst); len(got) != 1 || got[0] != "node-b" {
			t.Fatalf("nodes: %v", got)
		}
	})

	t.Run("release never recreates a deleted Instance", func(t *testing.T) {
		if _, err := instancestore.Apply(ctx, suite.Client, "node-a", view("gone", nil)); err != nil {
			t.Fatal(err)
		}
		inst, err := get("gone")
		if err != nil {
			t.Fatal(err)
		}
		if err := suite.Client.Delete(ctx, inst.DeepCopy()); err != nil {
			t.Fatal(err)
		}
		inst.Status.Nodes = append(inst.Status.Nodes, v1alpha1.InstanceNode{Name: "node-b"}) // not the last: takes the apply path
		if _, err := instancestore.Release(ctx, suite.Client, "node-a", inst); err != nil {
			t.Fatal(err)
		}
		if _, err := get("gone"); !apierrors.IsNotFound(err) {
			t.Fatalf("release recreated a deleted Instance: %v", err)
		}
	})

	t.Run("drop node on its behalf, whoever wrote the entry", func(t *testing.T) {
		// Written by a plain create, as no agent would: only an update can
		// remove an entry the writer's field manager does not own.
		inst := view("dead", nil)
		inst.Status.Nodes = []v1alpha1.InstanceNode{{Name: "node-a"}, {Name: "node-dead"}}
		if err := suite.Client.Create(ctx, inst); err != nil {
			t.Fatal(err)
		}
		if _, err := instancestore.Apply(ctx, suite.Client, "node-a", view("dead", nil)); err != nil {
			t.Fatal(err)
		}
		key := client.ObjectKeyFromObject(inst)
		if dropped, err := instancestore.DropNode(ctx, suite.Client, suite.Client, key, "node-dead"); err != nil || !dropped {
			t.Fatalf("drop: %v, %v", dropped, err)
		}
		got, err := get("dead")
		if err != nil {
			t.Fatal(err)
		}
		if n := nodes(got); len(n) != 1 || n[0] != "node-a" {
			t.Fatalf("nodes after the drop: %v", n)
		}
		if dropped, err := instancestore.DropNode(ctx, suite.Client, suite.Client, key, "node-dead"); err != nil || dropped {
			t.Fatalf("second drop: %v, %v", dropped, err)
		}
		if dropped, err := instancestore.DropNode(ctx, suite.Client, suite.Client, key, "node-a"); err != nil || !dropped {
			t.Fatalf("drop of the last node: %v, %v", dropped, err)
		}
		if _, err := get("dead"); !apierrors.IsNotFound(err) {
			t.Fatalf("the Instance outlived its last node: %v", err)
		}
		if dropped, err := instancestore.DropNode(ctx, suite.Client, suite.Client, key, "node-a"); err != nil || dropped {
			t.Fatalf("drop from a gone Instance: %v, %v", dropped, err)
		}
	})

	t.Run("slots are not forced and survive the view's applies", func(t *testing.T) {
		if _, err := instancestore.Apply(ctx, suite.Client, "node-a", view("slots", nil)); err != nil {
			t.Fatal(err)
		}
		inst, err := get("slots")
		if err != nil {
			t.Fatal(err)
		}
		id := inst.SlotIDs()[0]
		if err := instancestore.ApplySlots(ctx, suite.Client, "node-a", inst, []v1alpha1.InstanceSlot{{ID: id, Node: "node-a", Resource: inst.ResourceName()}}); err != nil {
			t.Fatal(err)
		}
		err = instancestore.ApplySlots(ctx, suite.Client, "node-b", inst, []v1alpha1.InstanceSlot{{ID: id, Node: "node-b"}})
		if !apierrors.IsConflict(err) {
			t.Fatalf("a second node stating a held slot: %v, want a conflict", err)
		}
		after, err := instancestore.Apply(ctx, suite.Client, "node-a", view("slots", map[string]string{"P": "x"}))
		if err != nil {
			t.Fatal(err)
		}
		if after.Status == nil || len(after.Status.Slots) != 1 || *after.Status.Slots[0].Node != "node-a" {
			t.Fatalf("the view's apply changed the slots: %+v", after.Status)
		}
		// The empty set releases them.
		if err := instancestore.ApplySlots(ctx, suite.Client, "node-a", inst, nil); err != nil {
			t.Fatal(err)
		}
		if inst, err = get("slots"); err != nil || len(inst.Status.Slots) != 0 {
			t.Fatalf("slots after release: %+v, %v", inst.Status.Slots, err)
		}
		// A deleted Instance is not recreated by a slot claim (the uid).
		if err := suite.Client.Delete(ctx, inst.DeepCopy()); err != nil {
			t.Fatal(err)
		}
		err = instancestore.ApplySlots(ctx, suite.Client, "node-a", inst, []v1alpha1.InstanceSlot{{ID: id, Node: "node-a"}})
		if err == nil || errors.Is(err, context.Canceled) {
			t.Fatalf("claim on a deleted Instance: %v", err)
		}
		if _, err := get("slots"); !apierrors.IsNotFound(err) {
			t.Fatalf("a claim recreated a deleted Instance: %v", err)
		}
	})
}
