package integration

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/agent"
	"github.com/dowse-dev/dowse/controller"
	shareddra "github.com/dowse-dev/dowse/internal/dra"
	"github.com/dowse-dev/dowse/internal/kubeflags"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/framework/testwait"
)

// startDRAController runs the controller with its DRA part on.
func startDRAController(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- controller.Run(ctx, controller.Config{RESTConfig: rest.CopyConfig(suite.Config), SkipNameValidation: true, NodeGracePeriod: 2 * time.Second,
			Client: kubeflags.Client{QPS: 1000, Burst: 2000}, Serving: kubeflags.Off(), Registerer: prometheus.NewRegistry(), DRA: true}, testr.New(t).WithName("controller"))
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("controller: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("controller did not stop")
		}
	})
}

// withDRA turns the agent's DRA part on, without a kubelet plugin, with
// CDI specs in a directory of the test's.
func withDRA(t *testing.T) agentOption {
	dir := t.TempDir()
	return func(c *agent.Config) {
		c.DRA.Enabled = true
		c.CDISpecDir = dir
	}
}

// driverSlices lists the ResourceSlices of Dowse's driver whose pools
// belong to namespace ns.
func driverSlices(t *testing.T, ns string) []resourceapi.ResourceSlice {
	t.Helper()
	var list resourceapi.ResourceSliceList
	if err := suite.Client.List(context.Background(), &list, client.MatchingFieldsSelector{
		Selector: fields.OneTermEqualSelector(resourceapi.ResourceSliceSelectorDriver, shareddra.DriverName)}); err != nil {
		t.Fatal(err)
	}
	var out []resourceapi.ResourceSlice
	for _, s := range list.Items {
		for _, d := range s.Spec.Devices {
			if pns, _, ok := shareddra.ParseDevice(s.Spec.Pool.Name, d.Name); ok && pns == ns {
				out = append(out, s)
				break
			}
		}
	}
	return out
}

func selectedNodes(s *resourceapi.ResourceSlice) []string {
	if s.Spec.NodeSelector == nil {
		return nil
	}
	var out []string
	for _, term := range s.Spec.NodeSelector.NodeSelectorTerms {
		for _, f := range term.MatchExpressions {
			out = append(out, f.Values...)
		}
	}
	slices.Sort(out)
	return out
}

// TestDRASharedDeviceOneSliceBothNodes: a shared device two agents see is
// one device in one ResourceSlice (published by the controller) whose node
// selector names both nodes; one node losing it, or dying, updates the
// selector; the Configuration's DeviceClass selects its devices; deleting
// the Configuration removes class and slices.
func TestDRASharedDeviceOneSliceBothNodes(t *testing.T) {
	ns := suite.Namespace(t)
	startDRAController(t)
	createNode(t, "dra-node-a", true, time.Now())
	nodeB := createNode(t, "dra-node-b", true, time.Now())
	a := startAgent(t, "dra-node-a", stateDir(t), withDRA(t))
	b := startAgent(t, "dra-node-b", stateDir(t), withDRA(t))
	startScripted(t, a.stateDir, "scripted", true, devices("cam-1"))
	hb := startScripted(t, b.stateDir, "scripted", true, devices("cam-1"))
	cfg := createConfiguration(t, ns, "cams", "scripted", `{}`, func(c *v1alpha1.Configuration) {
		c.Spec.Allocation = v1alpha1.AllocationDRA
		c.Spec.Capacity = 2
		c.Spec.BrokerProperties = map[string]string{"MODEL": "x1", "PORT": "554"}
	})
	className := shareddra.DeviceClassName(ns, "cams")
	testwait.For(t, 20*time.Second, func() error {
		var class resourceapi.DeviceClass
		if err := suite.Client.Get(context.Background(), client.ObjectKey{Name: className}, &class); err != nil {
			return err
		}
		if len(class.Spec.Selectors) != 1 || class.Spec.Selectors[0].CEL == nil || class.Spec.Selectors[0].CEL.Expression != shareddra.ClassSelector(ns, "cams") {
			return fmt.Errorf("class selectors %+v", class.Spec.Selectors)
		}
		return nil
	})
	hash := v1alpha1.DeviceHash("cam-1", true, "")
	expectSlice := func(nodes ...string) {
		t.Helper()
		testwait.For(t, 20*time.Second, func() error {
			got := driverSlices(t, ns)
			if len(got) != 1 {
				return fmt.Errorf("%d slices", len(got))
			}
			s := got[0]
			if s.Spec.Pool.Name != shareddra.SharedPool(ns, "cams", hash) || s.Spec.NodeName != nil || s.Spec.Pool.ResourceSliceCount != 1 {
				return fmt.Errorf("pool %+v nodeName %v", s.Spec.Pool, s.Spec.NodeName)
			}
			if len(s.Spec.Devices) != 1 || s.Spec.Devices[0].Name != hash {
				return fmt.Errorf("devices %+v", s.Spec.Devices)
			}
			d := s.Spec.Devices[0]
			if v := d.Attributes["PORT"].IntValue; v == nil || *v != 554 {
				return fmt.Errorf("PORT %+v", d.Attributes["PORT"])
			}
			if v := d.Attributes["MODEL"].StringValue; v == nil || *v != "x1" {
				return fmt.Errorf("MODEL %+v", d.Attributes["MODEL"])
			}
			if c := d.Capacity[shareddra.CapacitySlots]; c.Value.Value() != 2 || d.AllowMultipleAllocations == nil || !*d.AllowMultipleAllocations {
				return fmt.Errorf("capacity %+v, multiple %v", d.Capacity, d.AllowMultipleAllocations)
			}
			if got := selectedNodes(&s); !reflect.DeepEqual(got, nodes) {
				return fmt.Errorf("nodes %v, want %v", got, nodes)
			}
			// Owned by the class, so that deleting the classes (the
			// controller gone) takes the slices too.
			if len(s.OwnerReferences) != 1 || s.OwnerReferences[0].Kind != "DeviceClass" || s.OwnerReferences[0].Name != className {
				return fmt.Errorf("owners %+v, want DeviceClass %s", s.OwnerReferences, className)
			}
			return nil
		})
	}
	expectSlice("dra-node-a", "dra-node-b")
	hb.set(nil)
	expectSlice("dra-node-a")
	hb.set(devices("cam-1"))
	expectSlice("dra-node-a", "dra-node-b")
	// Node b dies (its agent stops, the Node is NotReady past the grace
	// period): the controller removes it from the Instance, and the
	// selector follows.
	b.stop()
	setReady(t, nodeB, false, time.Now().Add(-time.Minute))
	expectSlice("dra-node-a")

	deleteConfiguration(t, cfg)
	testwait.For(t, 20*time.Second, func() error {
		if n := len(driverSlices(t, ns)); n != 0 {
			return fmt.Errorf("%d slices left", n)
		}
		err := suite.Client.Get(context.Background(), client.ObjectKey{Name: className}, &resourceapi.DeviceClass{})
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("class: %w", err)
		}
		return nil
	})
}

