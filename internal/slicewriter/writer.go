// Package slicewriter keeps one publisher's DRA ResourceSlices as desired
// while holding only their metadata: the pools and slices it wrote are
// read back from annotations through a metadata-only watch, so that the
// devices of thousands of slices are never cached, and each slice's
// devices are built only when that slice has to be written.
//
// It follows the pool contract of resource.k8s.io: every slice of a pool
// carries the pool's generation and its slice count. A change confined to
// one slice is one update under the same generation (atomic for
// consumers); any other change bumps the generation and rewrites every
// slice of the pool, after deleting the obsolete ones. Slices are named
// after their pool and index, so a restarted writer finds its own.
package slicewriter

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	resourcev1 "k8s.io/client-go/kubernetes/typed/resource/v1"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
)

// Annotations by which the writer reads its slices back.
const (
	PoolAnnotation       = "dra.dowse.dev/pool"
	GenerationAnnotation = "dra.dowse.dev/pool-generation"
	// IndexAnnotation is "<index>/<slice count>".
	IndexAnnotation  = "dra.dowse.dev/slice-index"
	DigestAnnotation = "dra.dowse.dev/slice-digest"
)

// Options configure a Writer.
type Options struct {
	// Driver is every slice's spec.driver.
	Driver string
	// NodeName is every slice's spec.nodeName (a node's local devices);
	// empty: slices without one, whose pools' NodeSelector says where
	// their devices are. With Driver, it selects the slices this writer
	// owns: all of that driver and node name (or of no node name).
	NodeName string
	// Owner is every slice's controller owner (the Node), UID included;
	// Pool.Owner, when set, takes its place for that pool's slices.
	Owner *metav1.OwnerReference
	// Concurrency bounds parallel writes (default 4).
	Concurrency int
	// OnError is told of each failed write; the writer retries it.
	OnError func(err error, what string)
	// OnWrite is told of each slice created, updated or deleted.
	OnWrite func(verb string)
}

// Pool is one pool's desired slices: slice i of the pool is Slices[i].
type Pool struct {
	Slices []Slice
	// NodeSelector is where the devices are, for a writer without a
	// NodeName.
	NodeSelector *corev1.NodeSelector
	// Owner, when set, owns the pool's slices instead of Options.Owner.
	Owner *metav1.OwnerReference
}

// Slice is one desired slice. Digest identifies its devices (equal digests,
// equal devices); Devices builds them when the slice must be written.
type Slice struct {
	Digest  string
	Devices func() []resourceapi.Device
}

// Writer publishes desired pools; Update sets them, Start runs it.
type Writer struct {
	opts   Options
	slices resourcev1.ResourceSliceInterface
	meta   metadata.Interface
	log    logr.Logger
	wake   chan struct{}
	// synced is closed once the watch has listed the published slices.
	synced chan struct{}

	mu      sync.Mutex
	desired map[string]Pool
	// published holds what the API server has, by slice name, from the
	// watch and from the writer's own responses (which the watch may not
	// have shown yet: pending).
	published map[string]*sliceMeta
	pending   map[string]pendingWrite
}

type sliceMeta struct {
	name, uid, rv string
	// ours: the slice carries the writer's annotations; others are removed.
	ours         bool
	pool, digest string
	generation   int64
	index, count int
}

// pendingWrite is the writer's own last write of a slice, until the
// watch shows it.
type pendingWrite struct {
	uid, rv string
	deleted bool
	at      time.Time
}

// pendingFor is how long the writer trusts its own write over an older
// object the watch still shows.
const pendingFor = 30 * time.Second

// New makes a Writer. slices writes (use a client with protobuf content);
// meta watches the slices' metadata.
func New(slices resourcev1.ResourceSliceInterface, meta metadata.Interface, opts Options, log logr.Logger) (*Writer, error) {
	if opts.Driver == "" {
		return nil, errors.New("slicewriter: a driver name is required")
	}
	if opts.Concurrency < 1 {
		opts.Concurrency = 4
	}
	return &Writer{opts: opts, slices: slices, meta: meta, log: log, wake: make(chan struct{}, 1), synced: make(chan struct{}),
		published: map[string]*sliceMeta{}, pending: map[string]pendingWrite{}}, nil
}

