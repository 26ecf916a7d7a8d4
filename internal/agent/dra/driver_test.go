package dra

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"github.com/go-logr/logr/testr"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/dowse-dev/dowse/internal/agent/cdi"
	shareddra "github.com/dowse-dev/dowse/internal/dra"
	"github.com/dowse-dev/dowse/internal/scheme"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

func newTestDriver(t *testing.T, c client.Reader, pluginDir, cdiDir string) *Driver {
	t.Helper()
	d, err := New(nil, nil, nil, Options{NodeName: "n1", RegistrarDir: "unused", PluginDir: pluginDir, CDIDir: cdiDir}, testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	d.reader = c
	index(t, d, c)
	if d.checkpoint, err = loadCheckpoint(filepath.Join(pluginDir, CheckpointFile)); err != nil {
		t.Fatal(err)
	}
	d.adoptSpecs() // as Start does
	return d
}

// index gives d the Instances of c, as its informer would.
func index(t *testing.T, d *Driver, c client.Reader) {
	t.Helper()
	var l v1alpha1.InstanceList
	if err := c.List(context.Background(), &l); err != nil {
		t.Fatal(err)
	}
	for i := range l.Items {
		d.observe(&l.Items[i])
	}
}

func claimFor(uid, pool, device string) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "c-" + uid, Namespace: "apps", UID: types.UID(uid)},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
			Results: []resourceapi.DeviceRequestAllocationResult{{Request: "echo", Driver: shareddra.DriverName, Pool: pool, Device: device}},
		}}},
	}
}

// TestPrepareCheckpointed: sync publishes the local device in its pool
// (and writes no CDI spec); a claim allocated to it is answered with its
// CDI device, whose spec is written then, and again from the checkpoint
// (also by a new driver, after the Instance went, which removes stale
// specs); unprepare forgets it and removes the spec; a device not on this
// node fails its claim.
func TestPrepareCheckpointed(t *testing.T) {
	sch, err := scheme.New()
	if err != nil {
		t.Fatal(err)
	}
	inst := &v1alpha1.Instance{
		ObjectMeta: metav1.ObjectMeta{Name: "echo-0123456789abcdef", Namespace: "default", ResourceVersion: "1"},
		Spec: v1alpha1.InstanceSpec{ConfigurationName: "echo", DeviceID: "foo1", Capacity: 2,
			BrokerProperties: map[string]string{"DEBUG_ECHO_DESCRIPTION": "foo1"}},
		Status: v1alpha1.InstanceStatus{Nodes: []v1alpha1.InstanceNode{{Name: "n1"}}},
	}
	elsewhere := inst.DeepCopy()
	elsewhere.Name, elsewhere.Status.Nodes = "echo-fedcba9876543210", []v1alpha1.InstanceNode{{Name: "n2"}}
	cfg := &v1alpha1.Configuration{ObjectMeta: metav1.ObjectMeta{Name: "echo", Namespace: "default"},
		Spec: v1alpha1.ConfigurationSpec{Allocation: v1alpha1.AllocationDRA}}
	c := fake.NewClientBuilder().WithScheme(sch).WithObjects(inst, elsewhere, cfg).Build()
	pluginDir, cdiDir := t.TempDir(), t.TempDir()
	d := newTestDriver(t, c, pluginDir, cdiDir)
	ctx := context.Background()

	res, err := d.sync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pool := shareddra.LocalPool("n1", "default", "echo")
	if p, ok := res[pool]; !ok || len(res) != 1 || len(p.Slices) != 1 || len(p.Slices[0].Devices()) != 1 || p.Slices[0].Devices()[0].Name != "0123456789abcdef" {
		t.Fatalf("pools %+v", res)
	}
	specFile := filepath.Join(cdiDir, inst.CDISpecFileName()+".json")
	if _, err := os.Stat(specFile); !os.IsNotExist(err) {
		t.Fatalf("a CDI spec before any claim: %v", err)
	}

	claim := claimFor("u1", pool, "0123456789abcdef")
	check := func(d *Driver) {
		t.Helper()
		out, err := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{claim})
		if err != nil {
			t.Fatal(err)
		}
		r := out["u1"]
		if r.Err != nil || len(r.Devices) != 1 || r.Devices[0].CDIDeviceIDs[0] != "dowse.dev/instance=echo-0123456789abcdef.default" || r.Devices[0].Requests[0] != "echo" {
			t.Fatalf("prepare = %+v", r)
		}
	}
	check(d)
	if _, err := os.Stat(specFile); err != nil {
		t.Fatalf("no CDI spec for the prepared claim: %v", err)
	}
	check(d)
	if h := d.health(ctx); len(h.Devices) != 1 || h.Devices[0].Health != kubeletplugin.HealthStatusHealthy || h.Devices[0].PoolName != pool {
		t.Fatalf("health %+v", h)
	}
	// The CDI spec stays while the claim is prepared, even with the
	// Instance gone; the device is then reported unhealthy.
	if err := c.Delete(ctx, inst); err != nil {
		t.Fatal(err)
	}
	d.forget(inst)
	if h := d.health(ctx); len(h.Devices) != 1 || h.Devices[0].Health != kubeletplugin.HealthStatusUnhealthy {
		t.Fatalf("health after the Instance went %+v", h)
	}
	if _, err := d.sync(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(specFile); err != nil {
		t.Fatalf("CDI spec of a prepared claim removed: %v", err)
	}
	// A new process answers from the checkpoint, and removes a stale
	// spec no claim uses.
	stale := filepath.Join(cdiDir, "dowse.dev_default_gone-0000.json")
	if err := os.WriteFile(stale, []byte(`{}`), 0o644); err != nil {
		t.Fatal(err)
	}
	d2 := newTestDriver(t, c, pluginDir, cdiDir)
	check(d2)
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Fatalf("stale CDI spec kept: %v", err)
	}
	if _, err := os.Stat(specFile); err != nil {
		t.Fatalf("CDI spec of a checkpointed claim removed: %v", err)
	}

	out, err := d2.UnprepareResourceClaims(ctx, []kubeletplugin.NamespacedObject{
		{NamespacedName: types.NamespacedName{Namespace: "apps", Name: "c-u1"}, UID: "u1"},
		{NamespacedName: types.NamespacedName{Namespace: "apps", Name: "c-unknown"}, UID: "unknown"},
	})
	if err != nil || out["u1"] != nil || out["unknown"] != nil {
		t.Fatalf("unprepare = %v %v", out, err)
	}
	if got := newTestDriver(t, c, pluginDir, cdiDir).Prepared(); len(got) != 0 {
		t.Fatalf("prepared after unprepare: %v", got)
	}
	// No claim uses it any more: the spec goes with the unprepare.
	if _, err := os.Stat(specFile); !os.IsNotExist(err) {
		t.Fatalf("CDI spec left behind: %v", err)
	}

	out2, err := d2.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{claimFor("u2", shareddra.LocalPool("n2", "default", "echo"), "fedcba9876543210")})
	if err != nil {
		t.Fatal(err)
	}
	if out2["u2"].Err == nil {
		t.Fatal("a device of another node was prepared")
	}
}

