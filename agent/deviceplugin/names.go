// Package deviceplugin serves the kubelet device plugins that let pods ask
// for Dowse devices: one plugin per Instance on this node
// (dowse.dev/<instance>) and one per Configuration
// (dowse.dev/<configuration>), each offering one device per capacity slot,
// and writes a CDI spec per Instance for the container runtime.
//
// The lifecycle of a plugin (serve the socket, register with the kubelet,
// serve and register again when the kubelet restarts) is the Plugin type;
// what the plugin offers and answers is a separate gRPC service, so that
// both can be tested alone.
package deviceplugin

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// ResourcePrefix is the extended-resource domain of every Dowse plugin and
// the CDI vendor of every Dowse spec.
const ResourcePrefix = "dowse.dev/"

// InstanceHash is the part of an Instance name after its last '-': the hash
// the agent puts there, and the CDI device name.
func InstanceHash(instanceName string) string {
	if i := strings.LastIndexByte(instanceName, '-'); i >= 0 {
		return instanceName[i+1:]
	}
	return instanceName
}

// SlotID is the device id of slot n of an Instance: stable across restarts
// and nodes, so that every node and the Instance status agree on it.
func SlotID(instanceName string, n int) string {
	return fmt.Sprintf("%s-%d", InstanceHash(instanceName), n)
}

// SlotIDs are the slot ids of inst, one per capacity slot (at least one: a
// zero capacity means the Configuration left it unset).
func SlotIDs(inst *v1alpha1.Instance) []string {
	n := int(inst.Spec.Capacity)
	if n < 1 {
		n = 1
	}
	ids := make([]string, n)
	for i := range ids {
		ids[i] = SlotID(inst.Name, i)
	}
	return ids
}

// ResourceName is the extended resource of a name (Instance or
// Configuration), or an error when the kubelet would refuse it (the name
// part of a resource is at most 63 characters).
func ResourceName(name string) (string, error) {
	r := ResourcePrefix + name
	if errs := validation.IsQualifiedName(r); len(errs) > 0 {
		return "", fmt.Errorf("resource %q is not a valid extended resource name: %s", r, strings.Join(errs, "; "))
	}
	return r, nil
}

// CDIKind is the CDI kind of a Configuration's devices.
func CDIKind(configuration string) string { return ResourcePrefix + configuration }

// CDIName is the fully qualified CDI device name of an Instance.
func CDIName(inst *v1alpha1.Instance) string {
	return CDIKind(inst.Spec.ConfigurationName) + "=" + InstanceHash(inst.Name)
}

// EnvName makes s a valid, conventional environment variable name:
// upper case, every character outside [A-Z0-9_] replaced by '_', and a
// leading '_' when it would start with a digit. An empty s gives "".
func EnvName(s string) string {
	if s == "" {
		return ""
	}
	var b strings.Builder
	if s[0] >= '0' && s[0] <= '9' {
		b.WriteByte('_')
	}
	for _, r := range strings.ToUpper(s) {
		switch {
		case r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	return b.String()
}
