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
// controller asks brokers' resources by them, so they must agree. Every name
// a node shares with other namespaces' devices (the kubelet's resources, the
// runtime's CDI devices) carries the namespace, and every valid Kubernetes
// name gives a valid one.
//
//	Instance name     <configuration>-<hash>                 (InstanceName, InstanceHash)
//	resource names    dowse.dev/<instance>.<namespace>       (ResourceName, ParseResourceName)
//	                  dowse.dev/<configuration>.<namespace>
//	                  (longer than 63 after the prefix: <name cut>-<hash of both>)
//	CDI device        dowse.dev/instance=<instance>.<namespace> (CDIName, ParseCDIName)
//	slot id           <hash>-<n>                             (SlotID, ParseSlotID)
//
// Before the namespace was part of them, resources were dowse.dev/<instance>
// and dowse.dev/<configuration>, and CDI devices dowse.dev/<configuration>=<hash>
// (LegacyResourceName, LegacyCDIName): pods allocated under those names keep
// them while they run (the kubelet's checkpoint holds the resource and the
// CDI device of every allocation), so the agent still serves them for the
// slots such pods hold. The DRA names are internal/dra's.
const (
	// Domain is Dowse's API group and the prefix of every name Dowse
	// puts on others' objects: extended resources, CDI kinds, labels.
	Domain = "dowse.dev"
	// ResourcePrefix is the extended-resource domain of every Dowse device
	// plugin, and the CDI vendor of every Dowse spec.
	ResourcePrefix = Domain + "/"
	// CDIKind is the CDI kind (vendor/class) of every Instance's device.
	CDIKind = ResourcePrefix + "instance"

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
// so that the whole fits an extended resource name (InstancePrefix). Two
// long Configuration names with a common prefix can then share a name; the
// agent's writer detects that through spec.configurationName and reports it.
func InstanceName(configuration, hash string) string {
	return InstancePrefix(configuration) + "-" + hash
}

// InstancePrefix is the part of a Configuration's Instance names before the
// hash: the Configuration's name, cut to 46 characters. Idempotent.
func InstancePrefix(configuration string) string {
	if limit := maxResourceNameLen - HashLen - 1; len(configuration) > limit {
		return strings.TrimRight(configuration[:limit], "-.")
	}
	return configuration
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
// of namespace: "dowse.dev/<name>.<namespace>", or, when that is longer than
// a resource name allows, the name cut and a hash of namespace and name,
// "dowse.dev/<name cut>-<hash>" (dots made dashes, so that it never reads
// as the first form).
func ResourceName(namespace, name string) string {
	if full := name + "." + namespace; len(full) <= maxResourceNameLen {
		return ResourcePrefix + full
	}
	sum := sha256.Sum256([]byte(namespace + "/" + name))
	cut := strings.TrimRight(name[:min(len(name), maxResourceNameLen-HashLen-1)], "-.")
	return ResourcePrefix + strings.ReplaceAll(cut, ".", "-") + "-" + hex.EncodeToString(sum[:])[:HashLen]
}

// ParseResourceName is ResourceName's inverse: the namespace and the
// Instance or Configuration name, and false for a resource that is not
// Dowse's or whose name was too long to keep (the hashed form). A legacy
// name whose Instance or Configuration name has a dot reads as a current
// one: the agent compares resources with the names it makes, never parses
// what it is given.
func ParseResourceName(resource string) (namespace, name string, ok bool) {
	rest, ok := strings.CutPrefix(resource, ResourcePrefix)
	if !ok {
		return "", "", false
	}
	i := strings.LastIndexByte(rest, '.')
	if i <= 0 || i == len(rest)-1 {
		return "", "", false
	}
	return rest[i+1:], rest[:i], true
}

// LegacyResourceName is the resource an Instance or Configuration had
// before resources carried the namespace: "dowse.dev/<name>".
func LegacyResourceName(name string) string { return ResourcePrefix + name }

// ValidateResourceName returns an error when the kubelet would refuse
// resource (the name part is at most 63 characters).
func ValidateResourceName(resource string) error {
	if errs := validation.IsQualifiedName(resource); len(errs) > 0 {
		return fmt.Errorf("resource %q is not a valid extended resource name: %s", resource, strings.Join(errs, "; "))
	}
	return nil
}

// ResourceName is this Instance's extended resource.
func (in *Instance) ResourceName() string { return ResourceName(in.Namespace, in.Name) }

// CDIName is the fully qualified CDI device name of the Instance
// namespace/name, "dowse.dev/instance=<name>.<namespace>": a CDI device
// name takes the characters of object names and has no length limit, and
// the class is a constant, as CDI classes must start with a letter and
// Configuration names need not.
func CDIName(namespace, name string) string { return CDIKind + "=" + name + "." + namespace }

// ParseCDIName is CDIName's inverse.
func ParseCDIName(cdiName string) (namespace, name string, ok bool) {
	dev, ok := strings.CutPrefix(cdiName, CDIKind+"=")
	if !ok {
		return "", "", false
	}
	i := strings.LastIndexByte(dev, '.')
	if i <= 0 || i == len(dev)-1 {
		return "", "", false
	}
	return dev[i+1:], dev[:i], true
}

// CDIName is the fully qualified CDI device name of this Instance.
func (in *Instance) CDIName() string { return CDIName(in.Namespace, in.Name) }

// LegacyCDIName is the CDI device an Instance had before CDI names carried
// the namespace, "dowse.dev/<configuration>=<hash>".
func LegacyCDIName(configuration, hash string) string {
	return ResourcePrefix + configuration + "=" + hash
}

// LegacyCDIName is this Instance's LegacyCDIName.
func (in *Instance) LegacyCDIName() string {
	return LegacyCDIName(in.Spec.ConfigurationName, InstanceHash(in.Name))
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

// The names below are of what the agent and the controller make for others
// to find: brokers read the environment CDI gives them, and people and tests
// look up the broker Pods, Jobs and Services and the agent's CDI spec files.

// CDISpecFileName is the file, without extension, in the CDI spec directory
// that holds an Instance's spec: namespace and name keep Instances of every
// namespace apart.
func CDISpecFileName(namespace, name string) string {
	return Domain + "_" + namespace + "_" + name
}

// CDISpecFileName is CDISpecFileName of the Instance.
func (in *Instance) CDISpecFileName() string { return CDISpecFileName(in.Namespace, in.Name) }

// EnvName makes s a valid, conventional environment variable name, as the
// CDI specs give a device's properties to its broker: upper case, every
// character outside [A-Z0-9_] replaced by '_', and a leading '_' when it
// would start with a digit. An empty s gives "".
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

// BrokerResourcePlaceholder is the resource name a broker spec may use in
// its requests and limits; the controller replaces it with the Instance's
// resource, as Akri does with its own placeholder.
const BrokerResourcePlaceholder = "{{PLACEHOLDER}}"

// BrokerPodName is the broker Pod of an Instance on a node. Instance names
// are at most 63 characters, so the whole stays a valid DNS subdomain.
func BrokerPodName(instance, node string) string {
	return instance + "-" + shortHash(node, 8) + "-broker"
}

// BrokerJobName is the broker Job of an Instance for one Configuration
// generation, cut to the 63 characters the job-name label allows.
func BrokerJobName(instance string, generation int64) string {
	suffix := fmt.Sprintf("-g%d", generation)
	if len(instance)+len(suffix) > 63 {
		instance = strings.TrimRight(instance[:63-len(suffix)], "-.")
	}
	return instance + suffix
}

// InstanceServiceName and ConfigurationServiceName are the Services in
// front of an Instance's and a Configuration's brokers.
func InstanceServiceName(instance string) string { return cutName(instance, 59) + "-svc" }

func ConfigurationServiceName(configuration string) string {
	return cutName(configuration, 54) + "-" + shortHash(configuration, 4) + "-svc"
}

func shortHash(s string, n int) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])[:n]
}

func cutName(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.TrimRight(s[:n], "-.")
}
