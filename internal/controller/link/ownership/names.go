package ownership

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Labels and annotations of the Leases this package keeps.
const (
	// LabelKind is "node" on a node's ownership record and "replica" on a
	// replica's presence Lease.
	LabelKind = "dowse.dev/link"
	// LabelHolder names the replica holding a node's session
	// (HolderLabel(replica)), so that each replica lists and watches only
	// the records it holds.
	LabelHolder = "dowse.dev/link-holder"
	// AnnotationNode is the node a record is of (a label could not hold
	// every node name).
	AnnotationNode = "dowse.dev/node"
	// AnnotationSessions is the number of sessions a replica holds, on its
	// presence Lease.
	AnnotationSessions = "dowse.dev/sessions"
	// AnnotationDraining is "true" on the presence Lease of a replica that
	// is moving its edges away before it stops.
	AnnotationDraining = "dowse.dev/draining"
	// AnnotationEgress is where a replica's egress peer listener is
	// (host:port), on its presence Lease: a replica that does not hold a
	// node's session forwards the API server's connections to the holder.
	AnnotationEgress = "dowse.dev/egress"
	// AnnotationCloudServices is the address a replica relays cloud-side
	// Services on, on its presence Lease: the endpoints of every
	// cloud-side Service (package cloudservices).
	AnnotationCloudServices = "dowse.dev/cloud-services"
	// AnnotationReadings is where a replica serves the live readings API
	// (host:port), on its presence Lease: a replica asks the others for
	// the readings of the nodes they hold.
	AnnotationReadings = "dowse.dev/readings"

	kindNode    = "node"
	kindReplica = "replica"
)

const (
	nodeLeasePrefix    = "dowse-link-"
	replicaLeasePrefix = "dowse-cloudhub-"
)

// NodeLeaseName is the name of node's ownership record: the node's name
// after a prefix, shortened with a hash of the whole name when that would
// be too long for an object name.
func NodeLeaseName(node string) string { return objectName(nodeLeasePrefix, node) }

// ReplicaLeaseName is the name of a replica's presence Lease.
func ReplicaLeaseName(replica string) string { return objectName(replicaLeasePrefix, replica) }

func objectName(prefix, name string) string {
	full := prefix + name
	if len(full) <= validation.DNS1123SubdomainMaxLength && len(validation.IsDNS1123Subdomain(full)) == 0 {
		return full
	}
	// Node and Pod names are DNS subdomains already; anything else (too
	// long, or not a subdomain) keeps a readable head and the hash of the
	// whole, which no other name shares.
	head := strings.ToLower(name)
	head = strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '.' {
			return r
		}
		return '-'
	}, head)
	if len(head) > 200 {
		head = head[:200]
	}
	head = strings.Trim(head, "-.")
	return prefix + head + "-" + hash(name)
}

// HolderLabel is the LabelHolder value of replica: its name when that is a
// valid label value, else a hash of it.
func HolderLabel(replica string) string {
	if len(validation.IsValidLabelValue(replica)) == 0 && replica != "" {
		return replica
	}
	return "h-" + hash(replica)
}

func hash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:10])
}
