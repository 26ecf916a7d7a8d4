// Package instances turns the devices a handler reports on this node into
// Instance objects, shared with the agents of other nodes through
// server-side apply.
package instances

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"sort"
	"sync"

	"github.com/go-logr/logr"
	"golang.org/x/sync/errgroup"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// ConfigurationIndex is the cache field index on spec.configurationName that
// the agent registers; the writer lists a Configuration's Instances with it.
const ConfigurationIndex = "spec.configurationName"

// IndexByConfiguration is the index function for ConfigurationIndex.
func IndexByConfiguration(obj client.Object) []string {
	return []string{obj.(*v1alpha1.Instance).Spec.ConfigurationName}
}

// Writer applies one node's view of Instances. Each node applies under a
// field manager of its own, so its entry in status.nodes is its own and
// agents never overwrite each other.
type Writer struct {
	client       client.Client // reads come from the informer cache
	reader       client.Reader // reads straight from the API server
	nodeName     string
	fieldManager string
	concurrency  int
	metrics      *Metrics

	// applied remembers the spec (as JSON) this node last applied, with its
	// node entry, per Instance. The cache lags behind our own writes, so
	// without it a quick second Sync would apply everything again.
	mu      sync.Mutex
	applied map[types.NamespacedName]memo
}

type memo struct {
	configuration string
	digest        [sha256.Size]byte
}

// NewWriter makes a Writer for nodeName. c must read Instances from a cache
// indexed with ConfigurationIndex; concurrency bounds parallel writes;
// direct reads past the cache, needed only in rare races.
func NewWriter(c client.Client, direct client.Reader, nodeName string, concurrency int, m *Metrics) *Writer {
	if concurrency < 1 {
		concurrency = 1
	}
	return &Writer{client: c, reader: direct, nodeName: nodeName, fieldManager: FieldManager(nodeName), concurrency: concurrency, metrics: m, applied: map[types.NamespacedName]memo{}}
}

