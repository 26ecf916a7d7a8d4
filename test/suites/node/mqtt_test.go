package node

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/discovery-handlers/mqtt"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/framework/cluster"
	"github.com/dowse-dev/dowse/test/framework/procs"
	"github.com/dowse-dev/dowse/test/peers/mosquitto"
	"github.com/dowse-dev/dowse/test/peers/npmpeer"
)

// mqttMapperImage is the MQTT mapper's image, loaded into the node.
var mqttMapperImage = [2]string{"./mappers/mqtt/cmd/dowse-mqtt-mapper", "ghcr.io/dowse-dev/dowse-mqtt-mapper:latest"}

// testMQTTMapperPod proves on the real node that the MQTT mapper runs as the
// Pod the controller makes from samples/mqtt-pumps.yaml: Debian's mosquitto
// with a login, an Eclipse Tahu edge node (npm sparkplug-client) with a pump,
// the MQTT discovery handler (in the test's process, registered with the
// chart's agent) finding it; the mapper Pod reads the broker's login from
// the sample's Secret volume, the pump's data reach Device.status and a
// desired value reaches Tahu as a DCMD. It runs on TestChartOnNode's
// cluster and removes what it made.
func testMQTTMapperPod(t *testing.T, ctx context.Context, c *cluster.Cluster, cl client.Client, stateDir string) {
	const user, password = "plant", "mapper-pass-1"
	b := mosquitto.StartWithUsers(t, map[string]string{user: password})
	node := npmpeer.StartSparkplug(t, "tahu-line1", npmpeer.SparkplugConfig{ServerURL: b.Addr(), GroupID: "Plant1", EdgeNode: "Line1",
		Username: user, Password: password,
		Devices: map[string][]npmpeer.SparkplugMetric{"Pump1": {{Name: "Temperature", Type: "Double", Value: 21.5}, {Name: "Speed", Type: "Int32", Value: 1450}}}})

	hcfg := mqtt.Handler()
	hcfg.StateDir, hcfg.Logger = stateDir, testr.New(t).WithName("mqtt")
	serveHandler(t, ctx, hcfg)

	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "mqtt-credentials", Namespace: "default"},
		StringData: map[string]string{"user": user, "password": password}}
	if err := cl.Create(ctx, secret); err != nil {
		t.Fatal(err)
	}
	model := loadModel(t, "mqtt-pump-model.yaml")
	if err := cl.Create(ctx, model); err != nil {
		t.Fatal(err)
	}
	pumps := loadSample(t, "mqtt-pumps.yaml")
	var details map[string]any
	if err := json.Unmarshal(pumps.Spec.DiscoveryHandler.DiscoveryDetails.Raw, &details); err != nil {
		t.Fatal(err)
	}
	details["broker"] = b.Addr()
	// Tahu's node was born before the handler listened.
	details["sparkplug"].(map[string]any)["requestRebirth"] = true
	pumps.Spec.DiscoveryHandler.DiscoveryDetails.Raw, _ = json.Marshal(details)
	mport, err := procs.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	mapperPod := pumps.Spec.DeviceTemplate.MapperPodSpec
	mapperPod.HostNetwork = true // the node has no pod network; the broker is on its loopback
	mc := &mapperPod.Containers[0]
	mc.Args = []string{fmt.Sprintf("--metrics-address=127.0.0.1:%d", mport)}
	mc.Ports = []corev1.ContainerPort{{Name: "metrics", ContainerPort: int32(mport)}}
	mc.ImagePullPolicy = corev1.PullNever
	if err := cl.Create(ctx, pumps); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		deleteMapped(t, ctx, cl, pumps)
		_ = cl.Delete(context.Background(), model)
		_ = cl.Delete(context.Background(), secret)
	})

	// The pump's data reach Device.status through the mapper Pod.
	temp := 22.0
	var dev v1alpha1.Device
	eventuallyNode(t, ctx, 3*time.Minute, func() error {
		temp += 0.25
		node.Do(t, map[string]any{"op": "ddata", "device": "Pump1", "metrics": []npmpeer.SparkplugMetric{{Name: "Temperature", Type: "Double", Value: temp}}})
		var list v1alpha1.DeviceList
		if err := cl.List(ctx, &list, client.InNamespace("default")); err != nil {
			return err
		}
		if len(list.Items) != 1 {
			return fmt.Errorf("%d Devices, want the pump's one", len(list.Items))
		}
		dev = list.Items[0]
		if rep, _ := dev.Twin("temperature").Values(); rep != "" {
			return nil
		}
		return fmt.Errorf("no temperature reported yet: %+v", dev.Status.Twins)
	})

	// The mapper is the controller's Pod, unprivileged, its login from the
	// Secret's volume.
	var pods corev1.PodList
	if err := cl.List(ctx, &pods, client.InNamespace("default"), client.MatchingLabels{v1alpha1.LabelMapper: "true"}); err != nil || len(pods.Items) != 1 {
		t.Fatalf("mapper pods: %d (%v), want one", len(pods.Items), err)
	}
	pod := pods.Items[0]
	if pod.Status.Phase != corev1.PodRunning || pod.Spec.Containers[0].Image != mqttMapperImage[1] {
		t.Fatalf("mapper pod %s: %s, image %s", pod.Name, pod.Status.Phase, pod.Spec.Containers[0].Image)
	}
	for _, ctr := range pod.Spec.Containers {
		if sc := ctr.SecurityContext; sc != nil && sc.Privileged != nil && *sc.Privileged {
			t.Fatalf("the mapper container %s is privileged", ctr.Name)
		}
	}
	if !slices.ContainsFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Secret != nil && v.Secret.SecretName == secret.Name }) {
		t.Fatalf("the mapper pod has no volume of Secret %s: %+v", secret.Name, pod.Spec.Volumes)
	}

	// A desired value is a DCMD the edge node receives.
	from := node.Lines()
	i := slices.IndexFunc(dev.Spec.Properties, func(p v1alpha1.DeviceProperty) bool { return p.Name == "speed" })
	patch := fmt.Sprintf(`[{"op":"add","path":"/spec/properties/%d/desired","value":{"value":"1200"}}]`, i)
	if err := cl.Patch(ctx, &dev, client.RawPatch(types.JSONPatchType, []byte(patch))); err != nil {
		t.Fatal(err)
	}
	if ms := node.WaitCommand(t, "Pump1", from, time.Minute); len(ms) != 1 || ms[0].Name != "Speed" || ms[0].Type != "Int32" || ms[0].Value != float64(1200) {
		t.Errorf("DCMD %+v, want Speed Int32 1200", ms)
	}
	t.Logf("mapper pod %s (image %s) logged in with the Secret's login: temperature reported, desired speed 1200 sent as a DCMD", pod.Name, mqttMapperImage[1])
}
