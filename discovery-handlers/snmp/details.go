package snmp

import (
	"regexp"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/dowse-dev/dowse/internal/snmpclient"
	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
	"github.com/dowse-dev/dowse/shared/handler"
)

// Device properties, handed to brokers as environment variables (and to a
// deviceTemplate's configData as ${...}).
const (
	AddressProperty     = "SNMP_ADDRESS" // the agent's host (IP address or name)
	PortProperty        = "SNMP_PORT"
	VersionProperty     = "SNMP_VERSION" // v1, v2c or v3: how it was reached
	SysObjectIDProperty = "SNMP_SYS_OBJECT_ID"
	SysDescrProperty    = "SNMP_SYS_DESCR"
	SysNameProperty     = "SNMP_SYS_NAME"
)

// Discovery properties the handler reads from the Configuration (normally
// resolved from a Secret): the credentials.
const (
	// CommunityProperty is the v1/v2c community (default "public").
	CommunityProperty = "SNMP_COMMUNITY"
	// UserProperty is the v3 USM user name.
	UserProperty = "SNMP_USER"
	// AuthPassphraseProperty is the v3 user's authentication passphrase.
	AuthPassphraseProperty = "SNMP_AUTH_PASSPHRASE"
	// PrivPassphraseProperty is the v3 user's privacy passphrase.
	PrivPassphraseProperty = "SNMP_PRIV_PASSPHRASE"
)

// Defaults and bounds of Details.
const (
	DefaultPort       = 161
	DefaultMaxTargets = 1024
	MaxMaxTargets     = 65536
	DefaultTimeout    = time.Second
	// MinDefaultConcurrency is the least of the default bound on probes
	// in flight, which otherwise is what the rate and the timeout need
	// (Details.Concurrency).
	MinDefaultConcurrency   = 16
	MaxConcurrency          = 256
	DefaultPacketsPerSecond = 50
	MaxPacketsPerSecond     = 1000
	DefaultRescanInterval   = 60 * time.Second
	MinRescanInterval       = 100 * time.Millisecond
	DefaultFailureThreshold = 2
	// MaxBackoffRounds caps the exponential backoff of a target that
	// does not answer: it is asked at least every MaxBackoffRounds rounds.
	MaxBackoffRounds = 16
)

// Details are a Configuration's discoveryDetails for SNMP, e.g.
//
//	targets: ["10.0.4.0/24", "ups-3.plant.local:1161"]
//	version: v3
//	v3: {securityLevel: authPriv, authProtocol: SHA256, privProtocol: AES}
//	match: {sysObjectIdPrefixes: [".1.3.6.1.4.1.318"], sysDescr: "^APC"}
//
// with the credentials in discoveryProperties (SNMP_COMMUNITY, or SNMP_USER,
// SNMP_AUTH_PASSPHRASE and SNMP_PRIV_PASSPHRASE).
type Details struct {
	// Targets are "host:port", "host" (on each of Ports) or an IPv4/IPv6
	// CIDR range (every host address in it, on each of Ports). Required.
	Targets []string `json:"targets"`
	// Ports are the UDP ports of targets given without one. Default [161].
	Ports []int `json:"ports,omitempty"`
	// MaxTargets refuses details whose targets expand to more host:port
	// pairs than this. Default 1024, at most 65536.
	MaxTargets int `json:"maxTargets,omitempty"`
	// Version is v1, v2c (the default) or v3.
	Version string `json:"version,omitempty"`
	// V3 are the SNMPv3 settings that are not secret.
	V3 *V3 `json:"v3,omitempty"`
	// Match, when set, keeps only the agents that pass every condition.
	Match *Match `json:"match,omitempty"`
	// Timeout bounds each request, a Go duration. Default 1s. A request
	// is not retried within a round.
	Timeout string `json:"timeout,omitempty"`
	// Concurrency bounds the targets asked at once. A silent address
	// holds a slot for the whole timeout, so the default is what lets
	// packetsPerSecond pace a sweep of silent addresses: packetsPerSecond
	// × timeout + 1, at least 16; at most 256.
	Concurrency int `json:"concurrency,omitempty"`
	// PacketsPerSecond bounds the requests sent per second by one
	// Configuration (a v3 probe sends two). Default 50, at most 1000.
	PacketsPerSecond int `json:"packetsPerSecond,omitempty"`
	// RescanInterval is the pause between the end of a round and the next.
	// Default 60s, at least 100ms.
	RescanInterval string `json:"rescanInterval,omitempty"`
	// FailureThreshold is how many rounds in a row a known agent must go
	// unanswered before it is dropped. Default 2.
	FailureThreshold int `json:"failureThreshold,omitempty"`

	targets  []target // expanded, in order
	timeout  time.Duration
	interval time.Duration
	descrRe  *regexp.Regexp
	nameRe   *regexp.Regexp
	prefixes []string // normalized
}

