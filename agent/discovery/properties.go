package discovery

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// refIndex indexes Configurations by the ConfigMaps and Secrets their
// discoveryProperties read, so that a change of one re-resolves them.
const refIndex = "dowse.dev/property-refs"

func refKey(kind, namespace, name string) string { return kind + "/" + namespace + "/" + name }

func indexPropertyRefs(obj client.Object) []string {
	cfg := obj.(*v1alpha1.Configuration)
	var keys []string
	for _, p := range cfg.Spec.DiscoveryHandler.DiscoveryProperties {
		if p.ValueFrom == nil {
			continue
		}
		if r := p.ValueFrom.ConfigMapKeyRef; r != nil {
			keys = append(keys, refKey("ConfigMap", namespaceOr(r.Namespace, cfg.Namespace), r.Name))
		}
		if r := p.ValueFrom.SecretKeyRef; r != nil {
			keys = append(keys, refKey("Secret", namespaceOr(r.Namespace, cfg.Namespace), r.Name))
		}
	}
	return keys
}

func namespaceOr(ns, def string) string {
	if ns == "" {
		return def
	}
	return ns
}

// resolveProperties reads every discoveryProperty. A missing required
// reference is an error naming the property; a missing optional one is sent
// as a ByteData without a value, as Akri does.
func resolveProperties(ctx context.Context, c client.Reader, cfg *v1alpha1.Configuration) (map[string]*discoveryv1.ByteData, error) {
	out := make(map[string]*discoveryv1.ByteData, len(cfg.Spec.DiscoveryHandler.DiscoveryProperties))
	for i, p := range cfg.Spec.DiscoveryHandler.DiscoveryProperties {
		field := fmt.Sprintf("spec.discoveryHandler.discoveryProperties[%d] (%s)", i, p.Name)
		switch {
		case p.Value != nil:
			out[p.Name] = &discoveryv1.ByteData{Vec: []byte(*p.Value)}
		case p.ValueFrom != nil && p.ValueFrom.ConfigMapKeyRef != nil:
			r := p.ValueFrom.ConfigMapKeyRef
			var cm corev1.ConfigMap
			err := c.Get(ctx, client.ObjectKey{Namespace: namespaceOr(r.Namespace, cfg.Namespace), Name: r.Name}, &cm)
			v, found, err := lookup(err, func() ([]byte, bool) {
				if s, ok := cm.Data[r.Key]; ok {
					return []byte(s), true
				}
				b, ok := cm.BinaryData[r.Key]
				return b, ok
			})
			if err != nil {
				return nil, fmt.Errorf("%s: reading ConfigMap %s: %w", field, r.Name, err)
			}
			if !found && !r.Optional {
				return nil, fmt.Errorf("%s: ConfigMap %s/%s has no key %q", field, namespaceOr(r.Namespace, cfg.Namespace), r.Name, r.Key)
			}
			out[p.Name] = byteData(v, found)
		case p.ValueFrom != nil && p.ValueFrom.SecretKeyRef != nil:
			r := p.ValueFrom.SecretKeyRef
			var s corev1.Secret
			err := c.Get(ctx, client.ObjectKey{Namespace: namespaceOr(r.Namespace, cfg.Namespace), Name: r.Name}, &s)
			v, found, err := lookup(err, func() ([]byte, bool) { b, ok := s.Data[r.Key]; return b, ok })
			if err != nil {
				return nil, fmt.Errorf("%s: reading Secret %s: %w", field, r.Name, err)
			}
			if !found && !r.Optional {
				return nil, fmt.Errorf("%s: Secret %s/%s has no key %q", field, namespaceOr(r.Namespace, cfg.Namespace), r.Name, r.Key)
			}
			out[p.Name] = byteData(v, found)
		default:
			return nil, fmt.Errorf("%s: neither value nor valueFrom is set", field)
		}
	}
	return out, nil
}

// lookup turns a Get error and a key lookup into (value, found, error),
// treating a missing object like a missing key.
func lookup(getErr error, key func() ([]byte, bool)) ([]byte, bool, error) {
	if apierrors.IsNotFound(getErr) {
		return nil, false, nil
	}
	if getErr != nil {
		return nil, false, getErr
	}
	v, ok := key()
	return v, ok, nil
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
