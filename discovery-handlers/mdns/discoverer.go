package mdns

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/miekg/dns"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"

	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
	"github.com/dowse-dev/dowse/shared/handler"
)

// DefaultName is the handler name Configurations use by default.
const DefaultName = "mdns"

// Group and Group6 are mDNS's IPv4 and IPv6 multicast groups and port
// (RFC 6762 3).
var (
	Group  = netip.MustParseAddrPort("224.0.0.251:5353")
	Group6 = netip.MustParseAddrPort("[ff02::fb]:5353")
)

// Reasons a service or packet is skipped (handler.SetSkipped).
const (
	// SkipNoMatch: a service of the types browsed whose instance name or
	// TXT record fails the details' filters.
	SkipNoMatch = "NoMatch"
	// SkipOverLimit: a service past maxServices, not kept.
	SkipOverLimit = "OverLimit"
	// SkipGarbage: a packet that is not a DNS message, or too large.
	SkipGarbage = "Garbage"
	// SkipUnresolved: a matching service whose host has no address yet;
	// held back so that an Instance never appears without one.
	SkipUnresolved = "Unresolved"
)

// NewDiscoverer returns the mDNS handler.Discoverer.
func NewDiscoverer() handler.Discoverer { return &discoverer{} }

// Handler is the mDNS/DNS-SD handler as its binary serves it. Services are
// on the node's links, which other nodes may share, so it registers as
// shared: every node that sees a service agrees on one Instance (its id is
// the service's full instance name).
func Handler() handler.Config {
	return handler.Config{Name: DefaultName, Shared: true, Discoverer: NewDiscoverer()}
}

type discoverer struct{}

// packet is one datagram received.
type packet struct {
	data []byte
	from netip.Addr
}

// Discover implements handler.Discoverer: it joins the mDNS group on the
// interfaces, queries for the service types (again 1s, 2s, 4s... apart up
// to queryInterval), keeps the answers and announcements of any sender
// until their TTL runs out or a goodbye (TTL 0) ends them, asks for what
// an instance lacks (SRV, TXT, addresses), and sends the matching services
// whenever they change.
func (*discoverer) Discover(ctx context.Context, req *discoveryv1.DiscoverRequest, send func([]*discoveryv1.Device) error) error {
	d, err := ParseDetails(req.GetDiscoveryDetails())
	if err != nil {
		return err
	}
	log := logr.FromContextOrDiscard(ctx)
	ifaces, err := interfaces(d.Interfaces, d.ipv4, d.ipv6)
	if err != nil {
		return handler.InvalidDetails("interfaces: %v", err)
	}
	socks, err := listen(ifaces)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pkts := make(chan packet, 64)
	var wg sync.WaitGroup
	defer wg.Wait()
	var joined []string
	for _, s := range socks {
		stop := context.AfterFunc(ctx, func() { s.conn.Close() })
		wg.Go(func() {
			defer stop()
			read(ctx, s.conn, pkts)
		})
		joined = append(joined, s.group.String())
	}
	log.Info("mdns browsing", "serviceTypes", d.ServiceTypes, "groups", joined)

	c := newCache(d)
	garbage := map[string]string{}
	query := func(qs []dns.Question) {
		if len(qs) == 0 {
			return
		}
		m := new(dns.Msg)
		m.Question = qs
		b, err := m.Pack()
		if err != nil {
			return
		}
		for _, s := range socks {
			if _, err := s.conn.WriteToUDP(b, s.group); err != nil {
				log.V(1).Info("mdns query not sent", "group", s.group.String(), "err", err)
			}
		}
	}
	typeQuestions := func() []dns.Question {
		var qs []dns.Question
		for _, t := range d.ServiceTypes {
			qs = append(qs, dns.Question{Name: t + ".local.", Qtype: dns.TypePTR, Qclass: dns.ClassINET})
		}
		return qs
	}

	handle := func(p packet) {
		now := time.Now()
		m := new(dns.Msg)
		if len(p.data) > MaxPacket {
			noteGarbage(garbage, p.from, fmt.Sprintf("a %d-byte packet, more than %d", len(p.data), MaxPacket))
		} else if err := m.Unpack(p.data); err != nil {
			noteGarbage(garbage, p.from, "not a DNS message: "+err.Error())
		} else if c.add(m, now) {
			query(c.missing(now))
		}
	}

	wait := time.Second
	queryTimer := time.NewTimer(0)
	defer queryTimer.Stop()
	expiry := time.NewTimer(time.Hour)
	defer expiry.Stop()
	var lastSent []*discoveryv1.Device
	first := true
	publish := func() error {
		devs, sk := list(c, garbage)
		handler.SetSkipped(ctx, sk)
		if !first && slices.EqualFunc(devs, lastSent, sameDevice) {
			return nil
		}
		first, lastSent = false, devs
		return send(devs)
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-queryTimer.C:
			query(typeQuestions())
			queryTimer.Reset(wait)
			wait = min(2*wait, d.interval)
		case p := <-pkts:
			handle(p)
			// Take what else has arrived before sending.
			for drained := false; !drained; {
				select {
				case p := <-pkts:
					handle(p)
				default:
					drained = true
				}
			}
		case <-expiry.C:
		}
		_, next := c.expire(time.Now())
		if next.IsZero() {
			expiry.Reset(time.Hour)
		} else {
			expiry.Reset(time.Until(next) + 10*time.Millisecond)
		}
		if err := publish(); err != nil {
			return err
		}
	}
}

func sameDevice(a, b *discoveryv1.Device) bool {
	if a.GetId() != b.GetId() || len(a.GetProperties()) != len(b.GetProperties()) {
		return false
	}
	for k, v := range a.GetProperties() {
		if b.GetProperties()[k] != v {
			return false
		}
	}
	return true
}

