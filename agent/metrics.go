package agent

import (
	"github.com/prometheus/client_golang/prometheus"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// ctrlMetricsRegistry is the registry controller-runtime serves on the
// metrics address, beside the client and workqueue metrics it records.
func ctrlMetricsRegistry() prometheus.Registerer { return ctrlmetrics.Registry }
