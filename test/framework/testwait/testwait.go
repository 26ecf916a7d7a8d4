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

// Holds polls f for the whole of d and fails t at the first error: the
// other side of For, for what must not happen (a grant that must not
// appear, a file that must not change).
func Holds(t testing.TB, d time.Duration, f func() error) {
	t.Helper()
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(Interval) {
		if err := f(); err != nil {
			t.Fatalf("condition broken within %s: %v", d, err)
		}
	}
}
