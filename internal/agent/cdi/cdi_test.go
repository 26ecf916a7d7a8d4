package cdi

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

func testInstance(name string) *v1alpha1.Instance {
	return &v1alpha1.Instance{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: v1alpha1.InstanceSpec{
			ConfigurationName: "debug-echo", DeviceID: "foo0", Capacity: 2,
			BrokerProperties: map[string]string{"DEBUG_ECHO_DESCRIPTION": "foo0", "weird.name-1": "v"},
			Mounts:           []v1alpha1.Mount{{HostPath: "/tmp", ContainerPath: "/mnt/tmp", ReadOnly: true}},
			DeviceSpecs:      []v1alpha1.DeviceNode{{HostPath: "/dev/null", ContainerPath: "/dev/dowse0", Permissions: "rw"}},
		},
	}
}

func TestCDISpecValidatedByLibrary(t *testing.T) {
	dir := t.TempDir()
	w, err := NewWriter(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	inst := testInstance("debug-echo-a1b2c3")
	if err := w.Write(inst); err != nil {
		t.Fatal(err)
	}
	// Read back with the library, as containerd would.
	cache, err := cdi.NewCache(cdi.WithSpecDirs(dir), cdi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	if errs := cache.GetErrors(); len(errs) > 0 {
		t.Fatalf("spec errors: %v", errs)
	}
	dev := cache.GetDevice("dowse.dev/instance=debug-echo-a1b2c3.default")
	if dev == nil {
		t.Fatalf("device not found; devices: %v", cache.ListDevices())
	}
	if got := inst.CDIName(); got != "dowse.dev/instance=debug-echo-a1b2c3.default" {
		t.Fatalf("CDIName = %q", got)
	}
	edits := dev.ContainerEdits
	for _, want := range []string{"DEBUG_ECHO_DESCRIPTION=foo0", "DEBUG_ECHO_DESCRIPTION_A1B2C3=foo0", "WEIRD_NAME_1=v", "WEIRD_NAME_1_A1B2C3=v"} {
		if !slices.Contains(edits.Env, want) {
			t.Errorf("env lacks %q: %v", want, edits.Env)
		}
	}
	if len(edits.Mounts) != 1 || edits.Mounts[0].ContainerPath != "/mnt/tmp" || !slices.Contains(edits.Mounts[0].Options, "ro") {
		t.Errorf("mounts = %+v", edits.Mounts)
	}
	if len(edits.DeviceNodes) != 1 || edits.DeviceNodes[0].Path != "/dev/dowse0" || edits.DeviceNodes[0].HostPath != "/dev/null" {
		t.Errorf("device nodes = %+v", edits.DeviceNodes)
	}
	// Written atomically: no temporary file is left.
	files, _ := os.ReadDir(dir)
	if len(files) != 1 || !strings.HasSuffix(files[0].Name(), ".json") {
		t.Fatalf("files = %v", files)
	}
	if removed, err := w.Remove(inst.Namespace, inst.Name); err != nil || !removed {
		t.Fatalf("Remove = %v, %v", removed, err)
	}
	if _, err := os.Stat(filepath.Join(dir, files[0].Name())); !os.IsNotExist(err) {
		t.Fatalf("spec not removed: %v", err)
	}
	if removed, err := w.Remove(inst.Namespace, inst.Name); err != nil || removed {
		t.Fatalf("removing twice: %v, %v", removed, err)
	}
}

func TestCDISpecBadInput(t *testing.T) {
	for name, mutate := range map[string]func(*v1alpha1.Instance){
		"relative mount":       func(i *v1alpha1.Instance) { i.Spec.Mounts[0].HostPath = "tmp" },
		"relative device node": func(i *v1alpha1.Instance) { i.Spec.DeviceSpecs[0].ContainerPath = "dev/x" },
		"missing device node":  func(i *v1alpha1.Instance) { i.Spec.DeviceSpecs[0].HostPath = "/dev/dowse-does-not-exist" },
	} {
		t.Run(name, func(t *testing.T) {
			inst := testInstance("debug-echo-a1b2c3")
			mutate(inst)
			w, err := NewWriter(t.TempDir(), nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := w.Write(inst); err == nil {
				t.Fatal("no error")
			} else {
				t.Log(err)
			}
		})
	}
}
