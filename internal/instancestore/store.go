// Package instancestore performs every write Dowse makes to an Instance, so
// that each write's field manager, force and preconditions are said once:
//
//   - Apply: a node states its view of a device: the spec, the owner
//     references, its own entry in status.nodes and its NodeLabel, under
//     FieldManager(node), forced. Every node that sees a shared device
//     states the same spec; a conflict only means another node saw
//     different properties, and the latest observation wins.
//   - Release: a node drops its own entry and the Instance is deleted when no
//     node is left. The apply restates the spec so that the node keeps
//     co-owning it (dropping it would remove fields nobody else owns) and
//     states the uid, so that it fails rather than recreate a deleted
//     Instance. Each delete is preconditioned on the uid and the
//     resourceVersion that showed no other node, so a node that joined in
//     between keeps the Instance.
//   - DropNode: the controller removes a dead node on its behalf. The entry's
//     field manager is that node's, so an apply of the controller's cannot
//     remove it: DropNode reads the Instance live and updates it under the
//     resourceVersion it read (retried on conflict), and deletes it with the
//     same preconditions as Release when no node is left.
//   - Label: a node's Apply of an Instance as read, with the uid, so that
//     an Instance written before the NodeLabel existed gets it (and never
//     comes back once deleted).
//   - ApplySlots: a node states the capacity slots it holds, under
//     SlotFieldManager(node), not forced: a slot another node holds makes the
//     API server answer with a conflict, so two nodes never hold one slot.
//     It states the uid, like Release.
//
// Every write is idempotent, and its errors are retryable.
package instancestore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/internal/apply"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	acv1alpha1 "github.com/dowse-dev/dowse/shared/api/v1alpha1/applyconfiguration/api/v1alpha1"
)

// FieldManager is the server-side-apply field manager of one node's agent:
// of its view of Instances, and of its entries in Configurations.
func FieldManager(nodeName string) string {
	const prefix = "dowse-agent/"
	if len(prefix)+len(nodeName) > 128 { // the API server's limit
		sum := sha256.Sum256([]byte(nodeName))
		return prefix + nodeName[:64] + "-" + hex.EncodeToString(sum[:])[:16]
	}
	return prefix + nodeName
}

// SlotFieldManager is the field manager of one node's entries in
// status.slots. It must differ from FieldManager: Apply does not state
// slots, and under the same manager it would delete them.
func SlotFieldManager(nodeName string) string { return FieldManager(nodeName) + "/slots" }

// Apply states node's view of inst (name, namespace, owner references and
// spec as given) with node in status.nodes, and returns the Instance as the
// API server has it after the apply.
func Apply(ctx context.Context, c client.Client, node string, inst *v1alpha1.Instance) (*acv1alpha1.InstanceApplyConfiguration, error) {
	return applyView(ctx, c, node, inst, "", true)
}

// Label is Apply of cur (as read, its uid stated: a deleted Instance is not
// recreated), for an Instance that lists node but lacks its NodeLabel:
// written before the label existed, it is outside the node's label-scoped
// cache until it has it. The apply restates what node's manager stated
// before, so it changes nothing else.
func Label(ctx context.Context, c client.Client, node string, cur *v1alpha1.Instance) error {
	_, err := applyView(ctx, c, node, cur, cur.UID, true)
	return err
}

// applyView is Apply, or with withNode false the view without the node's
// entry, stating uid when it is not empty.
func applyView(ctx context.Context, c client.Client, node string, inst *v1alpha1.Instance, uid types.UID, withNode bool) (*acv1alpha1.InstanceApplyConfiguration, error) {
	ac := acv1alpha1.Instance(inst.Name, inst.Namespace).
		WithOwnerReferences(apply.OwnerReferences(inst.OwnerReferences)...).
		WithSpec(Spec(&inst.Spec))
	if uid != "" {
		ac.WithUID(uid)
	}
	st := acv1alpha1.InstanceStatus()
	if withNode {
		st.WithNodes(acv1alpha1.InstanceNode().WithName(node))
		ac.WithLabels(map[string]string{v1alpha1.NodeLabel(node): ""})
	}
	// Without the node's entry and label, the apply removes them (the field
	// manager no longer states them).
	ac.WithStatus(st)
	if err := c.Apply(ctx, ac, client.FieldOwner(FieldManager(node)), client.ForceOwnership); err != nil {
		return nil, err
	}
	return ac, nil
}

