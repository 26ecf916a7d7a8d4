// Package cacheindex reads an index of the manager's informer cache in
// place, without the copies client.List makes.
package cacheindex

import (
	"context"
	"fmt"

	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Index is an index on one informer of the manager's cache, read in
// place. client.List on a field index copies every match into a new list:
// a Configuration's 10,000 Instances are about 11 MB per status update,
// which set the controller's peak memory. Counting them, or naming them to
// enqueue, needs no copy.
type Index struct {
	name    string
	indexer toolscache.Indexer
}

// New adds an index called name to the informer of obj's kind
// (before the cache starts); keys are the values an object is found under,
// within its namespace.
func New(ctx context.Context, c cache.Cache, obj client.Object, name string, keys func(client.Object) []string) (*Index, error) {
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
	return &Index{name: name, indexer: withIndexer.GetIndexer()}, nil
}

// Objects are the cached objects under value in namespace. They are the
// cache's own: read them, never change them.
func (i *Index) Objects(namespace, value string) ([]client.Object, error) {
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
