package dra

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	shareddra "github.com/dowse-dev/dowse/internal/dra"
	"github.com/dowse-dev/dowse/internal/slicewriter"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// Publisher publishes the shared devices of DRA Configurations: one pool
// per shared Instance (internal/dra.SharedPool), one ResourceSlice holding its
// one device, with a nodeSelector naming exactly the nodes in the
// Instance's status.nodes (by their kubernetes.io/hostname label, see
// internal/dra.NodeSelector), so that the scheduler puts a pod on a node that
// sees the device and counts the device's capacity across all of them.
//
// The slices are written by internal/slicewriter, which keeps the pool
// generations and resourceSliceCount as the DRA contract asks, holds only
// the slices' metadata, and deletes the slices of a pool that is no longer
// desired. It owns every slice of driver dowse.dev without a nodeName (the
// agents' slices have one): on start it deletes those of Instances that
// went while the controller was down. Each slice is owned by its
// Configuration's DeviceClass (cluster-scoped, like the slice), so that
// deleting the classes removes the slices even without the controller; a
// device is published once its class is in the cache. The desired set is
// rebuilt from the cache when Instance, Configuration and class changes
// have been quiet for Debounce (at most MaxDelay into a burst). It runs on
// the leader only.
type Publisher struct {
	cache cache.Cache
	// reader reads Configurations, Instances and Nodes: the cache (tests:
	// a fake).
	reader   client.Reader
	kube     kubernetes.Interface
	meta     metadata.Interface
	log      logr.Logger
	metrics  *Metrics
	debounce time.Duration

	dirty chan struct{}
}

// The Publisher rebuilds the desired slices once changes have been quiet
// for Debounce, or MaxDelay after the first.
const (
	Debounce = 200 * time.Millisecond
	MaxDelay = 2 * time.Second
)

// NewPublisher wires a Publisher. c is the manager's cache (Instances
// must keep spec.shared, capacity and brokerProperties of shared devices;
// DeviceClasses are read from it); kube writes the slices (use protobuf);
// meta watches their metadata; metrics may be nil.
func NewPublisher(c cache.Cache, kube kubernetes.Interface, meta metadata.Interface, metrics *Metrics, log logr.Logger) *Publisher {
	return &Publisher{cache: c, reader: c, kube: kube, meta: meta, log: log, metrics: metrics, debounce: Debounce, dirty: make(chan struct{}, 1)}
}

func (p *Publisher) poke() {
	select {
	case p.dirty <- struct{}{}:
	default:
	}
}

// Start publishes until ctx ends. Errors writing slices are logged,
// counted and retried by the writer; Start fails only when the cache
// cannot be watched.
func (p *Publisher) Start(ctx context.Context) error {
	handler := toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { p.poke() },
		UpdateFunc: func(_, _ any) { p.poke() },
		DeleteFunc: func(any) { p.poke() },
	}
	for _, obj := range []client.Object{&v1alpha1.Instance{}, &v1alpha1.Configuration{}, &resourceapi.DeviceClass{}} {
		inf, err := p.cache.GetInformer(ctx, obj)
		if err != nil {
			return fmt.Errorf("watching %T: %w", obj, err)
		}
		if _, err := inf.AddEventHandler(handler); err != nil {
			return err
		}
	}
	// Nodes change often (status); only a hostname label matters here.
	nodes, err := p.cache.GetInformer(ctx, &corev1.Node{})
	if err != nil {
		return fmt.Errorf("watching nodes: %w", err)
	}
	if _, err := nodes.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { p.poke() },
		UpdateFunc: func(o, n any) {
			if on, ok := o.(*corev1.Node); ok {
				if nn, ok := n.(*corev1.Node); ok && on.Labels[corev1.LabelHostname] == nn.Labels[corev1.LabelHostname] {
					return
				}
			}
			p.poke()
		},
		DeleteFunc: func(any) { p.poke() },
	}); err != nil {
		return err
	}
	if !p.cache.WaitForCacheSync(ctx) {
		return ctx.Err()
	}
	desired, err := p.Desired(ctx)
	if err != nil {
		return err
	}
	writer, err := slicewriter.New(p.kube.ResourceV1().ResourceSlices(), p.meta, slicewriter.Options{
		Driver: shareddra.DriverName,
		// One pool per shared device: thousands of slices at once.
		Concurrency: 16,
		OnError: func(err error, what string) {
			p.metrics.publishError()
			p.log.Error(err, "publishing shared devices", "what", what)
		},
		OnWrite: p.metrics.write,
	}, p.log.WithName("resourceslices"))
	if err != nil {
		return err
	}
	writer.Update(desired)
	defer writer.Go(ctx)()
	p.metrics.devices(countDevices(desired))
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-p.dirty:
		}
		if !shareddra.Settle(ctx, p.dirty, p.debounce, MaxDelay) {
			return nil
		}
		desired, err := p.Desired(ctx)
		if err != nil {
			p.log.Error(err, "listing devices to publish")
			p.poke()
			continue
		}
		writer.Update(desired)
		p.metrics.devices(countDevices(desired))
	}
}

