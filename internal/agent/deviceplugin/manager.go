package deviceplugin

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	dp "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/dowse-dev/dowse/internal/agent/cdi"
	"github.com/dowse-dev/dowse/internal/agent/instances"
	"github.com/dowse-dev/dowse/internal/agent/slots"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// Options configure a Manager.
type Options struct {
	NodeName string
	// PluginDir is the kubelet's device-plugin directory (DefaultDir).
	PluginDir string
	// CDIDir is where CDI specs go; required unless Classic or CDI is set.
	CDIDir string
	// CDI, when set, writes the specs instead of a Writer of CDIDir's own:
	// the agent shares one with its DRA driver, so that legacy specs kept
	// by either stay.
	CDI *cdi.Writer
	// Classic makes Allocate answer with env, mounts and device nodes
	// instead of CDI device names, for runtimes without CDI. The CDI specs
	// are still written when CDIDir is set.
	Classic bool
	// ReclaimGrace is how long a slot this node holds may go unused by any
	// pod before the reclaimer frees it; 0 disables the reclaimer.
	ReclaimGrace time.Duration
	// ReclaimInterval is the time between reclaimer scans (10s when 0).
	ReclaimInterval time.Duration
	// PodResourcesSocket is the kubelet's pod-resources API
	// (DefaultPodResourcesSocket when empty).
	PodResourcesSocket string
	// Metrics records the plugins' work; nil records nothing.
	Metrics *Metrics
}

// Manager runs the device plugins of the Instances on this node and of
// their Configurations, and keeps their CDI specs, following the agent's
// Instance cache: a plugin and spec appear when an Instance lists this node
// and go when it no longer does.
type Manager struct {
	opts    Options
	client  client.Client // reads from the cache
	claimer slotClaimer
	slots   *slots.Claimer
	cdi     *cdi.Writer
	host    *Host
	log     logr.Logger
	// synced waits for the Instance cache (nil: the stale-spec sweep is
	// skipped, as in unit tests).
	synced func(ctx context.Context) bool

	started chan struct{}
	ctx     context.Context // Start's, for the plugins' goroutines
	wg      sync.WaitGroup

	mu        sync.Mutex
	instances map[types.NamespacedName]*instancePlugin
	configs   map[types.NamespacedName]*configPlugin // key: namespace, configuration name
	// legacy are the plugins of resource names slots are still held under
	// that are no longer an Instance's or Configuration's (LegacyResources),
	// by resource.
	legacy map[string]*legacyPlugin
}

type running struct {
	svc  *service
	stop func()
}

type instancePlugin struct {
	inst *v1alpha1.Instance
	run  *running // nil when the resource name is invalid
	// legacy are inst's LegacyResources, as last seen.
	legacy []string
}

// legacyPlugin serves a resource name pods were allocated under before the
// names carried the namespace (v1alpha1.LegacyResourceName): the kubelet
// keeps such a pod's allocation under that name, and a container of the
// pod that restarts needs the resource's plugin registered (and its CDI
// device defined). It offers only the slots held under it, so no new pod
// gets one, and goes when the last of them is released (the reclaimer
// frees a slot no pod uses).
type legacyPlugin struct {
	members map[types.NamespacedName]bool
	run     *running
}

type configPlugin struct {
	members map[string]bool // Instance names
	run     *running
}

// slotClaimer is what the Manager needs of a Claimer (tests fake it).
type slotClaimer interface {
	Claim(ctx context.Context, inst *v1alpha1.Instance, ids []string, resource string) error
	Forget(key types.NamespacedName)
}

// NewManager makes a Manager. c reads Instances from the agent's cache and
// writes slot claims.
func NewManager(c client.Client, opts Options, log logr.Logger) (*Manager, error) {
	if opts.PluginDir == "" {
		opts.PluginDir = DefaultDir
	}
	m := &Manager{
		opts: opts, client: c,
		host: NewHost(opts.PluginDir, log.WithName("plugins")), log: log,
		started:   make(chan struct{}),
		instances: map[types.NamespacedName]*instancePlugin{},
		configs:   map[types.NamespacedName]*configPlugin{},
		legacy:    map[string]*legacyPlugin{},
	}
	m.host.OnRegistered = opts.Metrics.registered
	m.slots = slots.NewClaimer(c, opts.NodeName)
	m.claimer = m.slots
	switch {
	case opts.CDI != nil:
		m.cdi = opts.CDI
	case opts.CDIDir != "":
		w, err := cdi.NewWriter(opts.CDIDir, nil)
		if err != nil {
			return nil, err
		}
		m.cdi = w
	case !opts.Classic:
		return nil, errors.New("device plugins: a CDI spec directory is required unless Allocate answers the classic way")
	}
	return m, nil
}

