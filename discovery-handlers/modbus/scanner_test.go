package modbus

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
)

// silentServers listens on n loopback addresses and accepts connections
// that never get an answer, like a device that is too slow, recording how
// many are open at once and when each arrived.
type silentServers struct {
	open, peak atomic.Int32
	mu         sync.Mutex
	arrivals   []time.Time
	addrs      []string
}

func startSilent(t *testing.T, n int) *silentServers {
	t.Helper()
	s := &silentServers{}
	for i := range n {
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.1.%d:0", i+1))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		s.addrs = append(s.addrs, l.Addr().String())
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				s.mu.Lock()
				s.arrivals = append(s.arrivals, time.Now())
				s.mu.Unlock()
				now := s.open.Add(1)
				for {
					p := s.peak.Load()
					if now <= p || s.peak.CompareAndSwap(p, now) {
						break
					}
				}
				go func() {
					// The client closes after its timeout; reading
					// until then holds the connection open.
					buf := make([]byte, 64)
					for {
						if _, err := c.Read(buf); err != nil {
							break
						}
					}
					s.open.Add(-1)
					c.Close()
				}()
			}
		}()
	}
	return s
}

func (s *silentServers) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.arrivals)
}

func TestRoundIsBoundedAndPaced(t *testing.T) {
	const n, concurrency, rate = 24, 4, 40
	srv := startSilent(t, n)
	targets := fmt.Sprintf("%q", srv.addrs[0])
	for _, a := range srv.addrs[1:] {
		targets += fmt.Sprintf(", %q", a)
	}
	d, err := ParseDetails(fmt.Sprintf(`{"targets": [%s], "timeout": "200ms", "concurrency": %d, "probesPerSecond": %d}`, targets, concurrency, rate))
	if err != nil {
		t.Fatal(err)
	}
	s := newScanner(d, testr.New(t))
	start := time.Now()
	if devs := s.round(context.Background()); len(devs) != 0 {
		t.Errorf("silent servers gave devices %v", devs)
	}
	took := time.Since(start)
	// The server sees a close a moment after the client made it, by which
	// time the worker may have connected to the next target: one over the
	// bound is that lag, more would be a leak.
	if p := srv.peak.Load(); p > concurrency+1 {
		t.Errorf("%d probes in flight at once, want at most %d", p, concurrency)
	}
	// n connections at most rate a second take at least (n-1)/rate.
	if min := time.Duration(n-1) * time.Second / rate; took < min {
		t.Errorf("round of %d targets took %v, want at least %v at %d/s", n, took, min, rate)
	}
	if got := srv.count(); got != n {
		t.Errorf("%d connections, want %d", got, n)
	}

	// Every target timed out without an answer, so each sits out the next
	// round, then two, then four.
	for i, wantProbes := range []int{0, n, 0, 0, n} {
		before := srv.count()
		s.round(context.Background())
		if got := srv.count() - before; got != wantProbes {
			t.Errorf("round %d after the first: %d probes, want %d (backoff)", i+2, got, wantProbes)
		}
	}
}
