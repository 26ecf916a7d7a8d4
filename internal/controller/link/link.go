// Package link is the controller's end of the cloud/edge link, as one
// subsystem: the link CA and the bootstrap and renewal endpoint
// (linkauth), the session table and the hub edges connect to (cloudhub),
// who owns each node's session among the replicas (ownership), the
// twins' status writer and sync (twins), and what each node is told it
// sees, which devices it may speak about and that it left (membership).
//
// Add builds them in the order they depend on each other, so that no part
// is reached before it exists: the CA, the bootstrap endpoint, the
// session table, the ownership records and presence (which act on the
// session table), the status writer (which commits to it and reports
// fences to ownership), the twin sync, memberships and departures, then
// the hub that serves the table and asks ownership, presence, departures
// and the status writer. What happens to a node's session (connected,
// taken over by another replica, departed from the cluster) reaches the
// parts that keep state per node through one interface,
// cloudhub.SessionObserver, that they register for on the session table.
package link

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/dowse-dev/dowse/internal/bootstrap"
	"github.com/dowse-dev/dowse/internal/controller/link/cloudhub"
	"github.com/dowse-dev/dowse/internal/controller/link/cloudservices"
	"github.com/dowse-dev/dowse/internal/controller/link/egress"
	"github.com/dowse-dev/dowse/internal/controller/link/linkauth"
	"github.com/dowse-dev/dowse/internal/controller/link/membership"
	"github.com/dowse-dev/dowse/internal/controller/link/ownership"
	"github.com/dowse-dev/dowse/internal/controller/link/readings"
	"github.com/dowse-dev/dowse/internal/controller/link/twins"
	"github.com/dowse-dev/dowse/internal/link/pki"
	"github.com/dowse-dev/dowse/internal/optional"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// Config is the cloud end of the cloud/edge link; the link is off when
