package twins

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/mappers/mapper"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/shared/handler"
	"github.com/dowse-dev/dowse/test/framework/testwait"
)

func mapperPods(t *testing.T, ns string) map[string]corev1.Pod {
	t.Helper()
	var pods corev1.PodList
	if err := suite.Client.List(context.Background(), &pods, client.InNamespace(ns), client.MatchingLabels{v1alpha1.LabelMapper: "true"}); err != nil {
		t.Fatal(err)
	}
	out := map[string]corev1.Pod{}
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			out[p.Spec.NodeName] = p
		}
	}
	return out
}

func nodesOf(pods map[string]corev1.Pod) []string {
	var out []string
	for n := range pods {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// TestMapperPodsFollowDevices: a deviceTemplate with a mapperPodSpec gets
// one mapper Pod per node that owns its Devices, pinned there, with the
// state directory and its registration name; a node that owns none loses
// its Pod; a template change replaces them.
func TestMapperPodsFollowDevices(t *testing.T) {
	ctx := context.Background()
	ns := suite.Namespace(t)
	// No controller manager here makes the default ServiceAccount.
	if err := suite.Client.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "default"}}); err != nil {
		t.Fatal(err)
	}
	if err := suite.Client.Create(ctx, thermostatModel(ns)); err != nil {
		t.Fatal(err)
	}
	cfg := templateConfiguration(ns, "plc", "502")
	cfg.Spec.DeviceTemplate.MapperPodSpec = &corev1.PodSpec{Containers: []corev1.Container{{Name: "mapper", Image: "ghcr.io/dowse-dev/dowse-modbus-mapper:v1"}}}
	if err := suite.Client.Create(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	startController(t)
	a := createInstance(t, ns, "plc", "plc-a", nil, "node-a")
	createInstance(t, ns, "plc", "plc-b", nil, "node-b")
	createInstance(t, ns, "plc", "plc-b2", nil, "node-b")

	var pods map[string]corev1.Pod
	testwait.For(t, 20*time.Second, func() error {
		pods = mapperPods(t, ns)
		if got := nodesOf(pods); !slices.Equal(got, []string{"node-a", "node-b"}) {
			return fmt.Errorf("mapper pods on %v, want node-a and node-b", got)
		}
		return nil
	})
	p := pods["node-a"]
	env := map[string]string{}
	for _, e := range p.Spec.Containers[0].Env {
		env[e.Name] = e.Value
	}
	if env[mapper.NameEnv] != "plc" || env[handler.StateDirEnv] != handler.DefaultStateDir {
		t.Errorf("env %v: want the Configuration's name and the state directory", env)
	}
	hostPath := ""
	for _, v := range p.Spec.Volumes {
		if v.HostPath != nil {
			hostPath = v.HostPath.Path
		}
	}
	if hostPath != handler.DefaultStateDir+"/dmi" || !metav1.IsControlledBy(&p, cfg) {
		t.Errorf("volumes %v, owners %v: want the DMI socket folder alone mounted and the Configuration as owner", p.Spec.Volumes, p.OwnerReferences)
	}

	// node-a no longer sees its only device: the Device moves, the Pod goes.
	setNodes(t, a, "node-b")
	testwait.For(t, 20*time.Second, func() error {
		if got := nodesOf(mapperPods(t, ns)); !slices.Equal(got, []string{"node-b"}) {
			return fmt.Errorf("mapper pods on %v, want node-b only", got)
		}
		return nil
	})
	// A mapper Pod that ended (the kubelet refused it: its host ports were
	// taken, say) is made again.
	failed := mapperPods(t, ns)["node-b"]
	failed.Status.Phase = corev1.PodFailed
	if err := suite.Client.Status().Update(ctx, &failed); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 20*time.Second, func() error {
		p, ok := mapperPods(t, ns)["node-b"]
		if !ok || p.UID == failed.UID || p.Status.Phase == corev1.PodFailed {
			return fmt.Errorf("node-b's failed mapper pod %s not made again", failed.Name)
		}
		return nil
	})
	// A new image replaces the Pod, the old one first: beside it, the new
	// one would find its host ports and its mapper name taken.
	old := mapperPods(t, ns)["node-b"]
	updateConfiguration(t, cfg, func(c *v1alpha1.Configuration) {
		c.Spec.DeviceTemplate.MapperPodSpec.Containers[0].Image = "ghcr.io/dowse-dev/dowse-modbus-mapper:v2"
	})
	goesFirst(t, ns, "node-b", &old)
	testwait.For(t, 20*time.Second, func() error {
		pods := mapperPods(t, ns)
		if p, ok := pods["node-b"]; !ok || p.Spec.Containers[0].Image != "ghcr.io/dowse-dev/dowse-modbus-mapper:v2" {
			return fmt.Errorf("node-b's mapper pod %v not replaced", pods["node-b"].Spec.Containers)
		}
		return nil
	})
	// Without a mapper in the template, no Pod.
	updateConfiguration(t, cfg, func(c *v1alpha1.Configuration) { c.Spec.DeviceTemplate.MapperPodSpec = nil })
	testwait.For(t, 20*time.Second, func() error {
		if got := nodesOf(mapperPods(t, ns)); len(got) != 0 {
			return fmt.Errorf("mapper pods left on %v", got)
		}
		return nil
	})
}

