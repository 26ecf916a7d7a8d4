package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"
)

// machineLockPath is where test clusters of every checkout on the machine
// take turns. Under /run: a reboot, which stops every cluster, clears it.
const machineLockPath = "/run/dowse-test-cluster.lock"

// lockMachine takes the lock file at path, waiting up to wait (30 minutes
// when zero) for the cluster that holds it to stop. The lock goes with the
// returned file: closed, or with the process.
func lockMachine(ctx context.Context, path string, wait time.Duration) (*os.File, error) {
	if wait == 0 {
		wait = 30 * time.Minute
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening the test-cluster lock: %w", err)
	}
	deadline := time.Now().Add(wait)
	told := false
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			_ = f.Close()
			return nil, fmt.Errorf("taking the test-cluster lock %s: %w", path, err)
		}
		if !told {
			fmt.Fprintf(os.Stderr, "waiting up to %s for another test cluster on this machine to stop (%s)\n", wait, path)
			told = true
		}
		if time.Now().After(deadline) {
			_ = f.Close()
			return nil, fmt.Errorf("another test cluster held %s for %s: only one can run on a machine", path, wait)
		}
		select {
		case <-ctx.Done():
			_ = f.Close()
			return nil, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}
