package controller

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/dowse-dev/dowse/internal/bootstrap"
	"github.com/dowse-dev/dowse/internal/contain"
	"github.com/dowse-dev/dowse/internal/controller/link/cloudhub"
	"github.com/dowse-dev/dowse/internal/controller/link/edges"
	"github.com/dowse-dev/dowse/internal/controller/link/linkauth"
	"github.com/dowse-dev/dowse/internal/controller/link/ownership"
	"github.com/dowse-dev/dowse/internal/controller/link/twins"
	"github.com/dowse-dev/dowse/internal/link/pki"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// LinkConfig is the cloud end of the cloud/edge link; the link is off when
// Hosts is empty.
type LinkConfig struct {
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
}

type committer func(node string, pos cloudhub.Position)

func (c committer) Commit(node string, pos cloudhub.Position) { c(node, pos) }

// forgetAll forgets a departed node in the hub, the twin sync and the
// ownership records.
type forgetAll struct {
	hub    *cloudhub.Hub
	sync   *twins.Sync
	claims *ownership.Claims
}

func (f forgetAll) Forget(node string) {
	f.hub.Forget(node)
	f.sync.Forget(node)
	f.claims.Forget(node)
}

// addLink adds the link CA (loaded or created in namespace), the bootstrap
// endpoint and the cloudhub to mgr. Every replica runs them, with the twin
// sync, the memberships and the status writes of the nodes whose sessions
// it holds (package internal/controller/link/ownership decides which); the leader alone
// records whether Devices fit their models.
func addLink(ctx context.Context, mgr ctrl.Manager, cfg Config, reg prometheus.Registerer, log logr.Logger) error {
	lc := cfg.Link
	cs, err := kubernetes.NewForConfig(mgr.GetConfig())
	if err != nil {
		return err
	}
	// The Secrets are read through a client of their own: the manager's
	// would cache every Secret of the cluster.
	secrets := cs.CoreV1().Secrets(cfg.Namespace)
	ca, err := bootstrap.LoadOrCreateCA(ctx, secrets, lc.CAValidity)
	if err != nil {
		return fmt.Errorf("link CA: %w", err)
	}
	live := mgr.GetAPIReader()
	auth, err := linkauth.NewServer(linkauth.Config{
		CA: ca, Tokens: linkauth.NewTokens(secrets), CertValidity: lc.CertValidity,
		Hosts: lc.Hosts, ServerCertValidity: 30 * 24 * time.Hour, Addr: lc.AuthAddr,
		Metrics:      linkauth.NewMetrics(reg),
		RequestRate:  lc.AuthRateLimit,
		RequestBurst: lc.AuthRateBurst,
		// Agents of a DaemonSet join with their pod's service account token.
		TokenReviews:         cs.AuthenticationV1().TokenReviews(),
		AgentServiceAccounts: lc.AgentServiceAccounts,
		// A node removed from the cluster cannot keep renewing.
		NodeAllowed: func(ctx context.Context, node string) (bool, error) {
			err := live.Get(ctx, client.ObjectKey{Name: node}, &corev1.Node{})
			if apierrors.IsNotFound(err) {
				return false, nil
			}
			return err == nil, err
		},
	})
	if err != nil {
		return err
	}
	// The link's listeners failing (an address in use) is the link's
	// failure, not the controller's: contained, each is logged, counted and
	// retried, and fails only the "link" readiness check meanwhile, while
	// brokers go on. Every replica serves the bootstrap endpoint and the
	// hub: the link's Service selects every ready replica.
	failures := contain.NewFailures(reg, "dowse_controller")
	authPart := &contain.Part{Name: "link-auth", Log: log, Failures: failures, Run: func(ctx context.Context) error {
		return auth.Start(logr.NewContext(ctx, log))
	}}
	if err := mgr.Add(authPart); err != nil {
		return err
	}

	// The hub serves the bootstrap endpoint's certificate, re-issued with it.
	tlsCfg := pki.ServerTLSConfig(auth.ServerCertificate, ca.Pool())
	if err := mgr.GetFieldIndexer().IndexField(ctx, &v1alpha1.Instance{}, edges.NodeIndex, edges.IndexByNode); err != nil {
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
	var members *edges.Memberships
	var departures *edges.Departures
	var twinSync *twins.Sync
	var hub *cloudhub.Hub
	var presence *ownership.Presence
	var claims *ownership.Claims
	twinMetrics := twins.NewMetrics(reg)
	status := twins.NewStatus(mgr.GetClient(), mgr.GetClient(), committer(func(node string, pos cloudhub.Position) { hub.Commit(node, pos) }),
		twins.StatusConfig{Interval: lc.TwinStatusInterval, Concurrency: lc.TwinStatusConcurrency, Live: mgr.GetAPIReader(),
			// A newer session wrote one of the node's Devices: close the
			// older one here now rather than when the watch tells.
			OnFenced: func(node string, through uint64) { claims.Fenced(node, through) }},
		twinMetrics, log.WithName("twins"))

	// A node's session is this replica's from the moment it claims the
	// node's record; when another replica claims it, this one closes its
	// session and drops what it took of it and did not write.
	cache := mgr.GetClient()
	claims, err = ownership.NewClaims(ownership.ClaimsConfig{
		Leases: cs.CoordinationV1().Leases(cfg.Namespace), Replica: lc.Replica, MaxInFlight: lc.MaxClaimsInFlight,
		NodeUID: func(ctx context.Context, node string) (types.UID, error) {
			var n corev1.Node
			err := cache.Get(ctx, client.ObjectKey{Name: node}, &n)
			return n.UID, err
		},
		Lost: func(node string, through uint64) {
			if hub.Evict(node, through) {
				status.Release(node)
				twinSync.Forget(node)
				members.Forget(node)
				log.Info("another replica took the node's session; closed it here", "node", node, "epoch", through)
			}
		},
		Metrics: ownership.NewMetrics(reg),
		Log:     log.WithName("ownership"),
	})
	if err != nil {
		return err
	}
	hub, err = cloudhub.New(cloudhub.Config{
		WebSocketAddr: lc.WebSocketAddr, QUICAddr: lc.QUICAddr, TLS: tlsCfg,
		Heartbeat: lc.Heartbeat, MaxFrame: lc.MaxMessageSize, QueueSize: lc.QueueSize,
		RateLimit: lc.RateLimit, RateBurst: lc.RateBurst, MaxConnections: lc.MaxConnections,
		DrainPeriod: lc.DrainPeriod,
		CanDrain:    func() bool { return presence.Others() > 0 },
		SendOn:      func(sessions int) bool { return presence.RoomElsewhere(sessions) },
		// A node that (re)connects learns which devices are its.
		OnConnect: func(ctx context.Context, node string) {
			members.OnConnect(ctx, node)
			twinSync.OnConnect(ctx, node)
		},
		// Reports are acknowledged once they are in Device.status, not
		// when taken: nothing is lost if the controller dies in between.
		ManualCommit: true,
		// Only nodes of the cluster: a deleted Node's certificate, still
		// valid, no longer gets in.
		NodeAllowed: func(ctx context.Context, node string) (bool, error) { return departures.Allowed(ctx, node) },
		Claim:       claims.Claim,
	}, edges.Authorizer{Reader: mgr.GetClient()}, status.Handle, reg)
	if err != nil {
		return err
	}
	members = edges.NewMemberships(mgr.GetClient(), hub, log.WithName("membership"))
	if err := members.SetupWithManager(mgr); err != nil {
		return err
	}
	twinSync = twins.NewSync(mgr.GetClient(), mgr.GetAPIReader(), hub, status, twinMetrics, log.WithName("twin-sync"))
	if err := twinSync.SetupWithManager(mgr); err != nil {
		return err
	}
	if err := twins.NewValidity(mgr.GetClient(), mgr.GetClient(), mgr.GetAPIReader(), log.WithName("device-validity")).SetupWithManager(mgr); err != nil {
		return err
	}
	if err := mgr.Add(status); err != nil {
		return err
	}
	departures = edges.NewDepartures(mgr.GetClient(), forgetAll{hub, twinSync, claims}, members, log.WithName("departures"))
	if err := departures.SetupWithManager(mgr); err != nil {
		return err
	}
	ownPart := &contain.Part{Name: "link-ownership", Log: log, Failures: failures, Run: func(ctx context.Context) error {
		return claims.Start(ctx)
	}}
	if err := mgr.Add(ownPart); err != nil {
		return err
	}
	presence, err = ownership.NewPresence(ownership.PresenceConfig{
		Leases: cs.CoordinationV1().Leases(cfg.Namespace), Replica: lc.Replica,
		Sessions: hub.Connected, Draining: hub.Draining,
		Move:       func(node string, delay time.Duration) bool { return hub.Move(node, delay, "rebalance") },
		Every:      lc.SpreadInterval,
		Log:        log.WithName("spread"),
		Registerer: reg,
	})
	if err != nil {
		return err
	}
	if err := mgr.Add(&contain.Part{Name: "link-spread", Log: log, Failures: failures, Run: func(ctx context.Context) error {
		select {
		case <-hub.Ready():
		case <-ctx.Done():
			return nil
		}
		return presence.Start(ctx)
	}}); err != nil {
		return err
	}
	hubPart := &contain.Part{Name: "cloudhub", Log: log, Failures: failures, Run: func(ctx context.Context) error {
		if !mgr.GetCache().WaitForCacheSync(ctx) {
			return errors.New("cache never synced")
		}
		log.Info("starting cloudhub", "websocket", lc.WebSocketAddr, "quic", lc.QUICAddr, "replica", lc.Replica)
		return hub.Start(logr.NewContext(ctx, log))
	}}
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