// Hosts is empty.
type Config struct {
	// Hosts are the names and addresses edges dial; they go into the
	// server certificate.
	Hosts []string
	// WebSocketAddr and QUICAddr are the cloudhub's listen addresses (TCP,
	// UDP; either may be empty); AuthAddr is the bootstrap and renewal
	// endpoint's.
	WebSocketAddr, QUICAddr, AuthAddr string
	// CertValidity is the lifetime of node certificates; CAValidity that of
	// the CA, when the controller creates it.
	CertValidity, CAValidity time.Duration
	Heartbeat                time.Duration
	MaxMessageSize           int
	// QueueSize bounds each node's unacknowledged outbound messages;
	// RateLimit and RateBurst pace each node's inbound ones.
	QueueSize int
	RateLimit float64
	RateBurst int
	// MaxConnections caps the edges connected at once.
	MaxConnections int
	// MaxStreamsPerNode caps the byte streams (the API server's egress,
	// cloud-side Services) open at once through one node's link, at most
	// link.DefaultMaxStreams (what an edge serves); one more is refused
	// (the egress answers 503 naming the node and the bound).
	MaxStreamsPerNode int
	// AuthRateLimit and AuthRateBurst pace the bootstrap and renewal
	// requests of all edges together.
	AuthRateLimit float64
	AuthRateBurst int
	// AgentServiceAccounts ("namespace/name") may bootstrap with a service
	// account token bound to an agent pod; empty: bootstrap tokens only.
	AgentServiceAccounts []string
	// TwinStatusInterval is the least time between two status writes of
	// one Device (twins' default when 0).
	TwinStatusInterval time.Duration
	// TwinStatusConcurrency bounds parallel Device status writes (twins'
	// default when 0).
	TwinStatusConcurrency int
	// TwinStatusBudget is the most Device status writes a second this
	// replica makes (twins' default when 0; negative: no bound).
	TwinStatusBudget float64
	// TwinHeartbeatInterval is how often a Device whose reports only
	// repeat its status is written to refresh its timestamps (twins'
	// default when 0).
	TwinHeartbeatInterval time.Duration
	// Replica is this replica's identity among the controller's replicas
	// (unique among those running at once): the holder of the node
	// sessions it serves. Run sets it to PodName, else to the host name
	// and a random suffix.
	Replica string
	// DrainPeriod is how long a stopping replica spends moving its edges
	// to the others (cloudhub's default when 0; negative: none).
	DrainPeriod time.Duration
	// SpreadInterval is how often a replica publishes how many sessions it
	// holds and checks that it holds no more than its share (ownership's
	// default when 0).
	SpreadInterval time.Duration
	// MaxClaimsInFlight bounds the node records this replica writes at
	// once when edges connect (ownership's default when 0).
	MaxClaimsInFlight int
	// Namespace holds the link CA's Secret, the bootstrap tokens and the
	// ownership and presence Leases (the controller's namespace).
	Namespace string
	// EgressUDS and EgressAddr serve the API server's egress (package
	// egress) on a Unix socket and on TCP with mutual TLS: a certificate of
	// the link CA for EgressHosts, and the API server's client certificate
	// of the same CA naming an egress client (`dowsectl egress-config`);
	// both empty: no egress.
	EgressUDS, EgressAddr string
	EgressHosts           []string
	// EgressProtocol is what the API server speaks to them
	// (egress.HTTPConnect, the default, or egress.GRPC).
	EgressProtocol string
	// EgressPeerAddr is where this replica takes the egress connections
	// other replicas forward to the node sessions it holds (TLS with
	// certificates of the link CA naming a replica); EgressPeerAdvertise
	// is the host:port they dial, published on its presence Lease. Empty:
	// no forwarding.
	EgressPeerAddr, EgressPeerAdvertise string
	// CloudServicePorts are the replica ports cloud-side Services are given
	// (package cloudservices; empty: none), relayed on CloudServiceAddress
	// (this replica's address, a host; the EndpointSlices list it). Needs
	// the egress peer listener: a connection goes over the link of the
	// Pod's node through the replica that holds it.
	CloudServicePorts   cloudservices.PortRange
	CloudServiceAddress string
	// ReadingsAddr serves the live readings API (package readings,
	// readings.dowse.dev/v1alpha1) on TLS; empty: off.
	// ReadingsAdvertise is the host:port the other replicas dial, published
	// on the presence Lease (ReadingsAddr's when empty).
	ReadingsAddr, ReadingsAdvertise string
	// ReadingsService is the Service the readings APIService names, in
	// Namespace: its names go into the serving certificate.
	ReadingsService string
	// ReadingsAPIService is the APIService whose caBundle this replica
	// keeps at the link CA (empty: not kept).
	ReadingsAPIService string
	// ReadingsHistory is how many values each property keeps before its
	// newest (readings' default when 0; none when negative).
	ReadingsHistory int
}

// egressAdvertised is the egress peer address this replica publishes.
func egressAdvertised(cfg Config) string {
	if cfg.EgressPeerAddr == "" {
		return ""
	}
	return cfg.EgressPeerAdvertise
}

// takeoverLog logs a session another replica took, after the parts
// before it dropped it.
type takeoverLog struct{ log logr.Logger }

func (takeoverLog) Connected(context.Context, string) {}
func (l takeoverLog) TakenOver(node string) {
	l.log.Info("another replica took the node's session; closed it here", "node", node)
}
func (takeoverLog) Departed(string) {}

