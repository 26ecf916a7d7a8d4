package opcua

import (
	"net/url"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/dowse-dev/dowse/shared/handler"
)

// Device properties, handed to brokers as environment variables.
const (
	// DiscoveryURLProperty is the URL on which the server answered
	// GetEndpoints, the one a broker should connect to.
	DiscoveryURLProperty = "OPCUA_DISCOVERY_URL"
	// ApplicationURIProperty is the server's applicationUri, also the
	// device id.
	ApplicationURIProperty = "OPCUA_APPLICATION_URI"
	// ApplicationNameProperty is the server's application name (its text).
	ApplicationNameProperty = "OPCUA_APPLICATION_NAME"
	// SecurityModesProperty lists the message security modes the server's
	// endpoints offer, comma-separated, sorted and unique, from None, Sign
	// and SignAndEncrypt.
	SecurityModesProperty = "OPCUA_SECURITY_MODES"
	// SecurityPoliciesProperty lists the short names of the security
	// policies its endpoints offer (e.g. None,Basic256Sha256), likewise.
	SecurityPoliciesProperty = "OPCUA_SECURITY_POLICIES"
	// SecureChannelProperty is set only when the Configuration gives a
	// client certificate: the "<mode> <policy>" of the most secure channel
	// the server opened with it (e.g. "SignAndEncrypt Basic256Sha256"),
	// SecureChannelRejected when the server refused the certificate, or
	// "none" when it offers no secure endpoint.
	SecureChannelProperty = "OPCUA_SECURE_CHANNEL"
	// SecureChannelRejected is SecureChannelProperty's value when the
	// server refused a secure channel with the client certificate.
	SecureChannelRejected = "rejected"
)

// Discovery properties the handler reads from the Configuration (normally
// resolved from a Secret).
const (
	// ClientCertificateProperty holds the client's certificate, PEM.
	ClientCertificateProperty = "OPCUA_CLIENT_CERTIFICATE"
	// ClientKeyProperty holds the client certificate's RSA private key, PEM.
	ClientKeyProperty = "OPCUA_CLIENT_KEY"
)

// Defaults and bounds of Details.
const (
	DefaultDiscoveryURL        = "opc.tcp://localhost:4840/"
	DefaultRediscoveryInterval = 10 * time.Second
	DefaultTimeout             = 5 * time.Second
	DefaultFailureThreshold    = 3

	// MinRediscoveryInterval keeps a Configuration from turning the handler
	// into a load generator against its servers.
	MinRediscoveryInterval = 100 * time.Millisecond
	// MaxDiscoveryURLs bounds the work of one round.
	MaxDiscoveryURLs = 64
)

// FilterAction says what a FilterList's items mean.
type FilterAction string

const (
	// Include keeps only the items listed.
	Include FilterAction = "Include"
	// Exclude keeps everything but the items listed (the default).
	Exclude FilterAction = "Exclude"
)

// FilterList keeps or drops values by exact match, like Akri's.
type FilterList struct {
	// Action is Include or Exclude; Exclude when empty.
	Action FilterAction `json:"action,omitempty"`
	// Items are the values the action applies to.
	Items []string `json:"items,omitempty"`
}

// Accepts reports whether v passes the filter; a nil filter passes all.
func (f *FilterList) Accepts(v string) bool {
	if f == nil {
		return true
	}
	listed := false
	for _, item := range f.Items {
		if item == v {
			listed = true
			break
		}
	}
	if f.Action == Include {
		return listed
	}
	return !listed
}

