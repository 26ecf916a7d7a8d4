// Package instances turns the devices a handler reports on this node into
// Instance objects, shared with the agents of other nodes. Its Writer
// decides what to write; internal/instancestore writes it.
package instances

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"unique"

	"github.com/go-logr/logr"
	"golang.org/x/sync/errgroup"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/internal/instancestore"
	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// getsBeforeList is how many new devices of one Sync are checked against
// other Configurations' Instances one cache read each before the namespace
// is listed once instead.
const getsBeforeList = 32

// ConfigurationIndex is the cache field index on spec.configurationName that
// the agent registers; the writer lists a Configuration's Instances with it.
const ConfigurationIndex = "spec.configurationName"

// IndexByConfiguration is the index function for ConfigurationIndex.
func IndexByConfiguration(obj client.Object) []string {
	if inst, ok := obj.(*v1alpha1.Instance); ok {
		return []string{inst.Spec.ConfigurationName}
	}
	return nil
}

// Writer applies one node's view of Instances (instancestore.Apply and
// Release), so its entry in status.nodes is its own and agents never
// overwrite each other.
type Writer struct {
	client      client.Client // reads come from the informer cache
	reader      client.Reader // reads straight from the API server
	nodeName    string
	concurrency int
	metrics     *Metrics
	local       Recorder

	// applied remembers the spec (as JSON) this node last applied, with its
	// node entry, per Instance. The cache lags behind our own writes, so
	// without it a quick second Sync would apply everything again.
	mu      sync.Mutex
	applied map[types.NamespacedName]memo
	// inflight are the Instances being applied, with the resourceVersion
	// the cache showed of each meanwhile (Observe): the watch may show an
	// apply before its response arrives.
	inflight map[types.NamespacedName]string
}

type memo struct {
	configuration string
	digest        [sha256.Size]byte
	// resourceVersion is the apply's: once the cache shows it, the memo
	// goes (Observe).
	resourceVersion string
}

// Recorder is told what this node's own handlers reported for each
// Instance it holds (cdi.Local): a shared Instance is written by every node
// that sees its device, so what a container here gets of the host must come
// from this node's report, not from the object.
type Recorder interface {
	Record(key types.NamespacedName, mounts []v1alpha1.Mount, devices []v1alpha1.DeviceNode)
	Drop(key types.NamespacedName)
}

// NewWriter makes a Writer for nodeName. c must read Instances from a cache
// indexed with ConfigurationIndex; concurrency bounds parallel writes;
// direct reads past the cache, needed only in rare races. local (may be
// nil) is told what this node discovered for each Instance.
func NewWriter(c client.Client, direct client.Reader, nodeName string, concurrency int, m *Metrics, local Recorder) *Writer {
	if concurrency < 1 {
		concurrency = 1
	}
	return &Writer{client: c, reader: direct, nodeName: nodeName, concurrency: concurrency, metrics: m, local: local, applied: map[types.NamespacedName]memo{},
		inflight: map[types.NamespacedName]string{}}
}

// SyncResult says what a Sync did.
type SyncResult struct {
	Applied, Released, Deleted int
	// Collisions names devices that were not written because their Instance
	// name belongs to another device or Configuration.
	Collisions []string
}

