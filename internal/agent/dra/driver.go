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
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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

// cdiOwner is the driver's name as a keeper of legacy CDI specs.
const cdiOwner = "dra"

type specState struct {
	resourceVersion, configuration string
}

type deviceState struct {
	resourceVersion string
	invalid         bool
	digest          string
}

// writeSpec writes inst's CDI spec. Called with d.mu held.
func (d *Driver) writeSpec(inst *v1alpha1.Instance) error {
	if err := d.cdi.Write(inst); err != nil {
		return err
	}
	d.specs[client.ObjectKeyFromObject(inst)] = specState{resourceVersion: inst.ResourceVersion, configuration: inst.Spec.ConfigurationName}
	return nil
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

// node reads this node's Node, the owner of its ResourceSlices, retrying
// until it can or ctx ends.
func (d *Driver) node(ctx context.Context) (*corev1.Node, error) {
	for wait := time.Second; ; wait = min(2*wait, 30*time.Second) {
		node, err := d.kube.CoreV1().Nodes().Get(ctx, d.opts.NodeName, metav1.GetOptions{})
		if err == nil {
			return node, nil
		}
		d.log.Error(err, "reading this node, the owner of its ResourceSlices; retrying", "in", wait)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(wait):
		}
	}
}

// here lists the Instances on this node of DRA Configurations, and which
// of those Configurations also use device plugins. The Instances are the
// cache's own objects (no copy of thousands per sync): read, never changed.
func (d *Driver) here(ctx context.Context) ([]*v1alpha1.Instance, map[types.NamespacedName]bool, error) {
	var cfgs v1alpha1.ConfigurationList
	if err := d.reader.List(ctx, &cfgs, client.UnsafeDisableDeepCopy); err != nil {
		return nil, nil, err
	}
	dra := map[types.NamespacedName]bool{} // value: also device plugins
	for i := range cfgs.Items {
		c := &cfgs.Items[i]
		if c.DeletionTimestamp == nil && c.Spec.UsesDRA() {
			dra[types.NamespacedName{Namespace: c.Namespace, Name: c.Name}] = c.Spec.UsesDevicePlugins()
		}
	}
	if len(dra) == 0 {
		return nil, dra, nil
	}
	var out []*v1alpha1.Instance
	d.instMu.Lock()
	defer d.instMu.Unlock()
	for _, inst := range d.insts {
		if _, ok := dra[types.NamespacedName{Namespace: inst.Namespace, Name: inst.Spec.ConfigurationName}]; ok &&
			inst.DeletionTimestamp == nil && inst.HasNode(d.opts.NodeName) {
			out = append(out, inst)
		}
	}
	return out, dra, nil
}

// sync returns the local pools to publish, keeps the CDI specs of the
// Instances that prepared claims use in step with them, and removes those
// no claim uses. A CDI spec is written when a claim is prepared, not when
// a device is discovered: thousands of devices cost no file each. An
// Instance whose spec would be refused (a device node missing on this
// node) is not published. The pools hold digests, and build a slice's
// devices only when the writer needs them.
func (d *Driver) sync(ctx context.Context) (map[string]slicewriter.Pool, error) {
	insts, cfgs, err := d.here(ctx)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.withPlugins = map[types.NamespacedName]bool{}
	for k, dp := range cfgs {
		if dp {
			d.withPlugins[k] = true
		}
	}
	seen := make(map[types.NamespacedName]struct{}, len(insts))
	members := map[string][]*v1alpha1.Instance{}
	for _, inst := range insts {
		key := client.ObjectKeyFromObject(inst)
		seen[key] = struct{}{}
		st, ok := d.devices[key]
		if !ok || st.resourceVersion != inst.ResourceVersion {
			st = deviceState{resourceVersion: inst.ResourceVersion}
			if _, err := cdi.Spec(inst); err != nil {
				d.log.Error(err, "invalid device; not offering it", "instance", key)
				d.opts.Metrics.invalidDevice()
				st.invalid = true
			} else if !inst.Spec.Shared {
				st.digest = slicewriter.Digest(shareddra.Device(inst))
			}
			d.devices[key] = st
		}
		if st.invalid {
			continue
		}
		if sp, ok := d.specs[key]; ok && sp.resourceVersion != inst.ResourceVersion {
			// In use, and changed: containers started from now on get
			// the new properties.
			if err := d.writeSpec(inst); err != nil {
				d.log.Error(err, "updating CDI spec", "instance", key)
			}
		}
		if inst.Spec.Shared {
			continue // the controller publishes it
		}
		pool := shareddra.Pool(inst, d.opts.NodeName)
		if err := shareddra.ValidPool(pool); err != nil {
			d.log.Error(err, "device not published", "instance", key)
			continue
		}
		members[pool] = append(members[pool], inst)
	}
	for key := range d.devices {
		if _, ok := seen[key]; !ok {
			delete(d.devices, key)
		}
	}
	for key := range d.specs {
		if !d.inUse(key) {
			d.removeSpec(key)
		}
	}
	out := make(map[string]slicewriter.Pool, len(members))
	n := 0
	for pool, insts := range members {
		have, ok := d.slices[pool]
		if !ok && d.sliceCount != nil {
			have = d.sliceCount(pool)
		}
		out[pool] = d.pool(insts, have)
		d.slices[pool] = len(out[pool].Slices)
		n += len(insts)
	}
	for pool := range d.slices {
		if _, ok := members[pool]; !ok {
			delete(d.slices, pool)
		}
	}
	d.opts.Metrics.devices(n)
	select {
	case d.healthChanged <- struct{}{}:
	default:
	}
	return out, nil
}

