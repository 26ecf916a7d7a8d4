package e2e

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/framework/testwait"
	"github.com/dowse-dev/dowse/test/peers/mosquitto"
	"github.com/dowse-dev/dowse/test/peers/npmpeer"
)

const mqttTwinManifest = `apiVersion: dowse.dev/v1alpha1
kind: DeviceModel
metadata: {name: pump, namespace: default}
spec:
  protocol: mqtt
  properties:
    - {name: temperature, type: DOUBLE, accessMode: ReadOnly, visitors: {protocolName: mqtt, configData: {metric: Temperature}}}
    - {name: speed, type: INT, accessMode: ReadWrite, minimum: "0", maximum: "3000",
       visitors: {protocolName: mqtt, configData: {metric: Speed, datatype: Int32}}}
---
apiVersion: dowse.dev/v1alpha1
kind: Configuration
metadata: {name: pumps, namespace: default}
spec:
  discoveryHandler:
    name: mqtt
    discoveryDetails: {broker: "%s", sparkplug: {groups: [Plant], devicesOnly: true, requestRebirth: true}}
  deviceTemplate:
    deviceModelRef: {name: pump}
    protocol:
      protocolName: mqtt
      configData: {broker: "${MQTT_BROKER}", source: "${MQTT_SOURCE}", group: "${MQTT_SPARKPLUG_GROUP}",
                   edgeNode: "${MQTT_SPARKPLUG_EDGE_NODE}", device: "${MQTT_SPARKPLUG_DEVICE}"}
    properties:
      - {name: temperature, reportCycle: 10s}
      - {name: speed, reportCycle: 10s}
`

// TestMQTTTwinEndToEnd: a Sparkplug B device of an Eclipse Tahu edge node
// (npm sparkplug-client) on Debian's mosquitto, found by
// dowse-mqtt-discovery, becomes an Instance and a Device; the agent hands
// the Device to dowse-mqtt-mapper over DMI; the device's data come back as
// reported values in Device.status, a desired value set on the Device
// arrives at Tahu as a DCMD, and the device's DDEATH makes its Instance
// vanish. All real binaries, with the controller's link.
func TestMQTTTwinEndToEnd(t *testing.T) {
	npmpeer.SparkplugModules(t)
	b := mosquitto.Start(t)
	c := startCloud(t, "--twin-status-interval", "500ms")
	ctx := context.Background()
	_, state, _ := c.joinAgent("edge-1", "")
	c.start("dowse-mqtt-discovery", "mqtt-discovery", "--state-dir", state)
	c.start("dowse-mqtt-mapper", "mqtt-mapper", "--state-dir", state, "--name", "pumps")
	c.apply(t, fmt.Sprintf(mqttTwinManifest, b.Addr()))
	node := npmpeer.StartSparkplug(t, "tahu-line1", npmpeer.SparkplugConfig{ServerURL: b.Addr(), GroupID: "Plant", EdgeNode: "Line1",
		Devices: map[string][]npmpeer.SparkplugMetric{"Pump1": {{Name: "Temperature", Type: "Double", Value: 21.5}, {Name: "Speed", Type: "Int32", Value: 1450}}}})

	// The node was born before anyone listened: its data make the handler
	// ask for a rebirth (requestRebirth), and the mapper takes the values.
	temp := 22.0
	var dev v1alpha1.Device
	testwait.For(t, 90*time.Second, func() error {
		temp += 0.25
		node.Do(t, map[string]any{"op": "ddata", "device": "Pump1", "metrics": []npmpeer.SparkplugMetric{{Name: "Temperature", Type: "Double", Value: temp}}})
		var list v1alpha1.DeviceList
		if err := c.client.List(ctx, &list, client.InNamespace("default")); err != nil {
			return err
		}
		if len(list.Items) != 1 {
			return fmt.Errorf("%d Devices, want the Sparkplug device's one", len(list.Items))
		}
		dev = list.Items[0]
		if rep, _ := dev.Twin("temperature").Values(); rep == "" {
			return fmt.Errorf("no temperature reported yet; status %+v", dev.Status)
		}
		return nil
	})
	if dev.Spec.NodeName != "edge-1" {
		t.Errorf("device node %q, want edge-1", dev.Spec.NodeName)
	}
	// The data follow the peer.
	temp = 30.5
	node.Do(t, map[string]any{"op": "ddata", "device": "Pump1", "metrics": []npmpeer.SparkplugMetric{{Name: "Temperature", Type: "Double", Value: temp}}})
	testwait.For(t, 30*time.Second, func() error {
		var d v1alpha1.Device
		if err := c.client.Get(ctx, client.ObjectKeyFromObject(&dev), &d); err != nil {
			return err
		}
		if rep, _ := d.Twin("temperature").Values(); rep != "30.5" {
			return fmt.Errorf("temperature reported %q, want 30.5", rep)
		}
		return nil
	})

	// A desired value is a DCMD the edge node receives.
	from := node.Lines()
	i := slices.IndexFunc(dev.Spec.Properties, func(p v1alpha1.DeviceProperty) bool { return p.Name == "speed" })
	patch := fmt.Sprintf(`[{"op":"add","path":"/spec/properties/%d/desired","value":{"value":"1200"}}]`, i)
	if err := c.client.Patch(ctx, &dev, client.RawPatch(types.JSONPatchType, []byte(patch))); err != nil {
		t.Fatal(err)
	}
	if ms := node.WaitCommand(t, "Pump1", from, 60*time.Second); len(ms) != 1 || ms[0].Name != "Speed" || ms[0].Type != "Int32" || ms[0].Value != float64(1200) {
		t.Errorf("DCMD %+v, want Speed Int32 1200", ms)
	}
	node.Do(t, map[string]any{"op": "ddata", "device": "Pump1", "metrics": []npmpeer.SparkplugMetric{{Name: "Speed", Type: "Int32", Value: 1200}}})
	testwait.For(t, 30*time.Second, func() error {
		var d v1alpha1.Device
		if err := c.client.Get(ctx, client.ObjectKeyFromObject(&dev), &d); err != nil {
			return err
		}
		if rep, obs := d.Twin("speed").Values(); rep != "1200" || obs != "1200" {
			return fmt.Errorf("speed reported %q, observedDesired %q, want 1200", rep, obs)
		}
		return nil
	})

	// Its death certificate: the Instance goes.
	node.Do(t, map[string]any{"op": "ddeath", "device": "Pump1"})
	testwait.For(t, 60*time.Second, func() error {
		var list v1alpha1.InstanceList
		if err := c.client.List(ctx, &list, client.InNamespace("default")); err != nil {
			return err
		}
		if len(list.Items) != 0 {
			return fmt.Errorf("%d Instances after the DDEATH, want none", len(list.Items))
		}
		return nil
	})
}
