package brokers

import (
	"context"

	batchv1 "k8s.io/api/batch/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/internal/controller/cacheindex"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// Indexes are the controller's in-place indexes, and the cache they index.
type Indexes struct {
	// Cache reads BrokerPods, which the client's scheme does not know.
	Cache cache.Cache
	// InstancesByConfiguration finds Instances by spec.configurationName.
	InstancesByConfiguration *cacheindex.Index
	// PodsByConfiguration and PodsByInstance find broker Pods by their
	// configuration and instance labels, JobsByInstance broker Jobs.
	PodsByConfiguration, PodsByInstance, JobsByInstance *cacheindex.Index
}

// NewIndexes adds the controller's in-place indexes to c.
func NewIndexes(ctx context.Context, c cache.Cache) (*Indexes, error) {
	insts, err := cacheindex.New(ctx, c, &v1alpha1.Instance{}, "dowse.dev/configuration", func(o client.Object) []string {
		if inst, ok := o.(*v1alpha1.Instance); ok {
			return []string{inst.Spec.ConfigurationName}
		}
		return nil
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
	pods, err := cacheindex.New(ctx, c, &BrokerPod{}, "dowse.dev/configuration-label", byLabel(v1alpha1.LabelConfiguration))
	if err != nil {
		return nil, err
	}
	podsByInst, err := cacheindex.New(ctx, c, &BrokerPod{}, "dowse.dev/instance-label", byLabel(v1alpha1.LabelInstance))
	if err != nil {
		return nil, err
	}
	jobsByInst, err := cacheindex.New(ctx, c, &batchv1.Job{}, "dowse.dev/instance-label", byLabel(v1alpha1.LabelInstance))
	if err != nil {
		return nil, err
	}
	return &Indexes{Cache: c, InstancesByConfiguration: insts, PodsByConfiguration: pods, PodsByInstance: podsByInst, JobsByInstance: jobsByInst}, nil
}
