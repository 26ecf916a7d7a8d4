package snmp

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/dowse-dev/dowse/internal/snmpclient"
	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
	"github.com/dowse-dev/dowse/shared/handler"
)

// discoverer serves Discover streams. Each stream scans on its own, with its
// own rate limit: Configurations do not share state.
type discoverer struct{}

// Discover implements handler.Discoverer.
func (d *discoverer) Discover(ctx context.Context, req *discoveryv1.DiscoverRequest, send func([]*discoveryv1.Device) error) error {
	details, err := ParseDetails(req.GetDiscoveryDetails())
	if err != nil {
		return err
	}
	sec, err := details.Security(req.GetDiscoveryProperties())
	if err != nil {
		return err
	}
	s := newScanner(details, sec, logr.FromContextOrDiscard(ctx))
	return handler.Rescan(ctx, details.Interval(), s.round, s.skippedNow, send)
}

type tracked struct {
	dev      *discoveryv1.Device
	failures int
}

// backoff is a silent target's state: it sits out skip more rounds.
type backoff struct {
	skip, next int
}

type skipNote struct{ reason, msg string }

// scanner is one stream's scan state between rounds.
type scanner struct {
	details *Details
	sec     *snmpclient.Security
	log     logr.Logger
	known   map[target]*tracked
	silent  map[target]*backoff
	// skipped are the targets of the last round that are no device, with
	// why; a target backed off keeps its last note.
	skipped map[target]skipNote
}

func newScanner(d *Details, sec *snmpclient.Security, log logr.Logger) *scanner {
	return &scanner{details: d, sec: sec, log: log, known: map[target]*tracked{}, silent: map[target]*backoff{}, skipped: map[target]skipNote{}}
}

// skippedNow summarises what the last round skipped.
func (s *scanner) skippedNow() *handler.Skipped {
	var sk handler.Skipped
	for t, n := range s.skipped {
		sk.Add(n.reason, t.String(), n.msg)
	}
	return &sk
}

// round asks every target not backed off, at most Concurrency at once and
// sending at most PacketsPerSecond a second, updates what is known and
// returns the device list.
func (s *scanner) round(ctx context.Context) []*discoveryv1.Device {
	d := s.details
	var due []target
	for _, t := range d.targets {
		if b := s.silent[t]; b != nil && b.skip > 0 {
			b.skip--
			continue
		}
		due = append(due, t)
	}

	results := make(chan result, d.Concurrency)
	work := make(chan target)
	var wg sync.WaitGroup
	for range min(d.Concurrency, len(due)) {
		wg.Go(func() {
			for t := range work {
				results <- probe(ctx, d, s.sec, t)
			}
		})
	}
	go func() {
		defer close(work)
		// A ticker paces the probes by the packets each sends; the first
		// goes at once.
		tick := time.NewTicker(time.Second * time.Duration(s.sec.PacketsPerRequest()) / time.Duration(d.PacketsPerSecond))
		defer tick.Stop()
		for i, t := range due {
			if i > 0 {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
			}
			select {
			case <-ctx.Done():
				return
			case work <- t:
			}
		}
	}()
	go func() {
		wg.Wait()
		close(results)
	}()

	seen := map[target]bool{}
	for r := range results {
		if ctx.Err() != nil {
			continue // the stream ended: drain, learn nothing
		}
		seen[r.target] = true
		s.noteSilent(r)
		delete(s.skipped, r.target)
		switch r.outcome {
		case device:
			s.known[r.target] = &tracked{dev: newDevice(s.sec, r)}
		case notDevice:
			s.skipped[r.target] = skipNote{r.reason, r.why}
			if _, ok := s.known[r.target]; ok {
				s.log.Info("snmp agent no longer a device, dropped", "address", r.target.String(), "reason", r.reason, "why", r.why)
				delete(s.known, r.target)
			}
		case noAnswer:
			if _, known := s.known[r.target]; !known {
				s.skipped[r.target] = skipNote{r.reason, r.why}
			}
			s.fail(r.target)
		}
	}
	// Known agents on targets that sat this round out count it as a
	// failure too: they went unanswered.
	for t := range s.known {
		if !seen[t] {
			s.fail(t)
		}
	}
	return s.list()
}

func (s *scanner) fail(t target) {
	k, ok := s.known[t]
	if !ok {
		return
	}
	k.failures++
	if k.failures >= s.details.FailureThreshold {
		s.log.Info("snmp agent dropped", "address", t.String(), "failedRounds", k.failures)
		delete(s.known, t)
	}
}

// noteSilent backs a target off exponentially, in rounds, while it does not
// answer, so that the empty addresses of a range are not asked every
// round; any answer resets it.
func (s *scanner) noteSilent(r result) {
	if r.outcome != noAnswer {
		delete(s.silent, r.target)
		return
	}
	b := s.silent[r.target]
	if b == nil {
		b = &backoff{next: 1}
		s.silent[r.target] = b
	}
	b.skip = b.next
	b.next = min(2*b.next, MaxBackoffRounds)
}

func (s *scanner) list() []*discoveryv1.Device {
	devs := make([]*discoveryv1.Device, 0, len(s.known))
	for _, k := range s.known {
		devs = append(devs, k.dev)
	}
	return devs
}

// newDevice builds the device of an agent that answered. Its id is its
// host:port: sysName is the administrator's to change, and two agents may
// share it.
func newDevice(sec *snmpclient.Security, r result) *discoveryv1.Device {
	props := map[string]string{
		AddressProperty:     r.target.Host,
		PortProperty:        strconv.Itoa(r.target.Port),
		VersionProperty:     sec.Version,
		SysObjectIDProperty: r.info.objectID,
		SysDescrProperty:    r.info.descr,
		SysNameProperty:     r.info.name,
	}
	return &discoveryv1.Device{Id: r.target.String(), Properties: props}
}