// Desired is the pools the Publisher wants, from the cache (its own
// objects, read without a copy, never changed).
func (p *Publisher) Desired(ctx context.Context) (map[string]slicewriter.Pool, error) {
	var cfgs v1alpha1.ConfigurationList
	if err := p.reader.List(ctx, &cfgs, client.UnsafeDisableDeepCopy); err != nil {
		return nil, err
	}
	// The DRA Configurations, each with the owner of its slices: its class.
	dra := map[types.NamespacedName]*metav1.OwnerReference{}
	for i := range cfgs.Items {
		c := &cfgs.Items[i]
		if c.DeletionTimestamp != nil || !c.Spec.UsesDRA() {
			continue
		}
		var class resourceapi.DeviceClass
		if err := p.reader.Get(ctx, types.NamespacedName{Name: shareddra.DeviceClassName(c.Namespace, c.Name)}, &class); err != nil {
			if apierrors.IsNotFound(err) {
				continue // published once the class is made
			}
			return nil, err
		}
		dra[types.NamespacedName{Namespace: c.Namespace, Name: c.Name}] = &metav1.OwnerReference{
			APIVersion: resourceapi.SchemeGroupVersion.String(), Kind: "DeviceClass", Name: class.Name, UID: class.UID}
	}
	out := map[string]slicewriter.Pool{}
	if len(dra) == 0 {
		return out, nil
	}
	var insts v1alpha1.InstanceList
	if err := p.reader.List(ctx, &insts, client.UnsafeDisableDeepCopy); err != nil {
		return nil, err
	}
	var errs []error
	hostnames := map[string]string{} // by node, read once per call
	for i := range insts.Items {
		inst := &insts.Items[i]
		owner := dra[types.NamespacedName{Namespace: inst.Namespace, Name: inst.Spec.ConfigurationName}]
		if !inst.Spec.Shared || inst.DeletionTimestamp != nil || len(inst.Status.Nodes) == 0 || owner == nil {
			continue
		}
		pool := shareddra.Pool(inst, "")
		if err := shareddra.ValidPool(pool); err != nil {
			errs = append(errs, err)
			continue
		}
		names := make([]string, len(inst.Status.Nodes))
		for j, n := range inst.Status.Nodes {
			h, ok := hostnames[n.Name]
			if !ok {
				h = p.hostname(ctx, n.Name)
				hostnames[n.Name] = h
			}
			names[j] = h
		}
		dev := shareddra.Device(inst)
		out[pool] = slicewriter.Pool{
			NodeSelector: shareddra.NodeSelector(names),
			Owner:        owner,
			Slices: []slicewriter.Slice{{Digest: slicewriter.Digest(dev), Devices: func() []resourceapi.Device {
				return []resourceapi.Device{dev}
			}}},
		}
	}
	if len(errs) > 0 {
		// Not fatal: the other devices are published.
		p.log.Error(errors.Join(errs...), "devices left out of the slices")
	}
	return out, nil
}

// hostname is the kubernetes.io/hostname label of node, or its name when
// the Node is unknown or has no such label.
func (p *Publisher) hostname(ctx context.Context, node string) string {
	var n corev1.Node
	if err := p.reader.Get(ctx, types.NamespacedName{Name: node}, &n); err == nil {
		if h := n.Labels[corev1.LabelHostname]; h != "" {
			return h
		}
	}
	return node
}

// countDevices counts the devices of pools of one device each.
func countDevices(pools map[string]slicewriter.Pool) int { return len(pools) }

// Metrics are the Publisher's; a nil *Metrics records nothing.
type Metrics struct {
	published prometheus.Gauge
	errors    prometheus.Counter
	writes    *prometheus.CounterVec
}

// NewMetrics registers the DRA metrics with reg (nil: none).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		published: prometheus.NewGauge(prometheus.GaugeOpts{Name: "dowse_dra_shared_devices", Help: "Shared devices the controller publishes in ResourceSlices."}),
		errors:    prometheus.NewCounter(prometheus.CounterOpts{Name: "dowse_dra_publish_errors_total", Help: "Errors writing ResourceSlices of shared devices (retried)."}),
		writes:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dowse_dra_resourceslice_writes_total", Help: "ResourceSlice writes for the controller's shared devices, by op (create, update, delete)."}, []string{"op"}),
	}
	if reg != nil {
		reg.MustRegister(m.published, m.errors, m.writes)
	}
	return m
}

func (m *Metrics) devices(n int) {
	if m != nil {
		m.published.Set(float64(n))
	}
}

func (m *Metrics) publishError() {
	if m != nil {
		m.errors.Inc()
	}
}

func (m *Metrics) write(op string) {
	if m != nil {
		m.writes.WithLabelValues(op).Inc()
	}
}
