package wsdiscovery

import (
	"context"
	"crypto/rand"
	"encoding/xml"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"golang.org/x/net/ipv4"
	"golang.org/x/sys/unix"
)

// Group is WS-Discovery's IPv4 multicast group and port.
var Group = netip.AddrPortFrom(netip.AddrFrom4([4]byte{239, 255, 255, 250}), 3702)

// maxMessage bounds a datagram read; discovery messages are a few KiB.
const maxMessage = 64 << 10

// Found is a target as a ProbeMatch or announcement described it, with
// where it came from.
type Found struct {
	Target
	// From is the sender's address; Interface the local interface.
	From      netip.Addr
	Interface string
}

// Announcement is a Hello (a device joined) or a Bye (a device leaves).
type Announcement struct {
	Found
	Hello bool
}

// MulticastInterfaces returns the interfaces that are up, multicast-capable,
// not loopback, and have an IPv4 address.
func MulticastInterfaces() ([]net.Interface, error) {
	all, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	var out []net.Interface
	for _, ifc := range all {
		if ifc.Flags&net.FlagUp == 0 || ifc.Flags&net.FlagMulticast == 0 || ifc.Flags&net.FlagLoopback != 0 {
			continue
		}
		if _, err := ipv4Addr(&ifc); err == nil {
			out = append(out, ifc)
		}
	}
	return out, nil
}

func ipv4Addr(ifc *net.Interface) (netip.Addr, error) {
	addrs, err := ifc.Addrs()
	if err != nil {
		return netip.Addr{}, err
	}
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Is4() {
			return p.Addr(), nil
		}
	}
	return netip.Addr{}, fmt.Errorf("interface %s has no IPv4 address", ifc.Name)
}

// NewMessageID returns a fresh urn:uuid message id.
func NewMessageID() string {
	var u [16]byte
	_, _ = rand.Read(u[:])
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	return fmt.Sprintf("urn:uuid:%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:])
}

// Probe sends, on each interface, one Probe per type set (a device must have
// every type of a set to answer it) and collects for wait the ProbeMatches
// that answer them; a match without XAddrs is resolved (a Resolve is
// sent and its ResolveMatch fills them in). Targets are de-duplicated by endpoint: peers repeat
// their answers, and a device may answer several probes or on several
// interfaces; the highest metadata version wins. Malformed answers are
// passed to bad (which may be nil) and otherwise ignored. An interface that
// cannot be used is an error only when no interface can.
func Probe(ctx context.Context, ifaces []net.Interface, wait time.Duration, bad func(from netip.Addr, err error), typeSets ...[]xml.Name) ([]Found, error) {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	var (
		mu      sync.Mutex
		found   = map[string]Found{}
		order   []string
		wg      sync.WaitGroup
		errs    []error
		working int
	)
	for _, ifc := range ifaces {
		conn, ids, err := sendProbes(ifc, typeSets)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		working++
		stop := context.AfterFunc(ctx, func() { conn.Close() })
		resolving := map[string]string{} // resolve message id -> endpoint
		resolved := map[string]bool{}
		wg.Go(func() {
			defer stop()
			defer conn.Close()
			buf := make([]byte, maxMessage)
			for {
				n, from, err := conn.ReadFromUDPAddrPort(buf)
				if err != nil {
					return
				}
				m, err := ParseMessage(buf[:n])
				if err != nil {
					if bad != nil {
						bad(from.Addr(), err)
					}
					continue
				}
				switch {
				case m.Action == ActionProbeMatch && ids[m.RelatesTo]:
				case m.Action == ActionResolveMatch && resolving[m.RelatesTo] != "":
				default:
					continue
				}
				mu.Lock()
				for _, t := range m.Targets {
					old, seen := found[t.Endpoint]
					if m.Action == ActionResolveMatch {
						// Fills in what the probe match left out.
						if seen && t.Endpoint == resolving[m.RelatesTo] && len(old.XAddrs) == 0 {
							old.XAddrs = t.XAddrs
							if len(old.Types) == 0 {
								old.Types = t.Types
							}
							found[t.Endpoint] = old
						}
						continue
					}
					if !seen {
						order = append(order, t.Endpoint)
					}
					if !seen || t.MetadataVersion > old.MetadataVersion {
						if len(t.XAddrs) == 0 && seen {
							t.XAddrs = old.XAddrs
						}
						found[t.Endpoint] = Found{Target: t, From: from.Addr().Unmap(), Interface: ifc.Name}
					}
					if len(found[t.Endpoint].XAddrs) == 0 && !resolved[t.Endpoint] {
						// WS-Discovery: a match without XAddrs is resolved.
						resolved[t.Endpoint] = true
						id := NewMessageID()
						resolving[id] = t.Endpoint
						_, _ = conn.WriteToUDP(BuildResolve(id, t.Endpoint), net.UDPAddrFromAddrPort(Group))
					}
				}
				mu.Unlock()
			}
		})
	}
	if working == 0 && len(ifaces) > 0 {
		return nil, errors.Join(errs...)
	}
	wg.Wait()
	out := make([]Found, 0, len(order))
	for _, e := range order {
		out = append(out, found[e])
	}
	return out, nil
}

// sendProbes opens a socket on ifc's IPv4 address and sends the probes out
// of ifc; answers come back to that socket.
func sendProbes(ifc net.Interface, typeSets [][]xml.Name) (*net.UDPConn, map[string]bool, error) {
	addr, err := ipv4Addr(&ifc)
	if err != nil {
		return nil, nil, err
	}
	conn, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(addr, 0)))
	if err != nil {
		return nil, nil, fmt.Errorf("interface %s: %w", ifc.Name, err)
	}
	pc := ipv4.NewPacketConn(conn)
	if err := pc.SetMulticastInterface(&ifc); err != nil {
		conn.Close()
		return nil, nil, fmt.Errorf("interface %s: %w", ifc.Name, err)
	}
	_ = pc.SetMulticastTTL(1)
	ids := map[string]bool{}
	to := net.UDPAddrFromAddrPort(Group)
	for _, types := range typeSets {
		id := NewMessageID()
		ids[id] = true
		if _, err := conn.WriteToUDP(BuildProbe(id, types...), to); err != nil {
			conn.Close()
			return nil, nil, fmt.Errorf("interface %s: sending a probe: %w", ifc.Name, err)
		}
	}
	return conn, ids, nil
}