// Update replaces the desired pools; a pool missing from pools has its
// slices deleted. pools is not kept or changed; the Devices functions may
// be called at any time after, also once a later Update has replaced
// them (a write in progress).
func (w *Writer) Update(pools map[string]Pool) {
	desired := make(map[string]Pool, len(pools))
	for name, p := range pools {
		if p.NodeSelector != nil || p.Owner != nil {
			// What a slice holds besides its devices is part of its digest.
			extra := Digest(p.NodeSelector, p.Owner)
			p.Slices = slices.Clone(p.Slices)
			for i := range p.Slices {
				p.Slices[i].Digest = Digest(p.Slices[i].Digest, extra)
			}
		}
		desired[name] = p
	}
	w.mu.Lock()
	w.desired = desired
	w.mu.Unlock()
	w.requestReconcile()
}

// requestReconcile makes the writer's loop reconcile again; it never
// blocks: one pending request covers any number of changes.
func (w *Writer) requestReconcile() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// Start watches the node's slices and writes until ctx ends. Nothing is
// written before the first Update.
func (w *Writer) Start(ctx context.Context) error {
	sel := fmt.Sprintf("%s=%s,%s=%s", resourceapi.ResourceSliceSelectorDriver, w.opts.Driver, resourceapi.ResourceSliceSelectorNodeName, w.opts.NodeName)
	inf := metadatainformer.NewFilteredMetadataInformer(w.meta, resourceapi.SchemeGroupVersion.WithResource("resourceslices"), "", 0,
		toolscache.Indexers{}, func(o *metav1.ListOptions) { o.FieldSelector = sel }).Informer()
	_ = inf.SetTransform(func(obj any) (any, error) {
		if m, ok := obj.(metav1.Object); ok {
			m.SetManagedFields(nil)
		}
		return obj, nil
	})
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { w.observe(obj) },
		UpdateFunc: func(_, obj any) { w.observe(obj) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if m, ok := obj.(metav1.Object); ok {
				w.forget(m.GetName(), string(m.GetUID()))
			}
		},
	}); err != nil {
		return err
	}
	go inf.RunWithContext(ctx)
	if !toolscache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return nil
	}
	close(w.synced)
	backoff := time.Duration(0)
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-w.wake:
		case <-retry.C:
		}
		if err := w.reconcile(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			backoff = min(max(2*backoff, time.Second), 30*time.Second)
			retry.Reset(backoff)
			continue
		}
		backoff = 0
	}
}

// Synced is closed once Start has read the published slices back, from
// which SliceCount answers.
func (w *Writer) Synced() <-chan struct{} { return w.synced }

// SliceCount is the slice count of pool as published (0 for a pool with
// no slice): a publisher that spreads a pool over slices keeps it across
// its restarts (internal/dra.Buckets).
func (w *Writer) SliceCount(pool string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, s := range w.published {
		if s.ours && s.pool == pool {
			n = max(n, s.count)
		}
	}
	return n
}

// Go runs Start in the background until stop is called (once or more),
// which waits for it to end and logs an error it ended with.
func (w *Writer) Go(ctx context.Context) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Start(ctx) }()
	return sync.OnceFunc(func() {
		cancel()
		if err := <-done; err != nil {
			w.log.Error(err, "ResourceSlice writer")
		}
	})
}

// observe takes an object the watch shows, unless it is older than the
// writer's own write of it: another incarnation (a uid before the
// writer's create or delete), or the writer's incarnation at an earlier
// resourceVersion.
func (w *Writer) observe(obj any) {
	m, ok := obj.(metav1.Object)
	if !ok {
		return
	}
	s := parse(m)
	w.mu.Lock()
	if p, ok := w.pending[s.name]; ok && time.Since(p.at) < pendingFor {
		switch {
		case p.deleted && s.uid != p.uid, !p.deleted && s.uid == p.uid && s.rv == p.rv:
			delete(w.pending, s.name)
		default:
			w.mu.Unlock()
			return
		}
	}
	w.published[s.name] = s
	w.mu.Unlock()
	w.requestReconcile()
}

