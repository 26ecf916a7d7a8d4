package linkauth

import (
	"net"
	"net/netip"
	"sync"

	"golang.org/x/time/rate"
)

// maxSources bounds the source addresses remembered; past it, those whose
// budget is full again (idle) are forgotten first.
const maxSources = 4096

// sourceLimits paces each source address on its own.
type sourceLimits struct {
	rate  rate.Limit
	burst int

	mu  sync.Mutex
	all map[netip.Addr]*rate.Limiter
}

func newSourceLimits(r rate.Limit, burst int) *sourceLimits {
	return &sourceLimits{rate: r, burst: burst, all: map[netip.Addr]*rate.Limiter{}}
}

// allow spends one request of remoteAddr's ("host:port") budget; an
// address it cannot read is not paced here (the global limit still is).
func (s *sourceLimits) allow(remoteAddr string) bool {
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		return true
	}
	addr, err := netip.ParseAddr(host)
	if err != nil {
		return true
	}
	addr = addr.Unmap()
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.all[addr]
	if l == nil {
		if len(s.all) >= maxSources {
			s.forgetIdleLocked()
		}
		l = rate.NewLimiter(s.rate, s.burst)
		s.all[addr] = l
	}
	return l.Allow()
}

// forgetIdleLocked drops the sources whose budget is full again: they
// would start afresh anyway. With none idle (a flood from as many
// addresses), it drops them all rather than grow.
func (s *sourceLimits) forgetIdleLocked() {
	for a, l := range s.all {
		if l.Tokens() >= float64(s.burst) {
			delete(s.all, a)
		}
	}
	if len(s.all) >= maxSources {
		clear(s.all)
	}
}
