package agent

import (
	"flag"
	"path/filepath"
	"strings"
	"time"

	"github.com/dowse-dev/dowse/internal/agent/deviceplugin"
	"github.com/dowse-dev/dowse/internal/agent/discovery"
	"github.com/dowse-dev/dowse/internal/agent/dra"
	"github.com/dowse-dev/dowse/internal/agent/edgehub"
	"github.com/dowse-dev/dowse/internal/agent/instances"
	"github.com/dowse-dev/dowse/internal/agent/slots"
	"github.com/dowse-dev/dowse/internal/agent/socketdir"
	"github.com/dowse-dev/dowse/internal/kubeflags"
	"github.com/dowse-dev/dowse/internal/nodepaths"
)

// InstancesLabelledMarker, in the agent's state directory, records that the
// agent gave its node's label to the cluster's Instances once: a later
// agent does not do it again.
const InstancesLabelledMarker = instances.LabelledMarker

// socketGroup is SocketGroup for socketdir (0: none).
func (c *Config) socketGroup() int {
	if c.SocketGroup <= 0 {
		return socketdir.NoGroup
	}
	return c.SocketGroup
}

// splitPaths is a comma-separated list of host folders, empty ones left out
// (an empty list allows none).
func splitPaths(v string) []string {
	out := []string{}
	for p := range strings.SplitSeq(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// setDefaults gives every zero field that has one the binary's default;
// Run calls it, and AddFlags shows its values as the flags' defaults.
func (c *Config) setDefaults() {
	if c.Client.QPS == 0 {
		c.Client.QPS, c.Client.Burst = 1000, 2000
	}
	c.Serving.SetDefaults(":9743", ":9744")
	if c.HostPaths.Devices == nil && c.HostPaths.Mounts == nil {
		c.HostPaths = discovery.DefaultHostPaths()
	}
	if c.StateDir == "" {
		c.StateDir = nodepaths.DefaultStateDir
	}
	if c.GracePeriod == 0 {
		c.GracePeriod = 5 * time.Minute
	}
	if c.MaxDevices == 0 {
		c.MaxDevices = 10000
	}
	if c.WriteConcurrency == 0 {
		// The API server spends less per write with more in flight.
		c.WriteConcurrency = 64
	}
	if c.CDISpecDir == "" {
		c.CDISpecDir = "/var/run/cdi"
	}
	if c.SlotReclaimGrace == 0 {
		c.SlotReclaimGrace = time.Minute
	}
	if c.PodResourcesSocket == "" {
		c.PodResourcesSocket = slots.DefaultPodResourcesSocket
	}
	if c.DRA.PluginDir == "" {
		c.DRA.PluginDir = dra.DefaultPluginDir
	}
	if c.Link.Transport == "" {
		c.Link.Transport = "websocket"
	}
	if c.Link.Heartbeat == 0 {
		c.Link.Heartbeat = edgehub.DefaultHeartbeat
	}
	if c.Link.StoreMaxEntries == 0 {
		c.Link.StoreMaxEntries = edgehub.DefaultStoreMaxEntries
	}
	if c.Link.StoreMaxBytes == 0 {
		c.Link.StoreMaxBytes = edgehub.DefaultStoreMaxBytes
	}
}

// AddFlags registers the agent's flags on fs, bound to c, with c's values
// after setDefaults as their defaults (the environment's NODE_NAME,
// DOWSE_STATE_DIR and DOWSE_LINK_TOKEN where it sets them). Device plugins
// and DRA's kubelet plugin, off in a zero Config, default to the kubelet's
// directories.
func (c *Config) AddFlags(fs *flag.FlagSet) {
	c.setDefaults()
	if c.DevicePluginDir == "" {
		c.DevicePluginDir = filepath.Clean(deviceplugin.DefaultDir) // the kubelet's has a trailing slash
	}
	if c.DRA.RegistrarDir == "" {
		c.DRA.RegistrarDir = dra.DefaultRegistrarDir
	}
	c.Client.AddFlags(fs)
	c.Serving.AddFlags(fs)
	fs.StringVar(&c.NodeAPI, "node-api", c.NodeAPI, "reach the API server through the node API proxy (`dowse-agent node-api`) at this `host:port`, so that the agent starts and reads its objects while the API server cannot be reached")
	fs.StringVar(&c.NodeAPICA, "node-api-ca", c.NodeAPICA, "the node API proxy's serving CA (serving-ca.crt in its --dir)")
	fs.StringVar(&c.NodeName, "node-name", kubeflags.EnvOr("NODE_NAME", c.NodeName), "this node's name (env NODE_NAME)")
	fs.StringVar(&c.StateDir, "state-dir", kubeflags.EnvOr(nodepaths.StateDirEnv, c.StateDir), "the agent's state directory: its link credentials and edge store, and the socket folders discovery/ (handlers) and dmi/ (mappers) (env "+nodepaths.StateDirEnv+")")
	fs.IntVar(&c.SocketGroup, "socket-group", c.SocketGroup, "group `id` owning the discovery/ and dmi/ socket folders and the agent's sockets in them, for handlers and mappers running as non-root users in it (0: the agent's own)")
	fs.Func("allowed-device-paths", "comma-separated host `folders` under which handlers may hand out device nodes (default /dev; \"/\" allows any)", func(v string) error {
		c.HostPaths.Devices = splitPaths(v)
		return nil
	})
	fs.Func("allowed-mount-paths", "comma-separated host `folders` under which handlers may hand out mounts (default /dev)", func(v string) error {
		c.HostPaths.Mounts = splitPaths(v)
		return nil
	})
	fs.StringVar(&c.Namespace, "namespace", c.Namespace, "only watch this namespace (default: all)")
	fs.Var(kubeflags.DurationOrNone(&c.GracePeriod), "handler-grace-period", "the `time` the devices of a handler that died or became unreachable stay (0: none)")
	fs.Var(kubeflags.IntOrNone(&c.MaxDevices), "max-devices", "most `devices` taken from one handler list for one Configuration (0: no limit)")
	fs.IntVar(&c.WriteConcurrency, "write-concurrency", c.WriteConcurrency, "parallel Instance writes (a burst of new devices is bound by the API server, which spends less per write with more in flight)")
	fs.StringVar(&c.DevicePluginDir, "device-plugin-dir", c.DevicePluginDir, "the kubelet's device-plugin directory; empty disables device plugins and CDI specs")
	fs.BoolVar(&c.DRA.Enabled, "dra", c.DRA.Enabled, "serve Dynamic Resource Allocation for Configurations with spec.allocation DRA or Both: publish this node's local devices as ResourceSlices and run the kubelet DRA plugin of driver dowse.dev (Kubernetes 1.34+)")
	fs.StringVar(&c.DRA.RegistrarDir, "dra-registrar-dir", c.DRA.RegistrarDir, "the kubelet's plugin registration directory; empty: publish slices but serve no kubelet plugin")
	fs.StringVar(&c.DRA.PluginDir, "dra-plugin-dir", c.DRA.PluginDir, "the DRA plugin's socket and prepared-claims checkpoint directory")
	fs.StringVar(&c.CDISpecDir, "cdi-spec-dir", c.CDISpecDir, "directory the agent writes a CDI spec per Instance to")
	fs.BoolVar(&c.ClassicAllocate, "classic-allocate", c.ClassicAllocate, "answer Allocate with env, mounts and device nodes instead of CDI device names (runtimes without CDI)")
	fs.Var(kubeflags.DurationOrNone(&c.SlotReclaimGrace), "slot-reclaim-grace", "free a capacity slot no running pod has used for this `time` (0 disables)")
	fs.StringVar(&c.PodResourcesSocket, "pod-resources-socket", c.PodResourcesSocket, "the kubelet's pod-resources API socket, read by the slot reclaimer")
	fs.Func("link-server", "the controller's cloudhub, `host:port` (its Service), or several comma-separated (its replicas': the agent starts at a random one and moves on to the next when a connection ends); empty: no cloud/edge link", func(s string) error {
		var all []string
		if err := kubeflags.List(&all).Set(s); err != nil {
			return err
		}
		c.Link.Server, c.Link.Servers = "", nil
		if len(all) > 0 {
			c.Link.Server = all[0]
		}
		if len(all) > 1 {
			c.Link.Servers = all[1:]
		}
		return nil
	})
	fs.StringVar(&c.Link.Transport, "link-transport", c.Link.Transport, "cloud/edge link transport: websocket or quic")
	fs.StringVar(&c.Link.AuthURL, "link-auth-url", c.Link.AuthURL, "the controller's link bootstrap endpoint, https://host:port")
	fs.StringVar(&c.Link.Token, "link-bootstrap-token", kubeflags.EnvOr("DOWSE_LINK_TOKEN", c.Link.Token), "one-time token from `dowsectl token create` (env DOWSE_LINK_TOKEN); needed until the node holds a certificate")
	fs.StringVar(&c.Link.ServiceAccountTokenFile, "link-service-account-token-file", c.Link.ServiceAccountTokenFile, "instead of a bootstrap token: the agent pod's projected service account token (audience dowse-link); the cloud issues the certificate for the pod's node")
	fs.StringVar(&c.Link.CAPin, "link-ca-cert-hash", c.Link.CAPin, "sha256:<hex> pin of the link CA, printed by `dowsectl token create`")
	fs.StringVar(&c.Link.CAFile, "link-ca-file", c.Link.CAFile, "the link CA certificate (PEM), instead of --link-ca-cert-hash")
	fs.DurationVar(&c.Link.Heartbeat, "link-heartbeat", c.Link.Heartbeat, "link heartbeat interval; a silent cloud is dropped after two")
	fs.IntVar(&c.Link.StoreMaxEntries, "link-store-max-entries", c.Link.StoreMaxEntries, "most unacknowledged messages the edge store keeps while offline (oldest dropped first)")
	fs.IntVar(&c.Link.StoreMaxBytes, "link-store-max-bytes", c.Link.StoreMaxBytes, "most bytes of unacknowledged messages the edge store keeps")
}
