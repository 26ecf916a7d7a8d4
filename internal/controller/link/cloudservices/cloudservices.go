// Package cloudservices makes Services on edge nodes reachable from the
// cloud side: a Service labelled dowse.dev/reach-from-cloud=true gets a
// cloud-side Service (its name and "-cloud") whose endpoints are the
// controller replicas, each at a port the leader gave the Service; a
// connection to one is relayed to a ready Pod of the Service over its
// node's link (through the replica holding the node's session, as the API
// server's egress is).
package cloudservices

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

const (
	// LabelReach marks a Service (with a selector) to be reached from the
	// cloud side; a Configuration's reachFromCloud sets it on the
	// Services Dowse makes for its brokers.
	LabelReach = v1alpha1.LabelReachFromCloud
	// AnnotationPorts records the replicas' ports the leader gave a
	// Service: "SERVICEPORT=REPLICAPORT,...".
	AnnotationPorts = "dowse.dev/cloud-ports"
	// LabelCloudOf names, on a cloud-side Service and its EndpointSlice,
	// the Service it is the cloud side of.
	LabelCloudOf = "dowse.dev/cloud-service-of"
	// Suffix makes a cloud-side Service's name of its Service's.
	Suffix = "-cloud"
)

// PortRange is the replicas' ports cloud-side Services are given.
type PortRange struct{ Min, Max int32 }

// ParsePortRange reads "MIN-MAX"; "" is no range (the feature off).
func ParsePortRange(s string) (PortRange, error) {
	if s == "" {
		return PortRange{}, nil
	}
	lo, hi, ok := strings.Cut(s, "-")
	a, errA := strconv.ParseInt(lo, 10, 32)
	b, errB := strconv.ParseInt(hi, 10, 32)
	if !ok || errA != nil || errB != nil || a < 1 || b > 65535 || a > b {
		return PortRange{}, fmt.Errorf("port range %q: want MIN-MAX within 1-65535", s)
	}
	return PortRange{Min: int32(a), Max: int32(b)}, nil
}

// Off reports whether the range is empty (cloud-side Services off).
func (r PortRange) Off() bool { return r.Min == 0 }

func (r PortRange) contains(p int32) bool { return p >= r.Min && p <= r.Max }

// ports reads AnnotationPorts: service port → replica port. Entries that
// do not parse are left out (they are given again).
func ports(s *corev1.Service) map[int32]int32 {
	out := map[int32]int32{}
	for _, kv := range strings.Split(s.Annotations[AnnotationPorts], ",") {
		k, v, ok := strings.Cut(kv, "=")
		a, errA := strconv.ParseInt(k, 10, 32)
		b, errB := strconv.ParseInt(v, 10, 32)
		if ok && errA == nil && errB == nil {
			out[int32(a)] = int32(b)
		}
	}
	return out
}

// formatPorts writes AnnotationPorts, sorted by service port.
func formatPorts(m map[int32]int32) string {
	keys := make([]int32, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%d=%d", k, m[k])
	}
	return strings.Join(parts, ",")
}

// reachable reports whether s asks to be reached from the cloud side and
// can be: a selector to find its Pods by, and no cloud side of its own.
func reachable(s *corev1.Service) bool {
	return s.Labels[LabelReach] == "true" && len(s.Spec.Selector) > 0 && s.Labels[LabelCloudOf] == "" && s.DeletionTimestamp.IsZero()
}

// tcpPorts are s's TCP ports (the link carries byte streams).
func tcpPorts(s *corev1.Service) []corev1.ServicePort {
	var out []corev1.ServicePort
	for _, p := range s.Spec.Ports {
		if p.Protocol == "" || p.Protocol == corev1.ProtocolTCP {
			out = append(out, p)
		}
	}
	return out
}

// CloudName is the cloud-side Service's name of Service name, or an error
// when it would be too long to be one.
func CloudName(name string) (string, error) {
	n := name + Suffix
	if len(n) > 63 {
		return "", fmt.Errorf("service %q: its cloud side's name %q is longer than 63 characters", name, n)
	}
	return n, nil
}
