package onvif

import (
	"encoding/xml"
	"net"
	"net/netip"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/dowse-dev/dowse/discovery-handlers/onvif/wsdiscovery"
	"github.com/dowse-dev/dowse/shared/handler"
)

// Filter actions.
const (
	Include = "Include"
	Exclude = "Exclude"
)

// Defaults and bounds of Details.
const (
	DefaultDiscoveryTimeout = 1 * time.Second
	MaxDiscoveryTimeout     = 60 * time.Second
	DefaultProbeInterval    = 30 * time.Second
	MinProbeInterval        = time.Second
	DefaultFailureThreshold = 3
)

// DefaultProbeTypes are the types probed for: ONVIF's
// NetworkVideoTransmitter and Device, one probe each.
var DefaultProbeTypes = []string{"dn:NetworkVideoTransmitter", "tds:Device"}

// Details are a Configuration's discoveryDetails for ONVIF, e.g.
//
//	ipAddresses: {action: Exclude, items: ["10.0.0.0/24"]}
//	macAddresses: {action: Include, items: ["c0:56:e3:a1:b2:c3"]}
//	scopes: {action: Include, items: ["onvif://www.onvif.org/location/*"]}
//	discoveryTimeoutSeconds: 2
//	probeInterval: 30s
type Details struct {
	// IPAddresses filters devices by the IPv4/IPv6 address of their device
	// service: addresses or CIDR ranges.
	IPAddresses *Filter `json:"ipAddresses,omitempty"`
	// MACAddresses filters devices by the MAC address of their network
	// interfaces (any of them), in any common notation.
	MACAddresses *Filter `json:"macAddresses,omitempty"`
	// Scopes filters devices by their WS-Discovery scopes; an item ending
	// in '*' matches by prefix, others exactly. A device matches when any
	// of its scopes does.
	Scopes *Filter `json:"scopes,omitempty"`
	// UUIDs filters devices by endpoint UUID, with or without "urn:uuid:".
	UUIDs *Filter `json:"uuids,omitempty"`
	// DiscoveryTimeoutSeconds is how long a probe waits for answers, 1-60.
	// Default 1.
	DiscoveryTimeoutSeconds int `json:"discoveryTimeoutSeconds,omitempty"`
	// ProbeInterval is the pause between probes, a Go duration of at least
	// 1s. Default 30s. Hello and Bye are heard at any time.
	ProbeInterval string `json:"probeInterval,omitempty"`
	// FailureThreshold is how many probes in a row a device may miss
	// before it is dropped (a Bye drops it at once). Default 3.
	FailureThreshold int `json:"failureThreshold,omitempty"`
	// Interfaces are the network interfaces to probe and listen on.
	// Default: every interface that is up, multicast-capable, not loopback
	// and has an IPv4 address.
	Interfaces []string `json:"interfaces,omitempty"`
	// ProbeTypes are the WS-Discovery types probed for, one probe each, as
	// prefix:name with a prefix of dn, tds or wsdp. Default
	// [dn:NetworkVideoTransmitter, tds:Device].
	ProbeTypes []string `json:"probeTypes,omitempty"`

	timeout  time.Duration
	interval time.Duration
	types    []xml.Name
	ips      *prefixFilter
	macs     map[string]bool
	uuids    map[string]bool
}

// Filter keeps (Include) or drops (Exclude) the devices whose value is one
// of Items.
type Filter struct {
	// Action is Include or Exclude. Default Include.
	Action string   `json:"action,omitempty"`
	Items  []string `json:"items"`
}

type prefixFilter struct {
	include  bool
	prefixes []netip.Prefix
}

// Timeout returns the parsed discovery timeout.
func (d *Details) Timeout() time.Duration { return d.timeout }

// Interval returns the parsed probe interval.
func (d *Details) Interval() time.Duration { return d.interval }

// Types returns the parsed probe types.
func (d *Details) Types() []xml.Name { return d.types }

