package twins

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/controller/mappers"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/testwait"
)

func mapperPods(t *testing.T, ns string) map[string]corev1.Pod {
	t.Helper()
	var pods corev1.PodList
	if err := suite.Client.List(context.Background(), &pods, client.InNamespace(ns), client.MatchingLabels{mappers.LabelMapper: "true"}); err != nil {
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
	if env[mappers.EnvMapperName] != "plc" || env[mappers.EnvStateDir] != mappers.DefaultStateDir {
		t.Errorf("env %v: want the Configuration's name and the state directory", env)
	}
	hostPath := ""
	for _, v := range p.Spec.Volumes {
		if v.HostPath != nil {
			hostPath = v.HostPath.Path
		}
	}
	if hostPath != mappers.DefaultStateDir || !metav1.IsControlledBy(&p, cfg) {
		t.Errorf("volumes %v, owners %v: want the state directory mounted and the Configuration as owner", p.Spec.Volumes, p.OwnerReferences)
	}

	// node-a no longer sees its only device: the Device moves, the Pod goes.
	setNodes(t, a, "node-b")
	testwait.For(t, 20*time.Second, func() error {
		if got := nodesOf(mapperPods(t, ns)); !slices.Equal(got, []string{"node-b"}) {
			return fmt.Errorf("mapper pods on %v, want node-b only", got)
		}
		return nil
	})
	// A new image replaces the Pod.
	updateConfiguration(t, cfg, func(c *v1alpha1.Configuration) {
		c.Spec.DeviceTemplate.MapperPodSpec.Containers[0].Image = "ghcr.io/dowse-dev/dowse-modbus-mapper:v2"
	})
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
