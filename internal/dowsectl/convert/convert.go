// Package convert turns Akri's Configurations (akri.sh/v0) and KubeEdge's
// DeviceModels and Devices (devices.kubeedge.io/v1beta1) into Dowse's, and
// says what of them it could not carry over and why.
package convert

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// Note is something of an object that was not carried over, or was
// carried over changed.
type Note struct {
	// Object is kind/namespace/name of the source object.
	Object string
	// Field is the source field's path; empty for the whole object.
	Field  string
	Reason string
}

func (n Note) String() string {
	if n.Field == "" {
		return n.Object + ": " + n.Reason
	}
	return n.Object + ": " + n.Field + ": " + n.Reason
}

// Result is what Convert made.
type Result struct {
	Objects []runtime.Object
	Notes   []Note
}

// akriHandlerNames are Akri's built-in discovery handlers' names for
// Dowse's handlers of the same protocols (Akri's own handler containers,
// which Dowse runs unchanged, register under Akri's names).
var akriHandlerNames = map[string]string{"debugEcho": "debug-echo", "onvif": "onvif", "udev": "udev", "opcua": "opcua"}

// Convert converts every object it knows and notes the others.
func Convert(objs []*unstructured.Unstructured) (Result, error) {
	var r Result
	for _, u := range objs {
		id := fmt.Sprintf("%s/%s", strings.ToLower(u.GetKind()), u.GetName())
		if ns := u.GetNamespace(); ns != "" {
			id = fmt.Sprintf("%s/%s/%s", strings.ToLower(u.GetKind()), ns, u.GetName())
		}
		var err error
		switch gv, kind := u.GetAPIVersion(), u.GetKind(); {
		case gv == "akri.sh/v0" && kind == "Configuration":
			err = r.akriConfiguration(id, u)
		case gv == "akri.sh/v0" && kind == "Instance":
			r.Notes = append(r.Notes, Note{Object: id, Reason: "not converted: Dowse's agents find and make Instances themselves"})
		case gv == "devices.kubeedge.io/v1beta1" && kind == "DeviceModel":
			err = r.kubeEdge(id, u, &v1alpha1.DeviceModel{})
		case gv == "devices.kubeedge.io/v1beta1" && kind == "Device":
			err = r.kubeEdge(id, u, &v1alpha1.Device{})
		case gv == "devices.kubeedge.io/v1beta1" && kind == "DeviceStatus":
			r.Notes = append(r.Notes, Note{Object: id, Reason: "not converted: Dowse keeps a Device's reported twins and state in its own status, and the edge reports them again"})
		case strings.HasPrefix(gv, "devices.kubeedge.io/"):
			r.Notes = append(r.Notes, Note{Object: id, Reason: fmt.Sprintf("not converted: %s is not devices.kubeedge.io/v1beta1 (KubeEdge 1.15 and later); move it to v1beta1 first", gv)})
		default:
			r.Notes = append(r.Notes, Note{Object: id, Reason: fmt.Sprintf("not converted: %s %s is neither Akri's nor KubeEdge's", gv, kind)})
		}
		if err != nil {
			return r, fmt.Errorf("%s: %w", id, err)
		}
	}
	return r, nil
}

// meta is what of the source's metadata a new object keeps.
func meta(u *unstructured.Unstructured) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: u.GetName(), Namespace: u.GetNamespace(), Labels: u.GetLabels(), Annotations: withoutLastApplied(u.GetAnnotations())}
}

func withoutLastApplied(a map[string]string) map[string]string {
	delete(a, "kubectl.kubernetes.io/last-applied-configuration")
	if len(a) == 0 {
		return nil
	}
	return a
}