// SetupWithManager adds the Manager and its Instance controller to mgr.
func (m *Manager) SetupWithManager(mgr ctrl.Manager) error {
	m.synced = mgr.GetCache().WaitForCacheSync
	if err := mgr.Add(m); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		For(&v1alpha1.Instance{}).
		// A Configuration's spec.allocation decides whether its Instances
		// get plugins: a change of it revisits them.
		Watches(&v1alpha1.Configuration{}, handler.EnqueueRequestsFromMapFunc(m.instancesOf),
			builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Named("deviceplugins").
		// One worker: plugin start and stop are cheap, and one worker keeps
		// the Configuration plugins' membership simple. Several agents run
		// in one process in tests: names need not be unique.
		WithOptions(controller.Options{MaxConcurrentReconciles: 1}).
		Complete(m)
}

// instancesOf lists the Instances of a Configuration, from the cache.
func (m *Manager) instancesOf(ctx context.Context, o client.Object) []reconcile.Request {
	var list v1alpha1.InstanceList
	if err := m.client.List(ctx, &list, client.InNamespace(o.GetNamespace()), client.MatchingFields{instances.ConfigurationIndex: o.GetName()}); err != nil {
		m.log.Error(err, "listing a Configuration's Instances", "configuration", client.ObjectKeyFromObject(o))
		return nil
	}
	out := make([]reconcile.Request, len(list.Items))
	for i := range list.Items {
		out[i] = reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])}
	}
	return out
}

// Start runs the kubelet watch until ctx ends, then stops every plugin and
// removes its socket. CDI specs stay: running containers do not need them,
// and the next agent rewrites them.
func (m *Manager) Start(ctx context.Context) error {
	m.ctx = ctx
	close(m.started)
	if m.opts.ReclaimGrace > 0 {
		r := &slots.Reclaimer{
			InUse:   slots.PodResourcesSlots(cmp.Or(m.opts.PodResourcesSocket, slots.DefaultPodResourcesSocket)),
			Claimer: m.slots, Node: m.opts.NodeName, Grace: m.opts.ReclaimGrace,
			Interval: cmp.Or(m.opts.ReclaimInterval, 10*time.Second), Instances: m.here,
			Log: m.log.WithName("reclaimer"), Reclaimed: m.opts.Metrics.slotsReclaimed,
		}
		m.wg.Go(func() { _ = r.Start(ctx) })
	}
	if m.cdi != nil && m.synced != nil {
		m.wg.Go(func() {
			if m.synced(ctx) {
				m.sweepCDI(ctx)
			}
		})
	}
	err := m.host.Start(ctx)
	m.wg.Wait()
	return err
}

