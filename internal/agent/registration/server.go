// Package registration serves the agent's registration socket, where
// discovery handlers announce themselves (Dowse's v1 protocol and Akri's v0).
package registration

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/dowse-dev/dowse/internal/agent/peercred"
	"github.com/dowse-dev/dowse/internal/agent/registry"
	"github.com/dowse-dev/dowse/internal/agent/socketdir"
	"github.com/dowse-dev/dowse/internal/nodepaths"
	discoveryv0 "github.com/dowse-dev/dowse/proto/discovery/v0"
	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
)

// SocketName is the registration socket's file name inside the state dir.
const SocketName = nodepaths.RegistrationSocket

// AkriSocketName is the name Akri's agent serves registration on, which
// Akri's discovery handlers (discovery-utils) dial in
// DISCOVERY_HANDLERS_DIRECTORY. The agent serves both, so that an Akri
// handler container mounting the state directory registers unchanged.
const AkriSocketName = nodepaths.AkriRegistrationSocket

// Server serves Registration on <state-dir>/registration.sock and
// <state-dir>/agent-registration.sock (one gRPC server on both).
type Server struct {
	socketPath string
	akriPath   string
	group      int
	registry   *registry.Registry
	log        logr.Logger
	serving    atomic.Bool
}

// New makes a Server that records registrations in reg, serving in
// stateDir's discovery folder, which members of group (socketdir) may use.
func New(stateDir string, group int, reg *registry.Registry, log logr.Logger) *Server {
	dir := nodepaths.DiscoveryDir(stateDir)
	return &Server{socketPath: filepath.Join(dir, SocketName), akriPath: filepath.Join(dir, AkriSocketName), group: group, registry: reg, log: log}
}

// Start serves until ctx ends. It replaces a stale socket left by an earlier
// agent; handlers notice the new socket and register again.
func (s *Server) Start(ctx context.Context) error {
	if err := socketdir.Prepare(filepath.Dir(s.socketPath), s.group); err != nil {
		return err
	}
	var listeners []net.Listener
	for _, p := range []string{s.socketPath, s.akriPath} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			closeAll(listeners)
			return fmt.Errorf("removing stale registration socket: %w", err)
		}
		lis, err := net.Listen("unix", p)
		if err != nil && p == s.akriPath {
			// Akri's name is a convenience for Akri's handlers: without it
			// (a state directory too long for its longer name, say) Dowse's
			// own socket still serves every handler.
			s.log.Error(err, "akri's registration socket not served", "socket", p)
			continue
		}
		if err != nil {
			closeAll(listeners)
			return fmt.Errorf("listening on registration socket: %w", err)
		}
		// Only the agent's user and the socket group may register a
		// handler.
		if err := socketdir.Socket(p, s.group); err != nil {
			closeAll(append(listeners, lis))
			return err
		}
		listeners = append(listeners, lis)
	}
	// The kernel's word on who registers (peercred): names stay with their
	// processes.
	srv := grpc.NewServer(grpc.Creds(peercred.Creds{}))
	discoveryv1.RegisterRegistrationServer(srv, &v1Server{s: s})
	discoveryv0.RegisterRegistrationServer(srv, &v0Server{s: s})
	// The agent's own health checks ask it through the socket.
	healthpb.RegisterHealthServer(srv, health.NewServer())
	errc := make(chan error, len(listeners))
	for _, lis := range listeners {
		go func() { errc <- srv.Serve(lis) }()
	}
	s.serving.Store(true)
	defer s.serving.Store(false)
	s.log.Info("serving registration", "socket", s.socketPath, "akriSocket", s.akriPath)
	select {
	case <-ctx.Done():
		srv.Stop()
		_ = os.Remove(s.socketPath)
		_ = os.Remove(s.akriPath)
		return nil
	case err := <-errc:
		srv.Stop()
		return fmt.Errorf("registration server: %w", err)
	}
}

func closeAll(ls []net.Listener) {
	for _, l := range ls {
		_ = l.Close()
	}
}