// FieldManager is the server-side-apply field manager of one node's agent.
func FieldManager(nodeName string) string {
	const prefix = "dowse-agent/"
	if len(prefix)+len(nodeName) > 128 { // the API server's limit
		sum := sha256.Sum256([]byte(nodeName))
		return prefix + nodeName[:64] + "-" + hex.EncodeToString(sum[:])[:16]
	}
	return prefix + nodeName
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
	var cached v1alpha1.InstanceList
	if err := w.client.List(ctx, &cached, client.InNamespace(cfg.Namespace), client.MatchingFields{ConfigurationIndex: cfg.Name}); err != nil {
		return SyncResult{}, fmt.Errorf("listing cached instances: %w", err)
	}
	byName := make(map[string]*v1alpha1.Instance, len(cached.Items))
	for i := range cached.Items {
		byName[cached.Items[i].Name] = &cached.Items[i]
	}

	var res SyncResult
	desired := make(map[string]*v1alpha1.Instance, len(devices))
	type work struct {
		desired, cached *v1alpha1.Instance
	}
	var todo []work
	for _, d := range devices {
		inst := w.desiredInstance(cfg, shared, d)
		if prev, ok := desired[inst.Name]; ok {
			res.Collisions = append(res.Collisions, fmt.Sprintf("devices %q and %q share Instance name %s", prev.Spec.DeviceID, d.Id, inst.Name))
			continue
		}
		desired[inst.Name] = inst
		cur := byName[inst.Name]
		if cur == nil {
			// Not one of this Configuration's: the name may still be taken
			// by another Configuration whose name shares our prefix.
			other := &v1alpha1.Instance{}
			if err := w.client.Get(ctx, client.ObjectKeyFromObject(inst), other); err == nil {
				cur = other
			} else if !apierrors.IsNotFound(err) {
				return res, fmt.Errorf("reading cached instance %s: %w", inst.Name, err)
			}
		}
		if cur != nil && (cur.Spec.DeviceID != inst.Spec.DeviceID || cur.Spec.ConfigurationName != inst.Spec.ConfigurationName) {
			res.Collisions = append(res.Collisions, fmt.Sprintf("device %q maps to Instance %s, which belongs to device %q of Configuration %q", d.Id, inst.Name, cur.Spec.DeviceID, cur.Spec.ConfigurationName))
			continue
		}
		if w.upToDate(cur, inst) {
			continue
		}
		todo = append(todo, work{desired: inst, cached: cur})
	}
	var release []*v1alpha1.Instance
	for name, cur := range byName {
		if _, want := desired[name]; !want && hasNode(cur, w.nodeName) {
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
		if cur, cached := byName[key.Name]; !want && (!cached || !hasNode(cur, w.nodeName)) {
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
			if err := w.upsert(gctx, wk.desired, wk.cached); err != nil {
				return fmt.Errorf("applying instance %s: %w", wk.desired.Name, err)
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
	if err := w.client.List(ctx, &cached, client.InNamespace(cfg.Namespace), client.MatchingFields{ConfigurationIndex: cfg.Name}); err != nil {
		return false, err
	}
	for i := range cached.Items {
		if hasNode(&cached.Items[i], w.nodeName) {
			return true, nil
		}
	}
	return false, nil
}

func (w *Writer) desiredInstance(cfg *v1alpha1.Configuration, shared bool, d *discoveryv1.Device) *v1alpha1.Instance {
	hash := DeviceHash(d.GetId(), shared, w.nodeName)
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
		ObjectMeta: metav1.ObjectMeta{Name: InstanceName(cfg.Name, hash), Namespace: cfg.Namespace},
		Spec: v1alpha1.InstanceSpec{
			ConfigurationName: cfg.Name,
			DeviceID:          d.GetId(),
			CDIName:           CDIName(cfg.Name, hash),
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
	if cur != nil && hasNode(cur, w.nodeName) && equality.Semantic.DeepEqual(cur.Spec, want.Spec) && ownedBy(cur, want.OwnerReferences) {
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

func (w *Writer) remember(want *v1alpha1.Instance, applied bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if applied {
		w.applied[client.ObjectKeyFromObject(want)] = memo{configuration: want.Spec.ConfigurationName, digest: memoDigest(want)}
	} else {
		delete(w.applied, client.ObjectKeyFromObject(want))
	}
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

func (w *Writer) upsert(ctx context.Context, want, cur *v1alpha1.Instance) error {
	w.remember(want, false)
	var applied v1alpha1.Instance
	m := applyMeta{Name: want.Name, Namespace: want.Namespace, OwnerReferences: want.OwnerReferences}
	if err := w.patch(ctx, m, &want.Spec, []v1alpha1.InstanceNode{{Name: w.nodeName}}, &applied); err != nil {
		return err
	}
	w.remember(want, true)
	return nil
}

// release drops this node from cur and deletes cur if no node is left. The
// apply restates the spec so that this node keeps co-owning it (dropping it
// would remove fields nobody else owns); the delete is conditional on the
// resourceVersion the apply returned, so a node that joined in between
// keeps the Instance.
func (w *Writer) release(ctx context.Context, cur *v1alpha1.Instance) (bool, error) {
	if cur.Spec.DeviceID == "" {
		// Known only from our own recent apply, not yet in the cache: read it
		// once from the API server (rare: a device that came and went
		// within the cache's lag).
		fresh := &v1alpha1.Instance{}
		if err := w.reader.Get(ctx, client.ObjectKeyFromObject(cur), fresh); err != nil {
			if apierrors.IsNotFound(err) {
				w.remember(cur, false)
				return false, nil
			}
			return false, err
		}
		if !hasNode(fresh, w.nodeName) {
			w.remember(cur, false)
			return false, nil
		}
		cur = fresh
	}
	spec, owners := cur.Spec, cur.OwnerReferences
	w.remember(cur, false)
	if cur.UID != "" && len(cur.Status.Nodes) == 1 && hasNode(cur, w.nodeName) {
		// The last node: one conditional delete instead of apply and delete.
		// A node that joined since changed the resourceVersion, and then
		// the delete fails and we fall back to dropping only our entry.
		uid, rv := cur.UID, cur.ResourceVersion
		err := w.client.Delete(ctx, cur.DeepCopy(), client.Preconditions{UID: &uid, ResourceVersion: &rv})
		switch {
		case err == nil:
			return true, nil
		case apierrors.IsNotFound(err):
			return false, nil
		case !apierrors.IsConflict(err):
			return false, err
		}
	}
	var after v1alpha1.Instance
	// The uid, when the cache knows it, makes the apply fail rather than
	// create an Instance that is gone. Without it (an Instance so new the
	// cache has not shown it) the apply may recreate it with no node, and
	// the delete below removes it again.
	err := w.patch(ctx, applyMeta{Name: cur.Name, Namespace: cur.Namespace, UID: cur.UID, OwnerReferences: owners}, &spec, nil, &after)
	if err != nil {
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			return false, nil
		}
		return false, err
	}
	if len(after.Status.Nodes) > 0 {
		return false, nil
	}
	uid, rv := after.UID, after.ResourceVersion
	err = w.client.Delete(ctx, &after, client.Preconditions{UID: &uid, ResourceVersion: &rv})
	switch {
	case err == nil:
		return true, nil
	case apierrors.IsNotFound(err), apierrors.IsConflict(err):
		return false, nil
	default:
		return false, err
	}
}

type applyMeta struct {
	Name            string                  `json:"name"`
	Namespace       string                  `json:"namespace"`
	UID             types.UID               `json:"uid,omitempty"`
	OwnerReferences []metav1.OwnerReference `json:"ownerReferences,omitempty"`
}

type applyInstance struct {
	APIVersion string                   `json:"apiVersion"`
	Kind       string                   `json:"kind"`
	Metadata   applyMeta                `json:"metadata"`
	Spec       *v1alpha1.InstanceSpec   `json:"spec,omitempty"`
	Status     *v1alpha1.InstanceStatus `json:"status,omitempty"`
}

// patch applies this node's view of one Instance: its spec and this node's
// entry in status.nodes (nodes holds this node, or is empty to drop it).
// Force: every node that sees a shared device states the same spec; a
// conflict only means another node saw different properties, and the latest
// observation wins.
func (w *Writer) patch(ctx context.Context, m applyMeta, spec *v1alpha1.InstanceSpec, nodes []v1alpha1.InstanceNode, into *v1alpha1.Instance) error {
	body, err := json.Marshal(applyInstance{
		APIVersion: v1alpha1.GroupVersion.String(), Kind: "Instance",
		Metadata: m, Spec: spec, Status: &v1alpha1.InstanceStatus{Nodes: nodes},
	})
	if err != nil {
		return err
	}
	into.Name, into.Namespace = m.Name, m.Namespace
	return w.client.Patch(ctx, into, client.RawPatch(types.ApplyPatchType, body), client.FieldOwner(w.fieldManager), client.ForceOwnership)
}

func hasNode(inst *v1alpha1.Instance, node string) bool {
	for _, n := range inst.Status.Nodes {
		if n.Name == node {
			return true
		}
	}
	return false
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
