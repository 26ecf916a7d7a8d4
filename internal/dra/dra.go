// Package dra names and describes Dowse's devices for Dynamic Resource
// Allocation (resource.k8s.io/v1), so that the controller (which publishes
// shared devices), the agents (which publish their node's local devices and
// prepare claims) and the samples agree. It is the one owner of these names:
//
//	driver        dowse.dev
//	DeviceClass   <configuration>.<namespace>.dowse.dev     (DeviceClassName)
//	local pool    <node>/<namespace>/<configuration>        (LocalPool)
//	              one pool per node and Configuration, published by the
//	              node's agent with spec.nodeName
//	shared pool   shared/<namespace>/<configuration>/<hash> (SharedPool)
//	              one pool per shared Instance, published by the controller
//	              with a nodeSelector naming the Instance's status.nodes
//	device        <hash>, the Instance hash                 (Device)
//
// A pool name longer than the API's 253 characters has its Configuration
// part cut as in Instance names (v1alpha1.InstancePrefix) and, if still too
// long, its node part cut and given a hash; a configuration attribute longer
// than 64 characters is cut and given a hash (ConfigurationAttribute). So
// every valid Kubernetes name gives valid DRA names.
//
// ParseDevice reads a (pool, device) pair of an allocation back into the
// Instance it names. Each device carries the Instance's broker properties
// as attributes (Attributes) and its capacity as the consumable capacity
// "slots", one consumed per claim, so that at most capacity claims share it.
package dra

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"

	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

const (
	// DriverName is the DRA driver of every Dowse device.
	DriverName = v1alpha1.Domain
	// CapacitySlots is the consumable capacity of each device: the
	// Configuration's capacity, one consumed by each claim by default.
	CapacitySlots resourceapi.QualifiedName = "slots"

	// The attributes every device has, besides its broker properties.
	AttrConfiguration resourceapi.QualifiedName = "configuration"
	AttrNamespace     resourceapi.QualifiedName = "namespace"
	AttrInstance      resourceapi.QualifiedName = "instance"
	AttrShared        resourceapi.QualifiedName = "shared"

	// MaxDevicesPerSlice is how many devices one ResourceSlice of Dowse's
	// holds: the API's limit for slices whose devices use advanced
	// features, so that no slice is refused whatever the devices carry.
	MaxDevicesPerSlice = resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures

	sharedPrefix = "shared"
	// LabelNamespace marks a DeviceClass with its Configuration's namespace
	// (v1alpha1.LabelConfiguration holds the Configuration's name).
	LabelNamespace = v1alpha1.Domain + "/namespace"
)

// DeviceClassName is the DeviceClass of a Configuration's devices,
// "<configuration>.<namespace>.dowse.dev". A name too long for an object
// name has its Configuration part cut and a hash of the whole appended.
func DeviceClassName(namespace, configuration string) string {
	name := configuration + "." + namespace + "." + v1alpha1.Domain
	if len(name) <= validation.DNS1123SubdomainMaxLength {
		return name
	}
	sum := sha256.Sum256([]byte(namespace + "/" + configuration))
	suffix := "-" + hex.EncodeToString(sum[:])[:v1alpha1.HashLen] + "." + namespace + "." + v1alpha1.Domain
	cut := strings.TrimRight(configuration[:max(0, validation.DNS1123SubdomainMaxLength-len(suffix))], "-.")
	return cut + suffix
}

// ClassSelector is the CEL expression of a Configuration's DeviceClass: the
// driver's devices whose namespace and configuration attributes name it.
func ClassSelector(namespace, configuration string) string {
	return fmt.Sprintf("device.driver == %q && device.attributes[%q].%s == %q && device.attributes[%q].%s == %q",
		DriverName, DriverName, AttrNamespace, namespace, DriverName, AttrConfiguration, ConfigurationAttribute(configuration))
}

// ConfigurationAttribute is the configuration attribute of a
// Configuration's devices: its name, or, longer than the 64 characters an
// attribute's string takes, the name cut and a hash of it.
func ConfigurationAttribute(configuration string) string {
	if len(configuration) <= resourceapi.DeviceAttributeMaxValueLength {
		return configuration
	}
	sum := sha256.Sum256([]byte(configuration))
	cut := configuration[:resourceapi.DeviceAttributeMaxValueLength-v1alpha1.HashLen-1]
	return cut + "-" + hex.EncodeToString(sum[:])[:v1alpha1.HashLen]
}

