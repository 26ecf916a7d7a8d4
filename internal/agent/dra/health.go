package dra

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	shareddra "github.com/dowse-dev/dowse/internal/dra"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// healthEvery is how often WatchHealthStatus repeats its report (the
// kubelet takes a device's health as unknown after 30 s without one).
const healthEvery = 10 * time.Second

// WatchHealthStatus reports the health of the devices of prepared claims:
// Healthy while their Instance lists this node, Unhealthy once it does not
// (the handler reports the device OFFLINE or gone), so that the kubelet can
// show it in the status of the pods that use it. A report goes at once,
// after every sync, and every healthEvery.
func (d *Driver) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	tick := time.NewTicker(healthEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case reports <- d.health(ctx):
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		case <-d.healthChanged:
		}
	}
}

// health is the report of WatchHealthStatus.
func (d *Driver) health(ctx context.Context) kubeletplugin.DeviceHealthReport {
	d.mu.Lock()
	defer d.mu.Unlock()
	var r kubeletplugin.DeviceHealthReport
	if d.checkpoint == nil {
		return r
	}
	seen := map[[2]string]bool{}
	now := time.Now()
	for _, c := range d.checkpoint.Claims {
		for _, dev := range c.Devices {
			k := [2]string{dev.Pool, dev.Device}
			if seen[k] {
				continue
			}
			seen[k] = true
			h := kubeletplugin.DeviceHealth{PoolName: dev.Pool, DeviceName: dev.Device, Health: kubeletplugin.HealthStatusHealthy, LastUpdated: now}
			ns, name, _ := shareddra.ParseDevice(dev.Pool, dev.Device)
			var inst v1alpha1.Instance
			if err := d.reader.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &inst); err != nil || !inst.HasNode(d.opts.NodeName) {
				h.Health = kubeletplugin.HealthStatusUnhealthy
				h.Message = "the device's handler no longer reports it on this node (OFFLINE or gone)"
			}
			r.Devices = append(r.Devices, h)
		}
	}
	return r
}