// TestDRALocalDevicesOnePoolPerNode: each agent publishes its node's local
// devices in a pool of its own (spec.nodeName), a device that vanishes
// leaves it, the Configuration going takes the slices with it, and a
// DevicePlugin Configuration publishes nothing.
func TestDRALocalDevicesOnePoolPerNode(t *testing.T) {
	ns := suite.Namespace(t)
	createNode(t, "dra-node-c", true, time.Now())
	createNode(t, "dra-node-d", true, time.Now())
	c := startAgent(t, "dra-node-c", stateDir(t), withDRA(t))
	d := startAgent(t, "dra-node-d", stateDir(t), withDRA(t))
	hc := startScripted(t, c.stateDir, "scripted", false, devices("usb-1", "usb-2"))
	startScripted(t, d.stateDir, "scripted", false, devices("usb-1"))
	cfg := createConfiguration(t, ns, "usb", "scripted", `{}`, func(c *v1alpha1.Configuration) { c.Spec.Allocation = v1alpha1.AllocationBoth })
	createConfiguration(t, ns, "plain", "scripted", `{}`)
	expect := func(want map[string][]string) {
		t.Helper()
		testwait.For(t, 20*time.Second, func() error {
			got := map[string][]string{}
			for _, s := range driverSlices(t, ns) {
				if s.Spec.NodeName == nil || s.Spec.Pool.Name != shareddra.LocalPool(*s.Spec.NodeName, ns, "usb") {
					return fmt.Errorf("slice %s: node %v pool %s", s.Name, s.Spec.NodeName, s.Spec.Pool.Name)
				}
				for _, dev := range s.Spec.Devices {
					got[*s.Spec.NodeName] = append(got[*s.Spec.NodeName], dev.Name)
				}
			}
			for _, v := range got {
				slices.Sort(v)
			}
			if !reflect.DeepEqual(got, want) {
				return fmt.Errorf("devices %v, want %v", got, want)
			}
			return nil
		})
	}
	h := func(id, node string) string { return v1alpha1.DeviceHash(id, false, node) }
	sorted := func(s ...string) []string { slices.Sort(s); return s }
	expect(map[string][]string{
		"dra-node-c": sorted(h("usb-1", "dra-node-c"), h("usb-2", "dra-node-c")),
		"dra-node-d": {h("usb-1", "dra-node-d")},
	})
	hc.set(devices("usb-2"))
	expect(map[string][]string{
		"dra-node-c": {h("usb-2", "dra-node-c")},
		"dra-node-d": {h("usb-1", "dra-node-d")},
	})
	deleteConfiguration(t, cfg)
	expect(map[string][]string{})
}
