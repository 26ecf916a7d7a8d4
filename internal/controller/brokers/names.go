// Package brokers deploys the workloads a Configuration's brokerSpec
// describes, per discovered device: a broker Pod per node that sees an
// Instance, or a Job per Instance, and the Instance and Configuration
// Services in front of them (Akri's brokers). The Pods of a mapper, which
// serve a Configuration's Devices per node rather than its Instances, are
// internal/controller/mappers'.
package brokers

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