// LocalPool is the pool of a node's local devices of one Configuration.
func LocalPool(node, namespace, configuration string) string {
	if pool := node + "/" + namespace + "/" + configuration; len(pool) <= resourceapi.PoolNameMaxLength {
		return pool
	}
	rest := "/" + namespace + "/" + v1alpha1.InstancePrefix(configuration)
	if room := resourceapi.PoolNameMaxLength - len(rest); len(node) > room {
		sum := sha256.Sum256([]byte(node))
		node = strings.TrimRight(node[:room-v1alpha1.HashLen-1], "-.") + "-" + hex.EncodeToString(sum[:])[:v1alpha1.HashLen]
	}
	return node + rest
}

// SharedPool is the pool of one shared Instance.
func SharedPool(namespace, configuration, hash string) string {
	if pool := sharedPrefix + "/" + namespace + "/" + configuration + "/" + hash; len(pool) <= resourceapi.PoolNameMaxLength {
		return pool
	}
	return sharedPrefix + "/" + namespace + "/" + v1alpha1.InstancePrefix(configuration) + "/" + hash
}

// ParseDevice is the inverse of LocalPool and SharedPool with the device
// name: the namespace and name of the Instance that a pool's device is (a
// cut Configuration part gives the same Instance name as the whole).
func ParseDevice(pool, device string) (namespace, instance string, ok bool) {
	parts := strings.Split(pool, "/")
	var cfg string
	switch {
	case len(parts) == 4 && parts[0] == sharedPrefix && parts[3] == device:
		namespace, cfg = parts[1], parts[2]
	case len(parts) == 3:
		namespace, cfg = parts[1], parts[2]
	default:
		return "", "", false
	}
	if namespace == "" || cfg == "" || device == "" {
		return "", "", false
	}
	return namespace, v1alpha1.InstanceName(cfg, device), true
}

// Pool is the pool that publishes inst: its shared pool, or the local pool
// of node.
func Pool(inst *v1alpha1.Instance, node string) string {
	if inst.Spec.Shared {
		return SharedPool(inst.Namespace, inst.Spec.ConfigurationName, v1alpha1.InstanceHash(inst.Name))
	}
	return LocalPool(node, inst.Namespace, inst.Spec.ConfigurationName)
}

// ValidPool returns an error when the API would refuse pool as a pool name
// (at most 253 characters; each '/'-separated part a DNS subdomain).
func ValidPool(pool string) error {
	if len(pool) > resourceapi.PoolNameMaxLength {
		return fmt.Errorf("pool name %q is longer than %d characters", pool, resourceapi.PoolNameMaxLength)
	}
	for part := range strings.SplitSeq(pool, "/") {
		if errs := validation.IsDNS1123Subdomain(part); len(errs) > 0 {
			return fmt.Errorf("pool name %q: %s", pool, strings.Join(errs, "; "))
		}
	}
	return nil
}

// Device is inst as a ResourceSlice device: named by its hash, with its
// attributes and its capacity as consumable "slots".
func Device(inst *v1alpha1.Instance) resourceapi.Device {
	capacity := max(inst.Spec.Capacity, 1)
	return resourceapi.Device{
		Name:                     v1alpha1.InstanceHash(inst.Name),
		Attributes:               Attributes(inst),
		AllowMultipleAllocations: ptr.To(true),
		Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			CapacitySlots: {
				Value: *resource.NewQuantity(int64(capacity), resource.DecimalSI),
				RequestPolicy: &resourceapi.CapacityRequestPolicy{
					Default: resource.NewQuantity(1, resource.DecimalSI),
				},
			},
		},
	}
}

// Attributes are inst's device attributes: configuration, namespace,
// instance and shared, then each broker property under AttributeName of its
// name (one that has no valid name, or collides with one before it in name
// order, is left out), typed int when it parses as a base-10 integer, bool
// when it is "true" or "false", string otherwise (a string longer than the
// API's 64 characters is left out rather than cut: a cut value would match
// no CEL comparison a user writes). At most 32 attributes and capacities
// per device, as the API allows: the rest of the properties in name order
// are left out.
func Attributes(inst *v1alpha1.Instance) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		AttrConfiguration: {StringValue: ptr.To(ConfigurationAttribute(inst.Spec.ConfigurationName))},
		AttrNamespace:     {StringValue: ptr.To(inst.Namespace)},
		AttrInstance:      {StringValue: ptr.To(inst.Name)},
		AttrShared:        {BoolValue: ptr.To(inst.Spec.Shared)},
	}
	limit := resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice - 1 // one capacity
	for _, k := range slices.Sorted(maps.Keys(inst.Spec.BrokerProperties)) {
		if len(attrs) >= limit {
			break
		}
		name := AttributeName(k)
		if name == "" {
			continue
		}
		if _, taken := attrs[name]; taken {
			continue
		}
		if a, ok := Attribute(inst.Spec.BrokerProperties[k]); ok {
			attrs[name] = a
		}
	}
	return attrs
}