// akriConfiguration is Akri's Configuration in both of its shapes: the
// current one (spec.brokerSpec) and the older one
// (spec.deploymentStrategy.brokerType, with the Services under it).
func (r *Result) akriConfiguration(id string, u *unstructured.Unstructured) error {
	spec, _, _ := unstructured.NestedMap(u.Object, "spec")
	take := func(path ...string) (any, bool) {
		v, ok, _ := unstructured.NestedFieldNoCopy(spec, path...)
		if ok {
			unstructured.RemoveNestedField(spec, path...)
		}
		return v, ok
	}
	decode := func(v any, into any, field string) error {
		raw, err := json.Marshal(v)
		if err != nil {
			return err
		}
		if err := json.Unmarshal(raw, into); err != nil {
			return fmt.Errorf("%s: %w", field, err)
		}
		return nil
	}
	cfg := &v1alpha1.Configuration{TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "Configuration"}, ObjectMeta: meta(u)}
	name, _ := take("discoveryHandler", "name")
	akriName, _ := name.(string)
	if akriName == "" {
		return fmt.Errorf("spec.discoveryHandler.name is empty")
	}
	cfg.Spec.DiscoveryHandler.Name = akriName
	if dowseName, ok := akriHandlerNames[akriName]; ok {
		cfg.Spec.DiscoveryHandler.Name = dowseName
		if dowseName != akriName {
			r.Notes = append(r.Notes, Note{Object: id, Field: "spec.discoveryHandler.name", Reason: fmt.Sprintf("%q became %q, Dowse's handler of that protocol (Akri's own handler cannot serve it: it registers as %q, and Dowse's handler names are DNS labels)", akriName, dowseName, akriName)})
		}
	} else {
		r.Notes = append(r.Notes, Note{Object: id, Field: "spec.discoveryHandler.name", Reason: fmt.Sprintf("%q is not one of Akri's built-in handlers: kept, for your handler, which Dowse runs unchanged", akriName)})
	}
	if details, ok := take("discoveryHandler", "discoveryDetails"); ok {
		obj, err := akriDetails(details)
		if err != nil {
			return fmt.Errorf("spec.discoveryHandler.discoveryDetails: %w", err)
		}
		if m, ok := obj["opcuaDiscoveryMethod"].(map[string]any); ok && akriName == "opcua" {
			// Akri nests OPC UA's discovery under its only method,
			// standard; Dowse's handler takes the fields themselves.
			std, _ := m["standard"].(map[string]any)
			delete(obj, "opcuaDiscoveryMethod")
			for k, v := range std {
				obj[k] = v
			}
			for k := range m {
				if k != "standard" {
					r.Notes = append(r.Notes, Note{Object: id, Field: "spec.discoveryHandler.discoveryDetails.opcuaDiscoveryMethod." + k, Reason: "not carried over: Dowse's OPC UA handler finds servers by discovery URLs (standard) only"})
				}
			}
		}
		if len(obj) > 0 {
			raw, err := json.Marshal(obj)
			if err != nil {
				return err
			}
			cfg.Spec.DiscoveryHandler.DiscoveryDetails = &apiextensionsv1.JSON{Raw: raw}
		}
	}
	if props, ok := take("discoveryHandler", "discoveryProperties"); ok {
		if err := decode(props, &cfg.Spec.DiscoveryHandler.DiscoveryProperties, "spec.discoveryHandler.discoveryProperties"); err != nil {
			return err
		}
	}
	broker := &v1alpha1.BrokerSpec{}
	if v, ok := take("brokerSpec", "brokerPodSpec"); ok {
		if err := decode(v, &broker.BrokerPodSpec, "spec.brokerSpec.brokerPodSpec"); err != nil {
			return err
		}
	}
	if v, ok := take("brokerSpec", "brokerJobSpec"); ok {
		if err := decode(v, &broker.BrokerJobSpec, "spec.brokerSpec.brokerJobSpec"); err != nil {
			return err
		}
	}
	if v, ok := take("brokerPodSpec"); ok {
		if err := decode(v, &broker.BrokerPodSpec, "spec.brokerPodSpec"); err != nil {
			return err
		}
	}
	if v, ok := take("deploymentStrategy", "brokerType", "pod"); ok {
		if err := decode(v, &broker.BrokerPodSpec, "spec.deploymentStrategy.brokerType.pod"); err != nil {
			return err
		}
	}
	if broker.BrokerPodSpec != nil || broker.BrokerJobSpec != nil {
		cfg.Spec.BrokerSpec = broker
	}
	for _, path := range [][]string{{"instanceServiceSpec"}, {"deploymentStrategy", "instanceServiceSpec"}} {
		if v, ok := take(path...); ok {
			if err := decode(v, &cfg.Spec.InstanceServiceSpec, "spec."+strings.Join(path, ".")); err != nil {
				return err
			}
		}
	}
	for _, path := range [][]string{{"configurationServiceSpec"}, {"deploymentStrategy", "configurationServiceSpec"}} {
		if v, ok := take(path...); ok {
			if err := decode(v, &cfg.Spec.ConfigurationServiceSpec, "spec."+strings.Join(path, ".")); err != nil {
				return err
			}
		}
	}
	if v, ok := take("brokerProperties"); ok {
		if err := decode(v, &cfg.Spec.BrokerProperties, "spec.brokerProperties"); err != nil {
			return err
		}
		if len(cfg.Spec.BrokerProperties) == 0 {
			cfg.Spec.BrokerProperties = nil
		}
	}
	if v, ok := take("capacity"); ok {
		if err := decode(v, &cfg.Spec.Capacity, "spec.capacity"); err != nil {
			return err
		}
	}
	for _, f := range leaves(spec, "spec") {
		r.Notes = append(r.Notes, Note{Object: id, Field: f, Reason: "not carried over: Dowse's Configuration has no such field"})
	}
	r.Objects = append(r.Objects, cfg)
	return nil
}

