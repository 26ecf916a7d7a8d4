package readings

// A watch from a resourceVersion: what a client that listed (or watched)
// at that resourceVersion has missed since, sent before the live
// changes, so that a reflector that watches again from the last
// resourceVersion it saw (client-go's informers, kubectl get -w after a
// list) stays in step without listing again.
//
// A reading's resourceVersion is its newest read time, so "newer than X"
// is a reading read after X; a value read earlier but taken by a replica
// after X (an edge resending what it read while offline, or a value in
// flight between replicas when the client's watch ended) is sent too:
// every reading a replica took after X less a margin is. A Device deleted
// since is sent as DELETED from the Devices' tombstones, which go back to
// when this replica began to follow the Devices; an older resourceVersion
// is answered 410 Gone (Expired), as the API server answers one older
// than its watch cache, and the client lists again.

import (
	"strconv"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"

	rv1 "github.com/dowse-dev/dowse/shared/api/readings/v1alpha1"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// takenAnnotation carries, between replicas only, when a replica took a
// reading's newest change (Unix microseconds); clients never see it
// (merged builds their metadata from the Device's).
const takenAnnotation = "readings.dowse.dev/taken"

// DefaultReplayMargin is how far before a watch's resourceVersion the
// replay looks at what the replicas took: a value read before it and
// still in flight between replicas when the client's last watch ended.
const DefaultReplayMargin = 5 * time.Second

// tombstone is a deleted Device, for replays.
type tombstone struct {
	key     types.NamespacedName
	labels  map[string]string
	created int64 // Unix microseconds, the Device's creationTimestamp
	at      int64 // Unix microseconds, when this replica saw it go
}

// deletions are the Devices deleted since this replica began to follow
// them: since is the oldest resourceVersion a watch can replay from.
type deletions struct {
	mu     sync.Mutex
	since  int64
	list   []tombstone // oldest first
	window time.Duration
	max    int
}

// add records a deletion at now, dropping those older than the window
// (or beyond max), which raises since.
func (d *deletions) add(t tombstone) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.list = append(d.list, t)
	cut := 0
	for cut < len(d.list) && (d.list[cut].at < t.at-d.window.Microseconds() || len(d.list)-cut > d.max) {
		d.since = max(d.since, d.list[cut].at)
		cut++
	}
	d.list = d.list[cut:]
}

// after returns the deletions after at, and whether at can be answered
// (not before since).
func (d *deletions) after(at int64) ([]tombstone, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.since == 0 || at < d.since {
		return nil, false
	}
	var out []tombstone
	for _, t := range d.list {
		if t.at > at {
			out = append(out, t)
		}
	}
	return out, true
}

// follows marks the start of the record (the Devices' informer is
// followed from now on).
func (d *deletions) follows(now int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.since == 0 {
		d.since = now
	}
}

// DeviceEvents is the handler of the Devices' informer the server follows
// the Devices with: watches learn of Devices created, changed (labels,
// node, status) and deleted, and replays of the deleted ones. Add it
// before the server serves; until then every replay is answered 410.
func (s *Server) DeviceEvents() toolscache.ResourceEventHandler {
	s.deleted.follows(time.Now().UnixMicro())
	touch := func(obj any) {
		if d, ok := obj.(*v1alpha1.Device); ok {
			s.cfg.Store.Touch(types.NamespacedName{Namespace: d.Namespace, Name: d.Name})
		}
	}
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { touch(obj) },
		UpdateFunc: func(_, obj any) { touch(obj) },
		DeleteFunc: func(obj any) {
			if u, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = u.Obj
			}
			d, ok := obj.(*v1alpha1.Device)
			if !ok {
				return
			}
			s.deleted.add(tombstone{key: types.NamespacedName{Namespace: d.Namespace, Name: d.Name}, labels: d.Labels,
				created: d.CreationTimestamp.UnixMicro(), at: time.Now().UnixMicro()})
			touch(d)
		},
	}
}

// parseVersion is a resourceVersion of this API (Unix microseconds).
func parseVersion(rv string) (int64, error) {
	n, err := strconv.ParseInt(rv, 10, 64)
	if err != nil || n < 0 {
		return 0, apierrors.NewBadRequest("resourceVersion " + strconv.Quote(rv) + " is not one of this API's (Unix microseconds)")
	}
	return n, nil
}

// tooOld is the answer to a watch from a resourceVersion before what
// this replica can replay.
func tooOld(rv, since int64) error {
	return apierrors.NewResourceExpired("too old resource version: " + strconv.FormatInt(rv, 10) + " (" + strconv.FormatInt(since, 10) + ")")
}

// createdAfter: the client that listed at rv had not seen d (creation
// times are whole seconds: one created in rv's second counts as after).
func createdAfter(created metav1.Time, rv int64) bool {
	return !created.IsZero() && created.UnixMicro() >= rv-rv%1_000_000
}

// replayEvent is an event a replay sends.
type replayEvent struct {
	typ string
	obj rv1.DeviceReading
}

// replay is what a client that saw everything up to rv has missed:
// items are the current readings the watch selects (merged, sorted),
// taken when a replica took each one's newest change (Unix
// microseconds), gone the Devices deleted after rv-margin. A reading
// read after rv, or taken after rv-margin, is MODIFIED, or ADDED when
// its Device was created after rv; a deleted one the client had is
// DELETED.
func replay(items []rv1.DeviceReading, taken map[types.NamespacedName]int64, gone []tombstone, rv int64, margin time.Duration,
	namespace, name string, sel labels.Selector) []replayEvent {
	from := rv - margin.Microseconds()
	var out []replayEvent
	present := map[types.NamespacedName]bool{}
	for _, it := range items {
		key := types.NamespacedName{Namespace: it.Namespace, Name: it.Name}
		present[key] = true
		v, _ := strconv.ParseInt(it.ResourceVersion, 10, 64)
		switch {
		case createdAfter(it.CreationTimestamp, rv):
			out = append(out, replayEvent{"ADDED", it})
		case v > rv || taken[key] > from:
			out = append(out, replayEvent{"MODIFIED", it})
		}
	}
	for _, t := range gone {
		if present[t.key] || t.at <= from || namespace != "" && t.key.Namespace != namespace || name != "" && t.key.Name != name ||
			!sel.Matches(labels.Set(t.labels)) || t.created > rv {
			continue
		}
		present[t.key] = true // deleted twice (recreated and deleted again): once
		out = append(out, replayEvent{"DELETED", rv1.DeviceReading{TypeMeta: typeMeta, ObjectMeta: metav1.ObjectMeta{
			Namespace: t.key.Namespace, Name: t.key.Name, Labels: t.labels,
			ResourceVersion: strconv.FormatInt(t.at, 10)}}})
	}
	return out
}
