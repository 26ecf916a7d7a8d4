// Command dowse-controller deploys brokers for discovered devices and
// removes dead nodes from Instances.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/dowse-dev/dowse/controller"
)

func main() {
	// The controller's live heap is small next to the garbage a burst of
	// broker creation makes: collecting at 50% growth keeps peak memory
	// down for little CPU, unless GOGC says otherwise.
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(50)
	}
	cfg := controller.Config{}
	// A FlagSet of our own: controller-runtime registers --kubeconfig on
	// flag.CommandLine in an init function.
	fs := flag.NewFlagSet("dowse-controller", flag.ExitOnError)
	fs.StringVar(&cfg.Kubeconfig, "kubeconfig", "", "path to a kubeconfig; empty means in-cluster")
	fs.BoolVar(&cfg.LeaderElection, "leader-elect", true, "let only one replica act at a time")
	fs.StringVar(&cfg.LeaderElectionNamespace, "leader-election-namespace", "dowse-system", "namespace of the leader election Lease")
	fs.DurationVar(&cfg.NodeGracePeriod, "node-grace-period", 5*time.Minute, "how long a node may be NotReady before it is removed from Instances")
	fs.StringVar(&cfg.MetricsAddr, "metrics-bind-address", ":9745", "Prometheus metrics address (0 disables)")
	fs.StringVar(&cfg.HealthAddr, "health-probe-bind-address", ":9746", "health probe address (0 disables)")
	fs.StringVar(&cfg.PprofAddr, "pprof-bind-address", "0", "Go profiling address (0 disables)")
	qps := fs.Float64("kube-api-qps", 200, "API client requests per second")
	fs.IntVar(&cfg.Burst, "kube-api-burst", 400, "API client burst")
	zapOpts := zap.Options{}
	zapOpts.BindFlags(fs)
	_ = fs.Parse(os.Args[1:])
	cfg.QPS = float32(*qps)

	// Request latency lets an operator tell a slow API server from a slow
	// controller.
	ctrlmetrics.RegisterRESTClientMetrics(ctrlmetrics.MetricRequestLatency)
	log := zap.New(zap.UseFlagOptions(&zapOpts))
	ctrl.SetLogger(log)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := controller.Run(ctx, cfg, log); err != nil {
		fmt.Fprintln(os.Stderr, "dowse-controller:", err)
		os.Exit(1)
	}
}