// V3 are an SNMPv3 user's settings beside its name and passphrases.
type V3 struct {
	// SecurityLevel is noAuthNoPriv, authNoPriv or authPriv. Default: what
	// the passphrases given allow (authPriv with both).
	SecurityLevel string `json:"securityLevel,omitempty"`
	// AuthProtocol is MD5, SHA (default), SHA224, SHA256, SHA384 or SHA512.
	AuthProtocol string `json:"authProtocol,omitempty"`
	// PrivProtocol is DES, AES (default), AES192, AES256, AES192C or
	// AES256C.
	PrivProtocol string `json:"privProtocol,omitempty"`
	// ContextName is the SNMPv3 context; default none.
	ContextName string `json:"contextName,omitempty"`
}

// Match keeps only the agents whose system group passes every condition.
type Match struct {
	// SysObjectIDPrefixes: sysObjectID must lie under one of these
	// numeric OIDs (arc by arc: .1.3.6.1.4.1.8072 holds
	// .1.3.6.1.4.1.8072.3.2.10).
	SysObjectIDPrefixes []string `json:"sysObjectIdPrefixes,omitempty"`
	// SysDescr is an RE2 expression sysDescr must match.
	SysDescr string `json:"sysDescr,omitempty"`
	// SysName is an RE2 expression sysName must match.
	SysName string `json:"sysName,omitempty"`
}

// target is one host:port to ask.
type target = handler.HostPort

// AddressList returns the expanded host:port targets, in order.
func (d *Details) AddressList() []string {
	out := make([]string, len(d.targets))
	for i, t := range d.targets {
		out[i] = t.String()
	}
	return out
}

// ProbeTimeout returns the parsed timeout.
func (d *Details) ProbeTimeout() time.Duration { return d.timeout }

// Interval returns the parsed rescan interval.
func (d *Details) Interval() time.Duration { return d.interval }

// ParseDetails parses and validates discovery_details (JSON or YAML), fills
// in defaults and expands the targets. Unknown fields are errors. Its errors
// are InvalidArgument statuses naming the bad field, ready to return from
// Discover.
func ParseDetails(s string) (*Details, error) {
	var d Details
	if err := yaml.UnmarshalStrict([]byte(s), &d); err != nil {
		return nil, handler.InvalidDetails("%v", err)
	}
	if err := d.defaultAndValidate(); err != nil {
		return nil, err
	}
	return &d, nil
}

// Security combines the details' version and v3 settings with the
// credentials in the discovery properties into the settings of a client.
// Its errors are InvalidArgument statuses naming what is wrong.
func (d *Details) Security(props map[string]*discoveryv1.ByteData) (*snmpclient.Security, error) {
	s := &snmpclient.Security{
		Version:        d.Version,
		Community:      string(props[CommunityProperty].GetVec()),
		User:           string(props[UserProperty].GetVec()),
		AuthPassphrase: string(props[AuthPassphraseProperty].GetVec()),
		PrivPassphrase: string(props[PrivPassphraseProperty].GetVec()),
	}
	if d.V3 != nil {
		if s.Version != snmpclient.V3 {
			return nil, handler.InvalidDetails("v3: set, but version is %q (set version: v3)", d.Version)
		}
		s.Level, s.AuthProtocol, s.PrivProtocol, s.ContextName = d.V3.SecurityLevel, d.V3.AuthProtocol, d.V3.PrivProtocol, d.V3.ContextName
	}
	if err := s.Check(); err != nil {
		return nil, handler.InvalidDetails("version %s with discovery properties %s/%s/%s/%s: %v", s.Version,
			CommunityProperty, UserProperty, AuthPassphraseProperty, PrivPassphraseProperty, err)
	}
	return s, nil
}