// forget drops a slice the watch shows deleted, unless that was an
// incarnation before the writer's own create.
func (w *Writer) forget(name, uid string) {
	w.mu.Lock()
	if p, ok := w.pending[name]; ok && time.Since(p.at) < pendingFor && !p.deleted && p.uid != uid {
		w.mu.Unlock()
		return
	}
	delete(w.published, name)
	delete(w.pending, name)
	w.mu.Unlock()
	w.requestReconcile()
}

func parse(m metav1.Object) *sliceMeta {
	a := m.GetAnnotations()
	s := &sliceMeta{name: m.GetName(), uid: string(m.GetUID()), rv: m.GetResourceVersion(), pool: a[PoolAnnotation], digest: a[DigestAnnotation]}
	gen, err1 := strconv.ParseInt(a[GenerationAnnotation], 10, 64)
	idx, cnt, found := strings.Cut(a[IndexAnnotation], "/")
	i, err2 := strconv.Atoi(idx)
	n, err3 := strconv.Atoi(cnt)
	s.ours = s.pool != "" && s.digest != "" && found && err1 == nil && err2 == nil && err3 == nil && i >= 0 && i < n
	s.generation, s.index, s.count = gen, i, n
	return s
}

// write is one API call of a reconcile.
type write struct {
	name string
	// del: delete (uid, rv preconditions); otherwise the slice to write,
	// created when rv is empty.
	del      bool
	uid, rv  string
	pool     string
	gen      int64
	index    int
	count    int
	slice    Slice
	selector *corev1.NodeSelector
	owner    *metav1.OwnerReference
}

// reconcile makes the published slices match the desired pools.
func (w *Writer) reconcile(ctx context.Context) error {
	w.mu.Lock()
	if w.desired == nil {
		w.mu.Unlock()
		return nil
	}
	for name, p := range w.pending {
		if time.Since(p.at) > pendingFor {
			delete(w.pending, name)
		}
	}
	byPool := map[string][]*sliceMeta{}
	var deletes, writes []write
	for _, s := range w.published {
		if _, want := w.desired[s.pool]; !s.ours || !want {
			deletes = append(deletes, write{name: s.name, del: true, uid: s.uid, rv: s.rv})
			continue
		}
		byPool[s.pool] = append(byPool[s.pool], s)
	}
	for _, pool := range slices.Sorted(maps.Keys(w.desired)) {
		d, p := w.plan(pool, w.desired[pool], byPool[pool])
		deletes, writes = append(deletes, d...), append(writes, p...)
	}
	w.mu.Unlock()
	if len(deletes)+len(writes) == 0 {
		return nil
	}
	// Obsolete slices go first: a consumer never sees them beside the
	// pool's new generation.
	if err := w.run(ctx, deletes); err != nil {
		return err
	}
	return w.run(ctx, writes)
}

// plan decides the writes of one pool against its published slices.
// Called with w.mu held.
func (w *Writer) plan(pool string, want Pool, have []*sliceMeta) (deletes, writes []write) {
	var gen int64
	for _, s := range have {
		gen = max(gen, s.generation)
	}
	n := len(want.Slices)
	matched := make(map[int]*sliceMeta, len(have))
	for _, s := range have {
		if s.generation < gen || s.index >= n || matched[s.index] != nil || s.name != w.sliceName(pool, s.index) {
			deletes = append(deletes, write{name: s.name, del: true, uid: s.uid, rv: s.rv})
			continue
		}
		matched[s.index] = s
	}
	var changed []int
	for i, sl := range want.Slices {
		if s := matched[i]; s == nil || s.count != n || s.digest != sl.Digest {
			changed = append(changed, i)
		}
	}
	if len(changed) == 0 && len(deletes) == 0 {
		return nil, nil
	}
	rewrite := changed
	if len(changed) > 1 || len(deletes) > 0 || gen == 0 {
		// More than one write: a new generation, in every slice. One write
		// (a change within one slice, or one missing slice recreated) is
		// atomic for consumers and keeps the generation.
		gen++
		rewrite = make([]int, n)
		for i := range rewrite {
			rewrite[i] = i
		}
	}
	for _, i := range rewrite {
		wr := write{name: w.sliceName(pool, i), pool: pool, gen: gen, index: i, count: n, slice: want.Slices[i], selector: want.NodeSelector, owner: cmp.Or(want.Owner, w.opts.Owner)}
		if s := matched[i]; s != nil {
			wr.uid, wr.rv = s.uid, s.rv
		}
		writes = append(writes, wr)
	}
	return deletes, writes
}