// Attribute types v: int, bool or string; false for a string the API would
// refuse (longer than 64 characters).
func Attribute(v string) (resourceapi.DeviceAttribute, bool) {
	if i, err := strconv.ParseInt(v, 10, 64); err == nil {
		return resourceapi.DeviceAttribute{IntValue: ptr.To(i)}, true
	}
	switch v {
	case "true":
		return resourceapi.DeviceAttribute{BoolValue: ptr.To(true)}, true
	case "false":
		return resourceapi.DeviceAttribute{BoolValue: ptr.To(false)}, true
	}
	if len(v) > resourceapi.DeviceAttributeMaxValueLength {
		return resourceapi.DeviceAttribute{}, false
	}
	return resourceapi.DeviceAttribute{StringValue: ptr.To(v)}, true
}

// AttributeName makes a broker property name a valid attribute name: a C
// identifier of at most 32 characters, every other character replaced by
// '_' and a leading '_' added when it would start with a digit; case is
// kept (DEBUG_ECHO_DESCRIPTION stays as it is, for CEL to read as
// device.attributes["dowse.dev"].DEBUG_ECHO_DESCRIPTION). "" when s is
// empty.
func AttributeName(s string) resourceapi.QualifiedName {
	if s == "" {
		return ""
	}
	var b strings.Builder
	if s[0] >= '0' && s[0] <= '9' {
		b.WriteByte('_')
	}
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	name := b.String()
	if len(name) > resourceapi.DeviceMaxIDLength {
		name = name[:resourceapi.DeviceMaxIDLength]
	}
	return resourceapi.QualifiedName(name)
}

// NodeSelector selects the nodes whose kubernetes.io/hostname label is one
// of hostnames (a ResourceSlice's selector takes exactly one term, and a
// metadata.name field requirement one value only, so the label is the way
// to name several nodes; the kubelet sets it to the node's name unless its
// hostname is overridden); nil when there are none.
func NodeSelector(hostnames []string) *corev1.NodeSelector {
	if len(hostnames) == 0 {
		return nil
	}
	return &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
		MatchExpressions: []corev1.NodeSelectorRequirement{{
			Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: slices.Compact(slices.Sorted(slices.Values(hostnames))),
		}},
	}}}
}

// Buckets spreads a pool's device names over its slices so that one
// device coming or going changes one slice: each name goes to the slice a
// hash of it picks, among a power of two of slices that holds at most
// spreadTarget devices each on average, so the slice count (and every
// slice) changes only when the pool doubles or halves. have is the pool's
// slice count now (0 for a new pool): the count grows as soon as the pool
// outgrows it but shrinks only once the pool fits a quarter of it, so a
// pool hovering at a threshold (4,096 devices: 128 slices or 256) does not
// rewrite every slice at each crossing. Should a slice pass
// MaxDevicesPerSlice (vanishingly rare), the count doubles until none
// does. It returns the slice count and each name's slice; a slice may be
// empty, which keeps the count, and so the other slices, unchanged when
// its last device goes.
func Buckets(names []string, have int) (int, []int) {
	n := 1
	for n*spreadTarget < len(names) {
		n *= 2
	}
	if have > n && have&(have-1) == 0 && have <= maxBuckets && len(names) > have*spreadTarget/4 {
		n = have
	}
	hashes := make([]uint32, len(names))
	for i, name := range names {
		h := fnv.New32a()
		h.Write([]byte(name))
		hashes[i] = h.Sum32()
	}
	of := make([]int, len(names))
	for {
		counts := make([]int, n)
		over := false
		for i, h := range hashes {
			b := int(h % uint32(n))
			of[i] = b
			counts[b]++
			over = over || counts[b] > MaxDevicesPerSlice
		}
		if !over || n >= maxBuckets {
			return n, of
		}
		n *= 2
	}
}

// spreadTarget is the most devices per slice on average in Buckets;
// maxBuckets bounds its doubling (names sharing a 32-bit hash).
const (
	spreadTarget = 32
	maxBuckets   = 1 << 16
)

// Settle waits, after a first change, until no change has come on dirty for
// quiet, or max has passed since the first: a publisher rebuilds its slices
// once per burst of Instance changes (thousands of devices discovered at
// once) rather than once per change, yet not later than max. False when
// ctx ended.
func Settle(ctx context.Context, dirty <-chan struct{}, quiet, max time.Duration) bool {
	deadline := time.NewTimer(max)
	defer deadline.Stop()
	for {
		t := time.NewTimer(quiet)
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-deadline.C:
			t.Stop()
			return true
		case <-t.C:
			return true
		case <-dirty:
			t.Stop()
		}
	}
}