func (d *Details) defaultAndValidate() error {
	if d.MaxTargets == 0 {
		d.MaxTargets = DefaultMaxTargets
	}
	if d.MaxTargets < 0 || d.MaxTargets > MaxMaxTargets {
		return handler.InvalidDetails("maxTargets: %d is not between 1 and %d", d.MaxTargets, MaxMaxTargets)
	}
	if len(d.Ports) == 0 {
		d.Ports = []int{DefaultPort}
	}
	for i, p := range d.Ports {
		if p < 1 || p > 65535 {
			return handler.InvalidDetails("ports[%d]: %d is not a UDP port", i, p)
		}
	}
	if len(d.Targets) == 0 {
		return handler.InvalidDetails("targets: at least one target is required")
	}
	if err := d.expandTargets(); err != nil {
		return err
	}
	switch strings.ToLower(d.Version) {
	case "", "v2c", "2c", "2":
		d.Version = snmpclient.V2c
	case "v1", "1":
		d.Version = snmpclient.V1
	case "v3", "3":
		d.Version = snmpclient.V3
	default:
		return handler.InvalidDetails("version: %q is not one of v1, v2c, v3", d.Version)
	}
	if m := d.Match; m != nil {
		for i, p := range m.SysObjectIDPrefixes {
			// A trailing dot ("under this arc") changes nothing.
			n, err := snmpclient.NormalizeOID(strings.TrimSuffix(p, "."))
			if err != nil {
				return handler.InvalidDetails("match.sysObjectIdPrefixes[%d]: %v", i, err)
			}
			d.prefixes = append(d.prefixes, n)
		}
		var err error
		if m.SysDescr != "" {
			if d.descrRe, err = regexp.Compile(m.SysDescr); err != nil {
				return handler.InvalidDetails("match.sysDescr: %v", err)
			}
		}
		if m.SysName != "" {
			if d.nameRe, err = regexp.Compile(m.SysName); err != nil {
				return handler.InvalidDetails("match.sysName: %v", err)
			}
		}
	}
	var err error
	if d.timeout, err = handler.ParseDuration("timeout", d.Timeout, DefaultTimeout, 10*time.Millisecond); err != nil {
		return err
	}
	if d.interval, err = handler.ParseDuration("rescanInterval", d.RescanInterval, DefaultRescanInterval, MinRescanInterval); err != nil {
		return err
	}
	if err := handler.ParseInt("packetsPerSecond", &d.PacketsPerSecond, DefaultPacketsPerSecond, MaxPacketsPerSecond); err != nil {
		return err
	}
	if err := handler.ParseInt("concurrency", &d.Concurrency, handler.PacedConcurrency(d.PacketsPerSecond, d.timeout, MinDefaultConcurrency, MaxConcurrency), MaxConcurrency); err != nil {
		return err
	}
	return handler.ParseInt("failureThreshold", &d.FailureThreshold, DefaultFailureThreshold, 1000)
}

// matches says whether an agent's system group passes the match, and if
// not, why.
func (d *Details) matches(a agentInfo) (bool, string) {
	if len(d.prefixes) > 0 {
		ok := false
		for _, p := range d.prefixes {
			if snmpclient.HasPrefix(a.objectID, p) {
				ok = true
				break
			}
		}
		if !ok {
			return false, "sysObjectID " + a.objectID + " is under none of match.sysObjectIdPrefixes"
		}
	}
	if d.descrRe != nil && !d.descrRe.MatchString(a.descr) {
		return false, "sysDescr " + strconv.Quote(a.descr) + " fails match.sysDescr"
	}
	if d.nameRe != nil && !d.nameRe.MatchString(a.name) {
		return false, "sysName " + strconv.Quote(a.name) + " fails match.sysName"
	}
	return true, ""
}

// expandTargets turns Targets into host:port pairs (handler.ExpandTargets).
func (d *Details) expandTargets() (err error) {
	d.targets, err = handler.ExpandTargets(d.Targets, d.Ports, d.MaxTargets, "UDP")
	return err
}