// Reconcile brings the plugins and CDI spec of one Instance in line with
// the cache.
func (m *Manager) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	select {
	case <-m.started:
	case <-ctx.Done():
		return reconcile.Result{}, ctx.Err()
	}
	log := m.log.WithValues("instance", req.NamespacedName)
	inst := &v1alpha1.Instance{}
	err := m.client.Get(ctx, req.NamespacedName, inst)
	if err != nil && !apierrors.IsNotFound(err) {
		return reconcile.Result{}, err
	}
	here := err == nil && inst.DeletionTimestamp == nil && inst.HasNode(m.opts.NodeName)
	if here && !m.usesDevicePlugins(ctx, inst) {
		// A Configuration allocated through DRA alone: no plugin, and its
		// CDI spec is internal/agent/dra's to keep.
		m.remove(req.NamespacedName, log)
		return reconcile.Result{}, nil
	}
	if here && m.cdi != nil {
		if _, err := m.cdi.Own(inst); errors.Is(err, cdi.ErrNotDiscoveredHere) {
			// Just started: this node's handler has not reported the
			// device yet, and only its report says what a container here
			// gets of the host (legacy spec included).
			log.V(1).Info("waiting for this node's handler to report the device")
			return reconcile.Result{RequeueAfter: time.Second}, nil
		}
		// The legacy spec first: the main one may still be an earlier
		// agent's, which its containers name.
		if len(LegacyResources(inst, m.opts.NodeName)) > 0 {
			if err := m.cdi.KeepLegacy(cdiOwner, req.NamespacedName, inst); err != nil {
				log.Error(err, "keeping the legacy CDI spec")
			}
		} else if err := m.cdi.DropLegacy(cdiOwner, req.NamespacedName); err != nil {
			log.Error(err, "removing the legacy CDI spec")
		}
		if err := m.cdi.Write(inst); err != nil {
			// Bad input from the handler: no plugin rather than pods that
			// fail to start. The Instance's next change brings us back.
			log.Error(err, "invalid device; not offering it")
			m.opts.Metrics.invalidDevice()
			here = false
		} else {
			m.opts.Metrics.cdiWritten()
		}
	}
	if !here {
		m.remove(req.NamespacedName, log)
		if m.cdi != nil {
			if err := m.cdi.DropLegacy(cdiOwner, req.NamespacedName); err != nil {
				return reconcile.Result{}, err
			}
			if removed, err := m.cdi.Remove(req.Namespace, req.Name); err != nil {
				return reconcile.Result{}, err
			} else if removed {
				m.opts.Metrics.cdiRemoved()
			}
		}
		return reconcile.Result{}, nil
	}
	m.upsert(inst, log) //nolint:contextcheck // plugins live as long as the manager, not the Reconcile that starts them
	return reconcile.Result{}, nil
}

// usesDevicePlugins says whether inst's Configuration asks for device
// plugins (spec.allocation DevicePlugin or Both); true when it is not in
// the cache (the default allocation).
func (m *Manager) usesDevicePlugins(ctx context.Context, inst *v1alpha1.Instance) bool {
	var cfg v1alpha1.Configuration
	if err := m.client.Get(ctx, types.NamespacedName{Namespace: inst.Namespace, Name: inst.Spec.ConfigurationName}, &cfg); err != nil {
		return true
	}
	return cfg.Spec.UsesDevicePlugins()
}

// cdiOwner is the device plugins' name as keepers of legacy CDI specs.
const cdiOwner = "deviceplugin"

// sweepCDI removes the specs of Instances that went away, or left this
// node, while no agent ran (no Reconcile comes for those), and the legacy
// specs no slot held under a legacy resource needs and nobody else keeps.
func (m *Manager) sweepCDI(ctx context.Context) {
	for _, f := range m.cdi.Specs() {
		inst := &v1alpha1.Instance{}
		err := m.client.Get(ctx, f.Instance, inst)
		if err != nil && !apierrors.IsNotFound(err) {
			continue
		}
		here := err == nil && inst.HasNode(m.opts.NodeName)
		if f.Legacy {
			if (here && len(LegacyResources(inst, m.opts.NodeName)) > 0) || m.cdi.LegacyKept(f.Instance) {
				continue
			}
			if err := m.cdi.RemoveFile(f); err != nil {
				m.log.Error(err, "removing a legacy CDI spec", "instance", f.Instance)
				continue
			}
			m.log.Info("legacy CDI spec removed: no slot is held under a legacy name", "instance", f.Instance)
			continue
		}
		if here {
			continue
		}
		if _, err := m.cdi.Remove(f.Instance.Namespace, f.Instance.Name); err != nil {
			m.log.Error(err, "removing stale CDI spec", "instance", f.Instance)
			continue
		}
		m.log.Info("stale CDI spec removed", "instance", f.Instance)
	}
}

