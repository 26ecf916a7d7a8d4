package v1alpha1

import (
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/types"
)

// PropertyObjects are the Secrets and ConfigMaps the discoveryProperties of c
// read, each named once and sorted (a reference without a namespace is in
// c's). They are the contract between the controller, which grants the
// agents read of exactly these objects (internal/controller/propertyaccess), and the
// agent, which watches exactly these (internal/agent/propertyrefs). A Configuration
// being deleted reads nothing.
func (c *Configuration) PropertyObjects() (secrets, configMaps []types.NamespacedName) {
	if c.DeletionTimestamp != nil {
		return nil, nil
	}
	for _, p := range c.Spec.DiscoveryHandler.DiscoveryProperties {
		if p.ValueFrom == nil {
			continue
		}
		if r := p.ValueFrom.SecretKeyRef; r != nil {
			secrets = append(secrets, r.Object(c.Namespace))
		}
		if r := p.ValueFrom.ConfigMapKeyRef; r != nil {
			configMaps = append(configMaps, r.Object(c.Namespace))
		}
	}
	return sortedUnique(secrets), sortedUnique(configMaps)
}

// Object is the referenced object: in namespace def (the Configuration's)
// unless r names one.
func (r *ObjectKeyRef) Object(def string) types.NamespacedName {
	ns := r.Namespace
	if ns == "" {
		ns = def
	}
	return types.NamespacedName{Namespace: ns, Name: r.Name}
}

func sortedUnique(ns []types.NamespacedName) []types.NamespacedName {
	slices.SortFunc(ns, func(a, b types.NamespacedName) int {
		if c := strings.Compare(a.Namespace, b.Namespace); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	return slices.Compact(ns)
}

// PropertyAccessRole is the Role (and RoleBinding) the controller keeps in
// each namespace holding objects that discoveryProperties read: it grants
// the agents get, list and watch on exactly those objects, by name.
const PropertyAccessRole = "dowse-agent-discovery-properties"
