package agent

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/dowse-dev/dowse/internal/agent/nodeapi"
	"github.com/dowse-dev/dowse/internal/agent/slots"
	"github.com/dowse-dev/dowse/internal/kubeflags"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// DefaultNodeAPIListen is where the node API proxy listens unless told.
const DefaultNodeAPIListen = "127.0.0.1:10270"

// NodeAPIConfig configures `dowse-agent node-api`: the node-local API proxy
// that keeps what the kubelet and the agent read, to answer them while the
// API server cannot be reached.
type NodeAPIConfig struct {
	// UpstreamKubeconfig is the kubelet's own kubeconfig: the API server's
	// address, its CA and the node's client certificate.
	UpstreamKubeconfig string
	Listen             string
	Dir                string
	MetricsAddr        string
	// PodResourcesSocket is the kubelet's pod-resources API, for holding
	// back offline the pods whose Dowse devices are not served yet.
	PodResourcesSocket string
	// KubeletKubeconfig, when set, is where the kubelet's kubeconfig
	// through the proxy is written at start.
	KubeletKubeconfig string
	NodeName          string
}

// AddFlags registers the node-api flags.
func (c *NodeAPIConfig) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.UpstreamKubeconfig, "upstream-kubeconfig", "/etc/kubernetes/kubelet.conf", "the kubelet's own kubeconfig (API server, CA, the node's client certificate)")
	fs.StringVar(&c.Listen, "listen", DefaultNodeAPIListen, "loopback `address` the kubelet and the agent reach the proxy at")
	fs.StringVar(&c.Dir, "dir", "/var/lib/dowse/node-api", "folder of the store (mode 0700), its seal key and the proxy's serving certificate")
	fs.StringVar(&c.NodeName, "node-name", kubeflags.EnvOr("NODE_NAME", ""), "this node's name, for the Event told after each cut (env NODE_NAME)")
	fs.StringVar(&c.PodResourcesSocket, "pod-resources-socket", slots.DefaultPodResourcesSocket, "the kubelet's pod-resources API: offline, a pod that asks for Dowse devices is handed to the kubelet once they are allocatable (empty: at once)")
	fs.StringVar(&c.MetricsAddr, "metrics-bind-address", "127.0.0.1:9745", "metrics address (0: off)")
	fs.StringVar(&c.KubeletKubeconfig, "kubelet-kubeconfig", "", "write the kubeconfig that points the kubelet at this proxy (its own, with this proxy's address and CA) to this `path` at start")
}

// throughNodeAPI is cfg sent to the node API proxy at addr instead, with
// the same credentials (a bearer token: the proxy passes it on).
func throughNodeAPI(cfg *rest.Config, addr, caFile string) *rest.Config {
	out := rest.CopyConfig(cfg)
	out.Host = "https://" + addr
	out.TLSClientConfig = rest.TLSClientConfig{CAFile: caFile}
	return out
}

// RunNodeAPI serves the node API proxy until ctx ends.
func RunNodeAPI(ctx context.Context, c NodeAPIConfig, log logr.Logger) error {
	if c.KubeletKubeconfig != "" {
		if err := nodeapi.WriteKubeletKubeconfig(c.UpstreamKubeconfig, c.Listen, c.Dir, c.KubeletKubeconfig); err != nil {
			return fmt.Errorf("writing the kubelet's kubeconfig: %w", err)
		}
	}
	upstream, err := clientcmd.BuildConfigFromFlags("", c.UpstreamKubeconfig)
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	srv, err := nodeapi.New(nodeapi.Config{Listen: c.Listen, Dir: c.Dir, Upstream: upstream, Log: log.WithName("node-api"), Metrics: reg,
		PodResourcesSocket: c.PodResourcesSocket, GatedPrefix: v1alpha1.ResourcePrefix, NodeName: c.NodeName})
	if err != nil {
		return err
	}
	if c.MetricsAddr != "" && c.MetricsAddr != "0" {
		ln, err := net.Listen("tcp", c.MetricsAddr)
		if err != nil {
			return err
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() {
			if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error(err, "metrics")
			}
		}()
		defer hs.Close()
	}
	return srv.Start(ctx)
}