// pool spreads one pool's Instances over its slices (shareddra.Buckets),
// of which it has have now. Called with d.mu held.
func (d *Driver) pool(insts []*v1alpha1.Instance, have int) slicewriter.Pool {
	slices.SortFunc(insts, func(a, b *v1alpha1.Instance) int { return strings.Compare(a.Name, b.Name) })
	names := make([]string, len(insts))
	for i, inst := range insts {
		names[i] = v1alpha1.InstanceHash(inst.Name)
	}
	count, of := shareddra.Buckets(names, have)
	bucket := make([][]*v1alpha1.Instance, count)
	parts := make([][]string, count)
	for i, inst := range insts {
		b := of[i]
		bucket[b] = append(bucket[b], inst)
		parts[b] = append(parts[b], names[i], d.devices[client.ObjectKeyFromObject(inst)].digest)
	}
	p := slicewriter.Pool{Slices: make([]slicewriter.Slice, count)}
	for b := range bucket {
		members := bucket[b]
		p.Slices[b] = slicewriter.Slice{Digest: slicewriter.Digest(parts[b]), Devices: func() []resourceapi.Device {
			devs := make([]resourceapi.Device, len(members))
			for i, inst := range members {
				devs[i] = shareddra.Device(inst)
			}
			return devs
		}}
	}
	return p
}

// adoptSpecs takes over the CDI specs of the checkpoint's claims (an
// earlier agent wrote them), legacy ones included, and, unless device
// plugins run (they keep their own), removes every other Dowse spec in the
// directory: left by claims unprepared while no agent ran.
func (d *Driver) adoptSpecs() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range d.checkpoint.Claims {
		for _, dev := range c.Devices {
			if ns, name, ok := shareddra.ParseDevice(dev.Pool, dev.Device); ok {
				// No resourceVersion: the next sync rewrites it if the
				// Instance is still here.
				d.specs[types.NamespacedName{Namespace: ns, Name: name}] = specState{configuration: dev.Configuration}
			}
		}
	}
	d.keepLegacy(nil)
	if d.opts.DevicePlugins {
		return
	}
	for _, f := range d.cdi.Specs() {
		if f.Legacy {
			if d.cdi.LegacyKept(f.Instance) {
				continue
			}
		} else if _, ok := d.specs[f.Instance]; ok {
			continue
		}
		if err := d.cdi.RemoveFile(f); err != nil {
			d.log.Error(err, "removing stale CDI spec", "instance", f.Instance)
		}
	}
}

