// Package optional keeps an optional part's failures in its own room: a
// Part runs its function again, with backoff, whenever it fails, logs and
// counts each failure, and never returns an error to the manager that runs
// it, so that (for example) a cloud/edge link that cannot listen or store
// never stops discovery or brokers. Its Check fails while the part is
// failing, for a readiness check.
//
// It has no controller-runtime in its imports: a Part is a manager Runnable
// by its Start method alone.
package optional

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dowse-dev/dowse/internal/backoff"
)

// Part is one optional, long-running piece of a binary.
type Part struct {
	// Name names the part in logs, in the failures metric and in Check's
	// error.
	Name string
	// Run runs the part until ctx ends (returning nil then) or it fails.
	// It is called again after a failure, so it must start from scratch
	// each time (open, serve, close).
	Run func(ctx context.Context) error
	// Log receives each failure; a discarding logger when zero.
	Log logr.Logger
	// Failures counts them, labelled by part (nil: not counted). See
	// NewFailures.
	Failures *prometheus.CounterVec
	// Backoff spaces the attempts (1 s doubling to 1 min, jittered, when
	// zero); a run that lasted longer than its Max starts the next one
	// from Initial again.
	Backoff backoff.Backoff
	// LeaderOnly runs the part on the elected leader only, when the
	// manager elects one.
	LeaderOnly bool

	mu      sync.Mutex
	lastErr error
}

// NewFailures makes and registers (when reg is not nil) the counter of
// part failures of one binary, <namespace>_part_failures_total{part}.
func NewFailures(reg prometheus.Registerer, namespace string) *prometheus.CounterVec {
	v := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Name: "part_failures_total",
		Help: "Failures of optional parts (each one retried), by part.",
	}, []string{"part"})
	if reg != nil {
		reg.MustRegister(v)
	}
	return v
}

// Start runs the part until ctx ends, retrying each failure. It always
// returns nil.
func (p *Part) Start(ctx context.Context) error {
	b := p.Backoff
	if b.Initial <= 0 {
		b = backoff.Backoff{Initial: time.Second, Max: time.Minute, Jitter: 0.5}
	}
	log := p.Log
	if log.GetSink() == nil {
		log = logr.Discard()
	}
	for {
		began := time.Now()
		err := p.Run(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err == nil {
			err = fmt.Errorf("%s stopped", p.Name)
		}
		if time.Since(began) > b.Max {
			b.Reset()
		}
		d := b.Next()
		p.mu.Lock()
		p.lastErr = err
		p.mu.Unlock()
		if p.Failures != nil {
			p.Failures.WithLabelValues(p.Name).Inc()
		}
		log.Error(err, "part failed; retrying", "part", p.Name, "after", d)
		if !backoff.Sleep(ctx, d) {
			return nil
		}
		p.mu.Lock()
		p.lastErr = nil // running again: Check passes until it fails again
		p.mu.Unlock()
	}
}

// Check is nil unless the part's last run failed and it waits to retry:
// for a readiness check (healthz.Checker's signature).
func (p *Part) Check(*http.Request) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.lastErr != nil {
		return fmt.Errorf("%s: %w", p.Name, p.lastErr)
	}
	return nil
}

// NeedLeaderElection is LeaderOnly (the manager's Runnable contract).
func (p *Part) NeedLeaderElection() bool { return p.LeaderOnly }

// Reregistering wraps reg for a Part's Run, which registers its metrics
// anew each time it is run: a collector an earlier run registered is
// replaced by the new one (its counts start again from zero, which
// Prometheus reads as a counter reset) instead of panicking MustRegister.
func Reregistering(reg prometheus.Registerer) prometheus.Registerer {
	if reg == nil {
		return nil
	}
	return reregisterer{reg}
}

type reregisterer struct{ prometheus.Registerer }

func (r reregisterer) Register(c prometheus.Collector) error {
	err := r.Registerer.Register(c)
	var dup prometheus.AlreadyRegisteredError
	if errors.As(err, &dup) {
		r.Registerer.Unregister(dup.ExistingCollector)
		return r.Registerer.Register(c)
	}
	return err
}

func (r reregisterer) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

// CacheSynced is a readiness check: nil once every informer of an informer
// cache (a controller-runtime cache.Cache) has synced.
func CacheSynced(c interface {
	WaitForCacheSync(ctx context.Context) bool
}) func(*http.Request) error {
	return func(r *http.Request) error {
		ctx, cancel := context.WithTimeout(r.Context(), 200*time.Millisecond)
		defer cancel()
		if !c.WaitForCacheSync(ctx) {
			return errors.New("informer cache not synced")
		}
		return nil
	}
}