// akriDetails reads Akri's discoveryDetails: a YAML document in a string
// (or, written by hand, already an object).
func akriDetails(v any) (map[string]any, error) {
	switch d := v.(type) {
	case map[string]any:
		return d, nil
	case string:
		out := map[string]any{}
		if strings.TrimSpace(d) == "" {
			return out, nil
		}
		if err := yaml.Unmarshal([]byte(d), &out); err != nil {
			return nil, fmt.Errorf("not a YAML object: %w", err)
		}
		return out, nil
	}
	return nil, fmt.Errorf("a %T, want a YAML string", v)
}

// kubeEdge converts a KubeEdge v1beta1 DeviceModel or Device into Dowse's,
// whose schema follows KubeEdge's: every spec field Dowse's type does not
// hold is noted. Both Device shapes are read: KubeEdge 1.23's, whose
// spec.stateReport says how the mapper reports the device's state, and the
// earlier one, whose status held reportToCloud and reportCycle for it
// (edgecore 1.23 still reads them when spec.stateReport is absent, and so
// does this). The rest of the status is not converted: the edge reports it
// again.
func (r *Result) kubeEdge(id string, u *unstructured.Unstructured, into runtime.Object) error {
	spec, _, _ := unstructured.NestedMap(u.Object, "spec")
	status, _, _ := unstructured.NestedMap(u.Object, "status")
	if u.GetKind() == "Device" {
		if props, ok := spec["properties"].([]any); ok {
			for i, p := range props {
				if pm, ok := p.(map[string]any); ok {
					for _, f := range []string{"reportCycle", "collectCycle"} {
						r.cycle(id, fmt.Sprintf("spec.properties[%d]", i), pm, f)
					}
					// KubeEdge's desired is not optional in its Go type: every
					// property written from it has one, empty when none is meant.
					if d, ok := pm["desired"].(map[string]any); ok && d["value"] == "" {
						delete(pm, "desired")
					}
				}
			}
		}
		if _, ok := spec["stateReport"]; !ok {
			sr := map[string]any{}
			for _, f := range []string{"reportToCloud", "reportCycle"} {
				if v, ok := status[f]; ok {
					sr[f] = v
					delete(status, f)
				}
			}
			if len(sr) > 0 {
				if spec == nil {
					spec = map[string]any{}
				}
				spec["stateReport"] = sr
				r.Notes = append(r.Notes, Note{Object: id, Field: "status.reportToCloud, status.reportCycle",
					Reason: "became spec.stateReport, where KubeEdge 1.23 moved them"})
			}
		}
		if sr, ok := spec["stateReport"].(map[string]any); ok {
			r.cycle(id, "spec.stateReport", sr, "reportCycle")
			// Unset is false to KubeEdge, true to Dowse.
			if _, ok := sr["reportToCloud"].(bool); !ok {
				sr["reportToCloud"] = false
				r.Notes = append(r.Notes, Note{Object: id, Field: "spec.stateReport.reportToCloud",
					Reason: "unset, KubeEdge's default: set to false (Dowse's default is true)"})
			}
		}
	}
	raw, err := json.Marshal(map[string]any{"spec": spec})
	if err != nil {
		return err
	}
	if err := json.Unmarshal(raw, into); err != nil {
		return fmt.Errorf("spec: %w", err)
	}
	back, err := json.Marshal(into)
	if err != nil {
		return err
	}
	var kept map[string]any
	if err := json.Unmarshal(back, &kept); err != nil {
		return err
	}
	keptSpec, _ := kept["spec"].(map[string]any)
	have := map[string]bool{}
	for _, f := range leaves(keptSpec, "spec") {
		have[f] = true
	}
	for _, f := range leaves(spec, "spec") {
		if !have[f] {
			r.Notes = append(r.Notes, Note{Object: id, Field: f, Reason: fmt.Sprintf("not carried over: Dowse's %s has no such field", u.GetKind())})
		}
	}
	if len(status) > 0 {
		r.Notes = append(r.Notes, Note{Object: id, Field: "status", Reason: "not carried over: the edge reports it again"})
	}
	switch o := into.(type) {
	case *v1alpha1.Device:
		o.TypeMeta, o.ObjectMeta = metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "Device"}, meta(u)
	case *v1alpha1.DeviceModel:
		o.TypeMeta, o.ObjectMeta = metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "DeviceModel"}, meta(u)
	}
	r.Objects = append(r.Objects, into)
	return nil
}

