package dra

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	shareddra "github.com/dowse-dev/dowse/internal/dra"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// PrepareResourceClaims answers each claim with the CDI devices of the
// Instances allocated to it by driver dowse.dev. Idempotent: a claim
// prepared before (by this process or, through the checkpoint, an earlier
// one) gets the same answer without looking at the Instances again, so a
// kubelet or agent restart never prepares a claim twice. A device that is
// not on this node (it left after the allocation) fails its claim with a
// retryable error.
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	changed := false
	for _, claim := range claims {
		if c, ok := d.checkpoint.Claims[claim.UID]; ok {
			out[claim.UID] = kubeletplugin.PrepareResult{Devices: c.result()}
			d.opts.Metrics.prepare("again")
			continue
		}
		c, err := d.prepare(ctx, claim)
		if err != nil {
			out[claim.UID] = kubeletplugin.PrepareResult{Err: err}
			d.opts.Metrics.prepare("error")
			d.log.Error(err, "claim not prepared", "claim", types.NamespacedName{Namespace: claim.Namespace, Name: claim.Name})
			continue
		}
		d.checkpoint.Claims[claim.UID] = c
		changed = true
		out[claim.UID] = kubeletplugin.PrepareResult{Devices: c.result()}
		d.opts.Metrics.prepare("prepared")
		d.log.Info("claim prepared", "claim", types.NamespacedName{Namespace: claim.Namespace, Name: claim.Name}, "devices", len(c.Devices))
	}
	if changed {
		if err := d.checkpoint.save(); err != nil {
			return nil, err
		}
		d.opts.Metrics.prepared(len(d.checkpoint.Claims))
	}
	return out, nil
}

func (d *Driver) prepare(ctx context.Context, claim *resourceapi.ResourceClaim) (*preparedClaim, error) {
	if claim.Status.Allocation == nil {
		return nil, errors.New("claim is not allocated")
	}
	c := &preparedClaim{Namespace: claim.Namespace, Name: claim.Name}
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != shareddra.DriverName {
			continue
		}
		ns, name, ok := shareddra.ParseDevice(r.Pool, r.Device)
		if !ok {
			return nil, fmt.Errorf("device %s/%s is not one of Dowse's", r.Pool, r.Device)
		}
		key := types.NamespacedName{Namespace: ns, Name: name}
		var inst v1alpha1.Instance
		if err := d.reader.Get(ctx, key, &inst); err != nil {
			if apierrors.IsNotFound(err) {
				return nil, fmt.Errorf("device %s/%s: Instance %s is gone", r.Pool, r.Device, key)
			}
			return nil, err
		}
		if !inst.HasNode(d.opts.NodeName) {
			return nil, fmt.Errorf("device %s/%s: Instance %s is not on node %s", r.Pool, r.Device, key, d.opts.NodeName)
		}
		if st, ok := d.specs[key]; !ok || st.resourceVersion != inst.ResourceVersion {
			if err := d.writeSpec(&inst); err != nil {
				return nil, err
			}
		}
		dev := preparedDevice{Requests: []string{r.Request}, Pool: r.Pool, Device: r.Device, CDIDeviceIDs: []string{inst.CDIName()}, Configuration: inst.Spec.ConfigurationName}
		if r.ShareID != nil {
			dev.ShareID = string(*r.ShareID)
		}
		c.Devices = append(c.Devices, dev)
	}
	return c, nil
}

// UnprepareResourceClaims forgets the claims; CDI specs of Instances that
// left this node while a claim used them go at the next sync. Idempotent:
// an unknown claim is no error.
func (d *Driver) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[types.UID]error, len(claims))
	changed := false
	for _, c := range claims {
		out[c.UID] = nil
		if _, ok := d.checkpoint.Claims[c.UID]; ok {
			delete(d.checkpoint.Claims, c.UID)
			changed = true
			d.opts.Metrics.unprepare()
			d.log.Info("claim unprepared", "claim", c.NamespacedName)
		}
	}
	if changed {
		if err := d.checkpoint.save(); err != nil {
			return nil, err
		}
		d.opts.Metrics.prepared(len(d.checkpoint.Claims))
		for key := range d.specs {
			if !d.inUse(key) {
				d.removeSpec(key)
			}
		}
		d.keepLegacy(nil)
	}
	return out, nil
}

// Prepared lists the prepared claims' UIDs (tests).
func (d *Driver) Prepared() []types.UID {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.checkpoint == nil {
		return nil
	}
	return slices.Sorted(maps.Keys(d.checkpoint.Claims))
}