// Listen receives Hello and Bye messages on the multicast group of each
// interface and calls fn with each (one call at a time), until ctx ends; it
// then returns nil. Malformed messages go to bad (which may be nil).
func Listen(ctx context.Context, ifaces []net.Interface, fn func(Announcement), bad func(from netip.Addr, err error)) error {
	var conns []*net.UDPConn
	var names []string
	for _, ifc := range ifaces {
		conn, err := net.ListenMulticastUDP("udp4", &ifc, net.UDPAddrFromAddrPort(Group))
		if err != nil {
			for _, c := range conns {
				c.Close()
			}
			return fmt.Errorf("listening on %s: %w", ifc.Name, err)
		}
		// Without this a socket bound to the group's port gets the group's
		// traffic of every interface some socket joined.
		if rc, err := conn.SyscallConn(); err == nil {
			// Best effort: kernels without the option deliver as before.
			_ = rc.Control(func(fd uintptr) {
				_ = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_IP, unix.IP_MULTICAST_ALL, 0)
			})
		}
		conns = append(conns, conn)
		names = append(names, ifc.Name)
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i, conn := range conns {
		stop := context.AfterFunc(ctx, func() { conn.Close() })
		wg.Go(func() {
			defer stop()
			defer conn.Close()
			buf := make([]byte, maxMessage)
			for {
				n, from, err := conn.ReadFromUDPAddrPort(buf)
				if err != nil {
					return
				}
				m, err := ParseMessage(buf[:n])
				if err != nil {
					if bad != nil {
						bad(from.Addr(), err)
					}
					continue
				}
				if m.Action != ActionHello && m.Action != ActionBye {
					continue
				}
				mu.Lock()
				for _, t := range m.Targets {
					fn(Announcement{Found: Found{Target: t, From: from.Addr().Unmap(), Interface: names[i]}, Hello: m.Action == ActionHello})
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return nil
}
