//go:build linux

package integration

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/discovery-handlers/mqtt"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/shared/handler/handlertest"
	"github.com/dowse-dev/dowse/test/framework/testwait"
	"github.com/dowse-dev/dowse/test/peers/mosquitto"
	"github.com/dowse-dev/dowse/test/peers/npmpeer"
)

// TestMQTTDevicesBecomeInstances runs the real MQTT handler beside an agent
// and the controller against Debian's mosquitto requiring a login, with an
// Eclipse Tahu edge node (npm sparkplug-client) and a Home Assistant config
// published retained by mosquitto_pub: a Configuration whose login comes
// from a Secret gets an Instance for the edge node, its device and the
// entity, with their properties; a DDEATH and then the node's will
// (NDEATH) make them vanish. One with a wrong password gets none, and its
// node's status says the broker refused it.
func TestMQTTDevicesBecomeInstances(t *testing.T) {
	npmpeer.SparkplugModules(t)
	b := mosquitto.StartWithUsers(t, map[string]string{"dowse": "pass-1", "edge": "edge-pass"})
	ctx := context.Background()
	ns := suite.Namespace(t)
	startController(t, time.Minute)
	dir := stateDir(t)
	const node = "mqtt-node"
	startAgent(t, node, dir)
	cfg := mqtt.Handler()
	cfg.StateDir, cfg.Logger = dir, testr.New(t).WithName("mqtt")
	handlertest.Serve(t, cfg)

	for name, pass := range map[string]string{"mqtt-ok": "pass-1", "mqtt-wrong": "pass-2"} {
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Data: map[string][]byte{"user": []byte("dowse"), "password": []byte(pass)}}
		if err := suite.Client.Create(ctx, sec); err != nil {
			t.Fatal(err)
		}
	}
	creds := func(secret string) func(*v1alpha1.Configuration) {
		ref := func(key string) *v1alpha1.DiscoveryPropertySource {
			return &v1alpha1.DiscoveryPropertySource{SecretKeyRef: &v1alpha1.ObjectKeyRef{Name: secret, Key: key}}
		}
		return func(c *v1alpha1.Configuration) {
			c.Spec.DiscoveryHandler.DiscoveryProperties = []v1alpha1.DiscoveryProperty{
				{Name: mqtt.UsernameProperty, ValueFrom: ref("user")}, {Name: mqtt.PasswordProperty, ValueFrom: ref("password")}}
		}
	}
	// A Home Assistant entity announced before anyone listens (retained).
	b.PublishAs(t, "edge", "edge-pass", "homeassistant/switch/relay7/config", []byte(`{"name": "Relay", "stat_t": "relay7/state",
		"cmd_t": "relay7/set", "dev": {"ids": ["relay7"], "mf": "Acme"}}`), true)
	details := fmt.Sprintf(`{"broker": %q, "sparkplug": {"groups": ["Plant"]}, "homeAssistant": {}}`, b.Addr())
	createConfiguration(t, ns, "plant", mqtt.DefaultName, details, creds("mqtt-ok"))
	wrong := createConfiguration(t, ns, "plant-wrong", mqtt.DefaultName, details, creds("mqtt-wrong"))
	// Subscribed once the retained entity is an Instance: births after it
	// are seen.
	expectCount(t, ns, "plant", 1, 30*time.Second)

	edge := npmpeer.StartSparkplug(t, "tahu-line1", npmpeer.SparkplugConfig{ServerURL: b.Addr(), GroupID: "Plant", EdgeNode: "Line1",
		Username: "edge", Password: "edge-pass",
		Devices: map[string][]npmpeer.SparkplugMetric{"Pump1": {{Name: "Temperature", Type: "Double", Value: 21.5}}}})
	want := func(ids ...string) {
		t.Helper()
		slices.Sort(ids)
		testwait.For(t, 30*time.Second, func() error {
			var got []string
			for _, i := range listInstances(t, ns, "plant") {
				got = append(got, i.DeviceID)
			}
			slices.Sort(got)
			if !slices.Equal(got, ids) {
				return fmt.Errorf("Instances of devices %q, want %q", got, ids)
			}
			return nil
		})
	}
	const relay, line, pump = "homeassistant/switch/relay7", "spBv1.0/Plant/Line1", "spBv1.0/Plant/Line1/Pump1"
	want(relay, line, pump)
	var list v1alpha1.InstanceList
	if err := suite.Client.List(ctx, &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for _, i := range list.Items {
		p := i.Spec.BrokerProperties
		switch i.Spec.DeviceID {
		case pump:
			if !i.Spec.Shared || p[mqtt.SparkplugDeviceProperty] != "Pump1" || p[mqtt.SparkplugMetricsProperty] != `{"Temperature":"Double"}` || p[mqtt.BrokerProperty] != b.Addr() {
				t.Errorf("Instance %s: shared %v, properties %v", i.Name, i.Spec.Shared, p)
			}
		case relay:
			if p[mqtt.HACommandTopicProperty] != "relay7/set" || p[mqtt.HADeviceIdentifiersProperty] != `["relay7"]` {
				t.Errorf("Instance %s: properties %v", i.Name, p)
			}
		}
	}

	edge.Do(t, map[string]any{"op": "ddeath", "device": "Pump1"})
	want(relay, line)
	edge.Stop() // without a word: the broker publishes its will, NDEATH
	want(relay)

	testwait.For(t, 30*time.Second, func() error {
		st := nodeStatus(t, ns, wrong.Name, node)
		if st == nil {
			return fmt.Errorf("no status of %s yet", node)
		}
		for _, sk := range st.Skipped {
			if sk.Reason == mqtt.SkipConnectFailed && len(sk.Candidates) == 1 && sk.Candidates[0].Candidate == b.Addr() &&
				strings.Contains(strings.ToLower(sk.Candidates[0].Message), "not authorized") {
				t.Logf("status.nodes[%s].skipped: %+v", node, st.Skipped)
				return nil
			}
		}
		return fmt.Errorf("skipped %+v, want ConnectFailed naming %s", st.Skipped, b.Addr())
	})
	if n := len(listInstances(t, ns, wrong.Name)); n != 0 {
		t.Errorf("a wrong password gave %d Instances", n)
	}
}
