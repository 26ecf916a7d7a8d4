package handler

import (
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// HostPort is one address a scanning handler probes.
type HostPort struct {
	Host string
	Port int
}

func (h HostPort) String() string { return net.JoinHostPort(h.Host, strconv.Itoa(h.Port)) }

// ExpandTargets turns a Configuration's targets (host, host:port, or a
// CIDR range) into the addresses to probe, each host without a port on
// every one of ports, dropping repeats. It refuses more than max addresses
// before it builds any list, so that a /8 costs nothing; an IPv4 range's
// network and broadcast addresses are left out (no device answers there,
// and a broadcast would reach them all). Errors are InvalidDetails naming
// the target; proto ("TCP", "UDP") words a bad port's.
func ExpandTargets(targets []string, ports []int, max int, proto string) ([]HostPort, error) {
	var out []HostPort
	seen := map[HostPort]bool{}
	add := func(h HostPort) {
		if !seen[h] {
			seen[h] = true
			out = append(out, h)
		}
	}
	total := 0
	for i, t := range targets {
		t = strings.TrimSpace(t)
		if t == "" {
			return nil, InvalidDetails("targets[%d]: must not be empty", i)
		}
		if strings.Contains(t, "/") {
			prefix, err := netip.ParsePrefix(t)
			if err != nil {
				return nil, InvalidDetails("targets[%d]: %q is not a CIDR range: %v", i, t, err)
			}
			prefix = prefix.Masked()
			hostBits := prefix.Addr().BitLen() - prefix.Bits()
			if hostBits > 24 {
				return nil, InvalidDetails("targets[%d]: %s has 2^%d addresses, more than maxTargets (%d) allows", i, t, hostBits, max)
			}
			hosts := 1 << hostBits
			skipEnds := prefix.Addr().Is4() && hostBits >= 2
			if skipEnds {
				hosts -= 2
			}
			total += hosts * len(ports)
			if total > max {
				return nil, InvalidDetails("targets[%d]: %s on %d port(s) brings the targets to %d, more than maxTargets (%d)", i, t, len(ports), total, max)
			}
			addr := prefix.Addr()
			for n := 0; n < 1<<hostBits; n, addr = n+1, addr.Next() {
				if skipEnds && (n == 0 || n == 1<<hostBits-1) {
					continue
				}
				for _, port := range ports {
					add(HostPort{addr.String(), port})
				}
			}
			continue
		}
		host, portStr, err := net.SplitHostPort(t)
		if err != nil {
			// No port: the host on each of ports. A bare IPv6 address is
			// taken as such; with a port it must be bracketed.
			host, portStr = strings.Trim(t, "[]"), ""
		}
		if host == "" || strings.ContainsAny(host, " \t/") {
			return nil, InvalidDetails("targets[%d]: %q has no valid host", i, t)
		}
		if _, err := netip.ParseAddr(host); err != nil && strings.Contains(host, ":") {
			return nil, InvalidDetails("targets[%d]: %q is neither host:port nor an IPv6 address", i, t)
		}
		if portStr == "" {
			total += len(ports)
			if total > max {
				return nil, InvalidDetails("targets[%d]: brings the targets to %d, more than maxTargets (%d)", i, total, max)
			}
			for _, port := range ports {
				add(HostPort{host, port})
			}
			continue
		}
		port, err := strconv.Atoi(portStr)
		if err != nil || port < 1 || port > 65535 {
			return nil, InvalidDetails("targets[%d]: %q: %q is not a %s port", i, t, portStr, proto)
		}
		total++
		if total > max {
			return nil, InvalidDetails("targets[%d]: brings the targets to %d, more than maxTargets (%d)", i, total, max)
		}
		add(HostPort{host, port})
	}
	return out, nil
}
