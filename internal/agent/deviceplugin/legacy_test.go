package deviceplugin

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	dp "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/dowse-dev/dowse/internal/scheme"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// writeOldSpec writes inst's spec as an agent before the namespace was in
// CDI names did: kind dowse.dev/<configuration>, device <hash>, in the file
// the current agent writes the Instance's spec to.
func writeOldSpec(t *testing.T, dir string, inst *v1alpha1.Instance) {
	t.Helper()
	spec := cdispec.Spec{Version: "0.6.0", Kind: "dowse.dev/" + inst.Spec.ConfigurationName,
		Devices: []cdispec.Device{{Name: v1alpha1.InstanceHash(inst.Name), ContainerEdits: cdispec.ContainerEdits{Env: []string{"OLD=1"}}}}}
	b, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, inst.CDISpecFileName()+".json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// cdiDevices lists the devices a runtime resolves in dir (conflicts are
// resolved to nothing, as the CDI library does).
func cdiDevices(t *testing.T, dir string) []string {
	t.Helper()
	c, err := cdiapi.NewCache(cdiapi.WithSpecDirs(dir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	return c.ListDevices()
}

// TestUpgradeKeepsLegacyNames: after an upgrade, a slot this node holds
// under the Instance's legacy resource (a pod allocated by an agent before
// resources carried the namespace) keeps that resource served (offering
// only that slot, which the new resource does not hand out) and its legacy
// CDI device defined beside the new one; both go once the slot is
// released, and the sweep removes a legacy spec no slot needs.
func TestUpgradeKeepsLegacyNames(t *testing.T) {
	sch, err := scheme.New()
	if err != nil {
		t.Fatal(err)
	}
	dir, cdiDir := t.TempDir(), t.TempDir()
	regs := make(chan *dp.RegisterRequest, 16)
	startKubelet(t, dir, regs)
	inst := testInstance("debug-echo-a1b2c3")
	inst.Status.Nodes = []v1alpha1.InstanceNode{{Name: "n1"}}
	legacyRes := v1alpha1.LegacyResourceName(inst.Name)
	inst.Status.Slots = []v1alpha1.InstanceSlot{{ID: "a1b2c3-0", Node: "n1", Resource: legacyRes}}
	writeOldSpec(t, cdiDir, inst)
	// Another Instance's stale legacy spec: no slot needs it.
	stale := testInstance("debug-echo-ffff00")
	stale.Status.Nodes = []v1alpha1.InstanceNode{{Name: "n1"}}
	writeOldSpec(t, cdiDir, stale)
	c := fake.NewClientBuilder().WithScheme(sch).WithObjects(inst, stale).Build()

	m, err := NewManager(c, Options{NodeName: "n1", PluginDir: dir, CDIDir: cdiDir}, testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	// Made over the earlier agent's directory, the writer kept both old
	// devices defined.
	if got := cdiDevices(t, cdiDir); !slices.Contains(got, inst.LegacyCDIName()) || !slices.Contains(got, stale.LegacyCDIName()) {
		t.Fatalf("after the upgrade the runtime resolves %v, want the legacy %s and %s", got, inst.LegacyCDIName(), stale.LegacyCDIName())
	}
	m.claimer = &fakeClaimer{taken: map[string]bool{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Start(ctx) }()
	defer func() { cancel(); <-done }()
	<-m.started
	reconcileOne := func(o *v1alpha1.Instance) {
		t.Helper()
		if _, err := m.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(o)}); err != nil {
			t.Fatal(err)
		}
	}
	reconcileOne(inst)
	var got []string
	for range 3 {
		got = append(got, waitReg(t, regs, 5*time.Second).ResourceName)
	}
	slices.Sort(got)
	if want := []string{legacyRes, inst.ResourceName(), v1alpha1.ResourceName("default", "debug-echo")}; !slices.Equal(got, want) {
		t.Fatalf("registered %v, want %v", got, want)
	}
	if got := cdiDevices(t, cdiDir); !slices.Contains(got, inst.CDIName()) || !slices.Contains(got, inst.LegacyCDIName()) {
		t.Fatalf("the runtime resolves %v, want %s and the legacy %s", got, inst.CDIName(), inst.LegacyCDIName())
	}
	m.sweepCDI(ctx)
	if got := cdiDevices(t, cdiDir); slices.Contains(got, stale.LegacyCDIName()) || !slices.Contains(got, inst.LegacyCDIName()) {
		t.Fatalf("after the sweep the runtime resolves %v: want the stale legacy spec gone, the one in use kept", got)
	}

	legacy, err := dialPlugin(t, dir, "n1", legacyRes).ListAndWatch(ctx, &dp.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	l, err := legacy.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Devices) != 1 || l.Devices[0].ID != "a1b2c3-0" || l.Devices[0].Health != dp.Healthy {
		t.Fatalf("legacy plugin offers %v, want only the held slot", l.Devices)
	}
	cur, err := dialPlugin(t, dir, "n1", inst.ResourceName()).ListAndWatch(ctx, &dp.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	n, err := cur.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(n.Devices) != 2 || n.Devices[0].Health != dp.Unhealthy || n.Devices[1].Health != dp.Healthy {
		t.Fatalf("the new resource offers %v: the slot held under the legacy one must be Unhealthy", n.Devices)
	}

	// The old pod ends and its slot is released: the legacy resource and
	// CDI device go.
	inst.Status.Slots = nil
	if err := c.Update(ctx, inst); err != nil {
		t.Fatal(err)
	}
	reconcileOne(inst)
	if _, err := legacy.Recv(); err == nil {
		t.Fatal("the legacy plugin's ListAndWatch still open after the slot was released")
	}
	if _, err := os.Stat(filepath.Join(dir, SocketName("n1", legacyRes))); !os.IsNotExist(err) {
		t.Fatalf("legacy socket left: %v", err)
	}
	if got := cdiDevices(t, cdiDir); slices.Contains(got, inst.LegacyCDIName()) || !slices.Contains(got, inst.CDIName()) {
		t.Fatalf("the runtime resolves %v, want %s alone", got, inst.CDIName())
	}
}