// Release drops node from cur (as last read) and deletes cur when no node
// is left. It reports whether it deleted cur; an Instance that is gone, or
// that another node joined, is no error.
func Release(ctx context.Context, c client.Client, node string, cur *v1alpha1.Instance) (bool, error) {
	if cur.UID != "" && len(cur.Status.Nodes) == 1 && cur.HasNode(node) {
		// The last node: one conditional delete instead of apply and delete.
		// A node that joined since changed the resourceVersion, and then
		// the delete fails and we fall back to dropping only our entry.
		deleted, changed, err := deleteUnchanged(ctx, c, cur.Namespace, cur.Name, cur.UID, cur.ResourceVersion)
		if !changed {
			return deleted, err
		}
	}
	// The uid, when the caller knows it, makes the apply fail rather than
	// create an Instance that is gone. Without it (an Instance so new the
	// cache has not shown it) the apply may recreate it with no node, and
	// the delete below removes it again.
	after, err := applyView(ctx, c, node, cur, cur.UID, false)
	if err != nil {
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			return false, nil
		}
		return false, err
	}
	if after.Status != nil && len(after.Status.Nodes) > 0 {
		return false, nil
	}
	deleted, _, err := deleteUnchanged(ctx, c, cur.Namespace, cur.Name, ptr.Deref(after.UID, ""), ptr.Deref(after.ResourceVersion, ""))
	return deleted, err
}

// deleteUnchanged deletes an Instance that still has uid and
// resourceVersion rv. It reports whether it deleted it, and whether the
// Instance had changed (a conflict, no error); one that is gone is neither.
func deleteUnchanged(ctx context.Context, c client.Client, namespace, name string, uid types.UID, rv string) (deleted, changed bool, err error) {
	inst := &v1alpha1.Instance{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}}
	err = c.Delete(ctx, inst, client.Preconditions{UID: &uid, ResourceVersion: &rv})
	switch {
	case err == nil:
		return true, false, nil
	case apierrors.IsNotFound(err):
		return false, false, nil
	case apierrors.IsConflict(err):
		return false, true, nil
	default:
		return false, false, err
	}
}

// DropNode removes node from the Instance at key, read live through live,
// and deletes the Instance when no node is left. It reports whether node
// was there; an Instance that is gone is no error.
func DropNode(ctx context.Context, c client.Client, live client.Reader, key types.NamespacedName, node string) (bool, error) {
	dropped := false
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var cur v1alpha1.Instance
		if err := live.Get(ctx, key, &cur); err != nil {
			return err
		}
		if !cur.HasNode(node) {
			return nil
		}
		dropped = true
		cur.Status.Nodes = slices.DeleteFunc(cur.Status.Nodes, func(n v1alpha1.InstanceNode) bool { return n.Name == node })
		delete(cur.Labels, v1alpha1.NodeLabel(node))
		if len(cur.Status.Nodes) == 0 {
			uid, rv := cur.UID, cur.ResourceVersion
			return c.Delete(ctx, &cur, client.Preconditions{UID: &uid, ResourceVersion: &rv})
		}
		return c.Update(ctx, &cur)
	})
	if err := client.IgnoreNotFound(err); err != nil {
		return false, fmt.Errorf("removing node %s from instance %s: %w", node, key, err)
	}
	return dropped, nil
}

// ApplySlots states slots, the whole set node holds of inst (as last read).
// A slot another node holds makes it fail with a conflict.
func ApplySlots(ctx context.Context, c client.Client, node string, inst *v1alpha1.Instance, slots []v1alpha1.InstanceSlot) error {
	// An empty set states no slot, which releases the node's last ones.
	st := acv1alpha1.InstanceStatus()
	for _, s := range slots {
		sac := acv1alpha1.InstanceSlot().WithID(s.ID).WithNode(s.Node)
		if s.Resource != "" {
			sac.WithResource(s.Resource)
		}
		if s.AllocationID != "" {
			sac.WithAllocationID(s.AllocationID)
		}
		st.WithSlots(sac)
	}
	ac := acv1alpha1.Instance(inst.Name, inst.Namespace).WithStatus(st)
	if inst.UID != "" {
		ac.WithUID(inst.UID)
	}
	return c.Apply(ctx, ac, client.FieldOwner(SlotFieldManager(node)))
}

// Spec is spec's apply configuration: every field the typed spec would
// state (its omitempty fields only when set).
func Spec(spec *v1alpha1.InstanceSpec) *acv1alpha1.InstanceSpecApplyConfiguration {
	ac := acv1alpha1.InstanceSpec().
		WithConfigurationName(spec.ConfigurationName).
		WithDeviceID(spec.DeviceID).
		WithShared(spec.Shared)
	if spec.Capacity != 0 {
		ac.WithCapacity(spec.Capacity)
	}
	if len(spec.BrokerProperties) > 0 {
		ac.WithBrokerProperties(spec.BrokerProperties)
	}
	for _, m := range spec.Mounts {
		mac := acv1alpha1.Mount().WithContainerPath(m.ContainerPath).WithHostPath(m.HostPath)
		if m.ReadOnly {
			mac.WithReadOnly(true)
		}
		ac.WithMounts(mac)
	}
	for _, d := range spec.DeviceSpecs {
		dac := acv1alpha1.DeviceNode().WithContainerPath(d.ContainerPath).WithHostPath(d.HostPath)
		if d.Permissions != "" {
			dac.WithPermissions(d.Permissions)
		}
		ac.WithDeviceSpecs(dac)
	}
	return ac
}
