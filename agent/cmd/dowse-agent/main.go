// Command dowse-agent is Dowse's per-node agent.
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

	"github.com/dowse-dev/dowse/agent"
	"github.com/dowse-dev/dowse/agent/dra"
	"github.com/dowse-dev/dowse/shared/version"
)

func main() {
	// An edge node's memory is scarcer than the agent's CPU: collect at 30%
	// heap growth instead of Go's 100%, unless GOGC says otherwise.
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(30)
	}
	cfg := agent.Config{}
	// A FlagSet of our own: controller-runtime registers --kubeconfig on
	// flag.CommandLine in an init function.
	fs := flag.NewFlagSet("dowse-agent", flag.ExitOnError)
	fs.StringVar(&cfg.Kubeconfig, "kubeconfig", "", "path to a kubeconfig; empty means in-cluster")
	fs.StringVar(&cfg.NodeName, "node-name", os.Getenv("NODE_NAME"), "this node's name (env NODE_NAME)")
	fs.StringVar(&cfg.StateDir, "state-dir", envOr("DOWSE_STATE_DIR", "/var/lib/dowse"), "state directory holding the registration and handler sockets (env DOWSE_STATE_DIR)")
	fs.StringVar(&cfg.Namespace, "namespace", "", "only watch this namespace (default: all)")
	fs.DurationVar(&cfg.GracePeriod, "handler-grace-period", 5*time.Minute, "how long the devices of a handler that died or became unreachable stay")
	fs.IntVar(&cfg.MaxDevices, "max-devices", 10000, "most devices taken from one handler list for one Configuration (0: no limit)")
	fs.IntVar(&cfg.WriteConcurrency, "write-concurrency", 64, "parallel Instance writes (a burst of new devices is bound by the API server, which spends less per write with more in flight)")
	qps := fs.Float64("kube-api-qps", 1000, "API client requests per second")
	fs.IntVar(&cfg.Burst, "kube-api-burst", 2000, "API client burst")
	fs.StringVar(&cfg.MetricsAddr, "metrics-bind-address", ":9743", "Prometheus metrics address (0 disables)")
	fs.StringVar(&cfg.HealthAddr, "health-probe-bind-address", ":9744", "health probe address (0 disables)")
	fs.StringVar(&cfg.PprofAddr, "pprof-bind-address", "0", "Go profiling address (0 disables)")
	fs.StringVar(&cfg.DevicePluginDir, "device-plugin-dir", "/var/lib/kubelet/device-plugins", "the kubelet's device-plugin directory; empty disables device plugins and CDI specs")
	fs.BoolVar(&cfg.DRA.Enabled, "dra", false, "serve Dynamic Resource Allocation for Configurations with spec.allocation DRA or Both: publish this node's local devices as ResourceSlices and run the kubelet DRA plugin of driver dowse.dev (Kubernetes 1.34+)")
	fs.StringVar(&cfg.DRA.RegistrarDir, "dra-registrar-dir", dra.DefaultRegistrarDir, "the kubelet's plugin registration directory; empty: publish slices but serve no kubelet plugin")
	fs.StringVar(&cfg.DRA.PluginDir, "dra-plugin-dir", dra.DefaultPluginDir, "the DRA plugin's socket and prepared-claims checkpoint directory")
	fs.StringVar(&cfg.CDISpecDir, "cdi-spec-dir", "/var/run/cdi", "directory the agent writes a CDI spec per Instance to")
	fs.BoolVar(&cfg.ClassicAllocate, "classic-allocate", false, "answer Allocate with env, mounts and device nodes instead of CDI device names (runtimes without CDI)")
	fs.DurationVar(&cfg.SlotReclaimGrace, "slot-reclaim-grace", time.Minute, "free a capacity slot no running pod has used for this long (0 disables)")
	fs.StringVar(&cfg.PodResourcesSocket, "pod-resources-socket", "/var/lib/kubelet/pod-resources/kubelet.sock", "the kubelet's pod-resources API socket, read by the slot reclaimer")
	linkServers := fs.String("link-server", "", "the controller's cloudhub, host:port (its Service), or several comma-separated (its replicas': the agent starts at a random one and moves on to the next when a connection ends); empty: no cloud/edge link")
	fs.StringVar(&cfg.Link.Transport, "link-transport", "websocket", "cloud/edge link transport: websocket or quic")
	fs.StringVar(&cfg.Link.AuthURL, "link-auth-url", "", "the controller's link bootstrap endpoint, https://host:port")
	fs.StringVar(&cfg.Link.Token, "link-bootstrap-token", os.Getenv("DOWSE_LINK_TOKEN"), "one-time token from `dowsectl token create` (env DOWSE_LINK_TOKEN); needed until the node holds a certificate")
	fs.StringVar(&cfg.Link.ServiceAccountTokenFile, "link-service-account-token-file", "", "instead of a bootstrap token: the agent pod's projected service account token (audience dowse-link); the cloud issues the certificate for the pod's node")
	fs.StringVar(&cfg.Link.CAPin, "link-ca-cert-hash", "", "sha256:<hex> pin of the link CA, printed by `dowsectl token create`")
	fs.StringVar(&cfg.Link.CAFile, "link-ca-file", "", "the link CA certificate (PEM), instead of --link-ca-cert-hash")
	fs.DurationVar(&cfg.Link.Heartbeat, "link-heartbeat", 10*time.Second, "link heartbeat interval; a silent cloud is dropped after two")
	fs.IntVar(&cfg.Link.StoreMaxEntries, "link-store-max-entries", 10000, "most unacknowledged messages the edge store keeps while offline (oldest dropped first)")
	fs.IntVar(&cfg.Link.StoreMaxBytes, "link-store-max-bytes", 64<<20, "most bytes of unacknowledged messages the edge store keeps")
	zapOpts := zap.Options{}
	zapOpts.BindFlags(fs)
	showVersion := version.Flag(fs, "dowse-agent")
	_ = fs.Parse(os.Args[1:])
	if showVersion.Print(os.Stdout) {
		return
	}
	cfg.QPS = float32(*qps)
	for _, s := range strings.Split(*linkServers, ",") {
		switch s = strings.TrimSpace(s); {
		case s == "":
		case cfg.Link.Server == "":
			cfg.Link.Server = s
		default:
			cfg.Link.Servers = append(cfg.Link.Servers, s)
		}
	}

	log := zap.New(zap.UseFlagOptions(&zapOpts))
	ctrl.SetLogger(log)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := agent.Run(ctx, cfg, log); err != nil {
		fmt.Fprintln(os.Stderr, "dowse-agent:", err)
		os.Exit(1)
	}
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
