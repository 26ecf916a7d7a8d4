package integration

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	dp "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/dowse-dev/dowse/agent"
	"github.com/dowse-dev/dowse/internal/agent/deviceplugin"
	shareddra "github.com/dowse-dev/dowse/internal/dra"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/framework/testwait"
)

// registrar is the kubelet's device-plugin registration service on a
// node: it records the resources registered.
type registrar struct {
	dp.UnimplementedRegistrationServer
	dir string
	mu  sync.Mutex
	got []string
}

func (r *registrar) Register(_ context.Context, req *dp.RegisterRequest) (*dp.Empty, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, req.ResourceName)
	return &dp.Empty{}, nil
}

func (r *registrar) resources() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Compact(slices.Sorted(slices.Values(r.got)))
}

// startRegistrar serves a kubelet registration socket in a directory of
// its own (the agent's --device-plugin-dir).
func startRegistrar(t *testing.T) *registrar {
	t.Helper()
	r := &registrar{dir: stateDir(t)}
	l, err := net.Listen("unix", filepath.Join(r.dir, "kubelet.sock"))
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	dp.RegisterRegistrationServer(srv, r)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
	return r
}

// withDevicePlugins turns the agent's device plugins on, registering with
// r, with CDI specs in cdiDir (shared with DRA).
func withDevicePlugins(r *registrar, cdiDir string) agentOption {
	return func(c *agent.Config) {
		c.DevicePluginDir = r.dir
		c.CDISpecDir = cdiDir
		c.DRA.Enabled = true
	}
}

// allocate asks node's plugin of resource for slot id, as the kubelet
// does, and returns the CDI devices of the answer.
func allocate(t *testing.T, r *registrar, node, resource, id string) []string {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+filepath.Join(r.dir, deviceplugin.SocketName(node, resource)), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := dp.NewDevicePluginClient(conn).Allocate(ctx, &dp.AllocateRequest{ContainerRequests: []*dp.ContainerAllocateRequest{{DevicesIds: []string{id}}}})
	if err != nil {
		t.Fatalf("allocating %s of %s on %s: %v", id, resource, node, err)
	}
	var out []string
	for _, d := range resp.ContainerResponses[0].CdiDevices {
		out = append(out, d.Name)
	}
	return out
}

// cdiResolves lists the CDI devices a runtime resolves in dir, and the
// spec errors (conflicts) it reports.
func cdiResolves(t *testing.T, dir string) ([]string, error) {
	t.Helper()
	c, err := cdiapi.NewCache(cdiapi.WithSpecDirs(dir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	var errs []string
	for _, e := range c.GetErrors() {
		for _, err := range e {
			errs = append(errs, err.Error())
		}
	}
	if len(errs) > 0 {
		return c.ListDevices(), fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return c.ListDevices(), nil
}

// stillness counts the writes to the given namespaces' Instances and
// Configurations, and to the ResourceSlices of their pools, from now
// until the returned function is called.
func stillness(t *testing.T, namespaces ...string) func() []string {
	t.Helper()
	dyn := dynamic.NewForConfigOrDie(suite.Config)
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	var events []string
	var wg sync.WaitGroup
	watchOne := func(gvr schema.GroupVersionResource, ns string, keep func(obj metav1.Object) bool) {
		var list interface{ GetResourceVersion() string }
		var err error
		if ns != "" {
			list, err = dyn.Resource(gvr).Namespace(ns).List(ctx, metav1.ListOptions{})
		} else {
			list, err = dyn.Resource(gvr).List(ctx, metav1.ListOptions{})
		}
		if err != nil {
			t.Fatal(err)
		}
		var w watch.Interface
		if ns != "" {
			w, err = dyn.Resource(gvr).Namespace(ns).Watch(ctx, metav1.ListOptions{ResourceVersion: list.GetResourceVersion()})
		} else {
			w, err = dyn.Resource(gvr).Watch(ctx, metav1.ListOptions{ResourceVersion: list.GetResourceVersion()})
		}
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			defer w.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case ev, ok := <-w.ResultChan():
					if !ok {
						return
					}
					if m, ok := ev.Object.(metav1.Object); ok && keep(m) {
						mu.Lock()
						events = append(events, fmt.Sprintf("%s %s %s/%s", ev.Type, gvr.Resource, m.GetNamespace(), m.GetName()))
						mu.Unlock()
					}
				}
			}
		})
	}
	all := func(metav1.Object) bool { return true }
	for _, ns := range namespaces {
		watchOne(v1alpha1.GroupVersion.WithResource("instances"), ns, all)
		watchOne(v1alpha1.GroupVersion.WithResource("configurations"), ns, all)
	}
	watchOne(resourceapi.SchemeGroupVersion.WithResource("resourceslices"), "", func(m metav1.Object) bool {
		pool := m.GetAnnotations()["dra.dowse.dev/pool"]
		for _, ns := range namespaces {
			if strings.Contains(pool, "/"+ns+"/") {
				return true
			}
		}
		return false
	})
	return func() []string {
		cancel()
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		return events
	}
}

