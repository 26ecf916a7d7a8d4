package agent

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/dowse-dev/dowse/internal/agent/edgecert"
	"github.com/dowse-dev/dowse/internal/agent/edgehub"
	"github.com/dowse-dev/dowse/internal/agent/edgereach"
	"github.com/dowse-dev/dowse/internal/link/pki"
	"github.com/dowse-dev/dowse/internal/optional"
	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
)

// LinkConfig is the node's end of the cloud/edge link; the link is off
// when Server is empty.
type LinkConfig struct {
	// Server is the cloudhub's host:port; Transport is "websocket" or "quic".
	Server, Transport string
	// Servers are more cloudhub addresses (its replicas'), see
	// edgehub.Config.Servers.
	Servers []string
	// AuthURL is the controller's bootstrap and renewal endpoint,
	// https://host:port.
	AuthURL string
	// Token, with CAPin (sha256:...) or CAFile, bootstraps the node's
	// certificate once (dowsectl token create); afterwards the credentials
	// under <state dir>/link are used and renewed.
	Token, CAPin, CAFile string
	// ServiceAccountTokenFile, instead of Token, bootstraps with the agent
	// pod's projected service account token (one DaemonSet, every node its
	// own identity).
	ServiceAccountTokenFile string
	Heartbeat               time.Duration
	// StoreMaxEntries and StoreMaxBytes bound what the edge store keeps
	// unacknowledged while offline.
	StoreMaxEntries, StoreMaxBytes int
}

// addLink adds the node's credentials and its edgehub to mgr. Bad settings
// fail the start; a token the cloud refuses only stops the link (logged and
// counted), never discovery.
func addLink(mgr manager.Manager, cfg Config, reg prometheus.Registerer, log logr.Logger) error {
	lc := cfg.Link
	if lc.AuthURL == "" {
		return errors.New("the link needs the controller's bootstrap endpoint (--link-auth-url)")
	}
	var caPEM []byte
	if lc.CAFile != "" {
		var err error
		if caPEM, err = os.ReadFile(lc.CAFile); err != nil {
			return fmt.Errorf("link CA file: %w", err)
		}
	}
	host, _, err := net.SplitHostPort(lc.Server)
	if err != nil {
		return fmt.Errorf("link server %q: %w", lc.Server, err)
	}
	certs, err := edgecert.New(edgecert.Config{
		Dir: filepath.Join(cfg.StateDir, "link"), Node: cfg.NodeName, URL: lc.AuthURL,
		Token: lc.Token, ServiceAccountTokenFile: lc.ServiceAccountTokenFile, CAPin: lc.CAPin, CAPEM: caPEM, Metrics: edgecert.NewMetrics(reg),
	})
	if err != nil {
		return err
	}
	log = log.WithName("link")
	if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		err := certs.Start(logr.NewContext(ctx, log.WithName("credentials")))
		var refused *edgecert.Refused
		if errors.As(err, &refused) {
			log.Error(err, "the cloud refused this node's credentials; the link stays down until the agent restarts with a new token (dowsectl token create)")
			return nil
		}
		return err
	})); err != nil {
		return err
	}
	// The edge's store or link failing is the link's failure, not the
	// agent's: contained, it is logged, counted and retried, and fails only
	// the "link" readiness check meanwhile, while discovery goes on.
	partReg := optional.Reregistering(reg)
	// What the cloud may reach through the link: this node's kubelet and
	// its pods, nothing else of the edge's network.
	reach := edgereach.New(cfg.NodeName, mgr.GetAPIReader(), reg)
	edge := &optional.Part{Name: "edgehub", Log: log, Failures: optional.NewFailures(reg, "dowse_agent"), Run: func(ctx context.Context) error {
		reg := partReg // each run registers its metrics again
		// The store, and the mapper API on it, serve from the start; the
		// link waits for the node's credentials (an expired certificate
		// with the cloud down keeps only the link down: reports wait in
		// the store). The CA joins the pool before the first dial.
		roots := x509.NewCertPool()
		hub, err := edgehub.New(edgehub.Config{
			Node: cfg.NodeName, Transport: lc.Transport, Server: lc.Server, Servers: lc.Servers,
			TLS:      pki.ClientTLSConfig(certs.GetClientCertificate, roots, host),
			StateDir: cfg.StateDir, Heartbeat: lc.Heartbeat,
			StoreMaxEntries: lc.StoreMaxEntries, StoreMaxBytes: lc.StoreMaxBytes,
			// Refused with its certificate (issued to an earlier Node of
			// this name): new credentials may get it in.
			OnRefused: func(code linkv1.Error_Code) {
				if code == linkv1.Error_PERMISSION_DENIED {
					certs.RenewNow()
				}
			},
			Reach: reach.Dial,
		}, func(ctx context.Context, env *linkv1.Envelope) {
			if m := env.GetDeviceMembership(); m != nil {
				log.Info("device membership from the cloud", "devices", len(m.Devices))
			}
		}, reg)
		if err != nil {
			return err
		}
		defer hub.Close()
		mappers := startMappers(cfg, hub, reg, log)
		return runEdge(logr.NewContext(ctx, log), mappers, func(ctx context.Context) error {
			select {
			case <-certs.Ready():
			case <-ctx.Done():
				return nil
			}
			roots.AddCert(certs.CA())
			log.Info("starting edgehub", "server", lc.Server, "servers", lc.Servers, "transport", lc.Transport)
			return hub.Start(ctx)
		})
	}}
	if err := mgr.AddReadyzCheck("link", edge.Check); err != nil {
		return err
	}
	return mgr.Add(edge)
}