// ParseDetails parses and validates discovery_details (JSON or YAML) and
// fills in defaults. Unknown fields are errors. Its errors are
// InvalidArgument statuses naming the bad field, ready to return from
// Discover.
func ParseDetails(s string) (*Details, error) {
	var d Details
	if err := yaml.UnmarshalStrict([]byte(s), &d); err != nil {
		return nil, handler.InvalidDetails("%v", err)
	}
	for name, f := range map[string]*Filter{"ipAddresses": d.IPAddresses, "macAddresses": d.MACAddresses, "scopes": d.Scopes, "uuids": d.UUIDs} {
		if f == nil {
			continue
		}
		switch f.Action {
		case "":
			f.Action = Include
		case Include, Exclude:
		default:
			return nil, handler.InvalidDetails("%s.action: %q is not Include or Exclude", name, f.Action)
		}
		if len(f.Items) == 0 {
			return nil, handler.InvalidDetails("%s.items: at least one item is required", name)
		}
	}
	if f := d.IPAddresses; f != nil {
		d.ips = &prefixFilter{include: f.Action == Include}
		for i, it := range f.Items {
			p, err := parseAddrOrPrefix(it)
			if err != nil {
				return nil, handler.InvalidDetails("ipAddresses.items[%d]: %q is not an IP address or CIDR range", i, it)
			}
			d.ips.prefixes = append(d.ips.prefixes, p)
		}
	}
	if f := d.MACAddresses; f != nil {
		d.macs = map[string]bool{}
		for i, it := range f.Items {
			hw, err := net.ParseMAC(strings.TrimSpace(it))
			if err != nil || len(hw) != 6 {
				return nil, handler.InvalidDetails("macAddresses.items[%d]: %q is not a MAC address", i, it)
			}
			d.macs[hw.String()] = true
		}
	}
	if f := d.UUIDs; f != nil {
		d.uuids = map[string]bool{}
		for i, it := range f.Items {
			u, ok := normalizeUUID(it)
			if !ok {
				return nil, handler.InvalidDetails("uuids.items[%d]: %q is not a UUID", i, it)
			}
			d.uuids[u] = true
		}
	}
	if f := d.Scopes; f != nil {
		for i, it := range f.Items {
			if strings.TrimSpace(it) == "" || strings.ContainsAny(it, " \t\n") {
				return nil, handler.InvalidDetails("scopes.items[%d]: %q is not a scope URI", i, it)
			}
		}
	}
	switch {
	case d.DiscoveryTimeoutSeconds == 0:
		d.timeout = DefaultDiscoveryTimeout
	case d.DiscoveryTimeoutSeconds < 1 || time.Duration(d.DiscoveryTimeoutSeconds)*time.Second > MaxDiscoveryTimeout:
		return nil, handler.InvalidDetails("discoveryTimeoutSeconds: %d is not between 1 and %d", d.DiscoveryTimeoutSeconds, int(MaxDiscoveryTimeout/time.Second))
	default:
		d.timeout = time.Duration(d.DiscoveryTimeoutSeconds) * time.Second
	}
	d.interval = DefaultProbeInterval
	if d.ProbeInterval != "" {
		v, err := time.ParseDuration(d.ProbeInterval)
		if err != nil {
			return nil, handler.InvalidDetails("probeInterval: %q is not a duration such as \"30s\"", d.ProbeInterval)
		}
		if v < MinProbeInterval {
			return nil, handler.InvalidDetails("probeInterval: %v is shorter than the minimum %v", v, MinProbeInterval)
		}
		d.interval = v
	}
	if d.FailureThreshold == 0 {
		d.FailureThreshold = DefaultFailureThreshold
	}
	if d.FailureThreshold < 1 || d.FailureThreshold > 100 {
		return nil, handler.InvalidDetails("failureThreshold: %d is not between 1 and 100", d.FailureThreshold)
	}
	for i, name := range d.Interfaces {
		if name == "" || len(name) > 15 || strings.ContainsAny(name, "/ \t") {
			return nil, handler.InvalidDetails("interfaces[%d]: %q is not an interface name", i, name)
		}
	}
	if len(d.ProbeTypes) == 0 {
		d.ProbeTypes = DefaultProbeTypes
	}
	for i, q := range d.ProbeTypes {
		prefix, local, ok := strings.Cut(q, ":")
		space, known := wsdiscovery.KnownPrefixes[prefix]
		if !ok || !known || local == "" || strings.ContainsAny(local, ": \t<>&") {
			return nil, handler.InvalidDetails("probeTypes[%d]: %q is not prefix:name with a prefix of dn, tds or wsdp", i, q)
		}
		d.types = append(d.types, xml.Name{Space: space, Local: local})
	}
	return &d, nil
}

func parseAddrOrPrefix(s string) (netip.Prefix, error) {
	s = strings.TrimSpace(s)
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		return p.Masked(), err
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	return netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()), nil
}

// normalizeUUID returns the lower-case bare UUID of s ("urn:uuid:..." or
// bare).
func normalizeUUID(s string) (string, bool) {
	s = strings.ToLower(strings.TrimSpace(s))
	s = strings.TrimPrefix(s, "urn:uuid:")
	if len(s) != 36 {
		return "", false
	}
	for i, c := range s {
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return "", false
			}
		default:
			if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
				return "", false
			}
		}
	}
	return s, true
}

// passesAddress applies the ipAddresses filter.
func (d *Details) passesAddress(a netip.Addr) bool {
	if d.ips == nil {
		return true
	}
	in := false
	for _, p := range d.ips.prefixes {
		if p.Contains(a.Unmap()) {
			in = true
			break
		}
	}
	return in == d.ips.include
}

// passesUUID applies the uuids filter to an endpoint address.
func (d *Details) passesUUID(endpoint string) bool {
	if d.uuids == nil {
		return true
	}
	u, _ := normalizeUUID(endpoint)
	return d.uuids[u] == (d.UUIDs.Action == Include)
}

// passesScopes applies the scopes filter.
func (d *Details) passesScopes(scopes []string) bool {
	f := d.Scopes
	if f == nil {
		return true
	}
	in := false
	for _, s := range scopes {
		for _, it := range f.Items {
			if p, ok := strings.CutSuffix(it, "*"); ok && strings.HasPrefix(s, p) || s == it {
				in = true
			}
		}
	}
	return in == (f.Action == Include)
}

// passesMACs applies the macAddresses filter to a device's MAC addresses
// (any of them may be listed). A device whose MACs are unknown passes an
// Exclude filter and fails an Include one.
func (d *Details) passesMACs(macs []string) bool {
	if d.macs == nil {
		return true
	}
	in := false
	for _, m := range macs {
		if hw, err := net.ParseMAC(m); err == nil && d.macs[hw.String()] {
			in = true
		}
	}
	return in == (d.MACAddresses.Action == Include)
}
