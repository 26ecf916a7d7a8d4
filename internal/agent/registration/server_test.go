package registration

import (
	"context"
	"errors"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/dowse-dev/dowse/internal/agent/registry"
	"github.com/dowse-dev/dowse/internal/agent/socketdir"
	"github.com/dowse-dev/dowse/internal/nodepaths"
	discoveryv0 "github.com/dowse-dev/dowse/proto/discovery/v0"
	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
)

// The readiness check passes once the socket is served; the liveness
// check fails once the socket no longer answers (here: removed under the
// agent, so no handler could register).
func TestHealthChecksFollowTheSocket(t *testing.T) {
	dir, err := os.MkdirTemp("", "reg")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	s := New(dir, socketdir.NoGroup, registry.New(dir), logr.Discard())
	req := httptest.NewRequest("GET", "/readyz", nil)
	if s.Ready(req) == nil {
		t.Fatal("ready before serving")
	}
	if err := s.Healthy(req); err != nil {
		t.Fatalf("a server not started yet is not wedged: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Start(ctx) }()
	deadline := time.Now().Add(5 * time.Second)
	for s.Ready(req) != nil {
		if time.Now().After(deadline) {
			t.Fatal("never ready")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := s.Healthy(req); err != nil {
		t.Fatalf("healthy server: %v", err)
	}
	if err := os.Remove(filepath.Join(nodepaths.DiscoveryDir(dir), SocketName)); err != nil {
		t.Fatal(err)
	}
	if s.Healthy(req) == nil {
		t.Fatal("a removed socket passed the liveness check")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// An Akri discovery handler dials agent-registration.sock (Akri's name) and
// registers under Akri's v0 service, with its network endpoint in Akri's
// http://host:port form; the agent records it as Dowse's own socket does.
func TestAkriRegistrationSocket(t *testing.T) {
	dir, err := os.MkdirTemp("", "reg")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	reg := registry.New(dir)
	s := New(dir, socketdir.NoGroup, reg, logr.Discard())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Start(ctx) }()
	deadline := time.Now().Add(5 * time.Second)
	for s.Ready(httptest.NewRequest("GET", "/readyz", nil)) != nil {
		if time.Now().After(deadline) {
			t.Fatal("never ready")
		}
		time.Sleep(5 * time.Millisecond)
	}
	for _, name := range []string{SocketName, AkriSocketName} {
		fi, err := os.Stat(filepath.Join(nodepaths.DiscoveryDir(dir), name))
		if err != nil {
			t.Fatal(err)
		}
		if perm := fi.Mode().Perm(); perm != 0o660 {
			t.Fatalf("%s has mode %v: only the agent's user and group may register", name, perm)
		}
	}
	conn, err := grpc.NewClient("unix://"+filepath.Join(nodepaths.DiscoveryDir(dir), AkriSocketName), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
	defer rcancel()
	for _, req := range []*discoveryv1.RegisterDiscoveryHandlerRequest{
		{Name: "akri-uds", Endpoint: filepath.Join(dir, "akri-uds.sock"), EndpointType: discoveryv1.RegisterDiscoveryHandlerRequest_UDS},
		{Name: "akri-net", Endpoint: "http://10.1.2.3:10000", EndpointType: discoveryv1.RegisterDiscoveryHandlerRequest_NETWORK, Shared: true},
	} {
		if _, err := discoveryv0.NewRegistrationClient(conn).RegisterDiscoveryHandler(rctx, req); err != nil {
			t.Fatalf("registering %s on %s: %v", req.GetName(), AkriSocketName, err)
		}
	}
	if h, ok := reg.Get("akri-uds"); !ok || h.Protocol != registry.ProtocolV0 || h.EndpointType != registry.UDS {
		t.Errorf("akri-uds registered as %+v", h)
	}
	if h, ok := reg.Get("akri-net"); !ok || h.Protocol != registry.ProtocolV0 || h.Endpoint != "10.1.2.3:10000" || !h.Shared {
		t.Errorf("akri-net registered as %+v", h)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{SocketName, AkriSocketName} {
		if _, err := os.Stat(filepath.Join(nodepaths.DiscoveryDir(dir), n)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left behind after stopping (%v)", n, err)
		}
	}
}

// A state directory too long for Akri's longer socket name still serves
// Dowse's own socket: Akri's name is never a reason to stop registration.
func TestAkriSocketTooLongIsNotFatal(t *testing.T) {
	base, err := os.MkdirTemp("", "reg")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(base) })
	// 107 bytes fit in a socket path: registration.sock fits, Akri's not.
	pad := 107 - len(base) - len("/") - len("/"+nodepaths.DiscoverySubdir) - len("/"+SocketName)
	if pad < 1 {
		t.Skipf("temp dir %s too long for this test", base)
	}
	dir := filepath.Join(base, strings.Repeat("d", pad))
	if len(filepath.Join(nodepaths.DiscoveryDir(dir), AkriSocketName)) <= 107 || len(filepath.Join(nodepaths.DiscoveryDir(dir), SocketName)) > 107 {
		t.Fatalf("bad test dir %s", dir)
	}
	s := New(dir, socketdir.NoGroup, registry.New(dir), logr.Discard())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Start(ctx) }()
	deadline := time.Now().Add(5 * time.Second)
	for s.Ready(httptest.NewRequest("GET", "/readyz", nil)) != nil {
		select {
		case err := <-done:
			t.Fatalf("Start failed: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("never ready")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := s.Healthy(httptest.NewRequest("GET", "/healthz", nil)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(nodepaths.DiscoveryDir(dir), AkriSocketName)); err == nil {
		t.Error("a socket path longer than 107 bytes was served")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
