package twins

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the twins' Prometheus metrics (NewMetrics(nil) for unregistered ones).
type Metrics struct {
	Reports        *prometheus.CounterVec
	Dropped        *prometheus.CounterVec
	Coalesced      prometheus.Counter
	Trimmed        prometheus.Counter
	Writes         *prometheus.CounterVec
	WriteSeconds   prometheus.Histogram
	ReportToStatus prometheus.Histogram
	// ReportTransit and StatusWait split ReportToStatus: the edge's part
	// (read time to the writer's hands: mapper, agent, edge store, link)
	// and the writer's wait (a report's arrival to its write's start:
	// the batch window, the coalescing interval, a busy queue).
	ReportTransit prometheus.Histogram
	StatusWait    prometheus.Histogram
	// PriorityWrites, StatusAge and Pending show the budget at work:
	// writes by the priority of what they carried, how far behind its
	// edge a Device's status was when written, and the Devices waiting.
	PriorityWrites *prometheus.CounterVec
	StatusAge      *prometheus.HistogramVec
	Pending        *prometheus.GaugeVec
	// UrgentWait is the writer's part of an acknowledgement's way: from
	// the arrival of the oldest unwritten urgent report of a Device (a
	// desired value's acknowledgement, a state or condition that changed)
	// to the end of the write that holds it.
	UrgentWait prometheus.Histogram
	Sent       *prometheus.CounterVec
}

// NewMetrics registers the metrics with reg (nil: unregistered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Reports: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "dowse", Subsystem: "twins", Name: "reports_total",
			Help: "Reports taken from nodes, by kind (reported, state)."}, []string{"kind"}),
		Dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "dowse", Subsystem: "twins", Name: "dropped_reports_total",
			Help: "Reports not applied, by reason (device-gone, model-gone, already-written, already-taken (a resend of one waiting to be written), fenced, released; and, for reports the node's agent should have refused, unknown-property, bad-value, too-large)."}, []string{"reason"}),
		Trimmed: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "dowse", Subsystem: "twins", Name: "trimmed_reports_total",
			Help: "Reports applied with metadata entries dropped past their bounds or a time ahead of the cloud's clock clamped."}),
		Coalesced: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "dowse", Subsystem: "twins", Name: "coalesced_reports_total",
			Help: "Reported values replaced by a newer one of the same property before they were written."}),
		Writes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "dowse", Subsystem: "twins", Name: "status_writes_total",
			Help: "Device status writes, by result."}, []string{"result"}),
		WriteSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "dowse", Subsystem: "twins", Name: "status_write_duration_seconds",
			Help: "Duration of one Device status write.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 14)}),
		ReportToStatus: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "dowse", Subsystem: "twins", Name: "report_to_status_seconds",
			Help: "From a device's oldest unwritten report (its read time) to its status write.", Buckets: prometheus.ExponentialBuckets(0.01, 2, 12)}),
		ReportTransit: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "dowse", Subsystem: "twins", Name: "report_transit_seconds",
			Help: "From a report's read time on the edge to its arrival at the status writer.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 14)}),
		StatusWait: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "dowse", Subsystem: "twins", Name: "status_wait_seconds",
			Help: "From a device's oldest unwritten report's arrival at the status writer to the start of the write that takes it.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 14)}),
		PriorityWrites: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "dowse", Subsystem: "twins", Name: "status_priority_writes_total",
			Help: "Device status writes made, by the priority of what they carried: urgent (a desired value's acknowledgement, a state or condition that changed), change (a changed value), repeat (timestamps refreshed on the heartbeat interval)."}, []string{"priority"}),
		StatusAge: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "dowse", Subsystem: "twins", Name: "status_age_seconds",
			Help: "How far behind its node a Device's status was when a write brought it up to date: from the arrival of the oldest report it did not show to the write, by the write's priority.", Buckets: prometheus.ExponentialBuckets(0.01, 2, 18)}, []string{"priority"}),
		UrgentWait: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "dowse", Subsystem: "twins", Name: "status_urgent_wait_seconds",
			Help: "From the arrival at the status writer of a Device's oldest unwritten urgent report (a desired value's acknowledgement, a state or condition that changed) to the end of the write that holds it.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 18)}),
		Pending: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "dowse", Subsystem: "twins", Name: "status_pending_devices",
			Help: "Devices waiting for a status write, by priority."}, []string{"priority"}),
		Sent: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "dowse", Subsystem: "twins", Name: "sent_total",
			Help: "Messages sent to nodes, by kind (device, device-removal, model, model-removal, inventory)."}, []string{"kind"}),
	}
	if reg != nil {
		reg.MustRegister(m.Reports, m.Dropped, m.Coalesced, m.Trimmed, m.Writes, m.WriteSeconds, m.ReportToStatus, m.ReportTransit, m.StatusWait, m.PriorityWrites, m.StatusAge, m.Pending, m.UrgentWait, m.Sent)
	}
	return m
}

func (m *Metrics) dropped(reason string) { m.Dropped.WithLabelValues(reason).Inc() }
