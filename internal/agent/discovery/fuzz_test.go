package discovery

import (
	"encoding/json"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilvalidation "k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/kube-openapi/pkg/validation/spec"
	"k8s.io/kube-openapi/pkg/validation/strfmt"
	"k8s.io/kube-openapi/pkg/validation/validate"
	"sigs.k8s.io/yaml"
	cdiparser "tags.cncf.io/container-device-interface/pkg/parser"

	"github.com/dowse-dev/dowse/deploy/crds"
	"github.com/dowse-dev/dowse/internal/agent/instances"
	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// instanceSchema is the OpenAPI schema of the Instance CRD as Dowse ships
// it (its CEL rules are about updates).
func instanceSchema(tb testing.TB) *validate.SchemaValidator {
	tb.Helper()
	b, err := crds.FS.ReadFile("dowse.dev_instances.yaml")
	if err != nil {
		tb.Fatal(err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.Unmarshal(b, &crd); err != nil {
		tb.Fatal(err)
	}
	j, err := json.Marshal(crd.Spec.Versions[0].Schema.OpenAPIV3Schema)
	if err != nil {
		tb.Fatal(err)
	}
	var schema spec.Schema
	if err := json.Unmarshal(j, &schema); err != nil {
		tb.Fatal(err)
	}
	return validate.NewSchemaValidator(&schema, nil, "", strfmt.Default)
}

// FuzzHandlerDevices feeds any device list a handler could send (a
// DiscoverResponse) to screen: it never panics; what it keeps are distinct
// non-empty ids, in the handler's order, at most max; each kept device's
// Instance passes the Instance CRD's schema (so the API server takes it and
// one bad device cannot hold back the list's writes) within the size the
// API server stores, with a valid name and derived names; and it names a
// problem exactly when it dropped something.
func FuzzHandlerDevices(f *testing.F) {
	seed := &discoveryv1.DiscoverResponse{Devices: []*discoveryv1.Device{
		{Id: "/dev/ttyUSB0", Properties: map[string]string{"UDEV_DEVNODE": "/dev/ttyUSB0", "vendor id": "0403"},
			DeviceSpecs: []*discoveryv1.DeviceSpec{{HostPath: "/dev/ttyUSB0", ContainerPath: "/dev/ttyUSB0", Permissions: "rw"}},
			Mounts:      []*discoveryv1.Mount{{HostPath: "/sys/x", ContainerPath: "/x", ReadOnly: true}}},
		{Id: "opc.tcp://10.0.0.1:4840"},
		{Id: "/dev/ttyUSB0"},
		{Id: ""},
		{Id: "bad", DeviceSpecs: []*discoveryv1.DeviceSpec{{HostPath: "/dev/x", ContainerPath: "/dev/x", Permissions: "rwx"}}},
	}}
	b, _ := proto.Marshal(seed)
	f.Add(b, uint8(0))
	f.Add(b, uint8(2))
	f.Add([]byte{}, uint8(1))
	schema := instanceSchema(f)
	cfg := &v1alpha1.Configuration{}
	cfg.Name, cfg.Namespace, cfg.UID = "1cams", "plant", "u"
	cfg.Spec.BrokerProperties = map[string]string{"SITE": "north"}

	f.Fuzz(func(t *testing.T, b []byte, max uint8) {
		var resp discoveryv1.DiscoverResponse
		if proto.Unmarshal(b, &resp) != nil {
			return
		}
		in := resp.GetDevices()
		kept, problem := screen(in, int(max), HostPaths{Devices: []string{"/"}, Mounts: []string{"/"}})
		if max > 0 && len(kept) > int(max) {
			t.Fatalf("kept %d devices, more than %d", len(kept), max)
		}
		if (problem != "") != (len(kept) != len(in)) {
			t.Fatalf("kept %d of %d devices, problem %q", len(kept), len(in), problem)
		}
		seen := map[string]bool{}
		at := 0
		for _, d := range kept {
			if d.GetId() == "" || seen[d.GetId()] {
				t.Fatalf("kept id %q (empty or repeated)", d.GetId())
			}
			seen[d.GetId()] = true
			i := slices.Index(in[at:], d)
			if i < 0 {
				t.Fatalf("device %q kept out of the handler's order", d.GetId())
			}
			at += i + 1
			for _, shared := range []bool{false, true} {
				inst := instances.Desired(cfg, shared, "edge-1", d)
				checkInstance(t, schema, inst)
			}
		}
	})
}

// checkInstance: inst passes the Instance CRD's schema, fits in what the
// API server stores, and its name and the names derived from it are valid.
func checkInstance(t *testing.T, schema *validate.SchemaValidator, inst *v1alpha1.Instance) {
	t.Helper()
	inst.APIVersion, inst.Kind = v1alpha1.GroupVersion.String(), "Instance"
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(inst)
	if err != nil {
		t.Fatal(err)
	}
	if r := schema.Validate(obj); !r.IsValid() {
		t.Fatalf("Instance of device %q refused by the CRD's schema: %v", inst.Spec.DeviceID, r.AsError())
	}
	if b, err := json.Marshal(inst); err != nil || len(b) > 1<<20 {
		t.Fatalf("Instance of device %q: %d bytes of JSON (%v), more than the API server keeps room for", inst.Spec.DeviceID, len(b), err)
	}
	if errs := utilvalidation.IsDNS1123Subdomain(inst.Name); len(errs) > 0 {
		t.Fatalf("Instance name %q: %v", inst.Name, errs)
	}
	if err := v1alpha1.ValidateResourceName(inst.ResourceName()); err != nil {
		t.Fatalf("resource name of %s: %v", inst.Name, err)
	}
	if _, _, _, err := cdiparser.ParseQualifiedName(inst.CDIName()); err != nil {
		t.Fatalf("CDI name of %s: %v", inst.Name, err)
	}
}
