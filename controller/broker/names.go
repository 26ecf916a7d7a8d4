// Package broker deploys what a Configuration asks for next to each of its
// devices: a broker Pod per node that sees an Instance, or a Job per
// Instance, and the Instance and Configuration Services in front of them.
package broker

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
)

// Placeholder is the resource name a broker spec may use in its requests
// and limits; the controller replaces it with the Instance's resource, as
// Akri does with its own placeholder.
const Placeholder = "{{PLACEHOLDER}}"

func shortHash(s string, n int) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])[:n]
}

// PodName is the broker Pod of an Instance on a node. Instance names are at
// most 63 characters, so the whole stays a valid DNS subdomain.
func PodName(instance, node string) string {
	return instance + "-" + shortHash(node, 8) + "-broker"
}

// JobName is the broker Job of an Instance for one Configuration
// generation, cut to the 63 characters the job-name label allows.
func JobName(instance string, generation int64) string {
	suffix := fmt.Sprintf("-g%d", generation)
	if len(instance)+len(suffix) > 63 {
		instance = strings.TrimRight(instance[:63-len(suffix)], "-.")
	}
	return instance + suffix
}

// InstanceServiceName and ConfigurationServiceName are the Services in
// front of an Instance's and a Configuration's brokers.
func InstanceServiceName(instance string) string { return cut(instance, 59) + "-svc" }

func ConfigurationServiceName(configuration string) string {
	return cut(configuration, 54) + "-" + shortHash(configuration, 4) + "-svc"
}

func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.TrimRight(s[:n], "-.")
}

// specHash is a stable digest of a spec, recorded on what is made from it.
func specHash(v any) string {
	b, _ := json.Marshal(v)
	return shortHash(string(b), 16)
}
