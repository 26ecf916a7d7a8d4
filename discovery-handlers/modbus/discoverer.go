package modbus

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"

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
	s := newScanner(details, logr.FromContextOrDiscard(ctx))
	return handler.Rescan(ctx, details.Interval(), s.round, s.skippedNow, send)
}

// unitKey names one (host:port, unit id).
type unitKey struct {
	address string
	unit    int
}

type tracked struct {
	dev      *discoveryv1.Device
	failures int
}

// backoff is a slow target's state: it sits out skip more rounds.
type backoff struct {
	skip, next int
}

// scanner is one stream's scan state between rounds.
type scanner struct {
	details *Details
	log     logr.Logger
	known   map[unitKey]*tracked
	slow    map[string]*backoff
	// skipped are the targets and units of the last round that are no
	// device, with why; a target backed off keeps its last note.
	skipped map[string]skipNote
}

// Reasons a target or unit is skipped, reported to the agent
// (handler.SetSkipped).
const (
	// SkipNoReply: the host refused or did not answer, or the unit gave no
	// definite answer.
	SkipNoReply = "NoReply"
	// SkipNoMatch: the unit answered with an exception, or with values or
	// an identification that fail the match.
	SkipNoMatch = "NoMatch"
)

type skipNote struct{ reason, msg string }

func newScanner(d *Details, log logr.Logger) *scanner {
	return &scanner{details: d, log: log, known: map[unitKey]*tracked{}, slow: map[string]*backoff{}, skipped: map[string]skipNote{}}
}

// skippedNow summarises what the last round skipped.
func (s *scanner) skippedNow() *handler.Skipped {
	var sk handler.Skipped
	for c, n := range s.skipped {
		sk.Add(n.reason, c, n.msg)
	}
	return &sk
}

// noteSkipped records the targets and units of r that are no device.
func (s *scanner) noteSkipped(r targetResult) {
	for k := range s.skipped {
		if k == r.address || strings.HasPrefix(k, r.address+" ") {
			delete(s.skipped, k)
		}
	}
	if r.connectErr != "" {
		s.skipped[r.address] = skipNote{SkipNoReply, r.connectErr}
		return
	}
	for _, u := range r.units {
		switch u.outcome {
		case noAnswer:
			if _, known := s.known[unitKey{r.address, u.unit}]; known {
				continue // a known device that missed a round is still listed
			}
			s.skipped[fmt.Sprintf("%s unit %d", r.address, u.unit)] = skipNote{SkipNoReply, u.why}
		case notDevice:
			s.skipped[fmt.Sprintf("%s unit %d", r.address, u.unit)] = skipNote{SkipNoMatch, u.why}
		}
	}
}

// round probes every target not backed off, at most Concurrency at once and
// starting at most ProbesPerSecond a second, updates what is known and
// returns the device list.
func (s *scanner) round(ctx context.Context) []*discoveryv1.Device {
	d := s.details
	var due []string
	for _, a := range d.targets {
		if b := s.slow[a]; b != nil && b.skip > 0 {
			b.skip--
			continue
		}
		due = append(due, a)
	}

	results := make(chan targetResult, d.Concurrency)
	work := make(chan string)
	var wg sync.WaitGroup
	for range min(d.Concurrency, len(due)) {
		wg.Go(func() {
			for a := range work {
				results <- probeTarget(d, a)
			}
		})
	}
	go func() {
		defer close(work)
		// A ticker paces connection attempts; the first goes at once.
		tick := time.NewTicker(time.Second / time.Duration(d.ProbesPerSecond))
		defer tick.Stop()
		for i, a := range due {
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
			case work <- a:
			}
		}
	}()
	go func() {
		wg.Wait()
		close(results)
	}()

	seen := map[unitKey]bool{}
	for r := range results {
		s.noteSlow(r)
		s.noteSkipped(r)
		for _, u := range r.units {
			key := unitKey{r.address, u.unit}
			seen[key] = true
			switch u.outcome {
			case device:
				s.known[key] = &tracked{dev: newDevice(d, r.address, u)}
			case notDevice:
				if _, ok := s.known[key]; ok {
					s.log.Info("modbus device no longer answers the probe or match, dropped", "address", r.address, "unitId", u.unit)
					delete(s.known, key)
				}
			case noAnswer:
				s.fail(key)
			}
		}
	}
	// Known devices on targets that sat this round out count it as a
	// failure too: they went unanswered.
	for key := range s.known {
		if !seen[key] {
			s.fail(key)
		}
	}
	return s.list()
}

func (s *scanner) fail(key unitKey) {
	t, ok := s.known[key]
	if !ok {
		return
	}
	t.failures++
	if t.failures >= s.details.FailureThreshold {
		s.log.Info("modbus device dropped", "address", key.address, "unitId", key.unit, "failedRounds", t.failures)
		delete(s.known, key)
	}
}

// noteSlow backs a target off exponentially, in rounds, while it times out
// without any unit answering, so that a slow or filtered host is not hit
// every round; any answer resets it.
func (s *scanner) noteSlow(r targetResult) {
	if !r.slow {
		delete(s.slow, r.address)
		return
	}
	b := s.slow[r.address]
	if b == nil {
		b = &backoff{next: 1}
		s.slow[r.address] = b
	}
	b.skip = b.next
	b.next = min(2*b.next, MaxBackoffRounds)
}

// list returns the known devices. Two units that claim the same
// identification id (a cloned configuration, a gateway answering for
// several) fall back to their address ids, so that ids stay unique.
func (s *scanner) list() []*discoveryv1.Device {
	count := map[string]int{}
	for _, t := range s.known {
		count[t.dev.Id]++
	}
	devs := make([]*discoveryv1.Device, 0, len(s.known))
	for key, t := range s.known {
		dev := t.dev
		if count[dev.Id] > 1 {
			dev = &discoveryv1.Device{Id: addressID(key.address, key.unit), Properties: dev.Properties}
		}
		devs = append(devs, dev)
	}
	return devs
}

func addressID(address string, unit int) string {
	return address + "/" + strconv.Itoa(unit)
}

// newDevice builds the device of a unit that answered. Its id is
// vendor/productCode/serial when the identification has all three (it then
// survives an address change), else host:port/unit.
func newDevice(d *Details, address string, u unitResult) *discoveryv1.Device {
	props := map[string]string{
		AddressProperty: address,
		UnitIDProperty:  strconv.Itoa(u.unit),
	}
	id := identification(&d.Probe, u, props)
	if id == "" {
		id = addressID(address, u.unit)
	}
	return &discoveryv1.Device{Id: id, Properties: props}
}

// identification adds a unit's identification objects to props and returns
// vendor/productCode/serial when it has all three, else "".
func identification(p *Probe, u unitResult, props map[string]string) string {
	for id, name := range identificationProperties {
		if v, ok := u.ident[id]; ok {
			props[name] = v
		}
	}
	if p.SerialObjectID == nil {
		return ""
	}
	serial, ok := u.ident[byte(*p.SerialObjectID)]
	if !ok {
		return ""
	}
	props[SerialNumberProperty] = serial
	vendor, product := props[VendorNameProperty], props[ProductCodeProperty]
	if vendor == "" || product == "" || serial == "" {
		return ""
	}
	return strings.Join([]string{vendor, product, serial}, "/")
}
