// Package slots holds a node's claims on the capacity slots of Instances
// (status.slots): Claimer claims and releases them, Reclaimer frees those no
// pod of the kubelet uses any more.
package slots

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/internal/instancestore"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// ErrSlotTaken is wrapped by Claim's error when another node holds a slot.
var ErrSlotTaken = errors.New("slot held elsewhere")

// Claimer claims capacity slots of Instances for one node in the Instances'
// status.slots. Each claim states the node's whole set of slots of the
// Instance (instancestore.ApplySlots): a slot another node holds makes the
// API server answer with a conflict, so two nodes never hold one slot.
// Allocate adds slots with Claim; the Reclaimer frees them with Release.
//
// Claim is idempotent; after a restart the node's set is taken from the
// Instance as the cache shows it, so no slot is lost or doubled.
type Claimer struct {
	c    client.Client
	node string
	seq  atomic.Uint64

	mu   sync.Mutex
	held map[types.NamespacedName]map[string]v1alpha1.InstanceSlot
}

// NewClaimer makes a Claimer for nodeName writing with c.
func NewClaimer(c client.Client, nodeName string) *Claimer {
	return &Claimer{c: c, node: nodeName, held: map[types.NamespacedName]map[string]v1alpha1.InstanceSlot{}}
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
	if err := instancestore.ApplySlots(ctx, c.c, c.node, inst, slots); err != nil {
		if apierrors.IsConflict(err) {
			return fmt.Errorf("claiming slots %v of Instance %s: %w: %w", ids, key, ErrSlotTaken, err)
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

// HeldSlots lists the slots of inst this node holds, by id.
func (c *Claimer) HeldSlots(inst *v1alpha1.Instance) []v1alpha1.InstanceSlot {
	c.mu.Lock()
	defer c.mu.Unlock()
	held := c.seed(client.ObjectKeyFromObject(inst), inst)
	out := make([]v1alpha1.InstanceSlot, 0, len(held))
	for _, id := range slices.Sorted(maps.Keys(held)) {
		out = append(out, held[id])
	}
	return out
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
	if err := instancestore.ApplySlots(ctx, c.c, c.node, inst, slots); err != nil {
		return fmt.Errorf("releasing slots %v of Instance %s: %w", ids, key, err)
	}
	c.held[key] = want
	return nil
}