// TestBothKeepsDevicePluginSpec: with device plugins on, the CDI spec of a
// Configuration allocated both ways is the device plugins' to keep: an
// unprepare leaves it.
func TestBothKeepsDevicePluginSpec(t *testing.T) {
	sch, err := scheme.New()
	if err != nil {
		t.Fatal(err)
	}
	inst := &v1alpha1.Instance{
		ObjectMeta: metav1.ObjectMeta{Name: "echo-0123456789abcdef", Namespace: "default", ResourceVersion: "1"},
		Spec:       v1alpha1.InstanceSpec{ConfigurationName: "echo", DeviceID: "foo1", BrokerProperties: map[string]string{"A": "b"}},
		Status:     v1alpha1.InstanceStatus{Nodes: []v1alpha1.InstanceNode{{Name: "n1"}}},
	}
	cfg := &v1alpha1.Configuration{ObjectMeta: metav1.ObjectMeta{Name: "echo", Namespace: "default"},
		Spec: v1alpha1.ConfigurationSpec{Allocation: v1alpha1.AllocationBoth}}
	c := fake.NewClientBuilder().WithScheme(sch).WithObjects(inst, cfg).Build()
	cdiDir := t.TempDir()
	d, err := New(nil, nil, nil, Options{NodeName: "n1", RegistrarDir: "unused", PluginDir: t.TempDir(), CDIDir: cdiDir, DevicePlugins: true}, testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	d.reader = c
	index(t, d, c)
	if d.checkpoint, err = loadCheckpoint(filepath.Join(d.opts.PluginDir, CheckpointFile)); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := d.sync(ctx); err != nil {
		t.Fatal(err)
	}
	pool := shareddra.LocalPool("n1", "default", "echo")
	if _, err := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{claimFor("u1", pool, "0123456789abcdef")}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.UnprepareResourceClaims(ctx, []kubeletplugin.NamespacedObject{{UID: "u1"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(cdiDir, inst.CDISpecFileName()+".json")); err != nil {
		t.Fatalf("the device plugins' CDI spec was removed: %v", err)
	}
}

// TestUpgradeKeepsLegacyCDIDevice: a claim prepared by an agent before CDI
// names carried the namespace was answered with the Instance's legacy CDI
// device, which the kubelet hands the runtime again when a container of the
// claim restarts: after the upgrade the driver answers the claim as before
// and keeps the legacy device defined beside the new one until the claim is
// unprepared.
func TestUpgradeKeepsLegacyCDIDevice(t *testing.T) {
	sch, err := scheme.New()
	if err != nil {
		t.Fatal(err)
	}
	inst := &v1alpha1.Instance{
		ObjectMeta: metav1.ObjectMeta{Name: "echo-0123456789abcdef", Namespace: "default", ResourceVersion: "1"},
		Spec:       v1alpha1.InstanceSpec{ConfigurationName: "echo", DeviceID: "foo1", BrokerProperties: map[string]string{"A": "b"}},
		Status:     v1alpha1.InstanceStatus{Nodes: []v1alpha1.InstanceNode{{Name: "n1"}}},
	}
	cfg := &v1alpha1.Configuration{ObjectMeta: metav1.ObjectMeta{Name: "echo", Namespace: "default"},
		Spec: v1alpha1.ConfigurationSpec{Allocation: v1alpha1.AllocationDRA}}
	c := fake.NewClientBuilder().WithScheme(sch).WithObjects(inst, cfg).Build()
	pluginDir, cdiDir := t.TempDir(), t.TempDir()
	pool := shareddra.LocalPool("n1", "default", "echo")
	// What the earlier agent left: its checkpoint and its spec.
	old := &checkpoint{path: filepath.Join(pluginDir, CheckpointFile), Version: checkpointVersion, Claims: map[types.UID]*preparedClaim{
		"u1": {Namespace: "apps", Name: "c-u1", Devices: []preparedDevice{{Requests: []string{"echo"}, Pool: pool, Device: "0123456789abcdef",
			CDIDeviceIDs: []string{inst.LegacyCDIName()}, Configuration: "echo"}}},
	}}
	if err := old.save(); err != nil {
		t.Fatal(err)
	}
	spec, err := cdi.LegacySpec(inst)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cdiDir, inst.CDISpecFileName()+".json"), b, 0o644); err != nil {
		t.Fatal(err)
	}

	d := newTestDriver(t, c, pluginDir, cdiDir)
	ctx := context.Background()
	if _, err := d.sync(ctx); err != nil {
		t.Fatal(err)
	}
	out, err := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{claimFor("u1", pool, "0123456789abcdef")})
	if err != nil || out["u1"].Err != nil || out["u1"].Devices[0].CDIDeviceIDs[0] != inst.LegacyCDIName() {
		t.Fatalf("the earlier agent's claim answered %+v, %v: want its legacy CDI device", out["u1"], err)
	}
	devs := resolvable(t, cdiDir)
	if !slices.Contains(devs, inst.LegacyCDIName()) || !slices.Contains(devs, inst.CDIName()) {
		t.Fatalf("the runtime resolves %v, want %s and the legacy %s", devs, inst.CDIName(), inst.LegacyCDIName())
	}
	if _, err := d.UnprepareResourceClaims(ctx, []kubeletplugin.NamespacedObject{{UID: "u1"}}); err != nil {
		t.Fatal(err)
	}
	if devs := resolvable(t, cdiDir); len(devs) != 0 {
		t.Fatalf("after the unprepare the runtime resolves %v, want nothing", devs)
	}
}

