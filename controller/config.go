package controller

import (
	"flag"
	"strconv"
	"strings"
	"time"

	"github.com/dowse-dev/dowse/internal/bootstrap"
	"github.com/dowse-dev/dowse/internal/controller/link/cloudservices"
	"github.com/dowse-dev/dowse/internal/controller/link/linkauth"
	"github.com/dowse-dev/dowse/internal/controller/link/ownership"
	"github.com/dowse-dev/dowse/internal/controller/link/twins"
	"github.com/dowse-dev/dowse/internal/controller/mappers"
	"github.com/dowse-dev/dowse/internal/kubeflags"
	"github.com/dowse-dev/dowse/internal/link"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// setDefaults gives every zero field that has one the binary's default
// (AddFlags shows them as the flags' defaults), and puts the link's agent
// service accounts given without a namespace in Namespace; Run calls it.
func (c *Config) setDefaults() {
	c.defaults()
	for i, sa := range c.Link.AgentServiceAccounts {
		if !strings.Contains(sa, "/") {
			c.Link.AgentServiceAccounts[i] = c.Namespace + "/" + sa
		}
	}
}

func (c *Config) defaults() {
	if c.Client.QPS == 0 {
		c.Client.QPS, c.Client.Burst = 200, 400
	}
	c.Serving.SetDefaults(":9745", ":9746")
	if c.Namespace == "" {
		c.Namespace = "dowse-system"
	}
	if c.LeaderElectionNamespace == "" {
		c.LeaderElectionNamespace = "dowse-system"
	}
	if c.LeaseDuration == 0 {
		c.LeaseDuration = 2 * time.Minute
	}
	if c.RenewDeadline == 0 {
		c.RenewDeadline = 100 * time.Second
	}
	if c.RetryPeriod == 0 {
		c.RetryPeriod = 5 * time.Second
	}
	if c.NodeGracePeriod == 0 {
		c.NodeGracePeriod = 5 * time.Minute
	}
	if c.MapperStateDir == "" {
		c.MapperStateDir = mappers.DefaultStateDir
	}
	l := &c.Link
	if l.CertValidity == 0 {
		l.CertValidity = linkauth.DefaultCertValidity
	}
	if l.CAValidity == 0 {
		l.CAValidity = bootstrap.DefaultCAValidity
	}
	if l.Heartbeat == 0 {
		l.Heartbeat = 10 * time.Second
	}
	if l.MaxMessageSize == 0 {
		l.MaxMessageSize = link.DefaultMaxFrame
	}
	if l.QueueSize == 0 {
		// A node is sent each of its Devices when it connects.
		l.QueueSize = 16384
	}
	if l.RateLimit == 0 {
		l.RateLimit, l.RateBurst = 2000, 4000
	}
	if l.MaxConnections == 0 {
		l.MaxConnections = 20000
	}
	if l.EgressProtocol == "" {
		l.EgressProtocol = "HTTPConnect"
	}
	if l.MaxStreamsPerNode == 0 {
		l.MaxStreamsPerNode = link.DefaultMaxStreams
	}
	if l.AuthRateLimit == 0 {
		l.AuthRateLimit, l.AuthRateBurst = linkauth.DefaultRequestRate, linkauth.DefaultRequestBurst
	}
	if l.TwinStatusInterval == 0 {
		l.TwinStatusInterval = time.Second
	}
	if l.TwinStatusConcurrency == 0 {
		l.TwinStatusConcurrency = 16
	}
	if l.TwinStatusBudget == 0 {
		l.TwinStatusBudget = twins.DefaultStatusBudget
	}
	if l.TwinHeartbeatInterval == 0 {
		l.TwinHeartbeatInterval = twins.DefaultHeartbeat
	}
	if l.SpreadInterval == 0 {
		l.SpreadInterval = 2 * time.Second
	}
	if l.DrainPeriod == 0 {
		l.DrainPeriod = 5 * time.Second
	}
	if l.MaxClaimsInFlight == 0 {
		l.MaxClaimsInFlight = ownership.DefaultMaxClaimsInFlight
	}
}

// AddFlags registers the controller's flags on fs, bound to c, with c's
// values after setDefaults as their defaults (the environment's
// POD_NAMESPACE and POD_NAME where it sets them). Leader election, DRA,
// the cloudhub's and bootstrap endpoint's addresses and the dowse-agent
// service accounts, off or empty in a zero Config, are on by default here.
func (c *Config) AddFlags(fs *flag.FlagSet) {
	c.defaults()
	c.LeaderElection, c.DRA = true, true
	if c.AgentServiceAccounts == nil {
		c.AgentServiceAccounts = []string{"dowse-agent"}
	}
	if c.Link.AgentServiceAccounts == nil {
		c.Link.AgentServiceAccounts = []string{"dowse-agent"}
	}
	if c.Link.WebSocketAddr == "" && c.Link.QUICAddr == "" {
		c.Link.WebSocketAddr, c.Link.QUICAddr = ":7443", ":7443"
	}
	if c.Link.AuthAddr == "" {
		c.Link.AuthAddr = ":9747"
	}
	c.Client.AddFlags(fs)
	c.Serving.AddFlags(fs)
	fs.BoolVar(&c.LeaderElection, "leader-elect", c.LeaderElection, "let only one replica act at a time")
	fs.StringVar(&c.LeaderElectionNamespace, "leader-election-namespace", c.LeaderElectionNamespace, "namespace of the leader election Lease")
	fs.DurationVar(&c.LeaseDuration, "leader-elect-lease-duration", c.LeaseDuration, "how long a killed leader's Lease holds before another replica takes over")
	fs.DurationVar(&c.RenewDeadline, "leader-elect-renew-deadline", c.RenewDeadline, "how long the leader tries to renew its Lease (the API server away) before it stops, and its process with it")
	fs.DurationVar(&c.RetryPeriod, "leader-elect-retry-period", c.RetryPeriod, "how often the leader renews and the others try to take over")
	fs.DurationVar(&c.NodeGracePeriod, "node-grace-period", c.NodeGracePeriod, "how long a node may be NotReady before it is removed from Instances, and an agent gone (see --agent-pod-selector) before its Configuration finalizers are dropped")
	fs.StringVar(&c.AgentPodSelector, "agent-pod-selector", c.AgentPodSelector, "label selector of the agent DaemonSet's Pods in --namespace: the finalizers of an agent with no Pod on its node are dropped after --node-grace-period; empty: off")
	fs.BoolVar(&c.DRA, "dra", c.DRA, "publish DeviceClasses and shared devices' ResourceSlices for Configurations with spec.allocation DRA or Both (needs resource.k8s.io/v1, Kubernetes 1.34+)")
	fs.StringVar(&c.Namespace, "namespace", kubeflags.EnvOr("POD_NAMESPACE", c.Namespace), "the controller's namespace, where the link CA and bootstrap tokens live (env POD_NAMESPACE)")
	fs.Var(kubeflags.List(&c.Link.Hosts), "link-hosts", "comma-separated `names` and addresses edges dial to reach this controller; empty: no cloud/edge link")
	fs.StringVar(&c.Link.WebSocketAddr, "link-websocket-address", c.Link.WebSocketAddr, "cloudhub WebSocket address (TCP; empty disables)")
	fs.StringVar(&c.Link.QUICAddr, "link-quic-address", c.Link.QUICAddr, "cloudhub QUIC address (UDP; empty disables)")
	fs.StringVar(&c.Link.AuthAddr, "link-auth-bind-address", c.Link.AuthAddr, "the edges' bootstrap and certificate renewal endpoint")
	fs.StringVar(&c.Link.EgressUDS, "egress-uds", c.Link.EgressUDS, "Unix socket `path` serving the API server's egress (EgressSelectorConfiguration, HTTPConnect): connections to edge nodes and their pods go over their links; empty: none")
	fs.StringVar(&c.Link.EgressProtocol, "egress-protocol", c.Link.EgressProtocol, "what the API server speaks on --egress-uds and --egress-address (its EgressSelectorConfiguration's proxyProtocol): HTTPConnect or GRPC (konnectivity's ProxyService)")
	fs.StringVar(&c.Link.EgressAddr, "egress-address", c.Link.EgressAddr, "TCP address serving the API server's egress with mutual TLS (the link CA; the API server's certificate from `dowsectl egress-config`); empty: none")
	fs.Var(kubeflags.List(&c.Link.EgressHosts), "egress-hosts", "comma-separated names and addresses the API server dials for --egress-address (its serving certificate)")
	fs.StringVar(&c.Link.EgressPeerAddr, "egress-peer-address", c.Link.EgressPeerAddr, "TCP address where this replica takes the egress connections other replicas forward to the node sessions it holds (TLS with the link CA); empty: a replica that does not hold a node's session dials it directly")
	fs.StringVar(&c.Link.EgressPeerAdvertise, "egress-peer-advertise", c.Link.EgressPeerAdvertise, "host:port the other replicas dial for --egress-peer-address (the pod's address)")
	fs.Func("cloud-service-ports", "MIN-MAX: replica ports for Services labelled dowse.dev/reach-from-cloud=true, each given a cloud-side Service (NAME-cloud) whose endpoints are the replicas, relayed over the links of its Pods' nodes; empty: none (needs --egress-peer-address)", func(v string) error {
		r, err := cloudservices.ParsePortRange(v)
		c.Link.CloudServicePorts = r
		return err
	})
	fs.StringVar(&c.Link.CloudServiceAddress, "cloud-service-address", c.Link.CloudServiceAddress, "this replica's address (the pod's IP; not loopback) that cloud-side Services are relayed on and listed at; empty: it relays none (it still gives ports when it leads)")
	fs.StringVar(&c.Link.ReadingsAddr, "readings-address", c.Link.ReadingsAddr, "TLS address serving the live readings API (readings.dowse.dev/v1alpha1: every Device's newest values and a short history from this replica's memory, registered as an APIService; authentication and authorization delegated to the API server); empty: none")
	fs.StringVar(&c.Link.ReadingsAdvertise, "readings-advertise", c.Link.ReadingsAdvertise, "host:port the other replicas dial for --readings-address (the pod's address; --readings-address when empty)")
	fs.StringVar(&c.Link.ReadingsService, "readings-service", c.Link.ReadingsService, "the Service in --namespace the readings APIService names (its names go into the serving certificate)")
	fs.StringVar(&c.Link.ReadingsAPIService, "readings-apiservice", c.Link.ReadingsAPIService, "the APIService whose caBundle this replica keeps at the link CA, which signs the readings API's certificates (empty: not kept)")
	fs.IntVar(&c.Link.ReadingsHistory, "readings-history", c.Link.ReadingsHistory, "values each property keeps in memory before its newest, for the readings API (0: 8; negative: none)")
	fs.DurationVar(&c.Link.CertValidity, "link-cert-validity", c.Link.CertValidity, "lifetime of node certificates (renewed at about two thirds)")
	fs.DurationVar(&c.Link.CAValidity, "link-ca-validity", c.Link.CAValidity, "lifetime of the link CA, when the controller creates it")
	fs.DurationVar(&c.Link.Heartbeat, "link-heartbeat", c.Link.Heartbeat, "link heartbeat interval; a silent edge is dropped after two")
	fs.IntVar(&c.Link.MaxMessageSize, "link-max-message-size", c.Link.MaxMessageSize, "largest link message accepted, in bytes")
	fs.IntVar(&c.Link.QueueSize, "link-queue-size", c.Link.QueueSize, "most unacknowledged messages queued for one node (a node is sent each of its Devices when it connects)")
	fs.StringVar(&c.PodName, "pod-name", kubeflags.EnvOr("POD_NAME", c.PodName), "this replica's Pod (env POD_NAME): its identity as the holder of the edges' sessions it serves and of the leader Lease, which a replica restarted in its Pod takes back at once (outside a Pod, the host name and a random suffix)")
	fs.DurationVar(&c.Link.SpreadInterval, "link-spread-interval", c.Link.SpreadInterval, "how often this replica publishes how many edges it serves and, when it holds more than its share, moves some to the other replicas")
	fs.IntVar(&c.Link.MaxClaimsInFlight, "link-max-claims-in-flight", c.Link.MaxClaimsInFlight, "most node ownership records this replica writes at once as edges connect (a replica taking over a dead one's edges claims each; more wait in their handshake rather than queue in the API server ahead of everything else the replica asks)")
	fs.Var(kubeflags.DurationOrNone(&c.Link.DrainPeriod), "link-drain-period", "when stopping, the `time` this replica spends moving its edges to the other replicas, spread over that time, before it closes what is left (0: none, the edges find out when their connections close)")
	fs.StringVar(&c.MapperStateDir, "mapper-state-dir", c.MapperStateDir, "the agents' state directory on the nodes (their --state-dir), whose dmi/ socket folder (alone) is mounted into the mapper Pods the controller runs")
	fs.Int64Var(&c.MapperSocketGroup, "mapper-socket-group", c.MapperSocketGroup, "the agents' --socket-group, given to the mapper Pods the controller runs as a supplemental group (0: none)")
	fs.DurationVar(&c.Link.TwinStatusInterval, "twin-status-interval", c.Link.TwinStatusInterval, "least time between two status writes of one Device, however fast its mappers report")
	fs.IntVar(&c.Link.TwinStatusConcurrency, "twin-status-concurrency", c.Link.TwinStatusConcurrency, "parallel Device status writes")
	fs.Float64Var(&c.Link.TwinStatusBudget, "twin-status-budget", c.Link.TwinStatusBudget, "most Device status writes a second this replica makes, however many Devices report however fast: a desired value's acknowledgement and state or condition changes first, then changed values, then repeats; under overload every Device is still written in turn, its status older (negative: no bound)")
	fs.DurationVar(&c.Link.TwinHeartbeatInterval, "twin-heartbeat-interval", c.Link.TwinHeartbeatInterval, "how often a Device whose reports only repeat what its status holds is written to refresh its timestamps")
	fs.Float64Var(&c.Link.RateLimit, "link-rate-limit", c.Link.RateLimit, "messages per second accepted from one node (each reported value is one; the edge coalesces what waits)")
	fs.IntVar(&c.Link.RateBurst, "link-rate-burst", c.Link.RateBurst, "burst of messages accepted from one node")
	fs.IntVar(&c.Link.MaxConnections, "link-max-connections", c.Link.MaxConnections, "most edge connections served at once")
	fs.IntVar(&c.Link.MaxStreamsPerNode, "max-streams-per-node", c.Link.MaxStreamsPerNode, "most byte streams (the API server's egress: kubectl logs, exec, port-forward; cloud-side Services) open at once through one node's link, at most "+strconv.Itoa(link.DefaultMaxStreams)+" (what an edge serves); one more is refused, the egress answering 503 with the node and the bound")
	fs.Var(kubeflags.List(&c.AgentServiceAccounts), "agent-service-accounts", "comma-separated service `accounts` of the agents (name in --namespace, or namespace/name), granted read of exactly the Secrets and ConfigMaps that Configurations' discoveryProperties name (a Role and RoleBinding "+v1alpha1.PropertyAccessRole+" in each namespace holding some); empty: the controller grants nothing")
	fs.Var(kubeflags.List(&c.PropertyNamespaces), "property-namespaces", "comma-separated `namespaces` whose Secrets and ConfigMaps any Configuration's discoveryProperties may read; a Configuration always may read its own namespace's, and is granted nothing elsewhere")
	fs.Var(kubeflags.List(&c.ConfigurationNamespaces), "configuration-namespaces", "comma-separated `namespaces` Configurations are served in (empty: any); the agents are granted read for Configurations elsewhere of nothing, so the controller needs read of Secrets and ConfigMaps only in these and --property-namespaces")
	fs.Var(kubeflags.List(&c.Link.AgentServiceAccounts), "link-agent-service-accounts", "comma-separated service `accounts` (name in --namespace, or namespace/name) whose pod-bound tokens (audience dowse-link) may bootstrap their pod's node; empty: bootstrap tokens only")
	fs.Float64Var(&c.Link.AuthRateLimit, "link-auth-rate-limit", c.Link.AuthRateLimit, "bootstrap and renewal requests per second, all edges together (more are answered 429 and retried)")
	fs.IntVar(&c.Link.AuthRateBurst, "link-auth-rate-burst", c.Link.AuthRateBurst, "burst of bootstrap and renewal requests")
}
