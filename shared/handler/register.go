package handler

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/dowse-dev/dowse/internal/backoff"
	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
)

// Reasons for a registration, logged with it.
const (
	reasonStartup       = "startup"
	reasonAgentSocket   = "registration socket created"
	reasonStreamGone    = "discover stream closed by the agent"
	reasonEventOverflow = "state directory events lost"
)

// registerLoop registers at startup and again on every request, retrying
// each registration until it succeeds. It returns nil when ctx ends and an
// error only when the agent rejects the registration as invalid.
func (s *Server) registerLoop(ctx context.Context) error {
	reason := reasonStartup
	for {
		if err := s.registerUntilDone(ctx, reason); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case reason = <-s.reregister:
		}
	}
}

// registerUntilDone calls the agent until a registration succeeds, backing
// off exponentially between failures. A request for registration that
// arrives meanwhile (the agent's socket has just appeared) cuts the wait
// short and resets the backoff, so a restarted agent hears from its handlers
// at once rather than after the longest backoff.
func (s *Server) registerUntilDone(ctx context.Context, reason string) error {
	retry := backoff.Backoff{Initial: s.cfg.RetryInitial, Max: s.cfg.RetryMax}
	for attempt := 1; ; attempt++ {
		err := s.register(ctx)
		if err == nil {
			s.metrics.registrations.Add(1)
			s.log.Info("registered with agent", "reason", reason, "attempt", attempt)
			return nil
		}
		if ctx.Err() != nil {
			return nil
		}
		s.metrics.registerFails.Add(1)
		if status.Code(err) == codes.InvalidArgument {
			return fmt.Errorf("agent rejected the registration of handler %q: %w", s.cfg.Name, err)
		}
		// Unavailable (no agent yet, or it is shutting down) is the usual
		// case; anything else is retried too, as the agent may be midway
		// through a restart.
		wait := retry.Next()
		s.log.Info("registration failed, will retry", "reason", reason, "attempt", attempt, "backoff", wait.String(), "err", err)

		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil
		case newReason := <-s.reregister:
			timer.Stop()
			reason = newReason
			retry.Reset()
		case <-timer.C:
		}
	}
}

// register makes one registration call over a fresh connection. A
// connection kept from an earlier agent would sit in gRPC's own reconnect
// backoff (up to two minutes) after the agent restarts and fail every call
// fast meanwhile; registrations are rare, so a new connection each time
// costs nothing and always dials the agent that is there now.
func (s *Server) register(ctx context.Context) error {
	conn, err := grpc.NewClient("unix://"+filepath.Join(s.cfg.SocketDir, RegistrationSocketName),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()

	ctx, cancel := context.WithTimeout(ctx, s.cfg.RegisterTimeout)
	defer cancel()
	_, err = discoveryv1.NewRegistrationClient(conn).RegisterDiscoveryHandler(ctx, &discoveryv1.RegisterDiscoveryHandlerRequest{
		Name:         s.cfg.Name,
		Endpoint:     s.socketPath,
		EndpointType: discoveryv1.RegisterDiscoveryHandlerRequest_UDS,
		Shared:       s.cfg.Shared,
	})
	return err
}

// watchStateDir turns changes in the state directory into registrations: a
// registration socket that is created means a (re)started agent that may not
// know this handler. It returns an error when the handler's own socket (ours)
// is removed or replaced, and nil when ctx ends.
func (s *Server) watchStateDir(ctx context.Context, watcher *fsnotify.Watcher, ours os.FileInfo) error {
	registrationSocket := filepath.Join(s.cfg.SocketDir, RegistrationSocketName)
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-watcher.Events:
			if !ok {
				return nil
			}
			switch filepath.Clean(ev.Name) {
			case registrationSocket:
				if ev.Has(fsnotify.Create) {
					s.requestRegistration(reasonAgentSocket)
				}
			case s.socketPath:
				// Events may be about the stale file Start replaced, or
				// about the creation of ours; only a path that no longer
				// leads to our socket matters.
				if info, err := os.Stat(s.socketPath); err != nil || !os.SameFile(info, ours) {
					return fmt.Errorf("handler socket %s was removed or replaced, the agent can no longer reach this handler", s.socketPath)
				}
			}
		case err, ok := <-watcher.Errors:
			if !ok {
				return nil
			}
			if errors.Is(err, fsnotify.ErrEventOverflow) {
				// A lost event may have been the agent's new socket.
				s.requestRegistration(reasonEventOverflow)
				continue
			}
			s.log.Error(err, "watching state directory failed")
		}
	}
}
