package cdi

import (
	"errors"
	"slices"
	"sync"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// ErrNotDiscoveredHere: this node's own handlers have not (yet) reported the
// Instance's device, so it has no mounts or device nodes of its own to give
// a container. Retryable: discovery fills Local shortly after a start.
var ErrNotDiscoveredHere = errors.New("the device is not discovered on this node (yet)")

// Local is what this node's own handlers reported of each Instance it
// holds: its host mounts and device nodes. A shared Instance is one object
// that every node seeing the device writes, so another node could put a
// host path of its choosing into it; what a container on this node gets of
// the host comes from here, never from the object.
//
// Record and Drop are called by the Instance writer; Own by everything that
// hands a device to a container. A nil *Local trusts the object (tests that
// run no discovery).
type Local struct {
	mu sync.RWMutex
	m  map[types.NamespacedName]edits
}

type edits struct {
	mounts  []v1alpha1.Mount
	devices []v1alpha1.DeviceNode
}

// NewLocal makes an empty Local.
func NewLocal() *Local { return &Local{m: map[types.NamespacedName]edits{}} }

// Record remembers what this node discovered for the Instance key.
func (l *Local) Record(key types.NamespacedName, mounts []v1alpha1.Mount, devices []v1alpha1.DeviceNode) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.m[key] = edits{mounts: mounts, devices: devices}
}

// Drop forgets the Instance key (this node no longer sees its device).
func (l *Local) Drop(key types.NamespacedName) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.m, key)
}

// Own is inst with the mounts and device nodes this node discovered in
// place of the object's (inst itself when they are the same), or
// ErrNotDiscoveredHere.
func (l *Local) Own(inst *v1alpha1.Instance) (*v1alpha1.Instance, error) {
	if l == nil {
		return inst, nil
	}
	l.mu.RLock()
	e, ok := l.m[client.ObjectKeyFromObject(inst)]
	l.mu.RUnlock()
	if !ok {
		return nil, ErrNotDiscoveredHere
	}
	if slices.Equal(e.mounts, inst.Spec.Mounts) && slices.Equal(e.devices, inst.Spec.DeviceSpecs) {
		return inst, nil
	}
	own := inst.DeepCopy()
	own.Spec.Mounts = slices.Clone(e.mounts)
	own.Spec.DeviceSpecs = slices.Clone(e.devices)
	return own, nil
}
