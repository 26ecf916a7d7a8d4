package onvif

import (
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"syscall"
	"time"

	"github.com/go-logr/logr"

	"github.com/dowse-dev/dowse/discovery-handlers/onvif/wsdiscovery"
	"github.com/dowse-dev/dowse/internal/onvifclient"
	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
	"github.com/dowse-dev/dowse/shared/handler"
)

// Device properties, handed to brokers as environment variables.
const (
	DeviceServiceURLProperty = "ONVIF_DEVICE_SERVICE_URL"
	DeviceUUIDProperty       = "ONVIF_DEVICE_UUID"
	DeviceIPAddressProperty  = "ONVIF_DEVICE_IP_ADDRESS"
	DeviceMACAddressProperty = "ONVIF_DEVICE_MAC_ADDRESS"
	StreamURIProperty        = "ONVIF_STREAM_URI"
)

// minReprobe bounds how often a Hello without types (which a client must
// answer with a probe) triggers a probe.
const minReprobe = time.Second

// discoverer serves Discover streams; each probes and listens on its own.
type discoverer struct{}

// NewDiscoverer returns the ONVIF handler.Discoverer, for callers that
// build their own handler.Server.
func NewDiscoverer() handler.Discoverer { return &discoverer{} }

type camera struct {
	dev    *discoveryv1.Device
	xaddr  string
	misses int
}

type failure struct {
	xaddr string
	until time.Time
	// reason and msg say why, for the skipped candidates.
	reason, msg string
}

// Reasons a camera is skipped, reported to the agent (handler.SetSkipped).
const (
	// SkipAuthRefused: the device service refused the credentials (or wants
	// some and none were given).
	SkipAuthRefused = "AuthRefused"
	// SkipNoReply: the device service did not answer (timeout, refused or
	// reset connection).
	SkipNoReply = "NoReply"
	// SkipDeviceServiceFailed: it answered with an error or nonsense.
	SkipDeviceServiceFailed = "DeviceServiceFailed"
	// SkipFiltered: a filter of the discovery details left it out.
	SkipFiltered = "Filtered"
	// SkipNoAddress: its WS-Discovery answer has no usable device service
	// address.
	SkipNoAddress = "NoDeviceServiceAddress"
)

// skipReason classifies an inspection's error.
func skipReason(err error) string {
	var e *onvifclient.Error
	switch {
	case errors.Is(err, onvifclient.ErrUnauthorized):
		return SkipAuthRefused
	case errors.As(err, &e):
		return SkipDeviceServiceFailed
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH) || isTimeout(err):
		return SkipNoReply
	}
	return SkipDeviceServiceFailed
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// skipNote is a camera left out by a filter or for its address, as of the
// latest probe round or announcement.
type skipNote struct{ reason, candidate, msg string }

// retryAfter is how long a camera whose device service failed is left
// alone: eight probe intervals, at most five minutes.
func (s *stream) retryAfter() time.Duration {
	return min(8*s.details.Interval(), 5*time.Minute)
}

// inspection is the outcome of asking one camera's device service.
type inspection struct {
	id, xaddr string
	seq       uint64
	found     wsdiscovery.Found
	addr      netip.Addr
	info      deviceInfo
	err       error
}

type stream struct {
	details *Details
	log     logr.Logger
	creds   credentials
	soap    *onvifclient.Client
	known   map[string]*camera // by UUID
	// pending are the inspections in flight, by UUID; a Bye or a newer
	// inspection makes an older one's result stale.
	pending map[string]uint64
	seq     uint64
	// failed are cameras whose device service did not answer, left alone
	// until a retry time unless their address changes.
	failed map[string]failure
	// left are cameras found but left out (filters, no address), by UUID;
	// cleared at each probe round.
	left      map[string]skipNote
	inspected chan inspection
	ctx       context.Context
}

