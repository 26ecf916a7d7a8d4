package dra

import (
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	shareddra "github.com/dowse-dev/dowse/internal/dra"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// cdiOwner is the driver's name as a keeper of legacy CDI specs.
const cdiOwner = "dra"

type specState struct {
	resourceVersion, configuration string
}

type deviceState struct {
	resourceVersion string
	invalid         bool
	digest          string
}

// writeSpec writes inst's CDI spec. Called with d.mu held.
func (d *Driver) writeSpec(inst *v1alpha1.Instance) error {
	if err := d.cdi.Write(inst); err != nil {
		return err
	}
	d.specs[client.ObjectKeyFromObject(inst)] = specState{resourceVersion: inst.ResourceVersion, configuration: inst.Spec.ConfigurationName}
	return nil
}

// adoptSpecs takes over the CDI specs of the checkpoint's claims (an
// earlier agent wrote them), legacy ones included, and, unless device
// plugins run (they keep their own), removes every other Dowse spec in the
// directory: left by claims unprepared while no agent ran.
func (d *Driver) adoptSpecs() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range d.checkpoint.Claims {
		for _, dev := range c.Devices {
			if ns, name, ok := shareddra.ParseDevice(dev.Pool, dev.Device); ok {
				// No resourceVersion: the next sync rewrites it if the
				// Instance is still here.
				d.specs[types.NamespacedName{Namespace: ns, Name: name}] = specState{configuration: dev.Configuration}
			}
		}
	}
	d.keepLegacy(nil)
	if d.opts.DevicePlugins {
		return
	}
	for _, f := range d.cdi.Specs() {
		if f.Legacy {
			if d.cdi.LegacyKept(f.Instance) {
				continue
			}
		} else if _, ok := d.specs[f.Instance]; ok {
			continue
		}
		if err := d.cdi.RemoveFile(f); err != nil {
			d.log.Error(err, "removing stale CDI spec", "instance", f.Instance)
		}
	}
}

// keepLegacy keeps the legacy CDI specs the checkpoint's claims use, and
// lets go of those it no longer does. insts, when not nil, are the
// Instances here by key, to write the specs from; an Instance not among
// them keeps the file an earlier agent left. Called with d.mu held.
func (d *Driver) keepLegacy(insts map[types.NamespacedName]*v1alpha1.Instance) {
	if d.checkpoint == nil {
		return
	}
	want := map[types.NamespacedName]bool{}
	for _, c := range d.checkpoint.Claims {
		for _, dev := range c.Devices {
			ns, name, ok := shareddra.ParseDevice(dev.Pool, dev.Device)
			if !ok {
				continue
			}
			for _, id := range dev.CDIDeviceIDs {
				if id != v1alpha1.CDIName(ns, name) {
					want[types.NamespacedName{Namespace: ns, Name: name}] = true
				}
			}
		}
	}
	for key := range want {
		if d.legacy[key] {
			continue
		}
		if err := d.cdi.KeepLegacy(cdiOwner, key, insts[key]); err != nil {
			d.log.Error(err, "keeping a legacy CDI spec", "instance", key)
			continue
		}
		d.legacy[key] = true
	}
	for key := range d.legacy {
		if want[key] {
			continue
		}
		if err := d.cdi.DropLegacy(cdiOwner, key); err != nil {
			d.log.Error(err, "removing a legacy CDI spec", "instance", key)
			continue
		}
		delete(d.legacy, key)
	}
}

// removeSpec removes the CDI spec of key, unless the agent's device
// plugins keep it (a Configuration allocated both ways, with device
// plugins on). Called with d.mu held.
func (d *Driver) removeSpec(key types.NamespacedName) {
	st, ok := d.specs[key]
	delete(d.specs, key)
	if ok && d.opts.DevicePlugins && d.withPlugins[types.NamespacedName{Namespace: key.Namespace, Name: st.configuration}] {
		return
	}
	if _, err := d.cdi.Remove(key.Namespace, key.Name); err != nil {
		d.log.Error(err, "removing CDI spec", "instance", key)
	}
}

// inUse says whether a prepared claim still uses the Instance key: its CDI
// spec stays until the claim is unprepared, so that a container that
// restarts still finds it. Called with d.mu held.
func (d *Driver) inUse(key types.NamespacedName) bool {
	if d.checkpoint == nil {
		return false
	}
	for _, c := range d.checkpoint.Claims {
		for _, dev := range c.Devices {
			if ns, name, ok := shareddra.ParseDevice(dev.Pool, dev.Device); ok && ns == key.Namespace && name == key.Name {
				return true
			}
		}
	}
	return false
}
