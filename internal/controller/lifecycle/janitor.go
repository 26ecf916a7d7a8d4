package lifecycle

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// AgentJanitor drops a Configuration finalizer of an agent that has not run
// for GracePeriod: an agent DaemonSet deleted before the Configurations
// (helm uninstall --no-hooks, a failed pre-delete hook, the agents taken off
// some nodes) would otherwise leave them Terminating for ever, with their
// Instances and brokers. The controller's node cleanup handles agents whose
// Node went; this handles agents that went from a Node that stays. A
// leader-only manager Runnable.
type AgentJanitor struct {
	Client client.Client
	Agents Agents
	// GracePeriod is how long an agent may be gone (a rolling update, a
	// crash loop) before its finalizers are dropped.
	GracePeriod time.Duration
	// Interval is how often the agents are counted; GracePeriod/4 (at
	// least 5s, at most 1m) when zero.
	Interval time.Duration
	Log      logr.Logger
	now      func() time.Time

	mu        sync.Mutex
	goneSince map[string]time.Time // by finalizer
}

// Start looks until ctx ends.
func (j *AgentJanitor) Start(ctx context.Context) error {
	if j.Interval <= 0 {
		j.Interval = min(max(j.GracePeriod/4, 5*time.Second), time.Minute)
	}
	if j.now == nil {
		j.now = time.Now
	}
	j.goneSince = map[string]time.Time{}
	t := time.NewTicker(j.Interval)
	defer t.Stop()
	for {
		if err := j.once(ctx); err != nil && ctx.Err() == nil {
			j.Log.Info("counting agents failed; trying again", "err", err, "after", j.Interval.String())
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// NeedLeaderElection: one replica drops finalizers.
func (j *AgentJanitor) NeedLeaderElection() bool { return true }

func (j *AgentJanitor) once(ctx context.Context) error {
	var cfgs v1alpha1.ConfigurationList
	if err := j.Client.List(ctx, &cfgs); err != nil {
		return err
	}
	held := map[string]bool{}
	for _, c := range cfgs.Items {
		for _, f := range c.Finalizers {
			if strings.HasPrefix(f, AgentFinalizerPrefix) {
				held[f] = true
			}
		}
	}
	if len(held) == 0 {
		j.mu.Lock()
		clear(j.goneSince)
		j.mu.Unlock()
		return nil
	}
	live, err := j.Agents.finalizers(ctx)
	if err != nil {
		return err
	}
	now := j.now()
	due := map[string]bool{}
	j.mu.Lock()
	for f := range j.goneSince {
		if !held[f] || live[f] {
			delete(j.goneSince, f)
		}
	}
	for f := range held {
		if live[f] {
			continue
		}
		since, ok := j.goneSince[f]
		if !ok {
			j.goneSince[f] = now
			continue
		}
		if now.Sub(since) >= j.GracePeriod {
			due[f] = true
		}
	}
	j.mu.Unlock()
	if len(due) == 0 {
		return nil
	}
	n, err := dropGone(ctx, j.Client, func(f string) bool { return due[f] })
	if n > 0 {
		j.Log.Info("dropped Configuration finalizers of agents gone for the grace period", "finalizers", n, "grace", j.GracePeriod.String())
	}
	return err
}
