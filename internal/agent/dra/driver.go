// Package dra is the agent's part of Dynamic Resource Allocation for the
// Configurations whose spec.allocation is DRA or Both: it publishes this
// node's local devices as ResourceSlices (one pool per Configuration,
// internal/dra.LocalPool, spec.nodeName this node), writes the CDI spec of
// every such Instance on this node, local or shared (agent/cdi), and serves
// the kubelet DRA plugin of driver dowse.dev (k8s.io/dynamic-resource-
// allocation's kubeletplugin helper), whose NodePrepareResources answers
// with the allocated Instances' CDI device names. Shared devices are
// published by the controller (controller/dra); their claims are prepared
// here like local ones.
package dra

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/internal/agent/cdi"
	shareddra "github.com/dowse-dev/dowse/internal/dra"
	"github.com/dowse-dev/dowse/internal/slicewriter"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// Defaults of Options.
const (
	DefaultRegistrarDir = kubeletplugin.KubeletRegistryDir
	DefaultPluginDir    = kubeletplugin.KubeletPluginsDir + "/" + shareddra.DriverName
	// CheckpointFile, in PluginDir, holds the prepared claims.
	CheckpointFile = "checkpoint.json"
	// The slices are rebuilt once changes have been quiet for debounce,
	// or maxDelay after the first.
	debounce = 200 * time.Millisecond
	maxDelay = 5 * time.Second
)

// Options configure a Driver.
type Options struct {
	NodeName string
	// RegistrarDir is the kubelet's plugin registration directory
	// (DefaultRegistrarDir); empty serves no kubelet plugin, so that only
	// the slices and CDI specs are kept (tests on an API server alone).
	RegistrarDir string
	// PluginDir is the plugin's own directory: its dra.sock and the
	// checkpoint of prepared claims (DefaultPluginDir when empty).
	PluginDir string
	// CDIDir is where the CDI specs go; required.
	CDIDir string
	// CDI, when set, writes the specs instead of a Writer of CDIDir's own
	// (the agent shares one with its device plugins).
	CDI *cdi.Writer
	// DevicePlugins says that the agent's device plugins run: they keep
	// the CDI specs of Configurations allocated both ways.
	DevicePlugins bool
	// Metrics records the driver's work; nil records nothing.
	Metrics *Metrics
}

// Driver is the node's DRA driver. Start runs it; its PrepareResourceClaims
// and UnprepareResourceClaims are the kubelet's calls (through the
// kubeletplugin helper, which serializes them).
type Driver struct {
	opts  Options
	cache cache.Cache
	// reader reads Instances and Configurations: the cache (tests: a fake).
	reader client.Reader
	kube   kubernetes.Interface
	meta   metadata.Interface
	cdi    *cdi.Writer
	log    logr.Logger
	dirty  chan struct{}
	// insts holds the cache's own Instance objects (never changed), fed
	// by its informer: a sync reads them without copying thousands.
	instMu sync.Mutex
	insts  map[types.NamespacedName]*v1alpha1.Instance
	// healthChanged wakes WatchHealthStatus after a sync.
	healthChanged chan struct{}

	mu         sync.Mutex
	checkpoint *checkpoint
	// specs are the CDI specs this driver wrote for prepared claims, by
	// Instance.
	specs map[types.NamespacedName]specState
	// devices holds, by Instance here, what its resourceVersion made of
	// it: whether its CDI spec would be accepted, and its device's digest.
	devices map[types.NamespacedName]deviceState
	// withPlugins are the DRA Configurations that use device plugins too.
	withPlugins map[types.NamespacedName]bool
	// sliceCount is the slice count of a pool as published (nil: none).
	sliceCount func(pool string) int
	// slices is each pool's slice count as last synced.
	slices map[string]int
	// legacy are the Instances whose legacy CDI spec this driver keeps:
	// a prepared claim answered with their v1alpha1.LegacyCDIName (by an
	// agent before CDI names carried the namespace), which the kubelet
	// hands the runtime again when a container of the claim restarts.
	legacy map[types.NamespacedName]bool
}

// New makes a Driver. c is the agent's cache (Instances and
// Configurations); kube writes ResourceSlices (use protobuf) and reads
// Nodes and ResourceClaims; meta watches the node's ResourceSlices'
// metadata.
func New(c cache.Cache, kube kubernetes.Interface, meta metadata.Interface, opts Options, log logr.Logger) (*Driver, error) {
	if opts.NodeName == "" {
		return nil, errors.New("dra: node name is required")
	}
	if opts.CDIDir == "" {
		return nil, errors.New("dra: a CDI spec directory is required")
	}
	if opts.PluginDir == "" {
		opts.PluginDir = DefaultPluginDir
	}
	w := opts.CDI
	if w == nil {
		var err error
		if w, err = cdi.NewWriter(opts.CDIDir, nil); err != nil {
			return nil, err
		}
	}
	return &Driver{legacy: map[types.NamespacedName]bool{}, slices: map[string]int{}, opts: opts, cache: c, reader: c, kube: kube, meta: meta, cdi: w, log: log, dirty: make(chan struct{}, 1), healthChanged: make(chan struct{}, 1),
		specs: map[types.NamespacedName]specState{}, devices: map[types.NamespacedName]deviceState{},
		insts: map[types.NamespacedName]*v1alpha1.Instance{}}, nil
}

