package twins

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/framework/testwait"
)

// TestPushMethodValid: a pushMethod the API server lets through but that
// cannot work (a ${NAME} no template filled, a Secret that does not exist)
// makes Valid False naming each field, and the twin works on: the Device
// is sent to its node without that pushMethod. Fixed, the pushMethod is
// sent.
func TestPushMethodValid(t *testing.T) {
	ctx := context.Background()
	ns := suite.Namespace(t)
	edge := ns + "-edge"
	if err := suite.Client.Create(ctx, thermostatModel(ns)); err != nil {
		t.Fatal(err)
	}
	d := device(ns, "pushy", edge, v1alpha1.DeviceProperty{Name: "temperature", PushMethod: &v1alpha1.PushMethod{
		MQTT:      &v1alpha1.PushMethodMQTT{Address: "${MQTT_BROKER}", Topic: "plant/temperature", QoS: 1},
		SecretRef: &corev1.LocalObjectReference{Name: "mqtt-credentials"}}})
	if err := suite.Client.Create(ctx, d); err != nil {
		t.Fatal(err)
	}
	hub := newFakeHub(edge)
	rig := startTwins(t, hub)
	rig.sync.Connected(ctx, edge)
	envs := waitSent(t, hub, edge, "model thermostat", "device pushy", "inventory 1/1")
	if pm := envs[1].GetDeviceUpdate().Device.Properties[0].PushMethod; pm != nil {
		t.Errorf("a pushMethod that cannot work was sent: %v", pm)
	}
	var c *metav1.Condition
	testwait.For(t, 10*time.Second, func() error {
		got, err := getDevice(ns, "pushy")
		if err != nil {
			return err
		}
		if c = meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionDeviceValid); c == nil || c.Status != metav1.ConditionFalse {
			return fmt.Errorf("Valid %+v, want False", c)
		}
		return nil
	})
	for _, want := range []string{"spec.properties[0].pushMethod.mqtt.address", "spec.properties[0].pushMethod.secretRef: Secret " + ns + "/mqtt-credentials does not exist"} {
		if !strings.Contains(c.Message, want) || c.Reason != "InvalidPushMethod" {
			t.Errorf("Valid %s %q: want it to say %q", c.Reason, c.Message, want)
		}
	}

	if err := suite.Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "mqtt-credentials"},
		StringData: map[string]string{"username": "plant", "password": "s3cret"}}); err != nil {
		t.Fatal(err)
	}
	// The controller writes the Device's status meanwhile (the Secret
	// came): read afresh on a conflict, as a person's kubectl edit would.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		got, err := getDevice(ns, "pushy")
		if err != nil {
			return err
		}
		got.Spec.Properties[0].PushMethod.MQTT.Address = "tcp://10.0.0.5:1883"
		return suite.Client.Update(ctx, got)
	}); err != nil {
		t.Fatal(err)
	}
	envs = waitSent(t, hub, edge, "device pushy")
	pm := envs[0].GetDeviceUpdate().Device.Properties[0].PushMethod
	if pm.GetMqtt().GetAddress() != "tcp://10.0.0.5:1883" || pm.GetMqtt().GetQos() != 1 || pm.GetSecretName() != "mqtt-credentials" {
		t.Errorf("pushMethod sent %v, want the broker, qos 1 and the Secret's name", pm)
	}
	testwait.For(t, 10*time.Second, func() error {
		got, err := getDevice(ns, "pushy")
		if err != nil {
			return err
		}
		if !meta.IsStatusConditionTrue(got.Status.Conditions, v1alpha1.ConditionDeviceValid) {
			return fmt.Errorf("conditions %+v, want Valid", got.Status.Conditions)
		}
		return nil
	})
}