// Sync makes this node's part of cfg's Instances match devices: it applies
// the Instances of present devices with this node in their status, and
// removes this node from the Instances of devices no longer present,
// deleting an Instance no node sees any more.
//
// Sync is idempotent, compares against the cache first, and makes no request
// when the cache already matches. Device ids must be unique and non-empty
// (the caller validates). A nil devices slice releases everything this node
// holds for cfg. Errors are retryable; what succeeded stays done.
func (w *Writer) Sync(ctx context.Context, cfg *v1alpha1.Configuration, shared bool, devices []*discoveryv1.Device) (SyncResult, error) {
	log := logr.FromContextOrDiscard(ctx).WithValues("configuration", cfg.Name, "namespace", cfg.Namespace)
	// The cache's own objects, not copies: Sync and the writes only read
	// them.
	var cached v1alpha1.InstanceList
	if err := w.client.List(ctx, &cached, client.InNamespace(cfg.Namespace), client.MatchingFields{ConfigurationIndex: cfg.Name}, client.UnsafeDisableDeepCopy); err != nil {
		return SyncResult{}, fmt.Errorf("listing cached instances: %w", err)
	}
	byName := make(map[string]*v1alpha1.Instance, len(cached.Items))
	for i := range cached.Items {
		byName[cached.Items[i].Name] = &cached.Items[i]
	}

	var res SyncResult
	// desired holds the device id of each Instance name wanted. The
	// Instances themselves are built again by the writes that need them,
	// so that a burst of thousands is not held twice while it is written.
	desired := make(map[string]string, len(devices))
	type work struct {
		device *discoveryv1.Device
		cached *v1alpha1.Instance
	}
	var todo []work
	// Other Configurations' Instances in the namespace, by name: read one
	// by one for the first devices not among this Configuration's, then
	// (a burst of new devices) listed once.
	var others map[string]*v1alpha1.Instance
	missing := 0
	for _, d := range devices {
		inst := w.desiredInstance(cfg, shared, d)
		if prev, ok := desired[inst.Name]; ok {
			res.Collisions = append(res.Collisions, fmt.Sprintf("devices %q and %q share Instance name %s", prev, d.Id, inst.Name))
			continue
		}
		desired[inst.Name] = d.GetId()
		cur := byName[inst.Name]
		if cur == nil {
			// Not one of this Configuration's: the name may still be taken
			// by another Configuration whose name shares our prefix. The
			// cache holds only this node's Instances; another node's is
			// caught by the apply (its configurationName and deviceID are
			// immutable).
			missing++
			if others == nil && missing <= getsBeforeList {
				other := &v1alpha1.Instance{}
				if err := w.client.Get(ctx, client.ObjectKeyFromObject(inst), other); err == nil {
					cur = other
				} else if !apierrors.IsNotFound(err) {
					return res, fmt.Errorf("reading cached instance %s: %w", inst.Name, err)
				}
			} else if others == nil {
				var all v1alpha1.InstanceList
				if err := w.client.List(ctx, &all, client.InNamespace(cfg.Namespace), client.UnsafeDisableDeepCopy); err != nil {
					return res, fmt.Errorf("listing cached instances: %w", err)
				}
				others = make(map[string]*v1alpha1.Instance, len(all.Items))
				for i := range all.Items {
					if o := &all.Items[i]; o.Spec.ConfigurationName != cfg.Name {
						others[o.Name] = o
					}
				}
			}
			if others != nil {
				cur = others[inst.Name]
			}
		}
		if cur != nil && (cur.Spec.DeviceID != inst.Spec.DeviceID || cur.Spec.ConfigurationName != inst.Spec.ConfigurationName) {
			res.Collisions = append(res.Collisions, fmt.Sprintf("device %q maps to Instance %s, which belongs to device %q of Configuration %q", d.Id, inst.Name, cur.Spec.DeviceID, cur.Spec.ConfigurationName))
			continue
		}
		if w.local != nil {
			w.local.Record(client.ObjectKeyFromObject(inst), inst.Spec.Mounts, inst.Spec.DeviceSpecs)
		}
		keepHostPaths(inst, cur)
		if w.upToDate(cur, inst) {
			continue
		}
		todo = append(todo, work{device: d, cached: cur})
	}
	var release []*v1alpha1.Instance
	for name, cur := range byName {
		if _, want := desired[name]; !want && cur.HasNode(w.nodeName) {
			release = append(release, cur)
		}
	}
	// Instances applied so recently that the cache has not shown them yet.
	w.mu.Lock()
	for key, m := range w.applied {
		if key.Namespace != cfg.Namespace || m.configuration != cfg.Name {
			continue
		}
		_, want := desired[key.Name]
		if cur, cached := byName[key.Name]; !want && (!cached || !cur.HasNode(w.nodeName)) {
			release = append(release, &v1alpha1.Instance{ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace}})
		}
	}
	w.mu.Unlock()
	if len(todo) == 0 && len(release) == 0 {
		return res, nil
	}

	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(w.concurrency)
	results := make(chan SyncResult, len(todo)+len(release))
	for _, wk := range todo {
		g.Go(func() error {
			want := w.desiredInstance(cfg, shared, wk.device)
			keepHostPaths(want, wk.cached)
			if err := w.upsert(gctx, want); err != nil {
				if wk.cached == nil && apierrors.IsInvalid(err) && strings.Contains(err.Error(), "is immutable") {
					// Not in this node's cache: an Instance of another node's,
					// whose derived fields the API server keeps immutable.
					results <- SyncResult{Collisions: []string{fmt.Sprintf("device %q maps to Instance %s, which belongs to another device or Configuration: %v", want.Spec.DeviceID, want.Name, err)}}
					return nil
				}
				return fmt.Errorf("applying instance %s: %w", want.Name, err)
			}
			results <- SyncResult{Applied: 1}
			return nil
		})
	}
	for _, cur := range release {
		g.Go(func() error {
			deleted, err := w.release(gctx, cur)
			if err != nil {
				return fmt.Errorf("releasing instance %s: %w", cur.Name, err)
			}
			r := SyncResult{Released: 1}
			if deleted {
				r.Deleted = 1
			}
			results <- r
			return nil
		})
	}
	err := g.Wait()
	close(results)
	for r := range results {
		res.Applied += r.Applied
		res.Released += r.Released
		res.Deleted += r.Deleted
		res.Collisions = append(res.Collisions, r.Collisions...)
	}
	w.metrics.observe(res)
	log.V(1).Info("instances synced", "applied", res.Applied, "released", res.Released, "deleted", res.Deleted, "collisions", len(res.Collisions))
	return res, err
}