// Add adds the link to mgr: the link CA (loaded or created in
// cfg.Namespace), the bootstrap endpoint and the cloudhub. Every replica
// runs them, with the twin sync, the memberships and the status writes of
// the nodes whose sessions it holds (package ownership decides which); the
// leader alone records whether Devices fit their models. The listeners'
// failures are contained (package optional): they fail the "link"
// readiness check, not the controller.
func Add(ctx context.Context, mgr ctrl.Manager, cfg Config, reg prometheus.Registerer, log logr.Logger) error {
	cs, err := kubernetes.NewForConfig(mgr.GetConfig())
	if err != nil {
		return err
	}
	cache, live := mgr.GetClient(), mgr.GetAPIReader()

	// The CA and the bootstrap endpoint. The Secrets are read through a
	// client of their own: the manager's would cache every Secret of the
	// cluster.
	secrets := cs.CoreV1().Secrets(cfg.Namespace)
	ca, err := bootstrap.LoadOrCreateCA(ctx, secrets, cfg.CAValidity)
	if err != nil {
		return fmt.Errorf("link CA: %w", err)
	}
	auth, err := linkauth.NewServer(linkauth.Config{
		CA: ca, Tokens: linkauth.NewTokens(secrets), CertValidity: cfg.CertValidity,
		Hosts: cfg.Hosts, ServerCertValidity: 30 * 24 * time.Hour, Addr: cfg.AuthAddr,
		Metrics:      linkauth.NewMetrics(reg),
		RequestRate:  cfg.AuthRateLimit,
		RequestBurst: cfg.AuthRateBurst,
		// Agents of a DaemonSet join with their pod's service account token.
		TokenReviews:         cs.AuthenticationV1().TokenReviews(),
		AgentServiceAccounts: cfg.AgentServiceAccounts,
		// Certificates are bound to their Node's UID; a node removed from
		// the cluster cannot keep renewing.
		NodeUID: membership.NodeUID(live),
	})
	if err != nil {
		return err
	}
	if err := addIndexes(ctx, mgr); err != nil {
		return err
	}

	// The session table, which the parts below act on and observe.
	hubCfg := cloudhub.Config{
		WebSocketAddr: cfg.WebSocketAddr, QUICAddr: cfg.QUICAddr,
		// The hub serves the bootstrap endpoint's certificate, re-issued
		// with it.
		TLS:       pki.ServerTLSConfig(auth.ServerCertificate, ca.Pool()),
		Heartbeat: cfg.Heartbeat, MaxFrame: cfg.MaxMessageSize, QueueSize: cfg.QueueSize,
		RateLimit: cfg.RateLimit, RateBurst: cfg.RateBurst, MaxConnections: cfg.MaxConnections,
		MaxStreamsPerNode: cfg.MaxStreamsPerNode,
		DrainPeriod:       cfg.DrainPeriod,
		// Reports are acknowledged once they are in Device.status, not
		// when taken: nothing is lost if the controller dies in between.
		ManualCommit: true,
	}
	sessions := cloudhub.NewSessions(hubCfg, reg)

	// A node's session is this replica's from the moment it claims the
	// node's record; when another replica claims it, this one closes its
	// session (and the observers drop what they took of it and did not
	// write).
	claims, err := ownership.NewClaims(ownership.ClaimsConfig{
		Leases: cs.CoordinationV1().Leases(cfg.Namespace), Replica: cfg.Replica, MaxInFlight: cfg.MaxClaimsInFlight,
		NodeUID: func(ctx context.Context, node string) (types.UID, error) {
			var n corev1.Node
			err := cache.Get(ctx, client.ObjectKey{Name: node}, &n)
			return n.UID, err
		},
		Lost:    func(node string, through uint64) { sessions.Evict(node, through) },
		Metrics: ownership.NewMetrics(reg),
		Log:     log.WithName("ownership"),
	})
	if err != nil {
		return err
	}
	presence, err := ownership.NewPresence(ownership.PresenceConfig{
		Leases: cs.CoordinationV1().Leases(cfg.Namespace), Replica: cfg.Replica,
		Sessions: sessions.Connected, Draining: sessions.Draining,
		Move:   func(node string, delay time.Duration) bool { return sessions.Move(node, delay, "rebalance") },
		Every:  cfg.SpreadInterval,
		Egress: egressAdvertised(cfg),
		CloudServices: func() string {
			if cfg.CloudServicePorts.Off() {
				return ""
			}
			return cfg.CloudServiceAddress
		}(),
		Readings:   readingsAdvertised(cfg),
		Log:        log.WithName("spread"),
		Registerer: reg,
	})
	if err != nil {
		return err
	}

	twinMetrics := twins.NewMetrics(reg)
	statusCfg := twins.StatusConfig{Interval: cfg.TwinStatusInterval, Concurrency: cfg.TwinStatusConcurrency, Live: live,
		Budget: cfg.TwinStatusBudget, Heartbeat: cfg.TwinHeartbeatInterval,
		// A newer session wrote one of the node's Devices: close the
		// older one here now rather than when the watch tells.
		OnFenced: claims.Fenced}
	var readingStore *readings.Store
	if cfg.ReadingsAddr != "" {
		readingStore = readings.NewStore(cfg.ReadingsHistory)
		statusCfg.Readings = readingStore
		sessions.Observe(readingStore)
	}
	status := twins.NewStatus(cache, cache, sessions, statusCfg, twinMetrics, log.WithName("twins"))
	twinSync := twins.NewSync(cache, live, sessions, status, twinMetrics, log.WithName("twin-sync"))
	members := membership.NewMemberships(cache, sessions, log.WithName("membership"))
	departures := membership.NewDepartures(cache, sessions, log.WithName("departures"))
	sessions.Observe(status, twinSync, members, claims, takeoverLog{log})

	hubCfg.Sessions = sessions
	hubCfg.Claim = claims.Claim
	hubCfg.CanDrain = func() bool { return presence.Others() > 0 }
	hubCfg.Redirect = presence.RoomElsewhere
	// Only nodes of the cluster: a deleted Node's certificate, still
	// valid, no longer gets in.
	hubCfg.NodeUID = membership.NodeUID(cache)
	hub, err := cloudhub.New(hubCfg, membership.Authorizer{Reader: cache}, status.Handle, reg)
	if err != nil {
		return err
	}

	// Then the manager runs them. The link's listeners failing (an
	// address in use) is the link's failure, not the controller's:
	// contained, each is logged, counted and retried, and fails only the
	// "link" readiness check meanwhile, while brokers go on. Every replica
	// serves the bootstrap endpoint and the hub: the link's Service
	// selects every ready replica.
	failures := optional.NewFailures(reg, "dowse_controller")
	authPart := &optional.Part{Name: "link-auth", Log: log, Failures: failures, Run: func(ctx context.Context) error {
		return auth.Start(logr.NewContext(ctx, log))
	}}
	ownPart := &optional.Part{Name: "link-ownership", Log: log, Failures: failures, Run: claims.Start}
	spreadPart := &optional.Part{Name: "link-spread", Log: log, Failures: failures, Run: func(ctx context.Context) error {
		select {
		case <-hub.Ready():
		case <-ctx.Done():
			return nil
		}
		return presence.Start(ctx)
	}}
	hubPart := &optional.Part{Name: "cloudhub", Log: log, Failures: failures, Run: func(ctx context.Context) error {
		if !mgr.GetCache().WaitForCacheSync(ctx) {
			return errors.New("cache never synced")
		}
		log.Info("starting cloudhub", "websocket", cfg.WebSocketAddr, "quic", cfg.QUICAddr, "replica", cfg.Replica)
		return hub.Start(logr.NewContext(ctx, log))
	}}
	if err := mgr.Add(authPart); err != nil {
		return err
	}
	if cfg.EgressUDS != "" || cfg.EgressAddr != "" || cfg.EgressPeerAddr != "" {
		var conf *tls.Config
		if cfg.EgressAddr != "" {
			if len(cfg.EgressHosts) == 0 {
				return errors.New("egress: --egress-address needs --egress-hosts, the names the API server dials")
			}
			serving := &pki.Rotating{Issue: func() (tls.Certificate, error) { return ca.IssueServer(cfg.EgressHosts, 30*24*time.Hour) }}
			conf = &tls.Config{MinVersion: tls.VersionTLS12, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: ca.Pool(),
				GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return serving.Get() }}
		}
		ecfg := egress.Config{UDS: cfg.EgressUDS, Addr: cfg.EgressAddr, TLS: conf, Protocol: cfg.EgressProtocol,
			Nodes: cache, Pods: live, Hub: hub, Registerer: reg, Log: log.WithName("egress")}
		if cfg.EgressPeerAddr != "" {
			host, _, err := net.SplitHostPort(cfg.EgressPeerAdvertise)
			if err != nil {
				return fmt.Errorf("egress peer advertise address %q: %w", cfg.EgressPeerAdvertise, err)
			}
			rc := &pki.Rotating{Issue: func() (tls.Certificate, error) {
				return ca.IssueReplica(cfg.Replica, []string{host}, 30*24*time.Hour)
			}}
			ecfg.PeerAddr = cfg.EgressPeerAddr
			ecfg.PeerTLS = &tls.Config{MinVersion: tls.VersionTLS13, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: ca.Pool(),
				GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return rc.Get() }}
			leases := cs.CoordinationV1().Leases(cfg.Namespace)
			ecfg.Forward = func(ctx context.Context, node, target string) (net.Conn, error) {
				l, err := leases.Get(ctx, ownership.NodeLeaseName(node), metav1.GetOptions{})
				if apierrors.IsNotFound(err) {
					return nil, egress.ErrNoHolder
				}
				if err != nil {
					return nil, err
				}
				holder := ptr.Deref(l.Spec.HolderIdentity, "")
				if holder == "" || holder == cfg.Replica {
					return nil, egress.ErrNoHolder
				}
				addr := presence.EgressOf(holder)
				if addr == "" {
					return nil, fmt.Errorf("replica %s holds it and publishes no egress address", holder)
				}
				peerHost, _, _ := net.SplitHostPort(addr)
				return egress.DialPeer(ctx, addr, &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: ca.Pool(), ServerName: peerHost,
					GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return rc.Get() }}, target)
			}
		}
		eg, err := egress.New(ecfg)
		if err != nil {
			return err
		}
		if err := mgr.Add(&optional.Part{Name: "egress", Log: log, Failures: failures, Run: eg.Start}); err != nil {
			return err
		}
		if !cfg.CloudServicePorts.Off() {
			if cfg.EgressPeerAddr == "" {
				return errors.New("cloud-side Services need --egress-peer-address")
			}
			// A replica without an address gives ports when it leads, and
			// relays none.
			if cfg.CloudServiceAddress != "" {
				relay := &cloudservices.Relay{Reader: live, Dial: eg.Dial, Host: cfg.CloudServiceAddress, Registerer: reg, Log: log.WithName("cloud-services")}
				if err := mgr.Add(&optional.Part{Name: "cloud-services", Log: log, Failures: failures, Run: relay.Start}); err != nil {
					return err
				}
			}
			if err := mgr.Add(&cloudservices.Allocator{Client: cache, Reader: live, Ports: cfg.CloudServicePorts,
				Hosts: presence.CloudServiceHosts, Log: log.WithName("cloud-services")}); err != nil {
				return err
			}
		}
	} else if !cfg.CloudServicePorts.Off() {
		return errors.New("cloud-side Services need --egress-peer-address")
	}
	if readingStore != nil {
		if err := addReadings(mgr, cfg, cs, ca, readingStore, presence, failures, reg, log.WithName("readings")); err != nil {
			return err
		}
	}
	// The agents pin the CA from a ConfigMap the controller publishes (the
	// chart does not make the CA, so its key is in no release history).
	caCert := &bootstrap.CACertPublisher{ConfigMaps: cs.CoreV1().ConfigMaps(cfg.Namespace), CA: ca}
	if err := mgr.Add(ctrl.RunnableFunc(func(ctx context.Context) error {
		return caCert.Start(logr.NewContext(ctx, log.WithName("link-ca")))
	})); err != nil {
		return err
	}
	for _, c := range []interface{ SetupWithManager(ctrl.Manager) error }{
		members, twinSync, twins.NewValidity(cache, cache, live, log.WithName("device-validity")),
	} {
		if err := c.SetupWithManager(mgr); err != nil {
			return err
		}
	}
	if err := mgr.Add(status); err != nil {
		return err
	}
	if err := departures.SetupWithManager(mgr); err != nil {
		return err
	}
	if err := mgr.Add(ownPart); err != nil {
		return err
	}
	if err := mgr.Add(spreadPart); err != nil {
		return err
	}
	// Ready while this replica can serve edges: listening, not draining,
	// and watching the records of the sessions it holds.
	if err := mgr.AddReadyzCheck("link", func(r *http.Request) error {
		var synced error
		if !claims.Synced() {
			synced = errors.New("link-ownership: the records of the sessions held are not listed yet")
		}
		return errors.Join(authPart.Check(r), hubPart.Check(r), ownPart.Check(r), hub.Serving(), synced)
	}); err != nil {
		return err
	}
	return mgr.Add(hubPart)
}

