// Package readings keeps the newest value of every property of each
// Device whose node's session this replica holds, with a short history,
// in memory, and serves them through the Kubernetes API as the aggregated
// API readings.dowse.dev/v1alpha1 (package
// shared/api/readings/v1alpha1): get, list and watch of DeviceReadings,
// with authentication and authorization delegated to the API server.
// Each replica serves what it holds and asks the other replicas for the
// rest. Nothing here is written to etcd: Device.status, written under its
// budget by package twins, stays the durable record.
package readings

import (
	"context"
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// DefaultHistory is how many values a property keeps before its newest.
const DefaultHistory = 8

// sample is a value and when it was read (Unix nanoseconds).
type sample struct {
	value string
	at    int64
}

// prop is one property's newest value and the ring of those before it.
type prop struct {
	name   string
	newest sample
	ring   []sample // up to the store's history, oldest at next once full
	next   int
}

// device is what the store holds of one Device.
type device struct {
	node    string
	state   string
	stateAt int64
	props   []*prop
	// version rises with every change the store takes (the store's
	// counter), for watches.
	version uint64
	// taken is when the store last took a change of the Device (Unix
	// microseconds, the replica's clock): a watch replaying from a
	// resourceVersion sends what was taken after it, whenever it was
	// read (an edge resending what it read while offline).
	taken int64
}

// Snapshot is a copy of what the store holds of a Device.
type Snapshot struct {
	Key     types.NamespacedName
	Node    string
	State   string
	StateAt time.Time
	Props   []PropSnapshot
	Version uint64
	// Taken is when the store last took a change of the Device.
	Taken time.Time
}

// PropSnapshot is a property's newest value and its history (oldest
// first).
type PropSnapshot struct {
	Name    string
	Value   string
	At      time.Time
	History []Sample
}

// Sample is a value read at a time.
type Sample struct {
	Value string
	At    time.Time
}

// Store holds readings in memory. Safe for concurrent use; Observe, the
// hot path (one call per report), takes one lock, and watchers are told
// which Devices changed without blocking it.
type Store struct {
	history int

	mu       sync.Mutex
	devices  map[types.NamespacedName]*device
	byNode   map[string]map[types.NamespacedName]struct{}
	version  uint64
	watchers map[*Watcher]struct{}
}

// NewStore makes a Store keeping history values before each newest one
// (DefaultHistory when 0; none when negative).
func NewStore(history int) *Store {
	if history == 0 {
		history = DefaultHistory
	}
	if history < 0 {
		history = 0
	}
	return &Store{history: history, devices: map[types.NamespacedName]*device{},
		byNode: map[string]map[types.NamespacedName]struct{}{}, watchers: map[*Watcher]struct{}{}}
}

func (s *Store) deviceLocked(key types.NamespacedName, node string) *device {
	d := s.devices[key]
	if d == nil {
		d = &device{node: node}
		s.devices[key] = d
		s.indexLocked(key, node)
	} else if d.node != node {
		s.unindexLocked(key, d.node)
		d.node = node
		s.indexLocked(key, node)
	}
	return d
}

func (s *Store) indexLocked(key types.NamespacedName, node string) {
	m := s.byNode[node]
	if m == nil {
		m = map[types.NamespacedName]struct{}{}
		s.byNode[node] = m
	}
	m[key] = struct{}{}
}

func (s *Store) unindexLocked(key types.NamespacedName, node string) {
	if m := s.byNode[node]; m != nil {
		delete(m, key)
		if len(m) == 0 {
			delete(s.byNode, node)
		}
	}
}

// Observe takes a reported value of a Device's property, read at at, from
// node. An older value than the newest one held goes to the history in
// its place (a resend after a reconnect); the same value at the same time
// again is ignored.
func (s *Store) Observe(key types.NamespacedName, node, property, value string, at time.Time) {
	ns := at.UnixNano()
	s.mu.Lock()
	d := s.deviceLocked(key, node)
	var p *prop
	for _, q := range d.props {
		if q.name == property {
			p = q
			break
		}
	}
	switch {
	case p == nil:
		d.props = append(d.props, &prop{name: property, newest: sample{value, ns}})
	case p.newest.at == ns && p.newest.value == value:
		s.mu.Unlock()
		return
	case ns < p.newest.at:
		// Late: kept in the history only (the newest stays).
		s.pushLocked(p, sample{value, ns})
	default:
		s.pushLocked(p, p.newest)
		p.newest = sample{value, ns}
	}
	s.version++
	d.version = s.version
	d.taken = time.Now().UnixMicro()
	s.notifyLocked(key, false)
	s.mu.Unlock()
}

func (s *Store) pushLocked(p *prop, v sample) {
	if s.history == 0 {
		return
	}
	if len(p.ring) < s.history {
		p.ring = append(p.ring, v)
		return
	}
	p.ring[p.next] = v
	p.next = (p.next + 1) % s.history
}

// SetState takes a Device's state as its mapper reported it at at.
func (s *Store) SetState(key types.NamespacedName, node, state string, at time.Time) {
	ns := at.UnixNano()
	s.mu.Lock()
	d := s.deviceLocked(key, node)
	if d.state == state && d.stateAt == ns || ns < d.stateAt {
		s.mu.Unlock()
		return
	}
	d.state, d.stateAt = state, ns
	s.version++
	d.version = s.version
	d.taken = time.Now().UnixMicro()
	s.notifyLocked(key, false)
	s.mu.Unlock()
}

// Forget drops a Device (deleted).
func (s *Store) Forget(key types.NamespacedName) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if d := s.devices[key]; d != nil {
		s.unindexLocked(key, d.node)
		delete(s.devices, key)
		s.notifyLocked(key, false) // a watch tells it is gone
	}
}

