package deviceplugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/agent/instances"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// SlotFieldManager is the field manager under which a node's agent applies
// its entries in status.slots. It must differ from instances.FieldManager:
// the Instance writer's applies do not state slots, and under the same
// manager they would delete them.
func SlotFieldManager(nodeName string) string { return instances.FieldManager(nodeName) + "/slots" }

// ErrSlotTaken is wrapped by Claim's error when another node holds a slot.
var ErrSlotTaken = errors.New("slot held elsewhere")

// Claimer claims capacity slots of Instances for one node in the Instances'
// status.slots. Each claim applies the node's whole set of slots of the
// Instance, without force: a slot another node holds makes the API server
// answer with a conflict, so two nodes never hold one slot. Allocate adds
// slots with Claim; the Reclaimer frees them with Release.
//
// Claim is idempotent; after a restart the node's set is taken from the
// Instance as the cache shows it, so no slot is lost or doubled.
type Claimer struct {
	c            client.Client
	node         string
	fieldManager string
	seq          atomic.Uint64

	mu   sync.Mutex
	held map[types.NamespacedName]map[string]v1alpha1.InstanceSlot
}

// NewClaimer makes a Claimer for nodeName writing with c.
func NewClaimer(c client.Client, nodeName string) *Claimer {
	return &Claimer{c: c, node: nodeName, fieldManager: SlotFieldManager(nodeName), held: map[types.NamespacedName]map[string]v1alpha1.InstanceSlot{}}
}

// Claim makes this node the holder of ids, slots of inst (as last seen),
// allocated through resource. It fails, wrapping ErrSlotTaken, when another
// node holds one of them, or this node holds it through another resource.
func (c *Claimer) Claim(ctx context.Context, inst *v1alpha1.Instance, ids []string, resource string) error {
	key := client.ObjectKeyFromObject(inst)
	for _, s := range inst.Status.Slots {
		if s.Node != c.node && slices.Contains(ids, s.ID) {
			return fmt.Errorf("slot %s of Instance %s: %w (%s)", s.ID, key, ErrSlotTaken, s.Node)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	_, known := c.held[key]
	held := c.seed(key, inst)
	want := maps.Clone(held)
	alloc := strconv.FormatInt(time.Now().UnixNano(), 36) + "-" + strconv.FormatUint(c.seq.Add(1), 36)
	changed := false
	for _, id := range ids {
		cur, ok := want[id]
		if ok && cur.Resource != "" && cur.Resource != resource {
			return fmt.Errorf("slot %s of Instance %s: %w through %s", id, key, ErrSlotTaken, cur.Resource)
		}
		if !ok {
			want[id] = v1alpha1.InstanceSlot{ID: id, Node: c.node, Resource: resource, AllocationID: alloc}
			changed = true
		}
	}
	if !changed && known {
		return nil
	}
	slots := make([]v1alpha1.InstanceSlot, 0, len(want))
	for _, k := range slices.Sorted(maps.Keys(want)) {
		slots = append(slots, want[k])
	}
	if err := c.apply(ctx, inst, slots); err != nil {
		if apierrors.IsConflict(err) {
			return fmt.Errorf("claiming slots %v of Instance %s: %w: %v", ids, key, ErrSlotTaken, err)
		}
		return fmt.Errorf("claiming slots %v of Instance %s: %w", ids, key, err)
	}
	c.held[key] = want
	return nil
}

// Forget drops what the Claimer remembers of an Instance (it is gone from
// this node).
func (c *Claimer) Forget(key types.NamespacedName) {
	c.mu.Lock()
	delete(c.held, key)
	c.mu.Unlock()
}

type slotApply struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string    `json:"name"`
		Namespace string    `json:"namespace"`
		UID       types.UID `json:"uid,omitempty"`
	} `json:"metadata"`
	Status struct {
		Slots []v1alpha1.InstanceSlot `json:"slots"`
	} `json:"status"`
}

func (c *Claimer) apply(ctx context.Context, inst *v1alpha1.Instance, slots []v1alpha1.InstanceSlot) error {
	var body slotApply
	body.APIVersion, body.Kind = v1alpha1.GroupVersion.String(), "Instance"
	// The uid makes the apply fail rather than recreate a deleted Instance.
	body.Metadata.Name, body.Metadata.Namespace, body.Metadata.UID = inst.Name, inst.Namespace, inst.UID
	body.Status.Slots = slots
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	into := &v1alpha1.Instance{ObjectMeta: metav1.ObjectMeta{Name: inst.Name, Namespace: inst.Namespace}}
	// No force: a conflict is exactly the "another node holds it" answer.
	return c.c.Patch(ctx, into, client.RawPatch(types.ApplyPatchType, b), client.FieldOwner(c.fieldManager))
}

func objectMeta(namespace, name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Namespace: namespace, Name: name}
}

// seed returns the node's set for key, taken from inst when not yet known.
// Callers hold c.mu.
func (c *Claimer) seed(key types.NamespacedName, inst *v1alpha1.Instance) map[string]v1alpha1.InstanceSlot {
	if held, ok := c.held[key]; ok {
		return held
	}
	held := map[string]v1alpha1.InstanceSlot{}
	for _, s := range inst.Status.Slots {
		if s.Node == c.node {
			held[s.ID] = s
		}
	}
	return held
}

// Held lists the slots of inst this node holds.
func (c *Claimer) Held(inst *v1alpha1.Instance) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Sorted(maps.Keys(c.seed(client.ObjectKeyFromObject(inst), inst)))
}

// Release frees ids, slots of inst this node holds. Idempotent.
func (c *Claimer) Release(ctx context.Context, inst *v1alpha1.Instance, ids []string) error {
	key := client.ObjectKeyFromObject(inst)
	c.mu.Lock()
	defer c.mu.Unlock()
	held := c.seed(key, inst)
	want := maps.Clone(held)
	for _, id := range ids {
		delete(want, id)
	}
	if len(want) == len(held) {
		c.held[key] = held
		return nil
	}
	slots := make([]v1alpha1.InstanceSlot, 0, len(want))
	for _, k := range slices.Sorted(maps.Keys(want)) {
		slots = append(slots, want[k])
	}
	if err := c.apply(ctx, inst, slots); err != nil {
		return fmt.Errorf("releasing slots %v of Instance %s: %w", ids, key, err)
	}
	c.held[key] = want
	return nil
}