// LegacyResources are the resources, other than inst's and its
// Configuration's, under which node holds slots of inst: names an earlier
// agent served (v1alpha1.LegacyResourceName), which pods allocated then
// still hold.
func LegacyResources(inst *v1alpha1.Instance, node string) []string {
	var out []string
	cur, cfg := inst.ResourceName(), v1alpha1.ResourceName(inst.Namespace, inst.Spec.ConfigurationName)
	for _, s := range inst.Status.Slots {
		if s.Node == node && s.Resource != "" && s.Resource != cur && s.Resource != cfg && !slices.Contains(out, s.Resource) {
			out = append(out, s.Resource)
		}
	}
	slices.Sort(out)
	return out
}

// here lists the Instances this node offers, as last seen.
func (m *Manager) here() []*v1alpha1.Instance {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]*v1alpha1.Instance, 0, len(m.instances))
	for _, ip := range m.instances {
		out = append(out, ip.inst)
	}
	return out
}

func (m *Manager) upsert(inst *v1alpha1.Instance, log logr.Logger) {
	key := client.ObjectKeyFromObject(inst)
	ckey := types.NamespacedName{Namespace: inst.Namespace, Name: inst.Spec.ConfigurationName}
	var stops []*running
	defer func() {
		for _, r := range stops {
			r.stop()
		}
		m.opts.Metrics.pluginsRunning(-len(stops))
	}()
	m.mu.Lock()
	defer m.mu.Unlock()
	ip, ok := m.instances[key]
	if ok {
		ip.inst = inst
		if ip.run != nil {
			ip.run.svc.changed.Notify()
		}
	} else {
		ip = &instancePlugin{inst: inst}
		res := inst.ResourceName()
		if err := v1alpha1.ValidateResourceName(res); err != nil {
			log.Error(err, "no Instance device plugin")
		} else {
			ip.run = m.startPlugin(res, m.instanceService(key, res), log)
		}
		m.instances[key] = ip
		log.Info("device offered", "slots", len(inst.SlotIDs()))
	}
	cp, ok := m.configs[ckey]
	if !ok {
		cp = &configPlugin{members: map[string]bool{}}
		res := v1alpha1.ResourceName(ckey.Namespace, ckey.Name)
		if err := v1alpha1.ValidateResourceName(res); err != nil {
			log.Error(err, "no Configuration device plugin")
		} else {
			cp.run = m.startPlugin(res, m.configService(ckey, res), log)
		}
		m.configs[ckey] = cp
	}
	cp.members[inst.Name] = true
	if cp.run != nil {
		cp.run.svc.changed.Notify()
	}
	legacy := LegacyResources(inst, m.opts.NodeName)
	for _, res := range ip.legacy {
		if !slices.Contains(legacy, res) {
			if r := m.leaveLegacy(res, key); r != nil {
				stops = append(stops, r)
			}
		}
	}
	for _, res := range legacy {
		lp := m.legacy[res]
		if lp == nil {
			lp = &legacyPlugin{members: map[types.NamespacedName]bool{}}
			if err := v1alpha1.ValidateResourceName(res); err != nil {
				log.Error(err, "no legacy device plugin")
			} else {
				lp.run = m.startPlugin(res, m.legacyService(res), log)
				log.Info("serving a legacy resource while pods allocated under it hold slots", "resource", res)
			}
			m.legacy[res] = lp
		}
		lp.members[key] = true
		if lp.run != nil {
			lp.run.svc.changed.Notify()
		}
	}
	ip.legacy = legacy
}

// leaveLegacy drops key from the legacy plugin of res and returns the
// plugin to stop (outside m.mu: its service takes it) when no member is
// left. Called with m.mu held.
func (m *Manager) leaveLegacy(res string, key types.NamespacedName) *running {
	lp := m.legacy[res]
	if lp == nil {
		return nil
	}
	delete(lp.members, key)
	if len(lp.members) > 0 {
		if lp.run != nil {
			lp.run.svc.changed.Notify()
		}
		return nil
	}
	delete(m.legacy, res)
	m.log.Info("legacy resource no longer served: no slot is held under it", "resource", res)
	return lp.run
}

