// Command dowse-controller deploys brokers for discovered devices and
// removes dead nodes from Instances. Its subcommands apply-crds and
// uninstall are the Helm chart's hooks (controller/lifecycle).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/dowse-dev/dowse/controller"
	"github.com/dowse-dev/dowse/controller/lifecycle"
	"github.com/dowse-dev/dowse/controller/linkauth"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/shared/version"
)

func main() {
	if len(os.Args) > 1 {
		if _, ok := lifecycle.Commands[os.Args[1]]; ok {
			log := zap.New()
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			if err := lifecycle.Command(ctx, os.Args[1], os.Args[2:], log.WithName(os.Args[1])); err != nil {
				fmt.Fprintf(os.Stderr, "dowse-controller %s: %v\n", os.Args[1], err)
				os.Exit(1)
			}
			return
		}
	}
	// The controller's live heap is small next to the garbage a burst of
	// broker creation makes: collecting at 35% growth held peak memory at
	// 10,000 Instances and Pods to 89-91 MiB (50%: 91-98 MiB) for 5% more
	// CPU, unless GOGC says otherwise.
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(35)
	}
	cfg := controller.Config{}
	// A FlagSet of our own: controller-runtime registers --kubeconfig on
	// flag.CommandLine in an init function.
	fs := flag.NewFlagSet("dowse-controller", flag.ExitOnError)
	fs.StringVar(&cfg.Kubeconfig, "kubeconfig", "", "path to a kubeconfig; empty means in-cluster")
	fs.BoolVar(&cfg.LeaderElection, "leader-elect", true, "let only one replica act at a time")
	fs.StringVar(&cfg.LeaderElectionNamespace, "leader-election-namespace", "dowse-system", "namespace of the leader election Lease")
	fs.DurationVar(&cfg.NodeGracePeriod, "node-grace-period", 5*time.Minute, "how long a node may be NotReady before it is removed from Instances, and an agent gone (see --agent-pod-selector) before its Configuration finalizers are dropped")
	fs.StringVar(&cfg.AgentPodSelector, "agent-pod-selector", "", "label selector of the agent DaemonSet's Pods in --namespace: the finalizers of an agent with no Pod on its node are dropped after --node-grace-period; empty: off")
	fs.StringVar(&cfg.MetricsAddr, "metrics-bind-address", ":9745", "Prometheus metrics address (0 disables)")
	fs.StringVar(&cfg.HealthAddr, "health-probe-bind-address", ":9746", "health probe address (0 disables)")
	fs.BoolVar(&cfg.DRA, "dra", true, "publish DeviceClasses and shared devices' ResourceSlices for Configurations with spec.allocation DRA or Both (needs resource.k8s.io/v1, Kubernetes 1.34+)")
	fs.StringVar(&cfg.PprofAddr, "pprof-bind-address", "0", "Go profiling address (0 disables)")
	qps := fs.Float64("kube-api-qps", 200, "API client requests per second")
	fs.IntVar(&cfg.Burst, "kube-api-burst", 400, "API client burst")
	fs.StringVar(&cfg.Namespace, "namespace", envOr("POD_NAMESPACE", "dowse-system"), "the controller's namespace, where the link CA and bootstrap tokens live (env POD_NAMESPACE)")
	linkHosts := fs.String("link-hosts", "", "comma-separated names and addresses edges dial to reach this controller; empty: no cloud/edge link")
	fs.StringVar(&cfg.Link.WebSocketAddr, "link-websocket-address", ":7443", "cloudhub WebSocket address (TCP; empty disables)")
	fs.StringVar(&cfg.Link.QUICAddr, "link-quic-address", ":7443", "cloudhub QUIC address (UDP; empty disables)")
	fs.StringVar(&cfg.Link.AuthAddr, "link-auth-bind-address", ":9747", "the edges' bootstrap and certificate renewal endpoint")
	fs.DurationVar(&cfg.Link.CertValidity, "link-cert-validity", 24*time.Hour, "lifetime of node certificates (renewed at about two thirds)")
	fs.DurationVar(&cfg.Link.CAValidity, "link-ca-validity", 10*365*24*time.Hour, "lifetime of the link CA, when the controller creates it")
	fs.DurationVar(&cfg.Link.Heartbeat, "link-heartbeat", 10*time.Second, "link heartbeat interval; a silent edge is dropped after two")
	fs.IntVar(&cfg.Link.MaxMessageSize, "link-max-message-size", 1<<20, "largest link message accepted, in bytes")
	fs.IntVar(&cfg.Link.QueueSize, "link-queue-size", 16384, "most unacknowledged messages queued for one node (a node is sent each of its Devices when it connects)")
	fs.StringVar(&cfg.PodName, "pod-name", os.Getenv("POD_NAME"), "this replica's Pod (env POD_NAME): its identity as the holder of the edges' sessions it serves (outside a Pod, the host name and a random suffix)")
	fs.DurationVar(&cfg.Link.SpreadInterval, "link-spread-interval", 2*time.Second, "how often this replica publishes how many edges it serves and, when it holds more than its share, moves some to the other replicas")
	fs.DurationVar(&cfg.Link.DrainPeriod, "link-drain-period", 5*time.Second, "when stopping, how long this replica spends moving its edges to the other replicas, spread over that time, before it closes what is left (0: none, the edges find out when their connections close)")
	fs.StringVar(&cfg.MapperStateDir, "mapper-state-dir", "/var/lib/dowse", "the agents' state directory on the nodes (their --state-dir), mounted into the mapper Pods the controller runs")
	fs.DurationVar(&cfg.Link.TwinStatusInterval, "twin-status-interval", time.Second, "least time between two status writes of one Device, however fast its mappers report")
	fs.IntVar(&cfg.Link.TwinStatusConcurrency, "twin-status-concurrency", 16, "parallel Device status writes")
	fs.Float64Var(&cfg.Link.RateLimit, "link-rate-limit", 2000, "messages per second accepted from one node (each reported value is one; the edge coalesces what waits)")
	fs.IntVar(&cfg.Link.RateBurst, "link-rate-burst", 4000, "burst of messages accepted from one node")
	fs.IntVar(&cfg.Link.MaxConnections, "link-max-connections", 20000, "most edge connections served at once")
	propertyAgents := fs.String("agent-service-accounts", "dowse-agent", "comma-separated service accounts of the agents (name in --namespace, or namespace/name), granted read of exactly the Secrets and ConfigMaps that Configurations' discoveryProperties name (a Role and RoleBinding "+v1alpha1.PropertyAccessRole+" in each namespace holding some); empty: the controller grants nothing")
	agentSAs := fs.String("link-agent-service-accounts", "dowse-agent", "comma-separated service accounts (name in --namespace, or namespace/name) whose pod-bound tokens (audience dowse-link) may bootstrap their pod's node; empty: bootstrap tokens only")
	fs.Float64Var(&cfg.Link.AuthRateLimit, "link-auth-rate-limit", linkauth.DefaultRequestRate, "bootstrap and renewal requests per second, all edges together (more are answered 429 and retried)")
	fs.IntVar(&cfg.Link.AuthRateBurst, "link-auth-rate-burst", linkauth.DefaultRequestBurst, "burst of bootstrap and renewal requests")
	zapOpts := zap.Options{}
	zapOpts.BindFlags(fs)
	showVersion := version.Flag(fs, "dowse-controller")
	_ = fs.Parse(os.Args[1:])
	if showVersion.Print(os.Stdout) {
		return
	}
	cfg.QPS = float32(*qps)
	if cfg.Link.DrainPeriod == 0 {
		cfg.Link.DrainPeriod = -1 // the library's zero is its default
	}
	if *propertyAgents != "" {
		cfg.AgentServiceAccounts = strings.Split(*propertyAgents, ",")
	}
	if *linkHosts != "" {
		cfg.Link.Hosts = strings.Split(*linkHosts, ",")
	}
	for _, sa := range strings.Split(*agentSAs, ",") {
		if sa = strings.TrimSpace(sa); sa != "" && !strings.Contains(sa, "/") {
			sa = cfg.Namespace + "/" + sa
		}
		if sa != "" {
			cfg.Link.AgentServiceAccounts = append(cfg.Link.AgentServiceAccounts, sa)
		}
	}

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

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
