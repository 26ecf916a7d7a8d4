package twins

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/controller"
	"github.com/dowse-dev/dowse/internal/kubeflags"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/framework/testwait"
)

func startController(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- controller.Run(ctx, controller.Config{RESTConfig: rest.CopyConfig(suite.Config), SkipNameValidation: true, NodeGracePeriod: time.Hour, Client: kubeflags.Client{QPS: 1000, Burst: 2000},
			Serving: kubeflags.Off(), Registerer: prometheus.NewRegistry()}, testr.New(t).WithName("controller"))
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

func createInstance(t *testing.T, ns, cfg, name string, props map[string]string, nodes ...string) *v1alpha1.Instance {
	t.Helper()
	inst := &v1alpha1.Instance{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: v1alpha1.InstanceSpec{ConfigurationName: cfg, DeviceID: name,
			Shared: true, Capacity: 1, BrokerProperties: props},
	}
	for _, n := range nodes {
		inst.Status.Nodes = append(inst.Status.Nodes, v1alpha1.InstanceNode{Name: n})
	}
	if err := suite.Client.Create(context.Background(), inst); err != nil {
		t.Fatal(err)
	}
	return inst
}

func setNodes(t *testing.T, inst *v1alpha1.Instance, nodes ...string) {
	t.Helper()
	var cur v1alpha1.Instance
	if err := suite.Client.Get(context.Background(), client.ObjectKeyFromObject(inst), &cur); err != nil {
		t.Fatal(err)
	}
	cur.Status.Nodes = nil
	for _, n := range nodes {
		cur.Status.Nodes = append(cur.Status.Nodes, v1alpha1.InstanceNode{Name: n})
	}
	if err := suite.Client.Update(context.Background(), &cur); err != nil {
		t.Fatal(err)
	}
}

func templateConfiguration(ns, name, port string) *v1alpha1.Configuration {
	return &v1alpha1.Configuration{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.ConfigurationSpec{
			DiscoveryHandler: v1alpha1.DiscoveryHandlerSpec{Name: "debug-echo"},
			DeviceTemplate: &v1alpha1.DeviceTemplate{
				DeviceModelRef: corev1.LocalObjectReference{Name: "thermostat"},
				Protocol: v1alpha1.ProtocolConfig{ProtocolName: "virtual",
					ConfigData: &apiextensionsv1.JSON{Raw: fmt.Appendf(nil, `{"address":"${ADDR}","port":%s,"missing":"${NOPE}"}`, port)}},
				Properties: []v1alpha1.DeviceProperty{
					{Name: "setpoint", Desired: &v1alpha1.TwinProperty{Value: "20"},
						Visitors: &v1alpha1.VisitorConfig{ProtocolName: "virtual", ConfigData: &apiextensionsv1.JSON{Raw: []byte(`{"register":"${REG}"}`)}}},
					{Name: "temperature"},
				},
			},
		},
	}
}

func configData(t *testing.T, j *apiextensionsv1.JSON) map[string]any {
	t.Helper()
	var m map[string]any
	if j == nil {
		return nil
	}
	if err := json.Unmarshal(j.Raw, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func getDevice(ns, name string) (*v1alpha1.Device, error) {
	var d v1alpha1.Device
	err := suite.Client.Get(context.Background(), keyOf(ns, name), &d)
	return &d, err
}

// TestDevicesFromInstances: an Instance of a Configuration with a
// deviceTemplate gets a Device (properties expanded, owned by the Instance,
// on one of its nodes); a template change updates it and keeps a desired
// value a person set; the node leaving moves it; a hand-made Device of the
// same name is reported and left alone; the Device goes with its Instance,
// and with the template.
func TestDevicesFromInstances(t *testing.T) {
	ctx := context.Background()
	ns := suite.Namespace(t)
	if err := suite.Client.Create(ctx, thermostatModel(ns)); err != nil {
		t.Fatal(err)
	}
	cfg := templateConfiguration(ns, "plc", "502")
	if err := suite.Client.Create(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	startController(t)
	inst := createInstance(t, ns, "plc", "plc-aaa111", map[string]string{"ADDR": "10.1.2.3", "REG": "40001"}, "node-b", "node-a")

	var dev *v1alpha1.Device
	testwait.For(t, 15*time.Second, func() error {
		var err error
		if dev, err = getDevice(ns, inst.Name); err != nil {
			return err
		}
		if dev.Spec.NodeName != "node-a" {
			return fmt.Errorf("nodeName %q, want node-a (first of the Instance's nodes)", dev.Spec.NodeName)
		}
		if len(dev.Spec.Properties) == 0 || dev.Spec.Properties[0].Desired == nil {
			return fmt.Errorf("template's desired value not applied yet: %+v", dev.Spec.Properties)
		}
		return nil
	})
	cd := configData(t, dev.Spec.Protocol.ConfigData)
	if cd["address"] != "10.1.2.3" || cd["port"] != float64(502) || cd["missing"] != "${NOPE}" {
		t.Errorf("configData %v: want address expanded, port kept, unknown names as written", cd)
	}
	if v := configData(t, dev.Spec.Properties[0].Visitors.ConfigData); v["register"] != "40001" {
		t.Errorf("visitor configData %v: want register 40001", v)
	}
	if got := dev.Spec.Properties[0].Desired.Value; got != "20" {
		t.Errorf("desired %q, want the template's 20", got)
	}
	if dev.Spec.MapperName != "plc" || !metav1.IsControlledBy(dev, inst) || dev.Labels[v1alpha1.LabelConfiguration] != "plc" {
		t.Errorf("mapperName %q, owner %v, labels %v: want the Configuration's name, the Instance, its labels", dev.Spec.MapperName, dev.OwnerReferences, dev.Labels)
	}

	// A person sets the desired value; then the template changes.
	patch := []byte(`{"spec":{"properties":[{"name":"setpoint","desired":{"value":"25"}}]}}`)
	if err := suite.Client.Patch(ctx, dev, client.RawPatch("application/apply-patch+yaml", append([]byte(`{"apiVersion":"dowse.dev/v1alpha1","kind":"Device",`), patch[1:]...)),
		client.FieldOwner("kubectl"), client.ForceOwnership); err != nil {
		t.Fatal(err)
	}
	var cur v1alpha1.Configuration
	if err := suite.Client.Get(ctx, client.ObjectKeyFromObject(cfg), &cur); err != nil {
		t.Fatal(err)
	}
	cur.Spec.DeviceTemplate.Protocol = templateConfiguration(ns, "plc", "503").Spec.DeviceTemplate.Protocol
	if err := suite.Client.Update(ctx, &cur); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 15*time.Second, func() error {
		d, err := getDevice(ns, inst.Name)
		if err != nil {
			return err
		}
		if port := configData(t, d.Spec.Protocol.ConfigData)["port"]; port != float64(503) {
			return fmt.Errorf("port %v, want the new template's 503", port)
		}
		if p := d.Property("setpoint"); p == nil || p.Desired == nil || p.Desired.Value != "25" {
			return fmt.Errorf("setpoint %+v: the person's desired 25 must stay", p)
		}
		return nil
	})

	// Failover: node-a no longer sees the device.
	setNodes(t, inst, "node-b", "node-c")
	testwait.For(t, 15*time.Second, func() error {
		d, err := getDevice(ns, inst.Name)
		if err != nil {
			return err
		}
		if d.Spec.NodeName != "node-b" {
			return fmt.Errorf("nodeName %q, want node-b after node-a left", d.Spec.NodeName)
		}
		return nil
	})

	// A hand-made Device of an Instance's name is left alone.
	hand := &v1alpha1.Device{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "plc-bbb222"},
		Spec: v1alpha1.DeviceSpec{DeviceModelRef: &corev1.LocalObjectReference{Name: "thermostat"}, NodeName: "node-z"}}
	if err := suite.Client.Create(ctx, hand); err != nil {
		t.Fatal(err)
	}
	clash := createInstance(t, ns, "plc", "plc-bbb222", nil, "node-a")
	testwait.For(t, 15*time.Second, func() error {
		var evs eventsv1.EventList
		if err := suite.Client.List(ctx, &evs, client.InNamespace(ns)); err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.Reason == "DeviceNameTaken" && e.Regarding.Name == clash.Name {
				return nil
			}
		}
		return fmt.Errorf("no DeviceNameTaken event for %s among %d events", clash.Name, len(evs.Items))
	})
	if d, err := getDevice(ns, hand.Name); err != nil || d.Spec.NodeName != "node-z" || len(d.OwnerReferences) != 0 {
		t.Fatalf("hand-made Device changed: %+v, %v", d, err)
	}

	// The Device goes with its Instance (no garbage collector runs here).
	if err := suite.Client.Delete(ctx, inst); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 15*time.Second, func() error {
		if _, err := getDevice(ns, inst.Name); !apierrors.IsNotFound(err) {
			return fmt.Errorf("device still there (%w)", err)
		}
		return nil
	})
	// And with the template; the hand-made one stays.
	other := createInstance(t, ns, "plc", "plc-ccc333", nil, "node-a")
	testwait.For(t, 15*time.Second, func() error { _, err := getDevice(ns, other.Name); return err })
	if err := suite.Client.Get(ctx, client.ObjectKeyFromObject(cfg), &cur); err != nil {
		t.Fatal(err)
	}
	cur.Spec.DeviceTemplate = nil
	if err := suite.Client.Update(ctx, &cur); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 15*time.Second, func() error {
		if _, err := getDevice(ns, other.Name); !apierrors.IsNotFound(err) {
			return fmt.Errorf("device of a template-less Configuration still there (%w)", err)
		}
		return nil
	})
	if _, err := getDevice(ns, hand.Name); err != nil {
		t.Fatalf("hand-made Device deleted: %v", err)
	}
}
