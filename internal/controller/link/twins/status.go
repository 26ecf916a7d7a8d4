package twins

// Status, the writer of Device.status: its configuration, its workers and
// when each Device is written.

import (
	"context"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/internal/controller/link/cloudhub"
)

// Committer is what Status needs of a ManualCommit cloudhub.
type Committer interface {
	Commit(node string, pos cloudhub.Position)
}

// StatusConfig configures Status. Zero values take the defaults noted.
type StatusConfig struct {
	// Interval is the least time between two status writes of one Device
	// (1s). A report that changes a value is written as soon as it arrives
	// when no change was written within the last interval; changes within
	// the interval after one coalesce into one trailing write with the
	// newest value of every property. Someone waits for an urgent report
	// (a desired value's acknowledgement, a state or condition that
	// changed): it waits only a tenth of the interval after any write.
	Interval time.Duration
	// Budget is the most status writes a second this writer makes, all
	// Devices together (100; negative: no bound). The most urgent go
	// first (a desired value's acknowledgement, a state or condition
	// that changed; then changed values; then repeats), and within a
	// priority the Device that has waited longest: under overload every
	// Device with news is still written once every (Devices with news ÷
	// Budget) seconds, its status older the more Devices share the budget.
	Budget float64
	// Heartbeat is how often a Device whose reports only repeat what its
	// status holds (a mapper reporting every cycle, a state reported
	// again) is written to keep its timestamps fresh (3m; never more
	// often than Interval).
	Heartbeat time.Duration
	// Batch is how long a leading-edge write waits for the reports that
	// arrive with the first one (3ms): a mapper's report of several
	// properties comes as several messages.
	Batch time.Duration
	// Concurrency bounds parallel status writes (16).
	Concurrency int
	// Live reads Devices from the API server after a write conflict (the
	// cache may not have seen the write that won yet); nil: the client.
	Live client.Reader
	// OnFenced, when set, is called (after Release) when a write finds the
	// Device written by a newer session of the same node: this replica's
	// sessions of the node through epoch through are not the owner and
	// should be closed.
	OnFenced func(node string, through uint64)
	// Readings, when set, is told every reported value and state taken
	// (before its status write, whatever the budget): the live view of
	// package readings.
	Readings Readings
}

// Readings takes what nodes report as it arrives (package readings'
// Store). Its methods are called under the writer's lock: they must be
// quick and must not call back.
type Readings interface {
	Observe(key types.NamespacedName, node, property, value string, at time.Time)
	SetState(key types.NamespacedName, node, state string, at time.Time)
	Forget(key types.NamespacedName)
}

// Defaults of StatusConfig's zero values.
const (
	DefaultStatusBudget = 100
	DefaultHeartbeat    = 3 * time.Minute
)

// Status owns the reported part of Device.status: it takes what nodes
// report (Handle), keeps the newest value of each property, and writes a
// changed Device at once when it is quiet, at most once per interval when
// it is busy, and no more Devices a second than its budget.
//
// Every write is a read-modify-write of the freshly read Device with its
// resourceVersion (a conflict is read again from the API server and
// retried), and applies only the reports after the stored
// status.reportedPosition, written in the same update: a report resent
// after a controller restart, or by a node to another replica, is never
// applied twice, and status never goes back. A writer whose session of a
// node is older (Inbound.Epoch) than the one that wrote the Device is
// fenced: it writes nothing more for that node (StatusConfig.OnFenced).
//
// Acknowledgements follow writes: a node's messages are committed to the
// hub (Committer) only through the last one whose effect is in the API
// server, or is held by a newer message the node has not had committed
// (a reported value of the same property, a state, a condition of the
// same type: the node resends that one to whichever replica serves it
// next, and it carries everything the older one said); messages that
// change nothing (a Device gone, a report already written, kinds the
// writer ignores) count as durable at once. So an edge forgets a report
// only once it, or what replaced it, is in etcd, and the messages it
// keeps are about one a pending property, not one a report, however long
// a Device waits for its turn.
type Status struct {
	client  client.Client // writes status
	reader  client.Reader // the cache
	live    client.Reader
	hub     Committer
	cfg     StatusConfig
	metrics *Metrics
	log     logr.Logger
	now     func() time.Time
	kick    chan struct{} // wakes Start's dispatcher: something was queued

	mu       sync.Mutex
	queue    *writeQueue
	devices  map[types.NamespacedName]*twinState
	nodes    map[string]*nodeAcks
	released map[string]int64 // node → the epoch Release dropped
	arrival  uint64
}