// Details are a Configuration's discoveryDetails for OPC UA, e.g.
//
//	discoveryUrls: ["opc.tcp://lds.plant.local:4840/"]
//	applicationNames: {action: Exclude, items: ["Test Server"]}
//	rediscoveryInterval: 30s
type Details struct {
	// DiscoveryURLs are the opc.tcp URLs to ask FindServers: servers, or
	// local discovery servers that list the servers registered with them.
	// Default [opc.tcp://localhost:4840/].
	DiscoveryURLs []string `json:"discoveryUrls,omitempty"`
	// ApplicationNames filters servers by application name (text).
	ApplicationNames *FilterList `json:"applicationNames,omitempty"`
	// RediscoveryInterval is the pause between rounds, a Go duration such
	// as "30s". Default 10s, at least 100ms.
	RediscoveryInterval string `json:"rediscoveryInterval,omitempty"`
	// Timeout bounds each FindServers or GetEndpoints call, connection
	// included. Default 5s.
	Timeout string `json:"timeout,omitempty"`
	// FailureThreshold is how many rounds in a row a known server must fail
	// its check before it is dropped. Default 3.
	FailureThreshold int `json:"failureThreshold,omitempty"`

	interval time.Duration
	timeout  time.Duration
}

// Interval returns the parsed rediscovery interval.
func (d *Details) Interval() time.Duration { return d.interval }

// CallTimeout returns the parsed per-call timeout.
func (d *Details) CallTimeout() time.Duration { return d.timeout }

// ParseDetails parses and validates discovery_details (JSON or YAML) and
// fills in defaults. Unknown fields are errors, so that a typo is not
// silently ignored. Its errors are InvalidArgument statuses naming the bad
// field, ready to return from Discover.
func ParseDetails(s string) (*Details, error) {
	var d Details
	if err := yaml.UnmarshalStrict([]byte(s), &d); err != nil {
		return nil, handler.InvalidDetails("%v", err)
	}
	if len(d.DiscoveryURLs) == 0 {
		d.DiscoveryURLs = []string{DefaultDiscoveryURL}
	}
	if len(d.DiscoveryURLs) > MaxDiscoveryURLs {
		return nil, handler.InvalidDetails("discoveryUrls: %d URLs, more than the %d allowed", len(d.DiscoveryURLs), MaxDiscoveryURLs)
	}
	seen := make(map[string]int, len(d.DiscoveryURLs))
	for i, raw := range d.DiscoveryURLs {
		u, err := url.Parse(raw)
		switch {
		case err != nil:
			return nil, handler.InvalidDetails("discoveryUrls[%d]: %q is not a URL: %v", i, raw, err)
		case u.Scheme != "opc.tcp":
			return nil, handler.InvalidDetails("discoveryUrls[%d]: %q: the scheme must be opc.tcp", i, raw)
		case u.Hostname() == "":
			return nil, handler.InvalidDetails("discoveryUrls[%d]: %q has no host", i, raw)
		}
		if j, dup := seen[raw]; dup {
			return nil, handler.InvalidDetails("discoveryUrls[%d]: %q duplicates discoveryUrls[%d]", i, raw, j)
		}
		seen[raw] = i
	}
	if f := d.ApplicationNames; f != nil {
		switch f.Action {
		case "":
			f.Action = Exclude
		case Include, Exclude:
		default:
			return nil, handler.InvalidDetails("applicationNames.action: %q is neither Include nor Exclude", f.Action)
		}
		for i, item := range f.Items {
			if strings.TrimSpace(item) == "" {
				return nil, handler.InvalidDetails("applicationNames.items[%d]: must not be empty", i)
			}
		}
	}
	var err error
	if d.interval, err = handler.ParseDuration("rediscoveryInterval", d.RediscoveryInterval, DefaultRediscoveryInterval, MinRediscoveryInterval); err != nil {
		return nil, err
	}
	if d.timeout, err = handler.ParseDuration("timeout", d.Timeout, DefaultTimeout, time.Millisecond); err != nil {
		return nil, err
	}
	switch {
	case d.FailureThreshold == 0:
		d.FailureThreshold = DefaultFailureThreshold
	case d.FailureThreshold < 0 || d.FailureThreshold > 1000:
		return nil, handler.InvalidDetails("failureThreshold: %d is not between 1 and 1000", d.FailureThreshold)
	}
	return &d, nil
}
