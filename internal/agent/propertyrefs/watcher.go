// Package propertyrefs reads the Secrets and ConfigMaps that this node's
// Configurations name in their discoveryProperties, and nothing else: one
// list-and-watch per object, by name (a metadata.name field selector), so
// the agent needs no right to list or watch Secrets and ConfigMaps, only
// get/list/watch on the objects it names. The controller grants exactly that
// (internal/controller/propertyaccess). A change of a watched object is reported to
// the Configurations that read it, so that they resolve their properties
// again.
package propertyrefs

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	toolscache "k8s.io/client-go/tools/cache"
)

// Kind is the kind of a referenced object.
type Kind string

// The kinds a discoveryProperty reads.
const (
	Secret    Kind = "Secret"
	ConfigMap Kind = "ConfigMap"
)

// Ref names one referenced object.
type Ref struct {
	Kind Kind
	types.NamespacedName
}

func (r Ref) String() string { return string(r.Kind) + " " + r.NamespacedName.String() }

// ErrPending says that a watched object has not been read yet (its first
// list is under way, or failed for less than ReportAfter); the owners are
// notified when it has been, or when the failure is to be reported.
var ErrPending = errors.New("not read yet")

// ReportAfter is how long a new watch's reads may fail before Value
// reports the failure instead of ErrPending: a Configuration that names a
// new object is often read by the agent a moment before the controller has
// granted it, and its status should not flap to Forbidden for that moment.
const ReportAfter = 5 * time.Second

// Watcher keeps one watch per object some owner (a Configuration) reads.
// It is safe for concurrent use. Its Start is a manager Runnable.
type Watcher struct {
	client  kubernetes.Interface
	notify  func(owners []types.NamespacedName)
	metrics *Metrics
	log     logr.Logger

	reportAfter time.Duration

	mu      sync.Mutex
	ctx     context.Context // nil until Start
	owners  map[types.NamespacedName]map[Ref]bool
	watches map[Ref]*objectWatch
}

// New makes a Watcher reading through c. notify is called (from the
// watches' goroutines, never with a lock held) with the owners of an object
// when it has been read for the first time, changed, was deleted, or its
// first read failed in a new way; it must not block for long. metrics may
// be nil.
func New(c kubernetes.Interface, notify func(owners []types.NamespacedName), metrics *Metrics, log logr.Logger) *Watcher {
	return &Watcher{client: c, notify: notify, metrics: metrics, log: log, reportAfter: ReportAfter,
		owners: map[types.NamespacedName]map[Ref]bool{}, watches: map[Ref]*objectWatch{}}
}

// Set states the objects owner reads (none: it reads nothing any more).
// Watches start for objects nobody read before and stop for objects nobody
// reads now. Idempotent.
func (w *Watcher) Set(owner types.NamespacedName, refs []Ref) {
	w.mu.Lock()
	if len(refs) == 0 {
		delete(w.owners, owner)
	} else {
		set := make(map[Ref]bool, len(refs))
		for _, r := range refs {
			set[r] = true
		}
		w.owners[owner] = set
	}
	wanted := map[Ref]bool{}
	for _, set := range w.owners {
		for r := range set {
			wanted[r] = true
		}
	}
	var stop []*objectWatch
	for r, ow := range w.watches {
		if !wanted[r] {
			stop = append(stop, ow)
			delete(w.watches, r)
		}
	}
	for r := range wanted {
		if w.watches[r] == nil {
			ow := w.newWatch(r)
			w.watches[r] = ow
			if w.ctx != nil {
				ow.start(w.ctx)
			}
		}
	}
	w.metrics.setWatched(len(w.watches))
	w.mu.Unlock()
	for _, ow := range stop {
		ow.stop()
	}
}

// Watched returns the objects watched now (tests and metrics).
func (w *Watcher) Watched() []Ref {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]Ref, 0, len(w.watches))
	for r := range w.watches {
		out = append(out, r)
	}
	return out
}

// Value returns key of the object ref, which an owner must have Set.
// found is false, with a nil error, when the object or its key does not
// exist. Before the object has been read the error is ErrPending, or, when
// reading it has failed for ReportAfter (for example Forbidden: the
// controller has not granted this node's agent the object), that failure;
// the watch retries with backoff meanwhile and the owners are notified
// once it succeeds. After the first read the last known object is served,
// also while its watch is failing.
func (w *Watcher) Value(ref Ref, key string) (v []byte, found bool, err error) {
	w.mu.Lock()
	ow := w.watches[ref]
	w.mu.Unlock()
	if ow == nil {
		return nil, false, fmt.Errorf("%s is not watched", ref)
	}
	if !ow.informer.HasSynced() {
		err := ow.lastError()
		switch {
		case err == nil:
			return nil, false, ErrPending
		case time.Since(ow.started) < ow.reportAfter:
			return nil, false, fmt.Errorf("%w (retrying: %w)", ErrPending, err)
		}
		return nil, false, err
	}
	obj, exists, err := ow.informer.GetStore().GetByKey(ref.Namespace + "/" + ref.Name)
	if err != nil || !exists {
		return nil, false, err
	}
	switch o := obj.(type) {
	case *corev1.Secret:
		v, found = o.Data[key]
	case *corev1.ConfigMap:
		if s, ok := o.Data[key]; ok {
			v, found = []byte(s), true
		} else {
			v, found = o.BinaryData[key]
		}
	}
	if found {
		v = append([]byte{}, v...) // the cached object is shared
	}
	return v, found, nil
}

