package discovery

import (
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// EventRecorder records Events (client-go's events.EventRecorder, which
// internal/events implements).
type EventRecorder interface {
	Eventf(regarding, related runtime.Object, eventtype, reason, action, note string, args ...any)
}

// Device states of the devices gauge.
const (
	// StateDiscovered: in an Instance this node holds.
	StateDiscovered = "discovered"
	// StateDropped: sent by the handler, not taken (over the agent's cap,
	// or its Instance name is another device's).
	StateDropped = "dropped"
	// StateSkipped: a candidate the handler looked at and skipped.
	StateSkipped = "skipped"
)

// Metrics are the discovery gauges: how many devices each Configuration has
// on this node by state, and the skipped candidates by reason.
type Metrics struct {
	devices *prometheus.GaugeVec
	skipped *prometheus.GaugeVec
}

// NewMetrics registers the gauges with reg (nil: not registered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		devices: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "dowse_agent_devices",
			Help: "Devices of a Configuration on this node, by state: discovered (in an Instance), dropped (sent by the handler, not taken), skipped (candidates the handler skipped)."},
			[]string{"namespace", "configuration", "node", "state"}),
		skipped: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "dowse_agent_skipped_candidates",
			Help: "Candidates a Configuration's handler skipped on this node in its latest look, by reason."},
			[]string{"namespace", "configuration", "node", "reason"}),
	}
	if reg != nil {
		reg.MustRegister(m.devices, m.skipped)
	}
	return m
}

func (m *Metrics) observe(cfg types.NamespacedName, node string, st sessionState) {
	if m == nil {
		return
	}
	skipped := 0
	m.skipped.DeletePartialMatch(prometheus.Labels{"namespace": cfg.Namespace, "configuration": cfg.Name})
	for _, r := range st.skipped {
		skipped += int(r.Count)
		m.skipped.WithLabelValues(cfg.Namespace, cfg.Name, node, r.Reason).Set(float64(r.Count))
	}
	m.devices.WithLabelValues(cfg.Namespace, cfg.Name, node, StateDiscovered).Set(float64(st.devices))
	m.devices.WithLabelValues(cfg.Namespace, cfg.Name, node, StateDropped).Set(float64(max(st.dropped, 0)))
	m.devices.WithLabelValues(cfg.Namespace, cfg.Name, node, StateSkipped).Set(float64(skipped))
}

func (m *Metrics) forget(cfg types.NamespacedName) {
	if m == nil {
		return
	}
	l := prometheus.Labels{"namespace": cfg.Namespace, "configuration": cfg.Name}
	m.devices.DeletePartialMatch(l)
	m.skipped.DeletePartialMatch(l)
}

// skipEvents emits an Event when a Configuration's skipped candidates on
// this node gain a reason, at most once per reason and Configuration per
// interval, and at most burst at once over all (a network full of cameras
// with the wrong password is one Event, not one per camera or per look).
type skipEvents struct {
	recorder EventRecorder
	node     string
	interval time.Duration
	limit    *rate.Limiter
	now      func() time.Time

	mu   sync.Mutex
	last map[skipKey]time.Time
}

type skipKey struct {
	uid    types.UID
	reason string
}

func newSkipEvents(rec EventRecorder, node string) *skipEvents {
	if rec == nil {
		return nil
	}
	return &skipEvents{recorder: rec, node: node, interval: 10 * time.Minute, limit: rate.NewLimiter(rate.Every(time.Second), 20),
		now: time.Now, last: map[skipKey]time.Time{}}
}

// changed emits Events for the reasons in now that were not in before.
func (e *skipEvents) changed(cfg *v1alpha1.Configuration, before, now []v1alpha1.SkippedReason) {
	if e == nil {
		return
	}
	had := map[string]bool{}
	for _, r := range before {
		had[r.Reason] = true
	}
	for _, r := range now {
		if had[r.Reason] || !e.allow(cfg.UID, r.Reason) {
			continue
		}
		var ex []string
		for _, c := range r.Candidates {
			ex = append(ex, c.Candidate+": "+c.Message)
		}
		e.recorder.Eventf(cfg, nil, corev1.EventTypeWarning, r.Reason, "Discover",
			"node %s: %s skipped by handler %s: %s", e.node, plural(r.Count, "candidate"), cfg.Spec.DiscoveryHandler.Name, strings.Join(ex, "; "))
	}
}

func (e *skipEvents) allow(uid types.UID, reason string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.now()
	k := skipKey{uid, reason}
	if t, ok := e.last[k]; ok && now.Sub(t) < e.interval {
		return false
	}
	if !e.limit.AllowN(now, 1) {
		return false
	}
	if len(e.last) > 4096 {
		for k, t := range e.last {
			if now.Sub(t) >= e.interval {
				delete(e.last, k)
			}
		}
	}
	e.last[k] = now
	return true
}

func plural(n int32, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}
