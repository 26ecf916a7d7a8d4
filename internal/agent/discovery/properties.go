package discovery

import (
	"errors"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dowse-dev/dowse/internal/agent/propertyrefs"
	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// valueSource is where property values come from (a propertyrefs.Watcher):
// an owner states what it reads, then reads values.
type valueSource interface {
	Set(owner types.NamespacedName, refs []propertyrefs.Ref)
	Value(ref propertyrefs.Ref, key string) ([]byte, bool, error)
}

// propertyRefs are the objects cfg's discoveryProperties read.
func propertyRefs(cfg *v1alpha1.Configuration) []propertyrefs.Ref {
	secrets, configMaps := cfg.PropertyObjects()
	refs := make([]propertyrefs.Ref, 0, len(secrets)+len(configMaps))
	for _, s := range secrets {
		refs = append(refs, propertyrefs.Ref{Kind: propertyrefs.Secret, NamespacedName: s})
	}
	for _, c := range configMaps {
		refs = append(refs, propertyrefs.Ref{Kind: propertyrefs.ConfigMap, NamespacedName: c})
	}
	return refs
}

// resolveProperties reads every discoveryProperty from src, which must
// watch propertyRefs(cfg). A missing required reference is an error naming
// the property; a missing optional one is sent as a ByteData without a
// value, as Akri does. An object not read yet makes an error that
// errors.Is propertyrefs.ErrPending.
func resolveProperties(src valueSource, cfg *v1alpha1.Configuration) (map[string]*discoveryv1.ByteData, error) {
	out := make(map[string]*discoveryv1.ByteData, len(cfg.Spec.DiscoveryHandler.DiscoveryProperties))
	for i, p := range cfg.Spec.DiscoveryHandler.DiscoveryProperties {
		field := fmt.Sprintf("spec.discoveryHandler.discoveryProperties[%d] (%s)", i, p.Name)
		var ref propertyrefs.Ref
		var r *v1alpha1.ObjectKeyRef
		switch {
		case p.Value != nil:
			out[p.Name] = &discoveryv1.ByteData{Vec: []byte(*p.Value)}
			continue
		case p.ValueFrom != nil && p.ValueFrom.ConfigMapKeyRef != nil:
			r = p.ValueFrom.ConfigMapKeyRef
			ref = propertyrefs.Ref{Kind: propertyrefs.ConfigMap, NamespacedName: r.Object(cfg.Namespace)}
		case p.ValueFrom != nil && p.ValueFrom.SecretKeyRef != nil:
			r = p.ValueFrom.SecretKeyRef
			ref = propertyrefs.Ref{Kind: propertyrefs.Secret, NamespacedName: r.Object(cfg.Namespace)}
		default:
			return nil, fmt.Errorf("%s: neither value nor valueFrom is set", field)
		}
		v, found, err := src.Value(ref, r.Key)
		switch {
		case errors.Is(err, propertyrefs.ErrPending):
			return nil, fmt.Errorf("%s: %s: %w", field, ref, err)
		case apierrors.IsForbidden(err):
			return nil, fmt.Errorf("%s: reading %s is forbidden (the controller grants this node's agent the objects discoveryProperties name, in Role %s of namespace %s; retrying): %w",
				field, ref, v1alpha1.PropertyAccessRole, ref.Namespace, err)
		case err != nil:
			return nil, fmt.Errorf("%s: reading %s (retrying): %w", field, ref, err)
		case !found && !r.Optional:
			return nil, fmt.Errorf("%s: %s has no key %q", field, ref, r.Key)
		}
		out[p.Name] = byteData(v, found)
	}
	return out, nil
}

func byteData(v []byte, found bool) *discoveryv1.ByteData {
	if !found {
		return &discoveryv1.ByteData{}
	}
	if v == nil {
		v = []byte{}
	}
	return &discoveryv1.ByteData{Vec: v}
}