// Start runs the watches until ctx ends, then stops them all.
func (w *Watcher) Start(ctx context.Context) error {
	w.mu.Lock()
	w.ctx = ctx
	for _, ow := range w.watches {
		ow.start(ctx)
	}
	w.mu.Unlock()
	<-ctx.Done()
	w.mu.Lock()
	all := w.watches
	w.watches = map[Ref]*objectWatch{}
	w.metrics.setWatched(0)
	w.mu.Unlock()
	for _, ow := range all {
		ow.stop()
	}
	return nil
}

func (w *Watcher) ownersOf(ref Ref) []types.NamespacedName {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []types.NamespacedName
	for o, set := range w.owners {
		if set[ref] {
			out = append(out, o)
		}
	}
	return out
}

func (w *Watcher) changed(ref Ref) {
	if owners := w.ownersOf(ref); len(owners) > 0 {
		w.notify(owners)
	}
}

// objectWatch is one object's informer.
type objectWatch struct {
	ref      Ref
	informer toolscache.SharedIndexInformer
	log      logr.Logger
	metrics  *Metrics
	changed  func()

	reportAfter time.Duration
	started     time.Time

	cancel context.CancelFunc
	done   chan struct{}

	mu  sync.Mutex
	err error // the last list or watch failure
}

func (w *Watcher) newWatch(ref Ref) *objectWatch {
	name := fields.OneTermEqualSelector("metadata.name", ref.Name).String()
	byName := func(o *metav1.ListOptions) { o.FieldSelector = name }
	var lw toolscache.ListerWatcher
	var example runtime.Object
	switch ref.Kind {
	case Secret:
		c := w.client.CoreV1().Secrets(ref.Namespace)
		lw = toolscache.ToListWatcherWithWatchListSemantics(&toolscache.ListWatch{
			ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				byName(&o)
				return c.List(ctx, o)
			},
			WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				byName(&o)
				return c.Watch(ctx, o)
			},
		}, w.client)
		example = &corev1.Secret{}
	default:
		c := w.client.CoreV1().ConfigMaps(ref.Namespace)
		lw = toolscache.ToListWatcherWithWatchListSemantics(&toolscache.ListWatch{
			ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				byName(&o)
				return c.List(ctx, o)
			},
			WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				byName(&o)
				return c.Watch(ctx, o)
			},
		}, w.client)
		example = &corev1.ConfigMap{}
	}
	inf := toolscache.NewSharedIndexInformerWithOptions(lw, example, toolscache.SharedIndexInformerOptions{
		ObjectDescription: ref.String(),
	})
	ow := &objectWatch{ref: ref, informer: inf, log: w.log.WithValues("object", ref.String()), metrics: w.metrics, changed: func() { w.changed(ref) }, reportAfter: w.reportAfter}
	// Keep what Value reads: managedFields and annotations (a
	// last-applied-configuration holds the values a second time) go.
	_ = inf.SetTransform(func(obj any) (any, error) {
		if m, ok := obj.(metav1.Object); ok {
			m.SetManagedFields(nil)
			m.SetAnnotations(nil)
		}
		return obj, nil
	})
	_ = inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *toolscache.Reflector, err error) {
		ow.failed(err)
	})
	_, _ = inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { ow.changed() },
		UpdateFunc: func(oldObj, newObj any) {
			o, ok1 := oldObj.(metav1.Object)
			n, ok2 := newObj.(metav1.Object)
			if ok1 && ok2 && o.GetResourceVersion() == n.GetResourceVersion() {
				return // a relist, not a change
			}
			ow.changed()
		},
		DeleteFunc: func(any) { ow.changed() },
	})
	return ow
}

func (ow *objectWatch) start(ctx context.Context) {
	ctx, ow.cancel = context.WithCancel(ctx)
	ow.done = make(chan struct{})
	ow.started = time.Now()
	go func() {
		defer close(ow.done)
		var wg sync.WaitGroup
		wg.Go(func() {
			// An object that does not exist makes no event: say when it
			// has been read.
			if toolscache.WaitForCacheSync(ctx.Done(), ow.informer.HasSynced) {
				ow.changed()
			}
		})
		wg.Go(func() {
			// Failing still when failures are to be reported: say so.
			t := time.NewTimer(ow.reportAfter)
			defer t.Stop()
			select {
			case <-ctx.Done():
			case <-t.C:
				if !ow.informer.HasSynced() && ow.lastError() != nil {
					ow.changed()
				}
			}
		})
		ow.informer.RunWithContext(ctx)
		wg.Wait()
	}()
	ow.log.V(1).Info("watching a discovery property object")
}

func (ow *objectWatch) stop() {
	if ow.cancel == nil {
		return // never started
	}
	ow.cancel()
	<-ow.done
	ow.log.V(1).Info("stopped watching a discovery property object")
}

func (ow *objectWatch) lastError() error {
	ow.mu.Lock()
	defer ow.mu.Unlock()
	return ow.err
}

// failed records a list or watch failure; the informer retries with backoff
// (0.8 s doubling to 30 s). A new failure before the object was ever read
// is logged and told to the owners, for their status.
func (ow *objectWatch) failed(err error) {
	ow.metrics.failed(err)
	ow.mu.Lock()
	same := ow.err != nil && ow.err.Error() == err.Error()
	ow.err = err
	ow.mu.Unlock()
	if same {
		return
	}
	if ow.informer.HasSynced() {
		ow.log.V(1).Info("watch of a discovery property object failed; retrying", "err", err)
		return
	}
	ow.log.Info("cannot read a discovery property object; retrying", "err", err)
	ow.changed()
}