func (w *Writer) run(ctx context.Context, ws []write) error {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(w.opts.Concurrency)
	var mu sync.Mutex
	var errs []error
	for _, wr := range ws {
		g.Go(func() error {
			if err := w.do(gctx, wr); err != nil {
				what := "write ResourceSlice " + wr.name
				if wr.del {
					what = "delete ResourceSlice " + wr.name
				}
				if w.opts.OnError != nil {
					w.opts.OnError(err, what)
				}
				mu.Lock()
				errs = append(errs, fmt.Errorf("%s: %w", what, err))
				mu.Unlock()
			}
			return nil
		})
	}
	_ = g.Wait()
	return errors.Join(errs...)
}

func (w *Writer) do(ctx context.Context, wr write) error {
	if wr.del {
		uid := types.UID(wr.uid)
		err := w.slices.Delete(ctx, wr.name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &wr.rv}})
		if err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		w.mu.Lock()
		delete(w.published, wr.name)
		w.pending[wr.name] = pendingWrite{uid: wr.uid, deleted: true, at: time.Now()}
		w.mu.Unlock()
		w.wrote("delete")
		return nil
	}
	obj := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name: wr.name, ResourceVersion: wr.rv, UID: types.UID(wr.uid),

			Annotations: map[string]string{
				PoolAnnotation:       wr.pool,
				GenerationAnnotation: strconv.FormatInt(wr.gen, 10),
				IndexAnnotation:      fmt.Sprintf("%d/%d", wr.index, wr.count),
				DigestAnnotation:     wr.slice.Digest,
			},
		},
		Spec: resourceapi.ResourceSliceSpec{
			Driver:       w.opts.Driver,
			NodeSelector: wr.selector,
			Pool:         resourceapi.ResourcePool{Name: wr.pool, Generation: wr.gen, ResourceSliceCount: int64(wr.count)},
			Devices:      wr.slice.Devices(),
		},
	}
	if wr.owner != nil {
		obj.OwnerReferences = []metav1.OwnerReference{*wr.owner}
	}
	if w.opts.NodeName != "" {
		obj.Spec.NodeName = ptr.To(w.opts.NodeName)
	}
	var got *resourceapi.ResourceSlice
	var err error
	verb := "update"
	if wr.rv == "" {
		verb = "create"
		got, err = w.slices.Create(ctx, obj, metav1.CreateOptions{})
	} else {
		got, err = w.slices.Update(ctx, obj, metav1.UpdateOptions{})
	}
	if err != nil {
		return err
	}
	s := parse(got)
	w.mu.Lock()
	if cur, ok := w.published[s.name]; !ok || cur.uid != s.uid || cur.rv != s.rv {
		// Not shown by the watch yet.
		w.published[s.name] = s
		w.pending[s.name] = pendingWrite{uid: s.uid, rv: s.rv, at: time.Now()}
	}
	w.mu.Unlock()
	w.log.V(1).Info("ResourceSlice written", "verb", verb, "slice", wr.name, "pool", wr.pool, "generation", wr.gen)
	w.wrote(verb)
	return nil
}

func (w *Writer) wrote(verb string) {
	if w.opts.OnWrite != nil {
		w.opts.OnWrite(verb)
	}
}

func (w *Writer) sliceName(pool string, index int) string {
	return SliceName(cmp.Or(w.opts.NodeName, w.opts.Driver), pool, index)
}

// SliceName is the name of slice index of pool for a writer: its node's
// name (its driver's without one, cut to leave room), a hash of the pool
// and the index.
func SliceName(prefix, pool string, index int) string {
	sum := sha256.Sum256([]byte(pool))
	if len(prefix) > 200 {
		prefix = strings.TrimRight(prefix[:200], ".-")
	}
	return prefix + "-" + hex.EncodeToString(sum[:5]) + "-" + strconv.Itoa(index)
}

// Digest is a digest of the JSON of parts (for Slice.Digest).
func Digest(parts ...any) string {
	h := sha256.New()
	enc := json.NewEncoder(h)
	for _, p := range parts {
		_ = enc.Encode(p)
	}
	return hex.EncodeToString(h.Sum(nil)[:16])
}
