package v1alpha1

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// The names derived from an Instance, each built and read back here only:
// the agent makes them, its device plugins and CDI specs parse them, and the
// controller asks brokers' resources by them, so they must agree.
//
//	Instance name     <configuration>-<hash>      (InstanceName, InstanceHash)
//	resource names    dowse.dev/<instance>        (ResourceName, ParseResourceName)
//	                  dowse.dev/<configuration>
//	CDI kind, device  dowse.dev/<configuration>   (CDIKind, CDIName, ParseCDIName)
//	                  device name <hash>
//	slot id           <hash>-<n>                  (SlotID, ParseSlotID)
const (
	// Domain is Dowse's API group and the prefix of every name Dowse
	// puts on others' objects: extended resources, CDI kinds, labels.
	Domain = "dowse.dev"
	// ResourcePrefix is the extended-resource domain of every Dowse device
	// plugin, and the CDI vendor of every Dowse spec.
	ResourcePrefix = Domain + "/"

	// HashLen hex digits = 64 bits: the chance of any collision among
	// 100,000 devices of one Configuration is about 3e-10.
	HashLen = 16
	// maxResourceNameLen is what an extended resource name allows after its
	// prefix; Instance names are cut to fit it.
	maxResourceNameLen = 63
)

// DeviceHash is the Instance hash of a device: of its id alone when shared
// (every node that sees it agrees), of id and node otherwise.
func DeviceHash(deviceID string, shared bool, nodeName string) string {
	h := sha256.New()
	h.Write([]byte(deviceID))
	if !shared {
		// A zero byte cannot occur in a node name, so ("a","bc") and
		// ("ab","c") never hash alike.
		h.Write([]byte{0})
		h.Write([]byte(nodeName))
	}
	return hex.EncodeToString(h.Sum(nil))[:HashLen]
}

// InstanceName is "<configuration>-<hash>", with the Configuration's name cut
// so that the whole fits an extended resource name. Two long Configuration
// names with a common prefix can then share a name; the agent's writer
// detects that through spec.configurationName and reports it.
func InstanceName(configuration, hash string) string {
	prefix := configuration
	if limit := maxResourceNameLen - len(hash) - 1; len(prefix) > limit {
		prefix = strings.TrimRight(prefix[:limit], "-.")
	}
	return prefix + "-" + hash
}

// InstanceHash is InstanceName's inverse for the hash: the part of an
// Instance name after its last '-' (the whole name when it has none).
func InstanceHash(instanceName string) string {
	if i := strings.LastIndexByte(instanceName, '-'); i >= 0 {
		return instanceName[i+1:]
	}
	return instanceName
}

// ResourceName is the extended resource of an Instance or a Configuration
// name. ValidateResourceName says whether the kubelet accepts it.
func ResourceName(name string) string { return ResourcePrefix + name }

// ParseResourceName is ResourceName's inverse: the Instance or
// Configuration name, and false for a resource that is not Dowse's.
func ParseResourceName(resource string) (string, bool) {
	name, ok := strings.CutPrefix(resource, ResourcePrefix)
	return name, ok && name != ""
}

// ValidateResourceName returns an error when the kubelet would refuse
// resource (the name part is at most 63 characters).
func ValidateResourceName(resource string) error {
	if errs := validation.IsQualifiedName(resource); len(errs) > 0 {
		return fmt.Errorf("resource %q is not a valid extended resource name: %s", resource, strings.Join(errs, "; "))
	}
	return nil
}

// CDIKind is the CDI kind of a Configuration's devices.
func CDIKind(configuration string) string { return ResourcePrefix + configuration }

// CDIName is the fully qualified CDI device name of an Instance,
// "dowse.dev/<configuration>=<hash>".
func CDIName(configuration, hash string) string { return CDIKind(configuration) + "=" + hash }

// ParseCDIName is CDIName's inverse.
func ParseCDIName(name string) (configuration, hash string, ok bool) {
	kind, hash, ok := strings.Cut(name, "=")
	if !ok {
		return "", "", false
	}
	configuration, ok = strings.CutPrefix(kind, ResourcePrefix)
	if !ok || configuration == "" || hash == "" {
		return "", "", false
	}
	return configuration, hash, true
}

// CDIName is the fully qualified CDI device name of this Instance.
func (in *Instance) CDIName() string {
	return CDIName(in.Spec.ConfigurationName, InstanceHash(in.Name))
}

// SlotID is the device id of slot n of an Instance: stable across restarts
// and nodes, so that every node and the Instance status agree on it.
func SlotID(instanceName string, n int) string {
	return InstanceHash(instanceName) + "-" + strconv.Itoa(n)
}

// ParseSlotID is SlotID's inverse: the Instance hash and the slot number.
func ParseSlotID(id string) (hash string, n int, ok bool) {
	i := strings.LastIndexByte(id, '-')
	if i <= 0 || strings.IndexByte(id[:i], '-') >= 0 {
		return "", 0, false
	}
	n, err := strconv.Atoi(id[i+1:])
	if err != nil || n < 0 || strconv.Itoa(n) != id[i+1:] {
		return "", 0, false
	}
	return id[:i], n, true
}

// SlotIDs are the slot ids of this Instance, one per capacity slot (at
// least one: a zero capacity means the Configuration left it unset).
func (in *Instance) SlotIDs() []string {
	n := max(int(in.Spec.Capacity), 1)
	ids := make([]string, n)
	for i := range ids {
		ids[i] = SlotID(in.Name, i)
	}
	return ids
}

// HasNode reports whether node is in status.nodes: it sees the device.
func (in *Instance) HasNode(node string) bool {
	for _, n := range in.Status.Nodes {
		if n.Name == node {
			return true
		}
	}
	return false
}
