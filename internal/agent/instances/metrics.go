package instances

import "github.com/prometheus/client_golang/prometheus"

// Metrics counts the writer's work.
type Metrics struct {
	applied, released, deleted, collisions prometheus.Counter
}

// NewMetrics registers the writer's counters with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		applied:    prometheus.NewCounter(prometheus.CounterOpts{Name: "dowse_agent_instances_applied_total", Help: "Instance applies (spec or this node's status) made by this agent."}),
		released:   prometheus.NewCounter(prometheus.CounterOpts{Name: "dowse_agent_instances_released_total", Help: "Instances this node stopped seeing."}),
		deleted:    prometheus.NewCounter(prometheus.CounterOpts{Name: "dowse_agent_instances_deleted_total", Help: "Instances deleted because no node sees them."}),
		collisions: prometheus.NewCounter(prometheus.CounterOpts{Name: "dowse_agent_instance_name_collisions_total", Help: "Devices skipped because their Instance name belongs to another device."}),
	}
	if reg != nil {
		reg.MustRegister(m.applied, m.released, m.deleted, m.collisions)
	}
	return m
}

func (m *Metrics) observe(r SyncResult) {
	if m == nil {
		return
	}
	m.applied.Add(float64(r.Applied))
	m.released.Add(float64(r.Released))
	m.deleted.Add(float64(r.Deleted))
	m.collisions.Add(float64(len(r.Collisions)))
}