// keepLegacy keeps the legacy CDI specs the checkpoint's claims use, and
// lets go of those it no longer does. insts, when not nil, are the
// Instances here by key, to write the specs from; an Instance not among
// them keeps the file an earlier agent left. Called with d.mu held.
func (d *Driver) keepLegacy(insts map[types.NamespacedName]*v1alpha1.Instance) {
	if d.checkpoint == nil {
		return
	}
	want := map[types.NamespacedName]bool{}
	for _, c := range d.checkpoint.Claims {
		for _, dev := range c.Devices {
			ns, name, ok := shareddra.ParseDevice(dev.Pool, dev.Device)
			if !ok {
				continue
			}
			for _, id := range dev.CDIDeviceIDs {
				if id != v1alpha1.CDIName(ns, name) {
					want[types.NamespacedName{Namespace: ns, Name: name}] = true
				}
			}
		}
	}
	for key := range want {
		if d.legacy[key] {
			continue
		}
		if err := d.cdi.KeepLegacy(cdiOwner, key, insts[key]); err != nil {
			d.log.Error(err, "keeping a legacy CDI spec", "instance", key)
			continue
		}
		d.legacy[key] = true
	}
	for key := range d.legacy {
		if want[key] {
			continue
		}
		if err := d.cdi.DropLegacy(cdiOwner, key); err != nil {
			d.log.Error(err, "removing a legacy CDI spec", "instance", key)
			continue
		}
		delete(d.legacy, key)
	}
}

// removeSpec removes the CDI spec of key, unless the agent's device
// plugins keep it (a Configuration allocated both ways, with device
// plugins on). Called with d.mu held.
func (d *Driver) removeSpec(key types.NamespacedName) {
	st, ok := d.specs[key]
	delete(d.specs, key)
	if ok && d.opts.DevicePlugins && d.withPlugins[types.NamespacedName{Namespace: key.Namespace, Name: st.configuration}] {
		return
	}
	if _, err := d.cdi.Remove(key.Namespace, key.Name); err != nil {
		d.log.Error(err, "removing CDI spec", "instance", key)
	}
}

// inUse says whether a prepared claim still uses the Instance key: its CDI
// spec stays until the claim is unprepared, so that a container that
// restarts still finds it. Called with d.mu held.
func (d *Driver) inUse(key types.NamespacedName) bool {
	if d.checkpoint == nil {
		return false
	}
	for _, c := range d.checkpoint.Claims {
		for _, dev := range c.Devices {
			if ns, name, ok := shareddra.ParseDevice(dev.Pool, dev.Device); ok && ns == key.Namespace && name == key.Name {
				return true
			}
		}
	}
	return false
}

// PrepareResourceClaims answers each claim with the CDI devices of the
// Instances allocated to it by driver dowse.dev. Idempotent: a claim
// prepared before (by this process or, through the checkpoint, an earlier
// one) gets the same answer without looking at the Instances again, so a
// kubelet or agent restart never prepares a claim twice. A device that is
// not on this node (it left after the allocation) fails its claim with a
// retryable error.
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	changed := false
	for _, claim := range claims {
		if c, ok := d.checkpoint.Claims[claim.UID]; ok {
			out[claim.UID] = kubeletplugin.PrepareResult{Devices: c.result()}
			d.opts.Metrics.prepare("again")
			continue
		}
		c, err := d.prepare(ctx, claim)
		if err != nil {
			out[claim.UID] = kubeletplugin.PrepareResult{Err: err}
			d.opts.Metrics.prepare("error")
			d.log.Error(err, "claim not prepared", "claim", types.NamespacedName{Namespace: claim.Namespace, Name: claim.Name})
			continue
		}
		d.checkpoint.Claims[claim.UID] = c
		changed = true
		out[claim.UID] = kubeletplugin.PrepareResult{Devices: c.result()}
		d.opts.Metrics.prepare("prepared")
		d.log.Info("claim prepared", "claim", types.NamespacedName{Namespace: claim.Namespace, Name: claim.Name}, "devices", len(c.Devices))
	}
	if changed {
		if err := d.checkpoint.save(); err != nil {
			return nil, err
		}
		d.opts.Metrics.prepared(len(d.checkpoint.Claims))
	}
	return out, nil
}