// Ready is a readiness check: nil once the socket is served.
func (s *Server) Ready(*http.Request) error {
	if !s.serving.Load() {
		return errors.New("registration socket not served yet")
	}
	return nil
}

// Healthy is a liveness check: once the socket is served, it must answer
// through its path within a second. A wedged server, or a socket file
// removed under the agent (handlers could no longer register), fails it,
// and a restart makes the socket anew.
func (s *Server) Healthy(req *http.Request) error {
	if !s.serving.Load() {
		return nil // not started, or stopping: not wedged
	}
	ctx, cancel := context.WithTimeout(req.Context(), time.Second)
	defer cancel()
	conn, err := grpc.NewClient("unix://"+s.socketPath, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		return fmt.Errorf("registration socket %s does not answer: %w", s.socketPath, err)
	}
	return nil
}

func (s *Server) register(ctx context.Context, req *discoveryv1.RegisterDiscoveryHandlerRequest, proto registry.Protocol) (*discoveryv1.Empty, error) {
	h := registry.Handler{
		Name:         req.GetName(),
		Endpoint:     req.GetEndpoint(),
		EndpointType: registry.EndpointType(req.GetEndpointType()),
		Shared:       req.GetShared(),
		Protocol:     proto,
		Registrant:   peercred.FromContext(ctx),
	}
	if err := s.mayTake(ctx, h); err != nil {
		s.log.Info("refused a registration under a name another live process holds", "name", h.Name, "caller", h.Registrant.String(), "reason", err.Error())
		return nil, status.Errorf(codes.PermissionDenied, "handler %q: %v", h.Name, err)
	}
	if err := s.registry.Register(h); err != nil {
		var inv *registry.InvalidError
		if errors.As(err, &inv) {
			s.log.Info("refused handler registration", "name", h.Name, "endpoint", h.Endpoint, "reason", inv.Reason)
			return nil, status.Error(codes.InvalidArgument, inv.Reason)
		}
		return nil, status.Error(codes.Internal, err.Error())
	}
	s.log.V(1).Info("handler registered", "name", h.Name, "endpoint", h.Endpoint, "shared", h.Shared, "protocol", proto)
	return &discoveryv1.Empty{}, nil
}

// mayTake says whether h's registrant may register under h's name: a
// name stays with the process that registered it while that process still
// serves the socket it registered (a handler restarted on a new socket
// takes its name back); another process, on the same registration socket
// (its folder is shared by every handler of the node), may not take it
// and answer the name's Configurations with devices of its own.
func (s *Server) mayTake(ctx context.Context, h registry.Handler) error {
	old, ok := s.registry.Get(h.Name)
	if !ok || !h.Registrant.Known || !old.Registrant.Known || old.Registrant.Same(h.Registrant) || old.EndpointType != registry.UDS {
		return nil
	}
	lctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	served, err := peercred.ListenerOf(lctx, old.Endpoint)
	if err != nil || served.Same(h.Registrant) {
		return nil // the old registration's socket is gone, or the caller serves it
	}
	return fmt.Errorf("the name is registered by %s, which still serves %s; a handler's name stays with the process that registered it while it lives", served.String(), old.Endpoint)
}

type v1Server struct {
	discoveryv1.UnimplementedRegistrationServer
	s *Server
}

func (v *v1Server) RegisterDiscoveryHandler(ctx context.Context, req *discoveryv1.RegisterDiscoveryHandlerRequest) (*discoveryv1.Empty, error) {
	return v.s.register(ctx, req, registry.ProtocolV1)
}

type v0Server struct {
	discoveryv0.UnimplementedRegistrationServer
	s *Server
}

func (v *v0Server) RegisterDiscoveryHandler(ctx context.Context, req *discoveryv1.RegisterDiscoveryHandlerRequest) (*discoveryv1.Empty, error) {
	return v.s.register(ctx, req, registry.ProtocolV0)
}
