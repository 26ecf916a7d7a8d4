package twins

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

func model(ns, name string, props ...v1alpha1.ModelProperty) *v1alpha1.DeviceModel {
	return &v1alpha1.DeviceModel{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.DeviceModelSpec{Protocol: "virtual", Properties: props}}
}

func thermostatModel(ns string) *v1alpha1.DeviceModel {
	return model(ns, "thermostat",
		v1alpha1.ModelProperty{Name: "temperature", Type: v1alpha1.PropertyDouble, AccessMode: v1alpha1.ReadOnly, Unit: "C"},
		v1alpha1.ModelProperty{Name: "setpoint", Type: v1alpha1.PropertyInt, AccessMode: v1alpha1.ReadWrite, Minimum: "5", Maximum: "30"},
		v1alpha1.ModelProperty{Name: "label", Type: v1alpha1.PropertyString, AccessMode: v1alpha1.ReadWrite},
	)
}

// TestCRDValidation: what the API server itself refuses in DeviceModels and
// Devices, with the message that says why.
func TestCRDValidation(t *testing.T) {
	ctx := context.Background()
	ns := suite.Namespace(t)
	models := []struct {
		name  string
		props []v1alpha1.ModelProperty
		want  string // "" accepted
	}{
		{"good", thermostatModel(ns).Spec.Properties, ""},
		{"bad-type", []v1alpha1.ModelProperty{{Name: "x", Type: "DECIMAL"}}, "Unsupported value"},
		{"bad-mode", []v1alpha1.ModelProperty{{Name: "x", Type: v1alpha1.PropertyInt, AccessMode: "WriteOnly"}}, "Unsupported value"},
		{"min-on-string", []v1alpha1.ModelProperty{{Name: "x", Type: v1alpha1.PropertyString, Minimum: "1"}}, "minimum applies to INT, FLOAT and DOUBLE only"},
		{"min-not-int", []v1alpha1.ModelProperty{{Name: "x", Type: v1alpha1.PropertyInt, Minimum: "1.5"}}, "minimum must be a number of the property's type"},
		{"max-not-number", []v1alpha1.ModelProperty{{Name: "x", Type: v1alpha1.PropertyDouble, Maximum: "hot"}}, "maximum must be a number of the property's type"},
		{"min-above-max", []v1alpha1.ModelProperty{{Name: "x", Type: v1alpha1.PropertyDouble, Minimum: "10", Maximum: "-1e1"}}, "minimum must not exceed maximum"},
		{"duplicate", []v1alpha1.ModelProperty{{Name: "x", Type: v1alpha1.PropertyInt}, {Name: "x", Type: v1alpha1.PropertyInt}}, "Duplicate value"},
	}
	for _, tc := range models {
		t.Run("model/"+tc.name, func(t *testing.T) {
			err := suite.Client.Create(ctx, model(ns, tc.name, tc.props...))
			check(t, err, tc.want)
		})
	}

	var defaulted v1alpha1.DeviceModel
	if err := suite.Client.Get(ctx, keyOf(ns, "good"), &defaulted); err != nil {
		t.Fatal(err)
	}

	dev := func(mut func(*v1alpha1.Device)) *v1alpha1.Device {
		d := &v1alpha1.Device{ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "dev-"},
			Spec: v1alpha1.DeviceSpec{DeviceModelRef: &corev1.LocalObjectReference{Name: "good"}, NodeName: "edge-1",
				Protocol: v1alpha1.ProtocolConfig{ProtocolName: "virtual", ConfigData: &apiextensionsv1.JSON{Raw: []byte(`{"address":"10.0.0.1","unit":{"id":3}}`)}},
				Properties: []v1alpha1.DeviceProperty{{Name: "setpoint", Desired: &v1alpha1.TwinProperty{Value: "21"},
					CollectCycle: ptr.To(intstr.FromString("500ms")), ReportCycle: ptr.To(intstr.FromInt32(10000))}}}}
		if mut != nil {
			mut(d)
		}
		return d
	}
	push := func(pm *v1alpha1.PushMethod) *v1alpha1.Device {
		return dev(func(d *v1alpha1.Device) { d.Spec.Properties[0].PushMethod = pm })
	}
	devices := []struct {
		name string
		dev  *v1alpha1.Device
		want string
	}{
		{"good", dev(nil), ""},
		{"push-mqtt", push(&v1alpha1.PushMethod{MQTT: &v1alpha1.PushMethodMQTT{Address: "tcp://10.0.0.5:1883", Topic: "plant/setpoint", QoS: 1}}), ""},
		{"push-http-and-redis", push(&v1alpha1.PushMethod{HTTP: &v1alpha1.PushMethodHTTP{HostName: "http://10.0.0.5", Port: 8080, RequestPath: "/readings"},
			DBMethod: &v1alpha1.DBMethodConfig{Redis: &v1alpha1.DBMethodRedis{RedisClientConfig: &v1alpha1.RedisClientConfig{Addr: "redis.plant:6379"}}}}), ""},
		{"push-template-placeholder", push(&v1alpha1.PushMethod{MQTT: &v1alpha1.PushMethodMQTT{Address: "${MQTT_BROKER}", Topic: "t"}}), ""},
		{"push-mqtt-scheme", push(&v1alpha1.PushMethod{MQTT: &v1alpha1.PushMethodMQTT{Address: "http://10.0.0.5:1883", Topic: "t"}}), "must be a broker URL"},
		{"push-mqtt-port", push(&v1alpha1.PushMethod{MQTT: &v1alpha1.PushMethodMQTT{Address: "tcp://10.0.0.5:70000", Topic: "t"}}), "port must be 1-65535"},
		{"push-mqtt-qos", push(&v1alpha1.PushMethod{MQTT: &v1alpha1.PushMethodMQTT{Address: "tcp://10.0.0.5", Topic: "t", QoS: 3}}), "qos"},
		{"push-mqtt-wildcard", push(&v1alpha1.PushMethod{MQTT: &v1alpha1.PushMethodMQTT{Address: "tcp://10.0.0.5", Topic: "plant/#"}}), "no wildcards"},
		{"push-http-port", push(&v1alpha1.PushMethod{HTTP: &v1alpha1.PushMethodHTTP{HostName: "http://10.0.0.5", Port: 0, RequestPath: "/r"}}), ""},
		{"push-http-host-with-path", push(&v1alpha1.PushMethod{HTTP: &v1alpha1.PushMethodHTTP{HostName: "http://10.0.0.5/x", Port: 80}}), "without port or path"},
		{"push-http-ftp", push(&v1alpha1.PushMethod{HTTP: &v1alpha1.PushMethodHTTP{HostName: "ftp://10.0.0.5", Port: 80}}), "must be http:// or https://"},
		{"push-two-sinks", push(&v1alpha1.PushMethod{MQTT: &v1alpha1.PushMethodMQTT{Address: "tcp://a", Topic: "t"}, OTEL: &v1alpha1.PushMethodOTEL{EndpointURL: "https://a:4318/v1/metrics"}}), "at most one of http, mqtt, otel and anomalyDetection"},
		{"push-nothing", push(&v1alpha1.PushMethod{}), "names no sink"},
		{"push-redis-addr", push(&v1alpha1.PushMethod{DBMethod: &v1alpha1.DBMethodConfig{Redis: &v1alpha1.DBMethodRedis{RedisClientConfig: &v1alpha1.RedisClientConfig{Addr: "redis://a:6379"}}}}), "must be host:port"},
		{"kubeedge-integer-cycles", dev(func(d *v1alpha1.Device) {
			d.Spec.Properties[0].CollectCycle = ptr.To(intstr.FromInt32(1000))
		}), ""},
		{"duration-cycle-bad", dev(func(d *v1alpha1.Device) {
			d.Spec.Properties[0].CollectCycle = ptr.To(intstr.FromString("soon"))
		}), "must be a duration such as 500ms or 10s, or integer milliseconds"},
		{"negative-cycle", dev(func(d *v1alpha1.Device) {
			d.Spec.Properties[0].ReportCycle = ptr.To(intstr.FromInt32(-1))
		}), "must be a duration"},
		{"no-model", dev(func(d *v1alpha1.Device) { d.Spec.DeviceModelRef = nil }), "deviceModelRef"},
		{"duplicate-property", dev(func(d *v1alpha1.Device) {
			d.Spec.Properties = append(d.Spec.Properties, d.Spec.Properties[0])
		}), "Duplicate value"},
		{"property-without-name", dev(func(d *v1alpha1.Device) { d.Spec.Properties[0].Name = "" }), "spec.properties[0].name"},
	}
	for _, tc := range devices {
		t.Run("device/"+tc.name, func(t *testing.T) {
			check(t, suite.Client.Create(ctx, tc.dev), tc.want)
		})
	}
	// Defaulting: accessMode is ReadOnly unless set.
	t.Run("model/access-mode-defaults-to-ReadOnly", func(t *testing.T) {
		m := model(ns, "defaults", v1alpha1.ModelProperty{Name: "x", Type: v1alpha1.PropertyInt})
		if err := suite.Client.Create(ctx, m); err != nil {
			t.Fatal(err)
		}
		if got := m.Spec.Properties[0].AccessMode; got != v1alpha1.ReadOnly {
			t.Fatalf("accessMode = %q, want ReadOnly", got)
		}
	})
}

func check(t *testing.T, err error, want string) {
	t.Helper()
	switch {
	case want == "" && err != nil:
		t.Fatalf("refused: %v", err)
	case want != "" && err == nil:
		t.Fatalf("accepted, want an error with %q", want)
	case want != "" && !strings.Contains(err.Error(), want):
		t.Fatalf("error %q does not say %q", err, want)
	}
}