// resolvable lists the CDI devices a runtime resolves in dir.
func resolvable(t *testing.T, dir string) []string {
	t.Helper()
	c, err := cdiapi.NewCache(cdiapi.WithSpecDirs(dir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	return c.ListDevices()
}

// TestSliceCountKept: the driver spreads a pool over the slice count it
// has (as published, after a restart, or as last synced) while the pool
// stays above a quarter of it, instead of the fewest slices that fit.
func TestSliceCountKept(t *testing.T) {
	sch, err := scheme.New()
	if err != nil {
		t.Fatal(err)
	}
	cfg := &v1alpha1.Configuration{ObjectMeta: metav1.ObjectMeta{Name: "echo", Namespace: "default"},
		Spec: v1alpha1.ConfigurationSpec{Allocation: v1alpha1.AllocationDRA}}
	objs := []client.Object{cfg}
	for i := range 100 {
		objs = append(objs, &v1alpha1.Instance{
			ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.InstanceName("echo", v1alpha1.DeviceHash(strconv.Itoa(i), false, "n1")), Namespace: "default", ResourceVersion: "1"},
			Spec:       v1alpha1.InstanceSpec{ConfigurationName: "echo", DeviceID: strconv.Itoa(i)},
			Status:     v1alpha1.InstanceStatus{Nodes: []v1alpha1.InstanceNode{{Name: "n1"}}},
		})
	}
	c := fake.NewClientBuilder().WithScheme(sch).WithObjects(objs...).Build()
	d := newTestDriver(t, c, t.TempDir(), t.TempDir())
	pool := shareddra.LocalPool("n1", "default", "echo")
	d.sliceCount = func(p string) int {
		if p == pool {
			return 8 // published by an earlier run, when the pool was bigger
		}
		return 0
	}
	ctx := context.Background()
	count := func() int {
		t.Helper()
		res, err := d.sync(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return len(res[pool].Slices)
	}
	if n := count(); n != 8 {
		t.Fatalf("100 devices in %d slices, want the 8 published (4 would rewrite every slice)", n)
	}
	for i := 40; i < 100; i++ {
		inst := objs[1+i].(*v1alpha1.Instance)
		d.forget(inst)
	}
	if n := count(); n != 2 {
		t.Fatalf("40 devices in %d slices, want 2 (a quarter of 8 slices fits them)", n)
	}
}
