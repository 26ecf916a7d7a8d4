package deviceplugin

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dowse-dev/dowse/internal/agent/slots"
)

// Metrics counts what the device plugins do. A nil *Metrics records nothing.
type Metrics struct {
	plugins       prometheus.Gauge
	registrations prometheus.Counter
	allocations   *prometheus.CounterVec
	allocateTime  prometheus.Histogram
	cdiWrites     prometheus.Counter
	cdiRemovals   prometheus.Counter
	invalid       prometheus.Counter
	reclaimed     prometheus.Counter
}

// NewMetrics registers the device plugins' metrics with reg (none when nil).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		plugins:       prometheus.NewGauge(prometheus.GaugeOpts{Name: "dowse_agent_device_plugins", Help: "Device plugins this agent serves (one per Instance and one per Configuration on this node)."}),
		registrations: prometheus.NewCounter(prometheus.CounterOpts{Name: "dowse_agent_device_plugin_registrations_total", Help: "Successful registrations with the kubelet (again after each kubelet restart)."}),
		allocations:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dowse_agent_allocations_total", Help: "Allocate calls by result: ok, conflict (a slot taken by another node or resource; the kubelet retries), error."}, []string{"result"}),
		allocateTime: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "dowse_agent_allocate_duration_seconds", Help: "Allocate latency, slot claim on the API server included.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14)}),
		cdiWrites:   prometheus.NewCounter(prometheus.CounterOpts{Name: "dowse_agent_cdi_spec_writes_total", Help: "CDI specs written."}),
		cdiRemovals: prometheus.NewCounter(prometheus.CounterOpts{Name: "dowse_agent_cdi_spec_removals_total", Help: "CDI specs removed."}),
		invalid:     prometheus.NewCounter(prometheus.CounterOpts{Name: "dowse_agent_invalid_devices_total", Help: "Devices not offered because their CDI spec was invalid (missing device node, relative mount path)."}),
		reclaimed:   prometheus.NewCounter(prometheus.CounterOpts{Name: "dowse_agent_slots_reclaimed_total", Help: "Slots freed because no running pod used them."}),
	}
	// Every result from the start, so that a dashboard's rate is 0, not
	// absent, before the first Allocate.
	for _, r := range []string{"ok", "conflict", "error"} {
		m.allocations.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.plugins, m.registrations, m.allocations, m.allocateTime, m.cdiWrites, m.cdiRemovals, m.invalid, m.reclaimed)
	}
	return m
}

func (m *Metrics) allocated(began time.Time, err error) {
	if m == nil {
		return
	}
	m.allocateTime.Observe(time.Since(began).Seconds())
	result := "ok"
	switch {
	case err == nil:
	case errors.Is(err, slots.ErrSlotTaken):
		result = "conflict"
	default:
		result = "error"
	}
	m.allocations.WithLabelValues(result).Inc()
}

// pluginsRunning moves the plugin gauge by delta (+1 started, -n stopped).
func (m *Metrics) pluginsRunning(delta int) {
	if m != nil {
		m.plugins.Add(float64(delta))
	}
}

func (m *Metrics) registered() {
	if m != nil {
		m.registrations.Inc()
	}
}

func (m *Metrics) cdiWritten() {
	if m != nil {
		m.cdiWrites.Inc()
	}
}

func (m *Metrics) cdiRemoved() {
	if m != nil {
		m.cdiRemovals.Inc()
	}
}

func (m *Metrics) invalidDevice() {
	if m != nil {
		m.invalid.Inc()
	}
}

func (m *Metrics) slotsReclaimed(n int) {
	if m != nil {
		m.reclaimed.Add(float64(n))
	}
}