// specTimes are the modification times of the CDI specs in dirs.
func specTimes(t *testing.T, dirs ...string) map[string]time.Time {
	t.Helper()
	out := map[string]time.Time{}
	for _, d := range dirs {
		ents, err := os.ReadDir(d)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			if info, err := e.Info(); err == nil {
				out[filepath.Join(d, e.Name())] = info.ModTime()
			}
		}
	}
	return out
}

// TestNamespacesDoNotCollide: two namespaces with a Configuration named
// "cams" on two nodes that both see one shared camera and one local device
// get disjoint extended resources, CDI devices (each answered by Allocate
// and resolvable beside the other, which the CDI library refuses for a
// name defined twice) and DRA devices; the agents' writes then stay still
// for 30 s, while a Configuration named "1cams" (not a valid CDI class)
// works through device plugins and DRA beside them.
func TestNamespacesDoNotCollide(t *testing.T) {
	startDRAController(t)
	nsA, nsB, nsC := suite.Namespace(t), suite.Namespace(t), suite.Namespace(t)
	nodes := []string{"ns-node-a", "ns-node-b"}
	regs := map[string]*registrar{}
	cdiDirs := map[string]string{}
	for _, n := range nodes {
		createNode(t, n, true, time.Now())
		regs[n], cdiDirs[n] = startRegistrar(t), t.TempDir()
		a := startAgent(t, n, stateDir(t), withDevicePlugins(regs[n], cdiDirs[n]))
		startScripted(t, a.stateDir, "ns-cams", true, devices("cam-1"))
		startScripted(t, a.stateDir, "ns-usb", false, devices("usb-1"))
	}
	both := func(c *v1alpha1.Configuration) { c.Spec.Allocation = v1alpha1.AllocationBoth }
	for _, ns := range []string{nsA, nsB} {
		createConfiguration(t, ns, "cams", "ns-cams", `{}`, both)
		createConfiguration(t, ns, "usb", "ns-usb", `{}`, both)
	}
	cam := v1alpha1.InstanceName("cams", v1alpha1.DeviceHash("cam-1", true, ""))
	usb := func(node string) string {
		return v1alpha1.InstanceName("usb", v1alpha1.DeviceHash("usb-1", false, node))
	}
	for _, ns := range []string{nsA, nsB} {
		testwait.For(t, 30*time.Second, func() error {
			for _, want := range []instanceView{{Name: cam, DeviceID: "cam-1", Nodes: nodes}} {
				if got := listInstances(t, ns, "cams"); len(got) != 1 || !slices.Equal(got[0].Nodes, want.Nodes) || got[0].Name != want.Name {
					return fmt.Errorf("%s: cams Instances %v, want %v", ns, got, want)
				}
			}
			if got := listInstances(t, ns, "usb"); len(got) != 2 {
				return fmt.Errorf("%s: usb Instances %v, want one per node", ns, got)
			}
			return nil
		})
	}

	// Device plugins: each namespace's resources, on each node.
	for _, n := range nodes {
		var want []string
		for _, ns := range []string{nsA, nsB} {
			want = append(want, v1alpha1.ResourceName(ns, cam), v1alpha1.ResourceName(ns, "cams"), v1alpha1.ResourceName(ns, usb(n)), v1alpha1.ResourceName(ns, "usb"))
		}
		slices.Sort(want)
		testwait.For(t, 30*time.Second, func() error {
			if got := regs[n].resources(); !slices.Equal(got, want) {
				return fmt.Errorf("%s registered %v, want %v", n, got, want)
			}
			return nil
		})
		// CDI: both namespaces' devices resolve, side by side.
		testwait.For(t, 20*time.Second, func() error {
			got, err := cdiResolves(t, cdiDirs[n])
			if err != nil {
				return err
			}
			for _, ns := range []string{nsA, nsB} {
				for _, inst := range []string{cam, usb(n)} {
					if !slices.Contains(got, v1alpha1.CDIName(ns, inst)) {
						return fmt.Errorf("%s: the runtime resolves %v, not %s", n, got, v1alpha1.CDIName(ns, inst))
					}
				}
			}
			return nil
		})
	}
	// Allocate answers each namespace's own CDI device, and each claims
	// its own namespace's slot.
	hash := v1alpha1.InstanceHash(cam)
	for _, ns := range []string{nsA, nsB} {
		if got := allocate(t, regs["ns-node-a"], "ns-node-a", v1alpha1.ResourceName(ns, cam), hash+"-0"); !slices.Equal(got, []string{v1alpha1.CDIName(ns, cam)}) {
			t.Fatalf("%s: Allocate answered %v, want %s", ns, got, v1alpha1.CDIName(ns, cam))
		}
	}
	for _, ns := range []string{nsA, nsB} {
		var inst v1alpha1.Instance
		if err := suite.Client.Get(context.Background(), keyOf(ns, cam), &inst); err != nil {
			t.Fatal(err)
		}
		if len(inst.Status.Slots) != 1 || inst.Status.Slots[0].Resource != v1alpha1.ResourceName(ns, cam) {
			t.Fatalf("%s: slots %+v, want one held through %s", ns, inst.Status.Slots, v1alpha1.ResourceName(ns, cam))
		}
	}
	// DRA: each namespace's pools hold its own devices.
	for _, ns := range []string{nsA, nsB} {
		testwait.For(t, 30*time.Second, func() error {
			pools := map[string]bool{}
			for _, s := range driverSlices(t, ns) {
				for _, d := range s.Spec.Devices {
					if got := *d.Attributes[shareddra.AttrNamespace].StringValue; got != ns {
						return fmt.Errorf("slice %s of pool %s holds a device of namespace %s", s.Name, s.Spec.Pool.Name, got)
					}
				}
				pools[s.Spec.Pool.Name] = true
			}
			want := []string{shareddra.SharedPool(ns, "cams", hash), shareddra.LocalPool("ns-node-a", ns, "usb"), shareddra.LocalPool("ns-node-b", ns, "usb")}
			if got := slices.Sorted(func(yield func(string) bool) {
				for p := range pools {
					if !yield(p) {
						return
					}
				}
			}); !slices.Equal(got, slices.Sorted(slices.Values(want))) {
				return fmt.Errorf("%s: pools %v, want %v", ns, got, want)
			}
			return nil
		})
	}

	// Steady: 30 s without a write to either namespace's Instances,
	// Configurations or slices, nor to a CDI spec; meanwhile "1cams".
	settled := time.Now()
	time.Sleep(2 * time.Second) // writes in flight land
	times := specTimes(t, cdiDirs["ns-node-a"], cdiDirs["ns-node-b"])
	stop := stillness(t, nsA, nsB)
	window := time.After(30 * time.Second)

	createConfiguration(t, nsC, "1cams", "ns-usb", `{}`, both)
	odd := v1alpha1.InstanceName("1cams", v1alpha1.DeviceHash("usb-1", false, "ns-node-a"))
	testwait.For(t, 30*time.Second, func() error {
		got, err := cdiResolves(t, cdiDirs["ns-node-a"])
		if err != nil {
			return err
		}
		if !slices.Contains(got, v1alpha1.CDIName(nsC, odd)) {
			return fmt.Errorf("the runtime resolves %v, not %s", got, v1alpha1.CDIName(nsC, odd))
		}
		if res := regs["ns-node-a"].resources(); !slices.Contains(res, v1alpha1.ResourceName(nsC, odd)) || !slices.Contains(res, v1alpha1.ResourceName(nsC, "1cams")) {
			return fmt.Errorf("registered %v, want %s's resources", res, odd)
		}
		return nil
	})
	if got := allocate(t, regs["ns-node-a"], "ns-node-a", v1alpha1.ResourceName(nsC, "1cams"), v1alpha1.InstanceHash(odd)+"-0"); !slices.Equal(got, []string{v1alpha1.CDIName(nsC, odd)}) {
		t.Fatalf("1cams: Allocate answered %v", got)
	}
	testwait.For(t, 30*time.Second, func() error {
		for _, s := range driverSlices(t, nsC) {
			if s.Spec.Pool.Name == shareddra.LocalPool("ns-node-a", nsC, "1cams") && len(s.Spec.Devices) == 1 && s.Spec.Devices[0].Name == v1alpha1.InstanceHash(odd) {
				return nil
			}
		}
		return fmt.Errorf("no slice of pool %s with %s", shareddra.LocalPool("ns-node-a", nsC, "1cams"), odd)
	})
	var class resourceapi.DeviceClass
	testwait.For(t, 20*time.Second, func() error {
		return suite.Client.Get(context.Background(), keyOf("", shareddra.DeviceClassName(nsC, "1cams")), &class)
	})

	<-window
	events := stop()
	t.Logf("%d writes to the two namespaces' objects in the 30 s after they settled (%s after the last check)", len(events), time.Since(settled).Round(time.Second))
	if len(events) > 0 {
		t.Errorf("the agents kept writing: %v", events)
	}
	for f, before := range times {
		info, err := os.Stat(f)
		if err != nil || !info.ModTime().Equal(before) {
			t.Errorf("CDI spec %s rewritten (%v)", f, err)
		}
	}
}
