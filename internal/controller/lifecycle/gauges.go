package lifecycle

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// TwinGauge is a Prometheus collector of the Devices (twins) by namespace
// and state, counted from the controller's cache at each scrape: nothing
// to keep in step, and no request to the API server.
type TwinGauge struct {
	Reader client.Reader
	desc   *prometheus.Desc
}

// NewTwinGauge returns the collector of dowse_controller_twins.
func NewTwinGauge(r client.Reader) *TwinGauge {
	return &TwinGauge{Reader: r, desc: prometheus.NewDesc("dowse_controller_twins",
		"Devices (twins) by namespace and the state their mapper last reported (unknown before any report).",
		[]string{"namespace", "state"}, nil)}
}

// Describe implements prometheus.Collector.
func (g *TwinGauge) Describe(ch chan<- *prometheus.Desc) { ch <- g.desc }

// Collect implements prometheus.Collector. Before the cache has synced it
// reports nothing.
func (g *TwinGauge) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var list v1alpha1.DeviceList
	if err := g.Reader.List(ctx, &list); err != nil {
		return
	}
	type key struct{ ns, state string }
	counts := map[key]int{}
	for i := range list.Items {
		st := list.Items[i].Status.State
		if st == "" {
			st = v1alpha1.DeviceStateUnknown
		}
		counts[key{list.Items[i].Namespace, st}]++
	}
	for k, n := range counts {
		ch <- prometheus.MustNewConstMetric(g.desc, prometheus.GaugeValue, float64(n), k.ns, k.state)
	}
}