func noteGarbage(garbage map[string]string, from netip.Addr, why string) {
	if len(garbage) < 16 {
		garbage[from.String()] = why
	}
}

// list returns the matching services as devices, and what was skipped.
func list(c *cache, garbage map[string]string) ([]*discoveryv1.Device, *handler.Skipped) {
	var sk handler.Skipped
	var devs []*discoveryv1.Device
	for _, s := range c.services() {
		if ok, why := c.d.matches(s); !ok {
			sk.Add(SkipNoMatch, s.fullName, why)
			continue
		}
		if len(s.addrs) == 0 {
			sk.Add(SkipUnresolved, s.fullName, "no address yet for "+strings.TrimSuffix(s.host, "."))
			continue
		}
		devs = append(devs, s.device())
	}
	for name := range c.overflow {
		sk.Add(SkipOverLimit, name, fmt.Sprintf("more than maxServices (%d) services", c.d.MaxServices))
	}
	for from, why := range garbage {
		sk.Add(SkipGarbage, from, why)
	}
	return devs, &sk
}

// iface is an interface to browse on and the families it has addresses of
// (and were asked for).
type iface struct {
	net.Interface
	ipv4, ipv6 bool
}

// interfaces returns the named interfaces, or every interface that is up,
// multicast-capable, not loopback and has an address of a family asked for.
func interfaces(names []string, ipv4, ipv6 bool) ([]iface, error) {
	var candidates []net.Interface
	if len(names) > 0 {
		for _, n := range names {
			ifc, err := net.InterfaceByName(n)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", n, err)
			}
			candidates = append(candidates, *ifc)
		}
	} else {
		all, err := net.Interfaces()
		if err != nil {
			return nil, err
		}
		for _, ifc := range all {
			if ifc.Flags&net.FlagUp != 0 && ifc.Flags&net.FlagMulticast != 0 && ifc.Flags&net.FlagLoopback == 0 {
				candidates = append(candidates, ifc)
			}
		}
	}
	var out []iface
	for _, ifc := range candidates {
		f := iface{Interface: ifc}
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			p, err := netip.ParsePrefix(a.String())
			if err != nil {
				continue
			}
			f.ipv4 = f.ipv4 || (ipv4 && p.Addr().Is4())
			f.ipv6 = f.ipv6 || (ipv6 && p.Addr().Is6())
		}
		switch {
		case f.ipv4 || f.ipv6:
			out = append(out, f)
		case len(names) > 0:
			return nil, fmt.Errorf("%s has no address of the families browsed", ifc.Name)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no interface is up, multicast-capable and has an address of the families browsed")
	}
	return out, nil
}

// socket is a socket joined to one group on one interface, and the group
// (with the interface as its zone for IPv6) that queries go to.
type socket struct {
	conn  *net.UDPConn
	group *net.UDPAddr
}

// listen joins the mDNS groups on each interface, one socket a group and
// interface bound to port 5353 (beside any mDNS responder on the node: the
// sockets share the port), so that queries go out from 5353 and answers
// come back by multicast.
func listen(ifaces []iface) ([]socket, error) {
	var socks []socket
	closeAll := func() {
		for _, s := range socks {
			s.conn.Close()
		}
	}
	for _, ifc := range ifaces {
		if ifc.ipv4 {
			group := net.UDPAddrFromAddrPort(Group)
			conn, err := net.ListenMulticastUDP("udp4", &ifc.Interface, group)
			if err != nil {
				closeAll()
				return nil, fmt.Errorf("joining %v on %s: %w", Group.Addr(), ifc.Name, err)
			}
			// Only this interface's traffic (best effort).
			setSockopt(conn, unix.IPPROTO_IP, unix.IP_MULTICAST_ALL, 0)
			pc := ipv4.NewPacketConn(conn)
			_ = pc.SetMulticastInterface(&ifc.Interface)
			_ = pc.SetMulticastTTL(255) // RFC 6762 11
			socks = append(socks, socket{conn, group})
		}
		if ifc.ipv6 {
			// ff02::fb is link-scoped: bound and sent to with the
			// interface as its zone.
			group := &net.UDPAddr{IP: net.IP(Group6.Addr().AsSlice()), Port: int(Group6.Port()), Zone: ifc.Name}
			conn, err := net.ListenMulticastUDP("udp6", &ifc.Interface, group)
			if err != nil {
				closeAll()
				return nil, fmt.Errorf("joining %v on %s: %w", Group6.Addr(), ifc.Name, err)
			}
			setSockopt(conn, unix.IPPROTO_IPV6, unix.IPV6_MULTICAST_ALL, 0)
			pc := ipv6.NewPacketConn(conn)
			_ = pc.SetMulticastInterface(&ifc.Interface)
			_ = pc.SetMulticastHopLimit(255) // RFC 6762 11
			socks = append(socks, socket{conn, group})
		}
	}
	return socks, nil
}

func setSockopt(conn *net.UDPConn, level, opt, value int) {
	if rc, err := conn.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) { _ = unix.SetsockoptInt(int(fd), level, opt, value) })
	}
}

// read hands each datagram to pkts until conn is closed; a datagram that
// does not fit MaxPacket comes with its size only. When pkts is full the
// datagram is dropped: a flood costs its own packets, not the stream.
func read(ctx context.Context, conn *net.UDPConn, pkts chan<- packet) {
	buf := make([]byte, MaxPacket+1)
	for {
		n, from, err := conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			continue
		}
		p := packet{from: from.Addr().Unmap()}
		if n > MaxPacket {
			p.data = make([]byte, n) // only its length is looked at
		} else {
			p.data = slices.Clone(buf[:n])
		}
		select {
		case pkts <- p:
		default:
		}
	}
}