// NewStatus makes a Status; hub may be nil (nothing to commit: tests).
func NewStatus(c client.Client, reader client.Reader, hub Committer, cfg StatusConfig, m *Metrics, log logr.Logger) *Status {
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.Budget == 0 {
		cfg.Budget = DefaultStatusBudget
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = DefaultHeartbeat
	}
	if cfg.Batch <= 0 {
		cfg.Batch = 3 * time.Millisecond
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 16
	}
	live := cfg.Live
	if live == nil {
		live = c
	}
	return &Status{client: c, reader: reader, live: live, hub: hub, cfg: cfg, metrics: m, log: log, now: time.Now,
		kick: make(chan struct{}, 1), queue: newWriteQueue(cfg.Budget),
		devices: map[types.NamespacedName]*twinState{}, nodes: map[string]*nodeAcks{}, released: map[string]int64{}}
}

// scheduleLocked queues key's write, if it has something to write: after
// the batch wait, and not before the interval after its last write (the
// last that carried news, when it carries news), nor, when it only
// repeats what its status holds, before the heartbeat interval after its
// status was last written; an urgent report (an acknowledgement, a state
// or condition that changed) a tenth of the interval after the last
// write; after a failure, not before its retry.
func (s *Status) scheduleLocked(key types.NamespacedName, st *twinState) {
	if st.writing || !st.hasItems() {
		return // the write in flight schedules what came meanwhile
	}
	now := s.now()
	due := now.Add(s.cfg.Batch)
	var next time.Time
	switch {
	case st.rush:
		// Someone waits for it: soon after the last write, whatever
		// the interval (at most ten a second a Device).
		next = st.lastWrite.Add(s.cfg.Interval / 10)
	case st.prio == prioRepeat:
		// Only this writer's own values repeated (twinPriority): it has
		// written the Device.
		next = st.lastWrite.Add(max(s.cfg.Heartbeat, s.cfg.Interval))
	case st.news:
		next = st.lastNewsWrite.Add(s.cfg.Interval)
	default:
		next = st.lastWrite.Add(s.cfg.Interval)
	}
	if next.After(due) {
		due = next
	}
	if st.retryAt.After(due) {
		due = st.retryAt
	}
	since := st.arrived
	if since.IsZero() {
		since = now
	}
	s.queue.add(key, st.prio, due, since)
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// NeedLeaderElection is false: every replica writes the status of the
// Devices of the nodes whose sessions it holds.
func (s *Status) NeedLeaderElection() bool { return false }

// Start writes changed Devices until ctx ends: at most Concurrency at
// once, at most Budget a second, the most urgent and then the longest
// waiting first.
func (s *Status) Start(ctx context.Context) error {
	slots := make(chan struct{}, s.cfg.Concurrency)
	var wg sync.WaitGroup
	defer wg.Wait()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		// A free worker first: the Device is taken when it can be
		// written at once, with what came until then.
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return nil
		}
		s.mu.Lock()
		key, _, ok, wait := s.queue.next(s.now())
		var b *batch
		var st *twinState
		if ok {
			st, b = s.takeLocked(key)
		}
		s.setPendingLocked()
		s.mu.Unlock()
		if b != nil {
			wg.Go(func() {
				defer func() { <-slots }()
				s.writeTaken(ctx, key, st, b)
			})
			continue
		}
		<-slots
		if ok {
			continue // forgotten or being written meanwhile
		}
		if wait <= 0 {
			wait = time.Hour
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return nil
		case <-s.kick:
		case <-timer.C:
		}
	}
}

func (s *Status) setPendingLocked() {
	for p, n := range s.queue.pending() {
		s.metrics.Pending.WithLabelValues(priority(p).String()).Set(float64(n))
	}
}

// Flush writes every changed Device now, whatever the interval and the
// budget, and returns when the writes are done (tests, and a stopping
// controller).
func (s *Status) Flush(ctx context.Context) {
	type taken struct {
		key types.NamespacedName
		st  *twinState
		b   *batch
	}
	s.mu.Lock()
	var all []taken
	for key, st := range s.devices {
		if st.dirty() && !st.writing {
			st, b := s.takeLocked(key)
			all = append(all, taken{key, st, b})
		}
	}
	s.mu.Unlock()
	sem := make(chan struct{}, s.cfg.Concurrency)
	var wg sync.WaitGroup
	for _, t := range all {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			s.writeTaken(ctx, t.key, t.st, t.b)
		})
	}
	wg.Wait()
}
