package twins

// Status, the writer of Device.status: its configuration, its workers and
// when each Device is written.

import (
	"context"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
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
	// newest value of every property. A report that repeats the value the
	// status holds (a heartbeat) waits for the interval after any write,
	// and does not hold back a change that follows it.
	Interval time.Duration
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
}

// Status owns the reported part of Device.status: it takes what nodes
// report (Handle), keeps the newest value of each property, and writes a
// changed Device at once when it is quiet, at most once per interval when
// it is busy.
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
// server; messages that change nothing (a Device gone, a report already
// written, kinds the writer ignores) count as durable at once. So an edge
// forgets a report only once it is in etcd.
type Status struct {
	client  client.Client // writes status
	reader  client.Reader // the cache
	live    client.Reader
	hub     Committer
	cfg     StatusConfig
	metrics *Metrics
	log     logr.Logger
	queue   workqueue.TypedRateLimitingInterface[types.NamespacedName]

	mu       sync.Mutex
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
	return &Status{client: c, reader: reader, live: live, hub: hub, cfg: cfg, metrics: m, log: log,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[types.NamespacedName](100*time.Millisecond, 30*time.Second),
			workqueue.TypedRateLimitingQueueConfig[types.NamespacedName]{Name: "twin-status"}),
		devices: map[types.NamespacedName]*twinState{}, nodes: map[string]*nodeAcks{}, released: map[string]int64{}}
}

// scheduleLocked queues key's write: at once (after the batch wait) when
// the Device was not written within the interval, else at the end of it.
func (s *Status) scheduleLocked(key types.NamespacedName, st *twinState) {
	if st.writing {
		return // the write in flight schedules what came meanwhile
	}
	now := time.Now()
	due := now.Add(s.cfg.Batch)
	last := st.lastWrite
	if st.news {
		last = st.lastNewsWrite
	}
	if next := last.Add(s.cfg.Interval); next.After(due) {
		due = next
	}
	s.queue.AddAfter(key, due.Sub(now))
}

// NeedLeaderElection is false: every replica writes the status of the
// Devices of the nodes whose sessions it holds.
func (s *Status) NeedLeaderElection() bool { return false }

// Start writes changed Devices until ctx ends, with Concurrency workers.
func (s *Status) Start(ctx context.Context) error {
	var wg sync.WaitGroup
	for range s.cfg.Concurrency {
		wg.Go(func() {
			for {
				key, shutdown := s.queue.Get()
				if shutdown {
					return
				}
				if err := s.writeOne(ctx, key); err != nil && ctx.Err() == nil {
					s.queue.AddRateLimited(key)
				} else {
					s.queue.Forget(key)
				}
				s.queue.Done(key)
			}
		})
	}
	<-ctx.Done()
	s.queue.ShutDown()
	wg.Wait()
	return nil
}

// Flush writes every changed Device now, whatever the interval, and
// returns when the writes are done (tests, and a stopping controller).
func (s *Status) Flush(ctx context.Context) {
	s.mu.Lock()
	var keys []types.NamespacedName
	for key, st := range s.devices {
		if st.dirty() && !st.writing {
			keys = append(keys, key)
		}
	}
	s.mu.Unlock()
	sem := make(chan struct{}, s.cfg.Concurrency)
	var wg sync.WaitGroup
	for _, key := range keys {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			_ = s.writeOne(ctx, key)
		})
	}
	wg.Wait()
}
