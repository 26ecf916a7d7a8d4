package cdi

import (
	"errors"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// TestSpecsComeFromThisNodesDiscovery: another node rewrites a shared
// Instance's mounts and device nodes (to the host's root); the spec this
// node writes keeps what its own handler reported, and an Instance its
// handler did not report gets no spec at all.
func TestSpecsComeFromThisNodesDiscovery(t *testing.T) {
	dir := t.TempDir()
	local := NewLocal()
	w, err := NewWriter(dir, local)
	if err != nil {
		t.Fatal(err)
	}
	mine := testInstance("cam-a1b2c3")
	if err := w.Write(mine); !errors.Is(err, ErrNotDiscoveredHere) {
		t.Fatalf("write before this node reported the device: %v, want ErrNotDiscoveredHere", err)
	}
	local.Record(client.ObjectKeyFromObject(mine), mine.Spec.Mounts, mine.Spec.DeviceSpecs)

	tampered := mine.DeepCopy()
	tampered.Spec.Mounts = []v1alpha1.Mount{{HostPath: "/", ContainerPath: "/host"}}
	tampered.Spec.DeviceSpecs = []v1alpha1.DeviceNode{{HostPath: "/dev/mem", ContainerPath: "/dev/mem", Permissions: "rw"}}
	if err := w.Write(tampered); err != nil {
		t.Fatal(err)
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(dir), cdi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	dev := cache.GetDevice(mine.CDIName())
	if dev == nil {
		t.Fatalf("device not found; devices: %v", cache.ListDevices())
	}
	edits := dev.ContainerEdits
	if len(edits.Mounts) != 1 || edits.Mounts[0].HostPath != "/tmp" || len(edits.DeviceNodes) != 1 || edits.DeviceNodes[0].HostPath != "/dev/null" {
		t.Errorf("spec from a tampered object: mounts %+v, device nodes %+v; want this node's /tmp and /dev/null", edits.Mounts, edits.DeviceNodes)
	}
	// The object handed out is not changed in place (it is the cache's).
	if tampered.Spec.Mounts[0].HostPath != "/" {
		t.Errorf("Own changed its argument: %+v", tampered.Spec.Mounts)
	}
	own, err := w.Own(tampered)
	if err != nil || own.Spec.Mounts[0].HostPath != "/tmp" || own.Spec.BrokerProperties["DEBUG_ECHO_DESCRIPTION"] != "foo0" {
		t.Errorf("Own: %+v %v", own, err)
	}
	local.Drop(client.ObjectKeyFromObject(mine))
	if _, err := w.Own(mine); !errors.Is(err, ErrNotDiscoveredHere) {
		t.Errorf("after Drop: %v, want ErrNotDiscoveredHere", err)
	}
	var nilWriter *Writer
	if got, err := nilWriter.Own(tampered); got != tampered || err != nil {
		t.Errorf("a nil Writer trusts the object: %v %v", got, err)
	}
}