// readingsAdvertised is where this replica's readings API is published.
func readingsAdvertised(cfg Config) string {
	if cfg.ReadingsAddr == "" {
		return ""
	}
	if cfg.ReadingsAdvertise != "" {
		return cfg.ReadingsAdvertise
	}
	return cfg.ReadingsAddr
}

// addReadings adds the live readings API: its server (a certificate of
// the link CA for the APIService's Service and the address the other
// replicas dial, which also names this replica to them), the front
// proxy's configuration, and the keeper of the APIService's caBundle.
func addReadings(mgr ctrl.Manager, cfg Config, cs kubernetes.Interface, ca *pki.CA, store *readings.Store, presence *ownership.Presence,
	failures *prometheus.CounterVec, reg prometheus.Registerer, log logr.Logger) error {
	adv := readingsAdvertised(cfg)
	host, _, err := net.SplitHostPort(adv)
	if err != nil {
		return fmt.Errorf("readings advertise address %q: %w", adv, err)
	}
	if host == "" {
		return fmt.Errorf("readings advertise address %q names no host the other replicas can dial", adv)
	}
	hosts := []string{host}
	if cfg.ReadingsService != "" {
		svc := cfg.ReadingsService + "." + cfg.Namespace
		hosts = append(hosts, svc+".svc", svc+".svc.cluster.local")
	}
	cert := &pki.Rotating{Issue: func() (tls.Certificate, error) { return ca.IssueReplica(cfg.Replica, hosts, 30*24*time.Hour) }}
	auth := &readings.Auth{ConfigMaps: cs.CoreV1().ConfigMaps("kube-system"), TokenReviews: cs.AuthenticationV1().TokenReviews(),
		SARs: cs.AuthorizationV1().SubjectAccessReviews(), Log: log}
	leases := cs.CoordinationV1().Leases(cfg.Namespace)
	srv, err := readings.NewServer(readings.Config{Addr: cfg.ReadingsAddr, Replica: cfg.Replica,
		GetCertificate:    func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return cert.Get() },
		ClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert.Get() },
		ReplicaCAs:        ca.Pool(), Store: store, Devices: mgr.GetClient(), Auth: auth,
		Holder: func(ctx context.Context, node string) (string, error) {
			l, err := leases.Get(ctx, ownership.NodeLeaseName(node), metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return "", nil
			}
			if err != nil {
				return "", err
			}
			return ptr.Deref(l.Spec.HolderIdentity, ""), nil
		},
		Peers: presence.ReadingsPeers, Registerer: reg, Log: log})
	if err != nil {
		return err
	}
	if err := mgr.Add(&optional.Part{Name: "readings-auth", Log: log, Failures: failures, Run: auth.Start}); err != nil {
		return err
	}
	if err := mgr.Add(&optional.Part{Name: "readings", Log: log, Failures: failures, Run: func(ctx context.Context) error {
		if !mgr.GetCache().WaitForCacheSync(ctx) {
			return errors.New("cache never synced")
		}
		// Watches follow the Devices (created, changed, deleted) and
		// replay the deleted ones from here on.
		inf, err := mgr.GetCache().GetInformer(ctx, &v1alpha1.Device{})
		if err != nil {
			return err
		}
		reg, err := inf.AddEventHandler(srv.DeviceEvents())
		if err != nil {
			return err
		}
		defer func() { _ = inf.RemoveEventHandler(reg) }()
		return srv.Start(ctx)
	}}); err != nil {
		return err
	}
	if cfg.ReadingsAPIService != "" {
		dyn, err := dynamic.NewForConfig(mgr.GetConfig())
		if err != nil {
			return err
		}
		keeper := &readings.CABundleKeeper{Client: dyn, Name: cfg.ReadingsAPIService, CAPEM: ca.CertPEM, Log: log}
		if err := mgr.Add(&optional.Part{Name: "readings-apiservice", Log: log, Failures: failures, Run: keeper.Start}); err != nil {
			return err
		}
	}
	return nil
}

// addIndexes adds the cache indexes the parts read by.
func addIndexes(ctx context.Context, mgr ctrl.Manager) error {
	if err := mgr.GetFieldIndexer().IndexField(ctx, &v1alpha1.Instance{}, membership.NodeIndex, membership.IndexByNode); err != nil {
		return err
	}
	for _, ix := range []struct {
		name string
		fn   client.IndexerFunc
	}{{twins.NodeIndex, twins.IndexByNode}, {twins.ModelIndex, twins.IndexByModel}} {
		if err := mgr.GetFieldIndexer().IndexField(ctx, &v1alpha1.Device{}, ix.name, ix.fn); err != nil {
			return err
		}
	}
	return nil
}
