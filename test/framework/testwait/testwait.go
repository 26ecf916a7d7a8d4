// Package testwait is the tests' one wait for something that happens
// eventually: a condition polled until it holds or time runs out.
package testwait

import (
	"testing"
	"time"
)

// Interval is how often For polls: often enough that a test is not slowed
// by it, seldom enough to leave the shared CPU to the code under test.
const Interval = 20 * time.Millisecond

// For polls f until it returns nil, and fails t with f's last error when
// timeout passes first.
func For(t testing.TB, timeout time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %s: %v", timeout, err)
		}
		time.Sleep(Interval)
	}
}