// ReleaseAll removes this node from every Instance of cfg.
func (w *Writer) ReleaseAll(ctx context.Context, cfg *v1alpha1.Configuration) (SyncResult, error) {
	return w.Sync(ctx, cfg, false, nil)
}

// Holds reports whether this node appears in any Instance of cfg.
func (w *Writer) Holds(ctx context.Context, cfg *v1alpha1.Configuration) (bool, error) {
	var cached v1alpha1.InstanceList
	if err := w.client.List(ctx, &cached, client.InNamespace(cfg.Namespace), client.MatchingFields{ConfigurationIndex: cfg.Name}, client.UnsafeDisableDeepCopy); err != nil {
		return false, err
	}
	for i := range cached.Items {
		if cached.Items[i].HasNode(w.nodeName) {
			return true, nil
		}
	}
	return false, nil
}

// keepHostPaths leaves the mounts and device nodes of an existing shared
// Instance as they are: they were set by the node that made it, the node
// policy refuses any other node's change (each node hands its containers
// what it discovered itself, cdi.Local), and an apply that tried would
// fail whole, this node's entry with it.
func keepHostPaths(want, cur *v1alpha1.Instance) {
	if cur == nil || !cur.Spec.Shared || !want.Spec.Shared {
		return
	}
	want.Spec.Mounts = slices.Clone(cur.Spec.Mounts)
	want.Spec.DeviceSpecs = slices.Clone(cur.Spec.DeviceSpecs)
}

func (w *Writer) desiredInstance(cfg *v1alpha1.Configuration, shared bool, d *discoveryv1.Device) *v1alpha1.Instance {
	return Desired(cfg, shared, w.nodeName, d)
}