// Touch tells the watchers that want them (WatchDevices') that a Device
// changed in the API (created, updated or deleted), whatever the store
// holds of it.
func (s *Store) Touch(key types.NamespacedName) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.notifyLocked(key, true)
}

// ForgetNode drops the Devices of node: another replica holds its session
// now (or it left), and serves them from what it takes.
func (s *Store) ForgetNode(node string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for key := range s.byNode[node] {
		delete(s.devices, key)
	}
	delete(s.byNode, node)
}

// Len is how many Devices the store holds.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.devices)
}

// Get copies what the store holds of key.
func (s *Store) Get(key types.NamespacedName) (Snapshot, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	d := s.devices[key]
	if d == nil {
		return Snapshot{}, false
	}
	return s.snapshotLocked(key, d), true
}

// List copies what the store holds of the Devices in namespace (every
// namespace when empty), held is asked of each Device's node: only the
// Devices of nodes it says true of are listed.
func (s *Store) List(namespace string, held func(node string) bool) []Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Snapshot
	for key, d := range s.devices {
		if namespace != "" && key.Namespace != namespace {
			continue
		}
		if held != nil && !held(d.node) {
			continue
		}
		out = append(out, s.snapshotLocked(key, d))
	}
	slices.SortFunc(out, func(a, b Snapshot) int {
		if a.Key.Namespace != b.Key.Namespace {
			if a.Key.Namespace < b.Key.Namespace {
				return -1
			}
			return 1
		}
		switch {
		case a.Key.Name < b.Key.Name:
			return -1
		case a.Key.Name > b.Key.Name:
			return 1
		}
		return 0
	})
	return out
}

func (s *Store) snapshotLocked(key types.NamespacedName, d *device) Snapshot {
	out := Snapshot{Key: key, Node: d.node, State: d.state, Version: d.version, Props: make([]PropSnapshot, 0, len(d.props))}
	if d.taken != 0 {
		out.Taken = time.UnixMicro(d.taken)
	}
	if d.stateAt != 0 {
		out.StateAt = time.Unix(0, d.stateAt)
	}
	for _, p := range d.props {
		ps := PropSnapshot{Name: p.name, Value: p.newest.value, At: time.Unix(0, p.newest.at)}
		if n := len(p.ring); n > 0 {
			ps.History = make([]Sample, 0, n)
			start := 0
			if n == s.history {
				start = p.next
			}
			for i := range n {
				v := p.ring[(start+i)%n]
				ps.History = append(ps.History, Sample{Value: v.value, At: time.Unix(0, v.at)})
			}
			// A late value may sit after a newer one: oldest first.
			slices.SortStableFunc(ps.History, func(a, b Sample) int { return a.At.Compare(b.At) })
		}
		out.Props = append(out.Props, ps)
	}
	slices.SortFunc(out.Props, func(a, b PropSnapshot) int {
		switch {
		case a.Name < b.Name:
			return -1
		case a.Name > b.Name:
			return 1
		}
		return 0
	})
	return out
}

// Watcher is told which Devices changed. Changes coalesce: a Device that
// changes again before the watcher reads it is reported once, so a slow
// watcher never holds the store up nor grows without bound.
type Watcher struct {
	s         *Store
	namespace string
	name      string
	// devices: told of Touch too.
	devices bool
	signal  chan struct{}

	mu      sync.Mutex
	pending map[types.NamespacedName]struct{}
}

// Watch starts a Watcher of the Devices in namespace (every namespace
// when empty) named name (any when empty). Stop ends it.
func (s *Store) Watch(namespace, name string) *Watcher { return s.watch(namespace, name, false) }

// WatchDevices is Watch, told of the Devices Touch names too.
func (s *Store) WatchDevices(namespace, name string) *Watcher { return s.watch(namespace, name, true) }

func (s *Store) watch(namespace, name string, devices bool) *Watcher {
	w := &Watcher{s: s, namespace: namespace, name: name, devices: devices, signal: make(chan struct{}, 1),
		pending: map[types.NamespacedName]struct{}{}}
	s.mu.Lock()
	s.watchers[w] = struct{}{}
	s.mu.Unlock()
	return w
}

// Stop ends w.
func (w *Watcher) Stop() {
	w.s.mu.Lock()
	delete(w.s.watchers, w)
	w.s.mu.Unlock()
}

// Changed is signalled when Take has something.
func (w *Watcher) Changed() <-chan struct{} { return w.signal }

// Take returns the Devices changed since the last Take.
func (w *Watcher) Take() []types.NamespacedName {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]types.NamespacedName, 0, len(w.pending))
	for k := range w.pending {
		out = append(out, k)
	}
	clear(w.pending)
	return out
}

func (s *Store) notifyLocked(key types.NamespacedName, touch bool) {
	for w := range s.watchers {
		if touch && !w.devices || w.namespace != "" && w.namespace != key.Namespace || w.name != "" && w.name != key.Name {
			continue
		}
		w.mu.Lock()
		w.pending[key] = struct{}{}
		w.mu.Unlock()
		select {
		case w.signal <- struct{}{}:
		default:
		}
	}
}

// Connected is cloudhub.SessionObserver's: nothing to do (the node's
// reports fill the store).
func (s *Store) Connected(context.Context, string) {}

// TakenOver is cloudhub.SessionObserver's: another replica serves the
// node's Devices now.
func (s *Store) TakenOver(node string) { s.ForgetNode(node) }

// Departed is cloudhub.SessionObserver's: the node left the cluster.
func (s *Store) Departed(node string) { s.ForgetNode(node) }