func (d *Driver) prepare(ctx context.Context, claim *resourceapi.ResourceClaim) (*preparedClaim, error) {
	if claim.Status.Allocation == nil {
		return nil, errors.New("claim is not allocated")
	}
	c := &preparedClaim{Namespace: claim.Namespace, Name: claim.Name}
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != shareddra.DriverName {
			continue
		}
		ns, name, ok := shareddra.ParseDevice(r.Pool, r.Device)
		if !ok {
			return nil, fmt.Errorf("device %s/%s is not one of Dowse's", r.Pool, r.Device)
		}
		key := types.NamespacedName{Namespace: ns, Name: name}
		var inst v1alpha1.Instance
		if err := d.reader.Get(ctx, key, &inst); err != nil {
			if apierrors.IsNotFound(err) {
				return nil, fmt.Errorf("device %s/%s: Instance %s is gone", r.Pool, r.Device, key)
			}
			return nil, err
		}
		if !inst.HasNode(d.opts.NodeName) {
			return nil, fmt.Errorf("device %s/%s: Instance %s is not on node %s", r.Pool, r.Device, key, d.opts.NodeName)
		}
		if st, ok := d.specs[key]; !ok || st.resourceVersion != inst.ResourceVersion {
			if err := d.writeSpec(&inst); err != nil {
				return nil, err
			}
		}
		dev := preparedDevice{Requests: []string{r.Request}, Pool: r.Pool, Device: r.Device, CDIDeviceIDs: []string{inst.CDIName()}, Configuration: inst.Spec.ConfigurationName}
		if r.ShareID != nil {
			dev.ShareID = string(*r.ShareID)
		}
		c.Devices = append(c.Devices, dev)
	}
	return c, nil
}

// UnprepareResourceClaims forgets the claims; CDI specs of Instances that
// left this node while a claim used them go at the next sync. Idempotent:
// an unknown claim is no error.
func (d *Driver) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[types.UID]error, len(claims))
	changed := false
	for _, c := range claims {
		out[c.UID] = nil
		if _, ok := d.checkpoint.Claims[c.UID]; ok {
			delete(d.checkpoint.Claims, c.UID)
			changed = true
			d.opts.Metrics.unprepare()
			d.log.Info("claim unprepared", "claim", c.NamespacedName)
		}
	}
	if changed {
		if err := d.checkpoint.save(); err != nil {
			return nil, err
		}
		d.opts.Metrics.prepared(len(d.checkpoint.Claims))
		for key := range d.specs {
			if !d.inUse(key) {
				d.removeSpec(key)
			}
		}
		d.keepLegacy(nil)
	}
	return out, nil
}

// HandleError logs background errors of the kubelet plugin; all of them
// are retried by the helper, none stops the agent.
func (d *Driver) HandleError(_ context.Context, err error, msg string) {
	d.log.Error(err, "kubelet DRA plugin", "what", msg)
}

// healthEvery is how often WatchHealthStatus repeats its report (the
// kubelet takes a device's health as unknown after 30 s without one).
const healthEvery = 10 * time.Second

// WatchHealthStatus reports the health of the devices of prepared claims:
// Healthy while their Instance lists this node, Unhealthy once it does not
// (the handler reports the device OFFLINE or gone), so that the kubelet can
// show it in the status of the pods that use it. A report goes at once,
// after every sync, and every healthEvery.
func (d *Driver) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	tick := time.NewTicker(healthEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case reports <- d.health(ctx):
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		case <-d.healthChanged:
		}
	}
}

// health is the report of WatchHealthStatus.
func (d *Driver) health(ctx context.Context) kubeletplugin.DeviceHealthReport {
	d.mu.Lock()
	defer d.mu.Unlock()
	var r kubeletplugin.DeviceHealthReport
	if d.checkpoint == nil {
		return r
	}
	seen := map[[2]string]bool{}
	now := time.Now()
	for _, c := range d.checkpoint.Claims {
		for _, dev := range c.Devices {
			k := [2]string{dev.Pool, dev.Device}
			if seen[k] {
				continue
			}
			seen[k] = true
			h := kubeletplugin.DeviceHealth{PoolName: dev.Pool, DeviceName: dev.Device, Health: kubeletplugin.HealthStatusHealthy, LastUpdated: now}
			ns, name, _ := shareddra.ParseDevice(dev.Pool, dev.Device)
			var inst v1alpha1.Instance
			if err := d.reader.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &inst); err != nil || !inst.HasNode(d.opts.NodeName) {
				h.Health = kubeletplugin.HealthStatusUnhealthy
				h.Message = "the device's handler no longer reports it on this node (OFFLINE or gone)"
			}
			r.Devices = append(r.Devices, h)
		}
	}
	return r
}

// Prepared lists the prepared claims' UIDs (tests).
func (d *Driver) Prepared() []types.UID {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.checkpoint == nil {
		return nil
	}
	return slices.Sorted(maps.Keys(d.checkpoint.Claims))
}