func (d *Driver) poke() {
	select {
	case d.dirty <- struct{}{}:
	default:
	}
}

// Start publishes this node's devices and serves the kubelet plugin until
// ctx ends; then the plugin's sockets go and the slices stay (a restarted
// agent takes them over; the Node's deletion removes them, as they are
// owned by it). Errors writing slices are logged, counted and retried.
func (d *Driver) Start(ctx context.Context) error {
	handler := toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { d.poke() },
		UpdateFunc: func(_, _ any) { d.poke() },
		DeleteFunc: func(any) { d.poke() },
	}
	instances := toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { d.observe(obj) },
		UpdateFunc: func(_, obj any) { d.observe(obj) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if inst, ok := obj.(*v1alpha1.Instance); ok {
				d.forget(inst)
			}
		},
	}
	for obj, h := range map[client.Object]toolscache.ResourceEventHandler{&v1alpha1.Instance{}: instances, &v1alpha1.Configuration{}: handler} {
		inf, err := d.cache.GetInformer(ctx, obj)
		if err != nil {
			return fmt.Errorf("watching %T: %w", obj, err)
		}
		if _, err := inf.AddEventHandler(h); err != nil {
			return err
		}
	}
	if !d.cache.WaitForCacheSync(ctx) {
		return ctx.Err()
	}
	if d.opts.RegistrarDir != "" {
		cp, err := loadCheckpoint(filepath.Join(d.opts.PluginDir, CheckpointFile))
		if err != nil {
			return err
		}
		d.checkpoint = cp
		d.opts.Metrics.prepared(len(cp.Claims))
		d.adoptSpecs()
	}
	node, err := d.node(ctx)
	if err != nil {
		return nil
	}
	writer, err := slicewriter.New(d.kube.ResourceV1().ResourceSlices(), d.meta, slicewriter.Options{
		Driver: shareddra.DriverName, NodeName: d.opts.NodeName,
		Owner: &metav1.OwnerReference{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID, Controller: ptr.To(true)},
		OnError: func(err error, what string) {
			d.opts.Metrics.publishError()
			d.log.Error(err, "publishing this node's devices", "what", what)
		},
		OnWrite: d.opts.Metrics.sliceWrite,
	}, d.log)
	if err != nil {
		return err
	}
	// The published slice counts first: a restarted agent keeps them
	// (shareddra.Buckets' hysteresis) rather than rewrite every slice.
	defer writer.Go(ctx)()
	select {
	case <-writer.Synced():
	case <-ctx.Done():
		return nil
	}
	d.sliceCount = writer.SliceCount
	desired, err := d.sync(ctx)
	if err != nil {
		return err
	}
	writer.Update(desired)
	klogCtx := klog.NewContext(ctx, d.log)
	if d.opts.RegistrarDir != "" {
		if err := mkdirAll(d.opts.PluginDir); err != nil {
			return err
		}
		helper, err := kubeletplugin.Start(klogCtx, d,
			kubeletplugin.DriverName(shareddra.DriverName),
			kubeletplugin.NodeName(d.opts.NodeName),
			kubeletplugin.KubeClient(d.kube),
			kubeletplugin.RegistrarDirectoryPath(d.opts.RegistrarDir),
			kubeletplugin.PluginDataDirectoryPath(d.opts.PluginDir),
		)
		if err != nil {
			return fmt.Errorf("starting the kubelet DRA plugin: %w", err)
		}
		defer helper.Stop()
		d.log.Info("kubelet DRA plugin serving", "driver", shareddra.DriverName, "registrarDir", d.opts.RegistrarDir)
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-d.dirty:
		}
		if !shareddra.Settle(ctx, d.dirty, debounce, maxDelay) {
			return nil
		}
		desired, err := d.sync(ctx)
		if err != nil {
			d.log.Error(err, "listing this node's devices")
			d.poke()
			continue
		}
		writer.Update(desired)
	}
}

// observe indexes an Instance of the informer's (and triggers a sync).
func (d *Driver) observe(obj any) {
	if inst, ok := obj.(*v1alpha1.Instance); ok {
		d.instMu.Lock()
		d.insts[client.ObjectKeyFromObject(inst)] = inst
		d.instMu.Unlock()
		d.poke()
	}
}

// forget drops a deleted Instance from the index (and triggers a sync).
func (d *Driver) forget(inst *v1alpha1.Instance) {
	d.instMu.Lock()
	delete(d.insts, client.ObjectKeyFromObject(inst))
	d.instMu.Unlock()
	d.poke()
}

// HandleError logs background errors of the kubelet plugin; all of them
// are retried by the helper, none stops the agent.
func (d *Driver) HandleError(_ context.Context, err error, msg string) {
	d.log.Error(err, "kubelet DRA plugin", "what", msg)
}