// cycle reads KubeEdge's integer cycle obj[f]. Since mapper-framework
// v1.18 (KubeEdge 1.18) mappers read it as milliseconds, as Dowse does, so
// it is kept; before, as nanoseconds (the samples' 10000000000 is 10 s).
// A value of a billion or more is a cycle of over 11 days as milliseconds
// and of a second or more as nanoseconds: it is read as nanoseconds, said
// in a note.
func (r *Result) cycle(id, at string, obj map[string]any, f string) {
	n, ok := obj[f].(float64)
	if !ok || n < 1e9 {
		return
	}
	d := time.Duration(int64(n)).String()
	obj[f] = d
	r.Notes = append(r.Notes, Note{Object: id, Field: at + "." + f,
		Reason: fmt.Sprintf("%.0f read as nanoseconds, as mapper-framework before v1.18 read it (since then it reads milliseconds: %.0f days), and became %q",
			n, n/float64(24*time.Hour/time.Millisecond), d)})
}

// leaves lists the paths of a JSON object's leaves that are not empty or
// zero, array elements by index.
func leaves(v any, at string) []string {
	var out []string
	switch x := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			out = append(out, leaves(x[k], at+"."+k)...)
		}
	case []any:
		for i, e := range x {
			out = append(out, leaves(e, fmt.Sprintf("%s[%d]", at, i))...)
		}
	case nil:
	case string:
		if x != "" {
			out = append(out, at)
		}
	case bool:
		// A zero value is every field's default: losing it loses nothing.
		if x {
			out = append(out, at)
		}
	case float64:
		if x != 0 {
			out = append(out, at)
		}
	default:
		out = append(out, at)
	}
	return slices.Clip(out)
}
