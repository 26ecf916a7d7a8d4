package broker

import (
	"context"
	"fmt"

	batchv1 "k8s.io/api/batch/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// CacheIndex is an index on one informer of the manager's cache, read in
// place. client.List on a field index copies every match into a new list:
// a Configuration's 10,000 Instances are about 11 MB per status update,
// which set the controller's peak memory. Counting them, or naming them to
// enqueue, needs no copy.
type CacheIndex struct {
	name    string
	indexer toolscache.Indexer
}

// NewCacheIndex adds an index called name to the informer of obj's kind
// (before the cache starts); keys are the values an object is found under,
// within its namespace.
func NewCacheIndex(ctx context.Context, c cache.Cache, obj client.Object, name string, keys func(client.Object) []string) (*CacheIndex, error) {
	inf, err := c.GetInformer(ctx, obj)
	if err != nil {
		return nil, err
	}
	withIndexer, ok := inf.(interface{ GetIndexer() toolscache.Indexer })
	if !ok {
		return nil, fmt.Errorf("the informer of %T exposes no indexer", obj)
	}
	err = inf.AddIndexers(toolscache.Indexers{name: func(o any) ([]string, error) {
		co, ok := o.(client.Object)
		if !ok {
			return nil, nil
		}
		vs := keys(co)
		out := make([]string, len(vs))
		for i, v := range vs {
			out[i] = co.GetNamespace() + "/" + v
		}
		return out, nil
	}})
	if err != nil {
		return nil, fmt.Errorf("indexing %T by %s: %w", obj, name, err)
	}
	return &CacheIndex{name: name, indexer: withIndexer.GetIndexer()}, nil
}

// Objects are the cached objects under value in namespace. They are the
// cache's own: read them, never change them.
func (i *CacheIndex) Objects(namespace, value string) ([]client.Object, error) {
	items, err := i.indexer.ByIndex(i.name, namespace+"/"+value)
	if err != nil {
		return nil, err
	}
	out := make([]client.Object, 0, len(items))
	for _, it := range items {
		if o, ok := it.(client.Object); ok {
			out = append(out, o)
		}
	}
	return out, nil
}

// Indexes are the controller's in-place indexes, and the cache they index.
type Indexes struct {
	// Cache reads BrokerPods, which the client's scheme does not know.
	Cache cache.Cache
	// InstancesByConfiguration finds Instances by spec.configurationName.
	InstancesByConfiguration *CacheIndex
	// PodsByConfiguration and PodsByInstance find broker Pods by their
	// configuration and instance labels, JobsByInstance broker Jobs.
	PodsByConfiguration, PodsByInstance, JobsByInstance *CacheIndex
}

// NewIndexes adds the controller's in-place indexes to c.
func NewIndexes(ctx context.Context, c cache.Cache) (*Indexes, error) {
	insts, err := NewCacheIndex(ctx, c, &v1alpha1.Instance{}, "dowse.dev/configuration", func(o client.Object) []string {
		return []string{o.(*v1alpha1.Instance).Spec.ConfigurationName}
	})
	if err != nil {
		return nil, err
	}
	byLabel := func(key string) func(client.Object) []string {
		return func(o client.Object) []string {
			if v, ok := o.GetLabels()[key]; ok {
				return []string{v}
			}
			return nil
		}
	}
	pods, err := NewCacheIndex(ctx, c, &BrokerPod{}, "dowse.dev/configuration-label", byLabel(v1alpha1.LabelConfiguration))
	if err != nil {
		return nil, err
	}
	podsByInst, err := NewCacheIndex(ctx, c, &BrokerPod{}, "dowse.dev/instance-label", byLabel(v1alpha1.LabelInstance))
	if err != nil {
		return nil, err
	}
	jobsByInst, err := NewCacheIndex(ctx, c, &batchv1.Job{}, "dowse.dev/instance-label", byLabel(v1alpha1.LabelInstance))
	if err != nil {
		return nil, err
	}
	return &Indexes{Cache: c, InstancesByConfiguration: insts, PodsByConfiguration: pods, PodsByInstance: podsByInst, JobsByInstance: jobsByInst}, nil
}
