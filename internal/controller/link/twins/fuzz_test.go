package twins

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"testing"

	"google.golang.org/protobuf/proto"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// FuzzCheck feeds any Device spec (as JSON, as a person could write it;
// the API server's schema is not assumed) to Check, the gate to the edge:
// it never panics, and a Device it passes is sent whole and as written:
// the EdgeDevice marshals, has each property in order with its pushMethod
// parts (those a PushMethodError names left out), and its protocol and
// visitor configData hold the Device's own keys with their values, the
// model's protocol keys beneath.
func FuzzCheck(f *testing.F) {
	f.Add([]byte(`{"deviceModelRef":{"name":"m"},"protocol":{"configData":{"address":"10.0.0.1:502","unitId":2,"deep":{"a":[1,"x",null]}}},
"properties":[{"name":"t","collectCycle":"250ms","reportCycle":1000,"visitors":{"protocolName":"modbus","configData":{"register":"HoldingRegister","offset":3}},
"pushMethod":{"mqtt":{"address":"tcp://127.0.0.1:1883","topic":"t","qos":1},"dbMethod":{"redis":{"redisClientConfig":{"addr":"127.0.0.1:6379"}}}}},
{"name":"s","desired":{"value":"5"}}]}`))
	f.Add([]byte(`{"deviceModelRef":{"name":"m"},"properties":[{"name":"t","pushMethod":{"http":{"hostName":"x","port":-1}}}]}`))
	f.Add([]byte(`{"deviceModelRef":{"name":"m"},"protocol":{"configData":[1]}}`))
	f.Add([]byte(`{}`))
	sch := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(sch); err != nil {
		f.Fatal(err)
	}
	model := &v1alpha1.DeviceModel{}
	model.Namespace, model.Name = "ns", "m"
	model.Spec = v1alpha1.DeviceModelSpec{Protocol: "modbus", ProtocolConfigData: js(`{"timeout":"1s","unitId":1}`),
		Properties: []v1alpha1.ModelProperty{
			{Name: "t", Type: v1alpha1.PropertyInt, Visitors: &v1alpha1.VisitorConfig{ProtocolName: "modbus", ConfigData: js(`{"address":1}`)}},
			{Name: "s", Type: v1alpha1.PropertyInt, AccessMode: v1alpha1.ReadWrite},
			{Name: "label", Type: v1alpha1.PropertyString, AccessMode: v1alpha1.ReadWrite},
		}}
	reader := fake.NewClientBuilder().WithScheme(sch).WithObjects(model).Build()
	secrets := func(context.Context, string, string) (bool, error) { return true, nil }

	f.Fuzz(func(t *testing.T, spec []byte) {
		d := &v1alpha1.Device{}
		if json.Unmarshal(spec, &d.Spec) != nil {
			return
		}
		d.Namespace, d.Name = "ns", "d"
		ed, _, invalid, err := Check(context.Background(), reader, secrets, d)
		if err != nil {
			t.Fatalf("reading the model: %v", err)
		}
		if ed == nil {
			if invalid == nil && d.Spec.DeviceModelRef != nil && d.Spec.DeviceModelRef.Name == "m" {
				t.Fatal("a Device of the model was neither passed nor refused")
			}
			return
		}
		if _, err := proto.Marshal(ed); err != nil {
			t.Fatalf("the EdgeDevice does not marshal: %v", err)
		}
		var pm *PushMethodError
		if invalid != nil && !errors.As(invalid, &pm) {
			t.Fatalf("a Device passed with %T %v", invalid, invalid)
		}
		if len(ed.Properties) != len(d.Spec.Properties) {
			t.Fatalf("%d properties sent of %d", len(ed.Properties), len(d.Spec.Properties))
		}
		checkKeys(t, "protocol", d.Spec.Protocol.ConfigData, ed.GetProtocolConfig().AsMap())
		for _, k := range []string{"timeout", "unitId"} {
			if _, ok := ed.GetProtocolConfig().AsMap()[k]; !ok {
				t.Fatalf("the model's protocol key %q is missing", k)
			}
		}
		for i, p := range d.Spec.Properties {
			ep := ed.Properties[i]
			if ep.Name != p.Name {
				t.Fatalf("property %d is %q, sent as %q", i, p.Name, ep.Name)
			}
			if p.Visitors != nil {
				checkKeys(t, "visitor of "+p.Name, p.Visitors.ConfigData, ep.GetVisitorConfig().AsMap())
			}
			dropped := pm != nil && pm.Properties[p.Name]
			want := p.PushMethod
			if dropped {
				want = nil
			}
			got := ep.GetPushMethod()
			if (got == nil) != (want == nil) || (want != nil && ((got.Http == nil) != (want.HTTP == nil) || (got.Mqtt == nil) != (want.MQTT == nil) ||
				(got.Otel == nil) != (want.OTEL == nil) || (got.DbMethod == nil) != (want.DBMethod == nil) ||
				(got.AnomalyDetection == nil) != (want.AnomalyDetection == nil))) {
				t.Fatalf("property %s: pushMethod %v sent for %+v", p.Name, got, want)
			}
		}
	})
}

// checkKeys: every key of the JSON object j is in got with its value
// (read as JSON reads it).
func checkKeys(t *testing.T, what string, j *apiextensionsv1.JSON, got map[string]any) {
	t.Helper()
	if j == nil || len(j.Raw) == 0 {
		return
	}
	var want map[string]any
	if err := json.Unmarshal(j.Raw, &want); err != nil {
		t.Fatalf("%s configData %s passed: %v", what, j.Raw, err)
	}
	for k, v := range want {
		if !reflect.DeepEqual(got[k], v) {
			t.Fatalf("%s configData %q: %#v sent as %#v", what, k, v, got[k])
		}
	}
}