// Discover implements handler.Discoverer.
func (d *discoverer) Discover(ctx context.Context, req *discoveryv1.DiscoverRequest, send func([]*discoveryv1.Device) error) error {
	details, err := ParseDetails(req.GetDiscoveryDetails())
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s := &stream{
		details: details, log: logr.FromContextOrDiscard(ctx),
		creds: parseCredentials(req.GetDiscoveryProperties()), soap: onvifclient.New(onvifclient.Options{Timeout: details.Timeout()}),
		known: map[string]*camera{}, pending: map[string]uint64{}, failed: map[string]failure{}, left: map[string]skipNote{}, inspected: make(chan inspection), ctx: ctx,
	}
	ifaces := s.interfaces()
	announcements := make(chan wsdiscovery.Announcement, 64)
	go func() {
		err := wsdiscovery.Listen(ctx, ifaces, func(a wsdiscovery.Announcement) {
			select {
			case announcements <- a:
			default: // a flood; the next probe catches up
			}
		}, s.bad)
		if err != nil {
			s.log.Info("cannot listen for WS-Discovery Hello and Bye; probing only", "err", err)
		}
	}()

	// Probes run in the background, one at a time, so that a Bye or Hello
	// is applied while a probe waits for answers.
	timer := time.NewTimer(0)
	defer timer.Stop()
	results := make(chan []wsdiscovery.Found, 1)
	probing := false
	var lastProbe time.Time
	startProbe := func() {
		probing = true
		lastProbe = time.Now()
		go func() { results <- s.probe(ctx, ifaces) }()
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
			if !probing {
				startProbe()
			}
			timer.Reset(details.Interval())
			continue
		case found := <-results:
			probing = false
			s.applyProbe(found)
		case r := <-s.inspected:
			s.applyInspection(r)
		case a := <-announcements:
			if !s.announced(a) && !probing {
				// A Hello that names no types must be answered with a
				// probe to learn what the device is; probes are at least
				// minReprobe apart.
				if wait := minReprobe - time.Since(lastProbe); wait > 0 {
					timer.Reset(wait)
				} else {
					startProbe()
				}
			}
		}
		if ctx.Err() != nil {
			return nil
		}
		handler.SetSkipped(ctx, s.skipped())
		if err := send(s.list()); err != nil {
			return err
		}
	}
}

func (s *stream) interfaces() []net.Interface {
	if len(s.details.Interfaces) == 0 {
		ifaces, err := wsdiscovery.MulticastInterfaces()
		if err != nil {
			s.log.Info("cannot list network interfaces", "err", err)
		}
		return ifaces
	}
	var out []net.Interface
	for _, name := range s.details.Interfaces {
		ifc, err := net.InterfaceByName(name)
		if err != nil {
			s.log.Info("configured interface not found on this node, skipped", "interface", name)
			continue
		}
		out = append(out, *ifc)
	}
	return out
}

func (s *stream) bad(from netip.Addr, err error) {
	s.log.V(1).Info("malformed WS-Discovery message ignored", "from", from.String(), "err", err)
}

// probe sends one probe round and returns what answered.
func (s *stream) probe(ctx context.Context, ifaces []net.Interface) []wsdiscovery.Found {
	var sets [][]xml.Name
	for _, t := range s.details.Types() {
		sets = append(sets, []xml.Name{t})
	}
	found, err := wsdiscovery.Probe(ctx, ifaces, s.details.Timeout(), s.bad, sets...)
	if err != nil {
		s.log.Info("WS-Discovery probe failed", "err", err)
	}
	return found
}

// applyProbe applies a probe round: every device found is known afresh;
// known devices not found count a miss, and are dropped after
// FailureThreshold.
func (s *stream) applyProbe(found []wsdiscovery.Found) {
	clear(s.left)
	seen := map[string]bool{}
	for _, f := range found {
		seen[uuidOf(f.Endpoint)] = true
		s.consider(f)
	}
	for id, c := range s.known {
		if seen[id] {
			continue
		}
		c.misses++
		if c.misses >= s.details.FailureThreshold {
			s.log.Info("ONVIF device dropped: no answer to probes", "uuid", id, "probes", c.misses)
			delete(s.known, id)
		}
	}
}

// announced applies a Hello or Bye; it reports false for a Hello that needs
// a probe (it names no types).
func (s *stream) announced(a wsdiscovery.Announcement) bool {
	id := uuidOf(a.Endpoint)
	if !a.Hello {
		delete(s.pending, id)
		delete(s.left, id)
		delete(s.failed, id)
		if _, ok := s.known[id]; ok {
			s.log.Info("ONVIF device said Bye", "uuid", id)
			delete(s.known, id)
		}
		return true
	}
	if len(a.Types) == 0 || len(a.XAddrs) == 0 {
		// Peers repeat their Hello; one already known needs no probe.
		_, known := s.known[id]
		return known
	}
	for _, t := range s.details.Types() {
		if a.HasType(t) {
			s.consider(a.Found)
			break
		}
	}
	return true
}