// goesFirst checks that node's old mapper Pod is being deleted and that no
// new one comes beside it, then finishes its deletion as the kubelet would
// once its containers stopped (no kubelet runs here).
func goesFirst(t *testing.T, ns, node string, old *corev1.Pod) {
	t.Helper()
	ctx := context.Background()
	testwait.For(t, 20*time.Second, func() error {
		var cur corev1.Pod
		if err := suite.Client.Get(ctx, client.ObjectKeyFromObject(old), &cur); err != nil || cur.DeletionTimestamp == nil {
			return fmt.Errorf("old mapper pod not being deleted (%w)", err)
		}
		return nil
	})
	time.Sleep(2 * time.Second)
	if p, ok := mapperPods(t, ns)[node]; ok {
		t.Fatalf("a new mapper pod %s beside the terminating one", p.Name)
	}
	if err := suite.Client.Delete(ctx, old, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
}

// updateConfiguration changes cfg's spec as a person would, read afresh and
// retried on conflict: the controller writes its status meanwhile.
func updateConfiguration(t *testing.T, cfg *v1alpha1.Configuration, change func(*v1alpha1.Configuration)) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var cur v1alpha1.Configuration
		if err := suite.Client.Get(context.Background(), client.ObjectKeyFromObject(cfg), &cur); err != nil {
			return err
		}
		change(&cur)
		return suite.Client.Update(context.Background(), &cur)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// createSerialInstance is a local Instance with a device node, as the udev
// handler makes for a serial port.
func createSerialInstance(t *testing.T, ns, cfg, name, node string) *v1alpha1.Instance {
	t.Helper()
	inst := &v1alpha1.Instance{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: v1alpha1.InstanceSpec{ConfigurationName: cfg, DeviceID: "/devices/" + name, Capacity: 1,
			DeviceSpecs: []v1alpha1.DeviceNode{{HostPath: "/dev/tty" + name, ContainerPath: "/dev/tty" + name}}},
		Status: v1alpha1.InstanceStatus{Nodes: []v1alpha1.InstanceNode{{Name: node}}},
	}
	if err := suite.Client.Create(context.Background(), inst); err != nil {
		t.Fatal(err)
	}
	return inst
}

// TestMapperPodsGetSerialDevices: a mapper whose Devices' Instances have
// device nodes (serial ports) asks for one slot of each Instance, the way
// a broker does (its extended resource; a claim from its template with
// DRA), not a hostPath; a second port on the node replaces the Pod
// delete-first (the new one would wait for the slot the old one holds).
func TestMapperPodsGetSerialDevices(t *testing.T) {
	ctx := context.Background()
	startController(t)
	for _, alloc := range []v1alpha1.Allocation{v1alpha1.AllocationDevicePlugin, v1alpha1.AllocationDRA} {
		t.Run(string(alloc), func(t *testing.T) {
			ns := suite.Namespace(t)
			if err := suite.Client.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "default"}}); err != nil {
				t.Fatal(err)
			}
			if err := suite.Client.Create(ctx, thermostatModel(ns)); err != nil {
				t.Fatal(err)
			}
			cfg := templateConfiguration(ns, "rtu", "502")
			cfg.Spec.Allocation = alloc
			cfg.Spec.DeviceTemplate.MapperPodSpec = &corev1.PodSpec{Containers: []corev1.Container{{Name: "mapper", Image: "ghcr.io/dowse-dev/dowse-modbus-mapper:v1"}}}
			if err := suite.Client.Create(ctx, cfg); err != nil {
				t.Fatal(err)
			}
			first := createSerialInstance(t, ns, "rtu", "rtu-usb0", "node-s")
			createInstance(t, ns, "rtu", "rtu-net", nil, "node-s") // a network device: nothing to open
			asks := func(p corev1.Pod) []string {
				if len(p.Spec.Containers) == 0 {
					return nil
				}
				var out []string
				for res := range p.Spec.Containers[0].Resources.Limits {
					out = append(out, string(res))
				}
				for _, c := range p.Spec.ResourceClaims {
					out = append(out, "claim:"+*c.ResourceClaimTemplateName)
				}
				slices.Sort(out)
				return out
			}
			want := func(insts ...*v1alpha1.Instance) []string {
				var out []string
				for _, i := range insts {
					if alloc == v1alpha1.AllocationDRA {
						out = append(out, "claim:"+i.Name)
					} else {
						out = append(out, i.ResourceName())
					}
				}
				slices.Sort(out)
				return out
			}
			// A Pod made before the controller saw the Instance's device
			// nodes is replaced delete-first: play the kubelet's part (none
			// runs here) and finish the deletion of a terminating one.
			finishDeletions := func() {
				var pods corev1.PodList
				if err := suite.Client.List(ctx, &pods, client.InNamespace(ns)); err != nil {
					return
				}
				for i := range pods.Items {
					if pods.Items[i].DeletionTimestamp != nil {
						_ = suite.Client.Delete(ctx, &pods.Items[i], client.GracePeriodSeconds(0))
					}
				}
			}
			var old corev1.Pod
			testwait.For(t, 20*time.Second, func() error {
				finishDeletions()
				p, ok := mapperPods(t, ns)["node-s"]
				if !ok || !slices.Equal(asks(p), want(first)) {
					return fmt.Errorf("node-s's mapper pod asks for %v, want %v", asks(p), want(first))
				}
				old = p
				return nil
			})
			if alloc == v1alpha1.AllocationDRA {
				if err := suite.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: first.Name}, &resourceapi.ResourceClaimTemplate{}); err != nil {
					t.Fatalf("the Instance's claim template: %v", err)
				}
				if len(old.Spec.Containers[0].Resources.Claims) != 1 {
					t.Fatalf("the mapper container uses claims %v", old.Spec.Containers[0].Resources.Claims)
				}
			}
			for _, v := range old.Spec.Volumes {
				if v.HostPath != nil && v.HostPath.Path != handler.DefaultStateDir+"/dmi" {
					t.Fatalf("a hostPath %s besides the DMI socket folder", v.HostPath.Path)
				}
			}
			second := createSerialInstance(t, ns, "rtu", "rtu-usb1", "node-s")
			// The old Pod is deleted, and no new one comes while it is
			// there (no kubelet here finishes the deletion).
			goesFirst(t, ns, "node-s", &old)
			testwait.For(t, 20*time.Second, func() error {
				p, ok := mapperPods(t, ns)["node-s"]
				if !ok || !slices.Equal(asks(p), want(first, second)) {
					return fmt.Errorf("node-s's mapper pod asks for %v, want %v", asks(p), want(first, second))
				}
				return nil
			})
		})
	}
}
