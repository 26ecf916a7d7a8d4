package handler

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/go-logr/logr"
	"google.golang.org/grpc"

	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
)

// Server serves one Discoverer to the agent on the node and keeps it
// registered. Make one with NewServer and run it with Start.
type Server struct {
	cfg        Config
	socketPath string
	log        logr.Logger

	// reregister asks the registration loop for another registration. It
	// holds at most one pending request: requests that arrive while one is
	// pending say nothing new and are dropped.
	reregister chan string

	started atomic.Bool
	metrics *metrics
	// streams numbers Discover streams, so that the log lines of one stream
	// can be told from another's.
	streams atomic.Uint64
}

// NewServer checks cfg and returns a Server that has not started yet.
func NewServer(cfg Config) (*Server, error) {
	sock, err := cfg.validateAndDefault()
	if err != nil {
		return nil, fmt.Errorf("invalid handler config: %w", err)
	}
	return &Server{
		cfg:        cfg,
		socketPath: sock,
		log:        cfg.Logger.WithValues("handler", cfg.Name, "endpoint", sock),
		reregister: make(chan string, 1),
		metrics:    newMetrics(cfg.Name),
	}, nil
}

// Metrics is an http.Handler writing the Server's metrics in the Prometheus
// text format, as served on Config.MetricsAddr.
func (s *Server) Metrics() http.Handler { return s.metrics }

// Endpoint is the absolute path of the Unix socket the Server listens on and
// registers with the agent.
func (s *Server) Endpoint() string { return s.socketPath }

// Start serves DiscoveryHandler on the handler's socket, registers with the
// agent and keeps the registration alive, until ctx ends or a fatal error
// occurs. It blocks, returns nil when ctx ends, and removes its socket
// before returning. A Server can be started once.
//
// Fatal errors: the socket cannot be created, the state directory cannot be
// watched, the agent rejects the registration as invalid (nothing the
// handler can change at run time), or the handler's socket is removed by
// someone else (the agent could no longer reach the handler; exiting lets
// the container restart and come back reachable).
func (s *Server) Start(ctx context.Context) error {
	if !s.started.CompareAndSwap(false, true) {
		return errors.New("handler server already started")
	}
	// A fatal error from any part stops the others. It is kept apart from
	// the context's cause, which is the parent's when the parent ended (a
	// signal, for signal.NotifyContext) and is no failure of the Server.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var fatal error
	var fatalOnce sync.Once
	fail := func(err error) {
		fatalOnce.Do(func() { fatal = err })
		cancel()
	}

	if err := os.MkdirAll(s.cfg.SocketDir, 0o750); err != nil {
		return fmt.Errorf("creating state directory: %w", err)
	}

	// Watch before registering: a registration socket recreated between the
	// first registration and the watch would otherwise go unnoticed.
	watcher, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watching state directory: %w", err)
	}
	defer watcher.Close()
	if err := watcher.Add(s.cfg.SocketDir); err != nil {
		return fmt.Errorf("watching state directory %s: %w", s.cfg.SocketDir, err)
	}

	lis, socketInfo, err := s.listen()
	if err != nil {
		return err
	}
	defer s.removeSocket(socketInfo)

	grpcServer := grpc.NewServer()
	discoveryv1.RegisterDiscoveryHandlerServer(grpcServer, &discoveryService{server: s, runCtx: ctx})

	var wg sync.WaitGroup
	wg.Go(func() {
		if err := grpcServer.Serve(lis); err != nil {
			fail(fmt.Errorf("serving discovery handler: %w", err))
		}
	})
	wg.Go(func() {
		if err := s.watchStateDir(ctx, watcher, socketInfo); err != nil {
			fail(err)
		}
	})
	wg.Go(func() {
		if err := s.registerLoop(ctx); err != nil {
			fail(err)
		}
	})
	if s.cfg.MetricsAddr != "" {
		wg.Go(func() { s.serveMetrics(ctx, s.cfg.MetricsAddr) })
	}
	s.log.Info("serving discovery handler", "shared", s.cfg.Shared)
	if a, ok := s.cfg.Discoverer.(Announcer); ok {
		a.Announce(s.log)
	}

	<-ctx.Done()
	s.stopGRPC(grpcServer)
	wg.Wait()

	if fatal != nil {
		return fatal
	}
	s.log.Info("discovery handler stopped")
	return nil
}

// listen replaces any stale file at the socket path and listens there. It
// returns the socket's FileInfo so that removeSocket can tell whether the
// file at the path is still this listener's.
func (s *Server) listen() (net.Listener, os.FileInfo, error) {
	if err := os.Remove(s.socketPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, nil, fmt.Errorf("removing stale handler socket: %w", err)
	}
	lis, err := net.Listen("unix", s.socketPath)
	if err != nil {
		return nil, nil, fmt.Errorf("listening on handler socket: %w", err)
	}
	// Only the handler's (and the agent's) user and group may discover.
	if err := os.Chmod(s.socketPath, 0o660); err != nil {
		lis.Close()
		return nil, nil, fmt.Errorf("restricting handler socket: %w", err)
	}
	// Go unlinks a Unix socket's path when its listener closes, whoever owns
	// the path by then. A successor with the same name and pid (a container
	// restarted while this one shuts down) may have replaced it, so removal
	// is left to removeSocket, which checks first.
	if ul, ok := lis.(*net.UnixListener); ok {
		ul.SetUnlinkOnClose(false)
	}
	info, err := os.Stat(s.socketPath)
	if err != nil {
		lis.Close()
		return nil, nil, fmt.Errorf("checking handler socket: %w", err)
	}
	return lis, info, nil
}

func (s *Server) removeSocket(ours os.FileInfo) {
	info, err := os.Stat(s.socketPath)
	if err != nil || !os.SameFile(info, ours) {
		return
	}
	if err := os.Remove(s.socketPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		s.log.Error(err, "could not remove handler socket")
	}
}

// stopGRPC lets open streams end: they see the Server's context end, and
// their Discoverers return, so GracefulStop normally finishes at once. A
// Discoverer that does not return in time is cut off.
func (s *Server) stopGRPC(grpcServer *grpc.Server) {
	done := make(chan struct{})
	go func() {
		grpcServer.GracefulStop()
		close(done)
	}()
	timer := time.NewTimer(s.cfg.ShutdownTimeout)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		s.log.Info("open Discover streams did not end in time, closing them", "timeout", s.cfg.ShutdownTimeout.String())
		grpcServer.Stop()
		<-done
	}
}

// requestRegistration asks for another registration, giving the reason for
// the log.
func (s *Server) requestRegistration(reason string) {
	select {
	case s.reregister <- reason:
	default:
	}
}

// Serve builds a Server from cfg and runs it until ctx ends: what most
// handler packages' Run needs.
func Serve(ctx context.Context, cfg Config) error {
	srv, err := NewServer(cfg)
	if err != nil {
		return err
	}
	return srv.Start(ctx)
}
