package registration

import (
	"context"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/dowse-dev/dowse/agent/registry"
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
	s := New(dir, registry.New(dir), logr.Discard())
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
	if err := os.Remove(filepath.Join(dir, SocketName)); err != nil {
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
