// Package broker deploys what a Configuration asks for next to each of its
// devices: a broker Pod per node that sees an Instance, or a Job per
// Instance, and the Instance and Configuration Services in front of them.
package broker

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"

	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// Placeholder is v1alpha1.BrokerResourcePlaceholder.
const Placeholder = v1alpha1.BrokerResourcePlaceholder

// specHash is a stable digest of a spec, recorded on what is made from it.
func specHash(v any) string {
	b, _ := json.Marshal(v)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])[:16]
}