func (m *Manager) remove(key types.NamespacedName, log logr.Logger) {
	m.mu.Lock()
	ip, ok := m.instances[key]
	var stops []*running
	if ok {
		delete(m.instances, key)
		if ip.run != nil {
			stops = append(stops, ip.run)
		}
		for _, res := range ip.legacy {
			if r := m.leaveLegacy(res, key); r != nil {
				stops = append(stops, r)
			}
		}
		ckey := types.NamespacedName{Namespace: key.Namespace, Name: ip.inst.Spec.ConfigurationName}
		if cp := m.configs[ckey]; cp != nil {
			delete(cp.members, key.Name)
			if len(cp.members) == 0 {
				delete(m.configs, ckey)
				if cp.run != nil {
					stops = append(stops, cp.run)
				}
			} else if cp.run != nil {
				cp.run.svc.changed.Notify()
			}
		}
	}
	m.mu.Unlock()
	for _, r := range stops {
		r.stop()
	}
	m.opts.Metrics.pluginsRunning(-len(stops))
	if ok {
		m.claimer.Forget(key)
		log.Info("device withdrawn")
	}
}

func (m *Manager) startPlugin(resource string, svc *service, log logr.Logger) *running {
	// The socket's name is unique per agent and resource, so several
	// agents (tests) never collide, and short: a resource name of 63
	// characters in the socket path would pass the 108-byte limit of unix
	// sockets.
	stop := m.host.Add(resource, SocketName(m.opts.NodeName, resource), svc)
	m.opts.Metrics.pluginsRunning(1)
	log.V(1).Info("device plugin served", "resource", resource)
	return &running{svc: svc, stop: stop}
}

// SocketName is the file name, in the device-plugin directory, of the
// socket that serves resource on node.
func SocketName(node, resource string) string {
	sum := sha256.Sum256([]byte(node + "\x00" + resource))
	return "dowse-" + hex.EncodeToString(sum[:10]) + ".sock"
}

// devicesOf lists inst's slots as seen by the plugin of resource; a slot
// another node holds, or this node through the other resource, is
// Unhealthy so that the kubelet does not hand it out here.
func devicesOf(inst *v1alpha1.Instance, node, resource string) []*dp.Device {
	elsewhere := map[string]bool{}
	for _, s := range inst.Status.Slots {
		if s.Node != node || (s.Resource != "" && s.Resource != resource) {
			elsewhere[s.ID] = true
		}
	}
	var out []*dp.Device
	for _, id := range inst.SlotIDs() {
		h := dp.Healthy
		if elsewhere[id] {
			h = dp.Unhealthy
		}
		out = append(out, &dp.Device{ID: id, Health: h})
	}
	return out
}

func (m *Manager) instance(key types.NamespacedName) *v1alpha1.Instance {
	m.mu.Lock()
	defer m.mu.Unlock()
	if ip := m.instances[key]; ip != nil {
		return ip.inst
	}
	return nil
}

func (m *Manager) instanceService(key types.NamespacedName, resource string) *service {
	return newService(
		func() []*dp.Device {
			if inst := m.instance(key); inst != nil {
				return devicesOf(inst, m.opts.NodeName, resource)
			}
			return nil
		},
		func(ctx context.Context, ids []string) (*dp.ContainerAllocateResponse, error) {
			inst := m.instance(key)
			if inst == nil {
				return nil, fmt.Errorf("instance %s is no longer on this node", key)
			}
			return m.allocate(ctx, resource, map[*v1alpha1.Instance][]string{inst: ids})
		})
}

func (m *Manager) configService(ckey types.NamespacedName, resource string) *service {
	members := func() []*v1alpha1.Instance {
		m.mu.Lock()
		defer m.mu.Unlock()
		cp := m.configs[ckey]
		if cp == nil {
			return nil
		}
		var out []*v1alpha1.Instance
		for _, name := range slices.Sorted(maps.Keys(cp.members)) {
			if ip := m.instances[types.NamespacedName{Namespace: ckey.Namespace, Name: name}]; ip != nil {
				out = append(out, ip.inst)
			}
		}
		return out
	}
	return newService(
		func() []*dp.Device {
			var out []*dp.Device
			for _, inst := range members() {
				out = append(out, devicesOf(inst, m.opts.NodeName, resource)...)
			}
			return out
		},
		func(ctx context.Context, ids []string) (*dp.ContainerAllocateResponse, error) {
			byHash := map[string]*v1alpha1.Instance{}
			for _, inst := range members() {
				byHash[v1alpha1.InstanceHash(inst.Name)] = inst
			}
			want := map[*v1alpha1.Instance][]string{}
			for _, id := range ids {
				i := strings.LastIndexByte(id, '-')
				inst := byHash[id[:max(i, 0)]]
				if inst == nil {
					return nil, fmt.Errorf("device %s is not a slot of Configuration %s on this node", id, ckey)
				}
				want[inst] = append(want[inst], id)
			}
			return m.allocate(ctx, resource, want)
		})
}

