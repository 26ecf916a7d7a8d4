// Package handlertest helps test discovery handlers against the real gRPC
// contract: a fake agent that accepts registrations on the registration
// socket, and a Discover client that reads a stream with deadlines.
package handlertest

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
	"github.com/dowse-dev/dowse/shared/handler"
)

// ShortTempDir returns a new directory removed when the test ends. Unix
// socket paths must fit in 107 bytes, and t.TempDir() paths, which contain
// the test's name, often do not.
func ShortTempDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "dowse")
	if err != nil {
		t.Fatalf("creating temp dir: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// Agent is a fake agent: it serves Registration on
// <stateDir>/registration.sock and records every request.
type Agent struct {
	discoveryv1.UnimplementedRegistrationServer

	socket string
	srv    *grpc.Server
	regs   chan *discoveryv1.RegisterDiscoveryHandlerRequest
	stop   sync.Once

	mu     sync.Mutex
	reject func(*discoveryv1.RegisterDiscoveryHandlerRequest) error
}

// StartAgent starts a fake agent in stateDir's discovery folder, where a
// handler of that state directory registers. It is stopped when the test
// ends.
func StartAgent(t testing.TB, stateDir string) *Agent {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(stateDir, "discovery"), 0o750); err != nil {
		t.Fatal(err)
	}
	a := &Agent{
		socket: filepath.Join(stateDir, "discovery", "registration.sock"),
		srv:    grpc.NewServer(),
		regs:   make(chan *discoveryv1.RegisterDiscoveryHandlerRequest, 100),
	}
	lis, err := net.Listen("unix", a.socket)
	if err != nil {
		t.Fatalf("fake agent: listening on %s: %v", a.socket, err)
	}
	discoveryv1.RegisterRegistrationServer(a.srv, a)
	go a.srv.Serve(lis)
	t.Cleanup(a.Stop)
	return a
}

// RegisterDiscoveryHandler records req, then answers with the error set by
// Reject, if any.
func (a *Agent) RegisterDiscoveryHandler(_ context.Context, req *discoveryv1.RegisterDiscoveryHandlerRequest) (*discoveryv1.Empty, error) {
	a.mu.Lock()
	reject := a.reject
	a.mu.Unlock()
	if reject != nil {
		if err := reject(req); err != nil {
			return nil, err
		}
	}
	select {
	case a.regs <- req:
	default: // a test that registers this often has failed already
	}
	return &discoveryv1.Empty{}, nil
}

// Reject makes the agent answer registrations with the error f returns; a
// nil error accepts the registration. Rejected registrations are not
// recorded.
func (a *Agent) Reject(f func(*discoveryv1.RegisterDiscoveryHandlerRequest) error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.reject = f
}

// Stop stops the agent as a crash would: connections close and the
// registration socket is removed.
func (a *Agent) Stop() {
	a.stop.Do(func() {
		a.srv.Stop()
		os.Remove(a.socket)
	})
}

// WaitForRegistration returns the next accepted registration, failing the
// test if none arrives within timeout.
func (a *Agent) WaitForRegistration(t testing.TB, timeout time.Duration) *discoveryv1.RegisterDiscoveryHandlerRequest {
	t.Helper()
	select {
	case req := <-a.regs:
		return req
	case <-time.After(timeout):
		t.Fatalf("fake agent: no registration within %v", timeout)
		return nil
	}
}

// NoRegistration fails the test if a registration arrives within d. Use it
// only to check that something does not happen.
func (a *Agent) NoRegistration(t testing.TB, d time.Duration) {
	t.Helper()
	select {
	case req := <-a.regs:
		t.Fatalf("fake agent: unexpected registration %v", req)
	case <-time.After(d):
	}
}

// Stream reads one Discover stream in the background.
type Stream struct {
	cancel context.CancelFunc
	msgs   chan *discoveryv1.DiscoverResponse
	done   chan struct{}
	err    error // set before done is closed
}

// Discover dials a handler's Unix socket endpoint, as the agent does, and
// opens a Discover stream. The stream is closed when the test ends.
func Discover(t testing.TB, endpoint string, req *discoveryv1.DiscoverRequest) *Stream {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("dialing handler at %s: %v", endpoint, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Stream{
		cancel: cancel,
		msgs:   make(chan *discoveryv1.DiscoverResponse, 100),
		done:   make(chan struct{}),
	}
	t.Cleanup(func() {
		cancel()
		<-s.done
		conn.Close()
	})
	go func() {
		defer close(s.done)
		stream, err := discoveryv1.NewDiscoveryHandlerClient(conn).Discover(ctx, req)
		if err != nil {
			s.err = err
			return
		}
		for {
			msg, err := stream.Recv()
			if err != nil {
				s.err = err
				return
			}
			s.msgs <- msg
		}
	}()
	return s
}

// Close cancels the stream, as the agent does when a Configuration goes
// away.
func (s *Stream) Close() { s.cancel() }

// Next returns the devices of the next message, failing the test if the
// stream ends or no message arrives within timeout.
func (s *Stream) Next(t testing.TB, timeout time.Duration) []*discoveryv1.Device {
	t.Helper()
	return s.NextResponse(t, timeout).GetDevices()
}

// NextResponse is Next with the whole message: the devices and the skipped
// candidates.
func (s *Stream) NextResponse(t testing.TB, timeout time.Duration) *discoveryv1.DiscoverResponse {
	t.Helper()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case msg := <-s.msgs:
		return msg
	case <-s.done:
		// Messages received before the end come first.
		select {
		case msg := <-s.msgs:
			return msg
		default:
		}
		t.Fatalf("discover stream ended instead of sending: %v", s.err)
	case <-timer.C:
		t.Fatalf("discover stream sent nothing within %v", timeout)
	}
	return nil
}

// Rest closes the stream and returns the messages it sent before it ended,
// failing the test if it has not ended within timeout.
func (s *Stream) Rest(t testing.TB, timeout time.Duration) []*discoveryv1.DiscoverResponse {
	t.Helper()
	s.cancel()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var out []*discoveryv1.DiscoverResponse
	for {
		select {
		case msg := <-s.msgs:
			out = append(out, msg)
		case <-s.done:
			for {
				select {
				case msg := <-s.msgs:
					out = append(out, msg)
				default:
					return out
				}
			}
		case <-timer.C:
			t.Fatalf("discover stream still open %v after it was closed", timeout)
		}
	}
}

// Err waits for the stream to end and returns its error, failing the test
// if it sends a message or is still open after timeout.
func (s *Stream) Err(t testing.TB, timeout time.Duration) error {
	t.Helper()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case msg := <-s.msgs:
		t.Fatalf("discover stream sent %v, want it to end", msg)
	case <-s.done:
		select {
		case msg := <-s.msgs:
			t.Fatalf("discover stream sent %v, want it to end", msg)
		default:
		}
		if s.err == nil {
			return errors.New("stream ended without error")
		}
		return s.err
	case <-timer.C:
		t.Fatalf("discover stream still open after %v", timeout)
	}
	return nil
}

// IDs returns the ids of devs, in order.
func IDs(devs []*discoveryv1.Device) []string {
	ids := make([]string, 0, len(devs))
	for _, d := range devs {
		ids = append(ids, d.GetId())
	}
	return ids
}

// Serve runs a handler of cfg until the test ends; the test fails when
// Serve returns an error, or does not return within 10 s of its context
// ending.
func Serve(t testing.TB, cfg handler.Config) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- handler.Serve(ctx, cfg) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s handler: Serve = %v", cfg.Name, err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("%s handler: Serve did not return within 10s of its context ending", cfg.Name)
		}
	})
}

// Run starts a fake agent in a new short state directory, serves a handler
// of cfg there until the test ends, and returns its registration.
func Run(t testing.TB, cfg handler.Config) *discoveryv1.RegisterDiscoveryHandlerRequest {
	t.Helper()
	cfg.StateDir = ShortTempDir(t)
	agent := StartAgent(t, cfg.StateDir)
	Serve(t, cfg)
	return agent.WaitForRegistration(t, 20*time.Second)
}
