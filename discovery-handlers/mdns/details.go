package mdns

import (
	"regexp"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/dowse-dev/dowse/shared/handler"
)

// Device properties, handed to brokers as environment variables.
const (
	InstanceProperty  = "MDNS_INSTANCE"  // the instance's own label, e.g. "Office printer"
	ServiceProperty   = "MDNS_SERVICE"   // e.g. _ipp._tcp
	DomainProperty    = "MDNS_DOMAIN"    // local
	HostProperty      = "MDNS_HOST"      // the SRV target, e.g. printer-3.local
	PortProperty      = "MDNS_PORT"      // the SRV port
	AddressProperty   = "MDNS_ADDRESS"   // the host's first address (IPv4, then routable IPv6, then link-local)
	AddressesProperty = "MDNS_ADDRESSES" // all of them, comma-separated
	// TXTPrefix prefixes each TXT key, upper-cased with characters that
	// are not letters or digits turned to _: txtvers=1 is MDNS_TXT_TXTVERS.
	TXTPrefix = "MDNS_TXT_"
)

// Defaults and bounds of Details.
const (
	DefaultMaxServices   = 256
	MaxMaxServices       = 4096
	MaxServiceTypes      = 16
	DefaultQueryInterval = time.Minute
	MinQueryInterval     = time.Second
	// MaxTXTEntries and MaxTXTBytes bound what a service's TXT record puts
	// in its properties; the rest is dropped (and counted).
	MaxTXTEntries = 64
	MaxTXTBytes   = 2048
)

var serviceTypeRe = regexp.MustCompile(`^_[A-Za-z0-9]([A-Za-z0-9-]{0,14})\._(tcp|udp)$`)

// Details are a Configuration's discoveryDetails for mDNS/DNS-SD, e.g.
//
//	serviceTypes: ["_ipp._tcp", "_http._tcp"]
//	txt: {ty: "^HP ", rp: "."}
//	instance: "^Office"
type Details struct {
	// ServiceTypes are the DNS-SD service types to browse, e.g. _http._tcp
	// (RFC 6763: an underscore, 1-15 letters, digits and hyphens, then
	// ._tcp or ._udp). Required, at most 16.
	ServiceTypes []string `json:"serviceTypes"`
	// Domain is the browsing domain. Only "local" (mDNS) is served.
	Domain string `json:"domain,omitempty"`
	// TXT keeps only services whose TXT record has each key (compared
	// case-insensitively) with a value matching the RE2 expression
	// ("" : the key is there, with any value or none).
	TXT map[string]string `json:"txt,omitempty"`
	// Instance, an RE2 expression, keeps only services whose instance
	// name matches.
	Instance string `json:"instance,omitempty"`
	// Interfaces are the network interfaces to browse on (default: every
	// interface that is up, multicast-capable, not loopback, with an
	// address of a family browsed).
	Interfaces []string `json:"interfaces,omitempty"`
	// IPFamilies are the IP versions browsed on: IPv4 (group
	// 224.0.0.251), IPv6 (group ff02::fb) or both (the default). A family
	// is used on an interface that has an address of it.
	IPFamilies []string `json:"ipFamilies,omitempty"`
	// MaxServices bounds the services kept; past it new ones are ignored
	// (and said so). Default 256, at most 4096.
	MaxServices int `json:"maxServices,omitempty"`
	// QueryInterval is the longest pause between queries for the service
	// types: queries go out at start, then 1s, 2s, 4s... apart up to it
	// (RFC 6762 5.2). Answers and announcements are taken at any time.
	// Default 1m, at least 1s.
	QueryInterval string `json:"queryInterval,omitempty"`

	ipv4, ipv6 bool
	txt        map[string]*regexp.Regexp // lower-cased keys
	instance   *regexp.Regexp
	interval   time.Duration
	types      map[string]bool // fully qualified, lower-cased: _http._tcp.local.
}

// ParseDetails parses and validates discovery_details (JSON or YAML) and
// fills in defaults. Unknown fields are errors; errors are InvalidArgument
// statuses naming the field.
func ParseDetails(s string) (*Details, error) {
	var d Details
	if err := yaml.UnmarshalStrict([]byte(s), &d); err != nil {
		return nil, handler.InvalidDetails("%v", err)
	}
	if len(d.ServiceTypes) == 0 {
		return nil, handler.InvalidDetails("serviceTypes: at least one service type (e.g. _http._tcp) is required")
	}
	if len(d.ServiceTypes) > MaxServiceTypes {
		return nil, handler.InvalidDetails("serviceTypes: %d types, at most %d", len(d.ServiceTypes), MaxServiceTypes)
	}
	switch strings.TrimSuffix(strings.ToLower(d.Domain), ".") {
	case "", "local":
		d.Domain = "local"
	default:
		return nil, handler.InvalidDetails("domain: %q: only local (mDNS) is served", d.Domain)
	}
	d.types = map[string]bool{}
	for i, t := range d.ServiceTypes {
		t = strings.TrimSuffix(strings.TrimSuffix(t, "."), ".local")
		if !serviceTypeRe.MatchString(t) {
			return nil, handler.InvalidDetails("serviceTypes[%d]: %q is not a service type such as _http._tcp", i, d.ServiceTypes[i])
		}
		d.ServiceTypes[i] = t
		d.types[strings.ToLower(t)+".local."] = true
	}
	if len(d.IPFamilies) == 0 {
		d.ipv4, d.ipv6 = true, true
	}
	for i, f := range d.IPFamilies {
		switch strings.ToLower(f) {
		case "ipv4":
			d.ipv4 = true
		case "ipv6":
			d.ipv6 = true
		default:
			return nil, handler.InvalidDetails("ipFamilies[%d]: %q is neither IPv4 nor IPv6", i, f)
		}
	}
	d.txt = map[string]*regexp.Regexp{}
	for k, expr := range d.TXT {
		if k == "" || len(k) > 255 {
			return nil, handler.InvalidDetails("txt: %q is not a TXT key", k)
		}
		re, err := regexp.Compile(expr)
		if err != nil {
			return nil, handler.InvalidDetails("txt.%s: %v", k, err)
		}
		d.txt[strings.ToLower(k)] = re
	}
	if d.Instance != "" {
		re, err := regexp.Compile(d.Instance)
		if err != nil {
			return nil, handler.InvalidDetails("instance: %v", err)
		}
		d.instance = re
	}
	if d.MaxServices == 0 {
		d.MaxServices = DefaultMaxServices
	}
	if d.MaxServices < 1 || d.MaxServices > MaxMaxServices {
		return nil, handler.InvalidDetails("maxServices: %d is not between 1 and %d", d.MaxServices, MaxMaxServices)
	}
	var err error
	if d.interval, err = handler.ParseDuration("queryInterval", d.QueryInterval, DefaultQueryInterval, MinQueryInterval); err != nil {
		return nil, err
	}
	return &d, nil
}