// Desired is the Instance (spec and metadata) that node writes for a
// device a handler of cfg found.
func Desired(cfg *v1alpha1.Configuration, shared bool, node string, d *discoveryv1.Device) *v1alpha1.Instance {
	hash := v1alpha1.DeviceHash(d.GetId(), shared, node)
	props := make(map[string]string, len(cfg.Spec.BrokerProperties)+len(d.GetProperties()))
	maps.Copy(props, cfg.Spec.BrokerProperties)
	maps.Copy(props, d.GetProperties())
	if len(props) == 0 {
		props = nil
	}
	capacity := cfg.Spec.Capacity
	if capacity < 1 {
		capacity = 1
	}
	inst := &v1alpha1.Instance{
		ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.InstanceName(cfg.Name, hash), Namespace: cfg.Namespace},
		Spec: v1alpha1.InstanceSpec{
			ConfigurationName: cfg.Name,
			DeviceID:          d.GetId(),
			Shared:            shared,
			Capacity:          capacity,
			BrokerProperties:  props,
		},
	}
	for _, m := range d.GetMounts() {
		inst.Spec.Mounts = append(inst.Spec.Mounts, v1alpha1.Mount{ContainerPath: m.GetContainerPath(), HostPath: m.GetHostPath(), ReadOnly: m.GetReadOnly()})
	}
	for _, s := range d.GetDeviceSpecs() {
		inst.Spec.DeviceSpecs = append(inst.Spec.DeviceSpecs, v1alpha1.DeviceNode{ContainerPath: s.GetContainerPath(), HostPath: s.GetHostPath(), Permissions: s.GetPermissions()})
	}
	sort.Slice(inst.Spec.Mounts, func(i, j int) bool { return inst.Spec.Mounts[i].ContainerPath < inst.Spec.Mounts[j].ContainerPath })
	sort.Slice(inst.Spec.DeviceSpecs, func(i, j int) bool {
		return inst.Spec.DeviceSpecs[i].ContainerPath < inst.Spec.DeviceSpecs[j].ContainerPath
	})
	if cfg.UID != "" {
		inst.OwnerReferences = []metav1.OwnerReference{{
			APIVersion: v1alpha1.GroupVersion.String(), Kind: "Configuration", Name: cfg.Name, UID: cfg.UID,
		}}
	}
	return inst
}

