package dra

import (
	"context"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/internal/agent/cdi"
	shareddra "github.com/dowse-dev/dowse/internal/dra"
	"github.com/dowse-dev/dowse/internal/slicewriter"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// node reads this node's Node, the owner of its ResourceSlices, retrying
// until it can or ctx ends.
func (d *Driver) node(ctx context.Context) (*corev1.Node, error) {
	for wait := time.Second; ; wait = min(2*wait, 30*time.Second) {
		node, err := d.kube.CoreV1().Nodes().Get(ctx, d.opts.NodeName, metav1.GetOptions{})
		if err == nil {
			return node, nil
		}
		d.log.Error(err, "reading this node, the owner of its ResourceSlices; retrying", "in", wait)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(wait):
		}
	}
}

// here lists the Instances on this node of DRA Configurations, and which
// of those Configurations also use device plugins. The Instances are the
// cache's own objects (no copy of thousands per sync): read, never changed.
func (d *Driver) here(ctx context.Context) ([]*v1alpha1.Instance, map[types.NamespacedName]bool, error) {
	var cfgs v1alpha1.ConfigurationList
	if err := d.reader.List(ctx, &cfgs, client.UnsafeDisableDeepCopy); err != nil {
		return nil, nil, err
	}
	dra := map[types.NamespacedName]bool{} // value: also device plugins
	for i := range cfgs.Items {
		c := &cfgs.Items[i]
		if c.DeletionTimestamp == nil && c.Spec.UsesDRA() {
			dra[types.NamespacedName{Namespace: c.Namespace, Name: c.Name}] = c.Spec.UsesDevicePlugins()
		}
	}
	if len(dra) == 0 {
		return nil, dra, nil
	}
	var out []*v1alpha1.Instance
	d.instMu.Lock()
	defer d.instMu.Unlock()
	for _, inst := range d.insts {
		if _, ok := dra[types.NamespacedName{Namespace: inst.Namespace, Name: inst.Spec.ConfigurationName}]; ok &&
			inst.DeletionTimestamp == nil && inst.HasNode(d.opts.NodeName) {
			out = append(out, inst)
		}
	}
	return out, dra, nil
}

// sync returns the local pools to publish, keeps the CDI specs of the
// Instances that prepared claims use in step with them, and removes those
// no claim uses. A CDI spec is written when a claim is prepared, not when
// a device is discovered: thousands of devices cost no file each. An
// Instance whose spec would be refused (a device node missing on this
// node) is not published. The pools hold digests, and build a slice's
// devices only when the writer needs them.
func (d *Driver) sync(ctx context.Context) (map[string]slicewriter.Pool, error) {
	insts, cfgs, err := d.here(ctx)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.withPlugins = map[types.NamespacedName]bool{}
	for k, dp := range cfgs {
		if dp {
			d.withPlugins[k] = true
		}
	}
	seen := make(map[types.NamespacedName]struct{}, len(insts))
	members := map[string][]*v1alpha1.Instance{}
	for _, inst := range insts {
		key := client.ObjectKeyFromObject(inst)
		seen[key] = struct{}{}
		st, ok := d.devices[key]
		if !ok || st.resourceVersion != inst.ResourceVersion {
			st = deviceState{resourceVersion: inst.ResourceVersion}
			if _, err := cdi.Spec(inst); err != nil {
				d.log.Error(err, "invalid device; not offering it", "instance", key)
				d.opts.Metrics.invalidDevice()
				st.invalid = true
			} else if !inst.Spec.Shared {
				st.digest = slicewriter.Digest(shareddra.Device(inst))
			}
			d.devices[key] = st
		}
		if st.invalid {
			continue
		}
		if sp, ok := d.specs[key]; ok && sp.resourceVersion != inst.ResourceVersion {
			// In use, and changed: containers started from now on get
			// the new properties.
			if err := d.writeSpec(inst); err != nil {
				d.log.Error(err, "updating CDI spec", "instance", key)
			}
		}
		if inst.Spec.Shared {
			continue // the controller publishes it
		}
		pool := shareddra.Pool(inst, d.opts.NodeName)
		if err := shareddra.ValidPool(pool); err != nil {
			d.log.Error(err, "device not published", "instance", key)
			continue
		}
		members[pool] = append(members[pool], inst)
	}
	for key := range d.devices {
		if _, ok := seen[key]; !ok {
			delete(d.devices, key)
		}
	}
	for key := range d.specs {
		if !d.inUse(key) {
			d.removeSpec(key)
		}
	}
	out := make(map[string]slicewriter.Pool, len(members))
	n := 0
	for pool, insts := range members {
		have, ok := d.slices[pool]
		if !ok && d.sliceCount != nil {
			have = d.sliceCount(pool)
		}
		out[pool] = d.pool(insts, have)
		d.slices[pool] = len(out[pool].Slices)
		n += len(insts)
	}
	for pool := range d.slices {
		if _, ok := members[pool]; !ok {
			delete(d.slices, pool)
		}
	}
	d.opts.Metrics.devices(n)
	select {
	case d.healthChanged <- struct{}{}:
	default:
	}
	return out, nil
}

// pool spreads one pool's Instances over its slices (shareddra.Buckets),
// of which it has have now. Called with d.mu held.
func (d *Driver) pool(insts []*v1alpha1.Instance, have int) slicewriter.Pool {
	slices.SortFunc(insts, func(a, b *v1alpha1.Instance) int { return strings.Compare(a.Name, b.Name) })
	names := make([]string, len(insts))
	for i, inst := range insts {
		names[i] = v1alpha1.InstanceHash(inst.Name)
	}
	count, of := shareddra.Buckets(names, have)
	bucket := make([][]*v1alpha1.Instance, count)
	parts := make([][]string, count)
	for i, inst := range insts {
		b := of[i]
		bucket[b] = append(bucket[b], inst)
		parts[b] = append(parts[b], names[i], d.devices[client.ObjectKeyFromObject(inst)].digest)
	}
	p := slicewriter.Pool{Slices: make([]slicewriter.Slice, count)}
	for b := range bucket {
		members := bucket[b]
		p.Slices[b] = slicewriter.Slice{Digest: slicewriter.Digest(parts[b]), Devices: func() []resourceapi.Device {
			devs := make([]resourceapi.Device, len(members))
			for i, inst := range members {
				devs[i] = shareddra.Device(inst)
			}
			return devs
		}}
	}
	return p
}