// consider takes a target that was found or announced: a known camera at
// the same address stays known; a new one (or one at a new address) that
// passes the discovery filters is inspected in the background.
func (s *stream) consider(f wsdiscovery.Found) {
	id := uuidOf(f.Endpoint)
	xaddr, addr, ok := pickXAddr(f)
	if !ok {
		s.log.Info("WS-Discovery target without a usable device service address, skipped", "uuid", id, "xaddrs", f.XAddrs, "from", f.From.String())
		s.left[id] = skipNote{SkipNoAddress, f.From.String(), fmt.Sprintf("uuid %s: no http(s) device service address with an IP in %v", id, f.XAddrs)}
		return
	}
	d := s.details
	var filter string
	switch {
	case !d.passesUUID(f.Endpoint):
		filter = "uuids"
	case !d.passesAddress(addr):
		filter = "ipAddresses"
	case !d.passesScopes(f.Scopes):
		filter = "scopes"
	}
	if filter != "" {
		s.left[id] = skipNote{SkipFiltered, xaddr, fmt.Sprintf("uuid %s: left out by the %s filter", id, filter)}
		return
	}
	delete(s.left, id)
	if c, ok := s.known[id]; ok && c.xaddr == xaddr {
		c.misses = 0
		return
	}
	if _, busy := s.pending[id]; busy {
		return
	}
	if f, ok := s.failed[id]; ok && f.xaddr == xaddr && time.Now().Before(f.until) {
		return
	}
	s.seq++
	s.pending[id] = s.seq
	r := inspection{id: id, xaddr: xaddr, seq: s.seq, found: f, addr: addr}
	go func() {
		r.info, r.err = inspect(s.ctx, s.soap, s.creds, id, xaddr)
		select {
		case s.inspected <- r:
		case <-s.ctx.Done():
		}
	}()
}

// applyInspection lists a camera whose device service answered; one that
// did not is skipped (and inspected again when next found).
func (s *stream) applyInspection(r inspection) {
	if s.pending[r.id] != r.seq {
		return // a Bye came meanwhile
	}
	delete(s.pending, r.id)
	if r.err != nil {
		s.failed[r.id] = failure{xaddr: r.xaddr, until: time.Now().Add(s.retryAfter()), reason: skipReason(r.err), msg: fmt.Sprintf("uuid %s: %v", r.id, r.err)}
		s.log.Info("ONVIF device skipped: its device service failed", "reason", s.failed[r.id].reason, "uuid", r.id, "deviceService", r.xaddr, "from", r.found.From.String(), "retryAfter", s.retryAfter().String(), "err", r.err)
		return
	}
	delete(s.failed, r.id)
	var macs []string
	if r.info.MAC != "" {
		macs = append(macs, r.info.MAC)
	}
	if !s.details.passesMACs(macs) {
		s.left[r.id] = skipNote{SkipFiltered, r.xaddr, fmt.Sprintf("uuid %s: left out by the macAddresses filter (MAC %q)", r.id, r.info.MAC)}
		return
	}
	props := map[string]string{
		DeviceServiceURLProperty: r.xaddr,
		DeviceUUIDProperty:       r.id,
		DeviceIPAddressProperty:  r.addr.String(),
	}
	if r.info.MAC != "" {
		props[DeviceMACAddressProperty] = r.info.MAC
	}
	if r.info.StreamURI != "" {
		props[StreamURIProperty] = r.info.StreamURI
	}
	s.known[r.id] = &camera{dev: &discoveryv1.Device{Id: r.id, Properties: props}, xaddr: r.xaddr}
}

// pickXAddr chooses the device service URL: an http(s) URL whose host is an
// IP address, preferring the one the answer came from (a device may list
// addresses of other interfaces, or lie).
func pickXAddr(f wsdiscovery.Found) (string, netip.Addr, bool) {
	var first string
	var firstAddr netip.Addr
	for _, x := range f.XAddrs {
		u, err := url.Parse(x)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") {
			continue
		}
		a, err := netip.ParseAddr(u.Hostname())
		if err != nil {
			continue
		}
		a = a.Unmap()
		if a == f.From {
			return x, a, true
		}
		if first == "" {
			first, firstAddr = x, a
		}
	}
	return first, firstAddr, first != ""
}

// uuidOf returns the bare UUID of an endpoint address, or the address when
// it is no urn:uuid.
func uuidOf(endpoint string) string {
	if u, ok := normalizeUUID(endpoint); ok {
		return u
	}
	return endpoint
}

// skipped are the cameras skipped now: those whose device service failed
// (until they are tried again) and those left out.
func (s *stream) skipped() *handler.Skipped {
	var sk handler.Skipped
	ids := make([]string, 0, len(s.failed)+len(s.left))
	for id := range s.failed {
		ids = append(ids, id)
	}
	for id := range s.left {
		ids = append(ids, id)
	}
	slices.Sort(ids) // the same cameras, the same summary
	for _, id := range slices.Compact(ids) {
		if f, ok := s.failed[id]; ok {
			sk.Add(f.reason, f.xaddr, f.msg)
		} else if n, ok := s.left[id]; ok {
			sk.Add(n.reason, n.candidate, n.msg)
		}
	}
	return &sk
}

func (s *stream) list() []*discoveryv1.Device {
	out := make([]*discoveryv1.Device, 0, len(s.known))
	for _, c := range s.known {
		out = append(out, c.dev)
	}
	return out
}
