package cluster

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestLockMachineWaitsForTheHolder(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cluster.lock")
	ctx := context.Background()
	held, err := lockMachine(ctx, path, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if f, err := lockMachine(ctx, path, 1500*time.Millisecond); err == nil || !strings.Contains(err.Error(), "only one can run") {
		t.Fatalf("second lock while held: %v, %v; want the held error", f, err)
	}
	// Released while the next one waits: it gets the lock.
	go func() {
		time.Sleep(500 * time.Millisecond)
		_ = held.Close()
	}()
	next, err := lockMachine(ctx, path, time.Minute)
	if err != nil {
		t.Fatalf("lock after the holder closed: %v", err)
	}
	_ = next.Close()
}
