package dmi

// Rate limits: the reports accepted per second for the Devices of one
// mapper.

import "golang.org/x/time/rate"

// allow says whether the Devices of mapper owner may report n values
// more now (Config.ReportRate, ReportBurst).
func (s *Server) allow(owner string, n int) bool {
	if s.cfg.ReportRate < 0 {
		return true
	}
	s.mu.Lock()
	l := s.limiters[owner]
	if l == nil {
		l = rate.NewLimiter(rate.Limit(s.cfg.ReportRate), s.cfg.ReportBurst)
		s.limiters[owner] = l
	}
	s.mu.Unlock()
	return l.AllowN(s.cfg.Now(), n)
}