// legacyService serves a legacy resource: the slots its members hold
// under it, Healthy, and nothing else.
func (m *Manager) legacyService(resource string) *service {
	held := func() map[string]*v1alpha1.Instance {
		m.mu.Lock()
		defer m.mu.Unlock()
		out := map[string]*v1alpha1.Instance{}
		lp := m.legacy[resource]
		if lp == nil {
			return out
		}
		for _, key := range slices.SortedFunc(maps.Keys(lp.members), func(a, b types.NamespacedName) int { return strings.Compare(a.String(), b.String()) }) {
			ip := m.instances[key]
			if ip == nil {
				continue
			}
			for _, s := range ip.inst.Status.Slots {
				if s.Node == m.opts.NodeName && s.Resource == resource && out[s.ID] == nil {
					out[s.ID] = ip.inst
				}
			}
		}
		return out
	}
	return newService(
		func() []*dp.Device {
			h := held()
			out := make([]*dp.Device, 0, len(h))
			for _, id := range slices.Sorted(maps.Keys(h)) {
				out = append(out, &dp.Device{ID: id, Health: dp.Healthy})
			}
			return out
		},
		func(ctx context.Context, ids []string) (*dp.ContainerAllocateResponse, error) {
			h := held()
			want := map[*v1alpha1.Instance][]string{}
			for _, id := range ids {
				inst := h[id]
				if inst == nil {
					return nil, fmt.Errorf("device %s is not a slot held under %s on this node", id, resource)
				}
				want[inst] = append(want[inst], id)
			}
			return m.allocate(ctx, resource, want)
		})
}

// allocate claims the slots and answers with CDI device names, or, in
// classic mode, with env, mounts and device nodes: never both, so that a
// runtime with CDI does not get every edit twice.
func (m *Manager) allocate(ctx context.Context, resource string, want map[*v1alpha1.Instance][]string) (*dp.ContainerAllocateResponse, error) {
	began := time.Now()
	resp, err := m.answer(ctx, resource, want)
	m.opts.Metrics.allocated(began, err)
	return resp, err
}

func (m *Manager) answer(ctx context.Context, resource string, want map[*v1alpha1.Instance][]string) (*dp.ContainerAllocateResponse, error) {
	resp := &dp.ContainerAllocateResponse{}
	insts := slices.SortedFunc(maps.Keys(want), func(a, b *v1alpha1.Instance) int { return strings.Compare(a.Name, b.Name) })
	for _, inst := range insts {
		if err := m.claimer.Claim(ctx, inst, want[inst], resource); err != nil {
			return nil, err
		}
		if !m.opts.Classic {
			resp.CdiDevices = append(resp.CdiDevices, &dp.CDIDevice{Name: inst.CDIName()})
			continue
		}
		if resp.Envs == nil {
			resp.Envs = map[string]string{}
		}
		maps.Copy(resp.Envs, cdi.Env(inst))
		// The host paths this node's own handler reported, not the
		// object's, which other nodes also write.
		own, err := m.cdi.Own(inst)
		if err != nil {
			return nil, fmt.Errorf("instance %s: %w", inst.Name, err)
		}
		for _, mt := range own.Spec.Mounts {
			resp.Mounts = append(resp.Mounts, &dp.Mount{ContainerPath: mt.ContainerPath, HostPath: mt.HostPath, ReadOnly: mt.ReadOnly})
		}
		for _, d := range own.Spec.DeviceSpecs {
			perm := d.Permissions
			if perm == "" {
				perm = "rw"
			}
			resp.Devices = append(resp.Devices, &dp.DeviceSpec{ContainerPath: d.ContainerPath, HostPath: d.HostPath, Permissions: perm})
		}
	}
	return resp, nil
}