func (w *Writer) upToDate(cur, want *v1alpha1.Instance) bool {
	key := client.ObjectKeyFromObject(want)
	if cur != nil && cur.HasNode(w.nodeName) && equality.Semantic.DeepEqual(cur.Spec, want.Spec) && ownedBy(cur, want.OwnerReferences) {
		// The cache has caught up: the memo is no longer needed.
		w.mu.Lock()
		delete(w.applied, key)
		w.mu.Unlock()
		return true
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	m, ok := w.applied[key]
	return ok && m.digest == memoDigest(want)
}

// Forget drops what the writer remembers of an Instance; call it when the
// Instance is deleted, so that the next Sync creates it again if wanted.
func (w *Writer) Forget(key types.NamespacedName) {
	w.mu.Lock()
	delete(w.applied, key)
	w.mu.Unlock()
}

// Observe is told of each Instance the cache shows (its informer's
// events): the memo of an apply the cache now shows is no longer needed,
// so a burst of thousands of devices does not stay remembered.
func (w *Writer) Observe(obj any) {
	inst, ok := obj.(*v1alpha1.Instance)
	if !ok {
		return
	}
	key := client.ObjectKeyFromObject(inst)
	w.mu.Lock()
	if _, ok := w.inflight[key]; ok {
		w.inflight[key] = inst.ResourceVersion
	}
	if m, ok := w.applied[key]; ok && m.resourceVersion != "" && m.resourceVersion == inst.ResourceVersion {
		delete(w.applied, key)
	}
	w.mu.Unlock()
}

// rememberUnlessCached remembers an apply the cache does not show yet
// (its resourceVersion not observed while it was in flight).
func (w *Writer) rememberUnlessCached(want *v1alpha1.Instance, resourceVersion string) {
	key := client.ObjectKeyFromObject(want)
	w.mu.Lock()
	defer w.mu.Unlock()
	seen := w.inflight[key]
	delete(w.inflight, key)
	if resourceVersion != "" && seen == resourceVersion {
		return
	}
	w.applied[key] = memo{configuration: want.Spec.ConfigurationName, digest: memoDigest(want), resourceVersion: resourceVersion}
}

// memoDigest is what the memo keeps of an applied Instance: a digest, not
// a copy, so that a burst of thousands of devices does not hold each twice.
func memoDigest(inst *v1alpha1.Instance) [sha256.Size]byte {
	b, _ := json.Marshal(struct {
		Spec   v1alpha1.InstanceSpec
		Owners []metav1.OwnerReference
	}{inst.Spec, inst.OwnerReferences})
	return sha256.Sum256(b)
}

func (w *Writer) upsert(ctx context.Context, want *v1alpha1.Instance) error {
	key := client.ObjectKeyFromObject(want)
	w.mu.Lock()
	delete(w.applied, key)
	w.inflight[key] = ""
	w.mu.Unlock()
	ac, err := instancestore.Apply(ctx, w.client, w.nodeName, want)
	if err != nil {
		w.mu.Lock()
		delete(w.inflight, key)
		w.mu.Unlock()
		return err
	}
	w.rememberUnlessCached(want, ptr.Deref(ac.ResourceVersion, ""))
	return nil
}

// release drops this node from cur (instancestore.Release), after reading
// an Instance the cache has not shown yet.
func (w *Writer) release(ctx context.Context, cur *v1alpha1.Instance) (bool, error) {
	if cur.Spec.DeviceID == "" {
		// Known only from our own recent apply, not yet in the cache: read it
		// once from the API server (rare: a device that came and went
		// within the cache's lag).
		fresh := &v1alpha1.Instance{}
		if err := w.reader.Get(ctx, client.ObjectKeyFromObject(cur), fresh); err != nil {
			if apierrors.IsNotFound(err) {
				w.Forget(client.ObjectKeyFromObject(cur))
				return false, nil
			}
			return false, err
		}
		if !fresh.HasNode(w.nodeName) {
			w.Forget(client.ObjectKeyFromObject(cur))
			return false, nil
		}
		cur = fresh
	}
	w.Forget(client.ObjectKeyFromObject(cur))
	if w.local != nil {
		w.local.Drop(client.ObjectKeyFromObject(cur))
	}
	return instancestore.Release(ctx, w.client, w.nodeName, cur)
}

func ownedBy(inst *v1alpha1.Instance, refs []metav1.OwnerReference) bool {
	for _, want := range refs {
		found := false
		for _, have := range inst.OwnerReferences {
			if have.UID == want.UID {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// Trim is the agent cache's transform of Instances: it drops what the
// agent never reads (managedFields; labels, which the cache's label
// selector has already used on the server's side) and makes the strings
// every Instance of a Configuration repeats share one copy, so that
// thousands of cached Instances cost less.
func Trim(obj any) (any, error) {
	inst, ok := obj.(*v1alpha1.Instance)
	if !ok {
		return obj, nil
	}
	inst.ManagedFields = nil
	inst.Labels = nil
	inst.Namespace = intern(inst.Namespace)
	inst.Spec.ConfigurationName = intern(inst.Spec.ConfigurationName)
	for i := range inst.OwnerReferences {
		r := &inst.OwnerReferences[i]
		r.APIVersion, r.Kind, r.Name, r.UID = intern(r.APIVersion), intern(r.Kind), intern(r.Name), types.UID(intern(string(r.UID)))
	}
	for i := range inst.Status.Nodes {
		inst.Status.Nodes[i].Name = intern(inst.Status.Nodes[i].Name)
	}
	return inst, nil
}

func intern(s string) string { return unique.Make(s).Value() }
