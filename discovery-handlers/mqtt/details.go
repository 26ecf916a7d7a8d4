package mqtt

import (
	"crypto/tls"
	"crypto/x509"
	"net/url"
	"regexp"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"sigs.k8s.io/yaml"

	"github.com/dowse-dev/dowse/internal/sparkplug"
	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
	"github.com/dowse-dev/dowse/shared/handler"
)

// Device properties, handed to brokers as environment variables (and to a
// deviceTemplate's configData as ${...}).
const (
	// BrokerProperty is the broker's URL as the details name it.
	BrokerProperty = "MQTT_BROKER"
	// SourceProperty is "sparkplug" or "homeassistant": which convention
	// announced the device.
	SourceProperty = "MQTT_SOURCE"

	SparkplugGroupProperty    = "MQTT_SPARKPLUG_GROUP"
	SparkplugEdgeNodeProperty = "MQTT_SPARKPLUG_EDGE_NODE"
	// SparkplugDeviceProperty is the device id; absent for an edge node.
	SparkplugDeviceProperty = "MQTT_SPARKPLUG_DEVICE"
	// SparkplugMetricsProperty is a JSON object of the birth's metrics,
	// name to data type ({"Temperature":"Double","Relay":"Boolean"}); at
	// most maxMetrics of them and MaxMetricsText bytes.
	SparkplugMetricsProperty = "MQTT_SPARKPLUG_METRICS"
	// SparkplugMetricCountProperty counts the birth's metrics, all of them.
	SparkplugMetricCountProperty = "MQTT_SPARKPLUG_METRIC_COUNT"

	HAComponentProperty = "MQTT_HA_COMPONENT" // sensor, switch, light...
	HANodeIDProperty    = "MQTT_HA_NODE_ID"   // absent without one
	HAObjectIDProperty  = "MQTT_HA_OBJECT_ID"
	// HAComponentIDProperty is the component's key in a device-based
	// config's components (absent for a config of one entity).
	HAComponentIDProperty       = "MQTT_HA_COMPONENT_ID"
	HAConfigTopicProperty       = "MQTT_HA_CONFIG_TOPIC"
	HAUniqueIDProperty          = "MQTT_HA_UNIQUE_ID"
	HANameProperty              = "MQTT_HA_NAME"
	HAStateTopicProperty        = "MQTT_HA_STATE_TOPIC"
	HACommandTopicProperty      = "MQTT_HA_COMMAND_TOPIC"
	HAAvailabilityTopicProperty = "MQTT_HA_AVAILABILITY_TOPIC"
	HADeviceClassProperty       = "MQTT_HA_DEVICE_CLASS"
	HAUnitProperty              = "MQTT_HA_UNIT"
	HAValueTemplateProperty     = "MQTT_HA_VALUE_TEMPLATE"
	HAPayloadOnProperty         = "MQTT_HA_PAYLOAD_ON"
	HAPayloadOffProperty        = "MQTT_HA_PAYLOAD_OFF"
	// HADeviceIdentifiersProperty is a JSON list of the device's
	// identifiers (["0x00158d0001a2b3c4"]).
	HADeviceIdentifiersProperty  = "MQTT_HA_DEVICE_IDENTIFIERS"
	HADeviceNameProperty         = "MQTT_HA_DEVICE_NAME"
	HADeviceManufacturerProperty = "MQTT_HA_DEVICE_MANUFACTURER"
	HADeviceModelProperty        = "MQTT_HA_DEVICE_MODEL"
)

// Sources (SourceProperty).
const (
	SourceSparkplug     = "sparkplug"
	SourceHomeAssistant = "homeassistant"
)

// Discovery properties the handler reads from the Configuration (normally
// resolved from a Secret): how to sign in to the broker.
const (
	UsernameProperty = "MQTT_USERNAME"
	PasswordProperty = "MQTT_PASSWORD"
	// CACertProperty is PEM certificates to trust for an ssl:// or wss://
	// broker instead of the system's.
	CACertProperty = "MQTT_CA_CERT"
	// ClientCertProperty and ClientKeyProperty are a PEM client
	// certificate and its key, both or neither.
	ClientCertProperty = "MQTT_CLIENT_CERT"
	ClientKeyProperty  = "MQTT_CLIENT_KEY"
)

// Defaults and bounds of Details.
const (
	DefaultMaxDevices = 1024
	MaxMaxDevices     = 65536
	DefaultMaxPayload = 64 << 10
	MaxMaxPayload     = 1 << 20
	DefaultMaxMetrics = 256
	MaxMaxMetrics     = 4096
	// MaxMetricsText bounds SparkplugMetricsProperty, in bytes.
	MaxMetricsText = 16 << 10
	// MaxHAValue bounds a Home Assistant config's string that becomes a
	// property, in bytes; a longer one makes the config Garbage.
	MaxHAValue = 1024
	// DefaultHAPrefix is Home Assistant's discovery prefix.
	DefaultHAPrefix = "homeassistant"
	maxGroups       = 64
	maxComponents   = 64
)

// Details are a Configuration's discoveryDetails for MQTT, e.g.
//
//	broker: tcp://mosquitto.plant.local:1883
//	sparkplug: {groups: ["Plant1"], edgeNode: "^Line", device: ""}
//	homeAssistant: {components: [sensor, switch]}
//
// with the credentials in discoveryProperties (MQTT_USERNAME,
// MQTT_PASSWORD, MQTT_CA_CERT, MQTT_CLIENT_CERT, MQTT_CLIENT_KEY).
type Details struct {
	// Broker is the broker's URL: tcp:// (or mqtt://), ssl:// (or tls://,
	// mqtts://), ws:// or wss://, with a port. Required.
	Broker string `json:"broker"`
	// ClientID is the client id to connect with; default
	// "dowse-discovery-" and random hex, one per stream.
	ClientID string `json:"clientId,omitempty"`
	// TLS tunes an ssl:// or wss:// connection.
	TLS *TLS `json:"tls,omitempty"`
	// Sparkplug, when set, finds Sparkplug B edge nodes and devices.
	Sparkplug *Sparkplug `json:"sparkplug,omitempty"`
	// HomeAssistant, when set, finds Home Assistant MQTT discovery
	// entities. At least one of the two is required.
	HomeAssistant *HomeAssistant `json:"homeAssistant,omitempty"`
	// MaxDevices bounds the devices kept; past it new ones are ignored (and
	// said so). Default 1024, at most 65536.
	MaxDevices int `json:"maxDevices,omitempty"`
	// MaxPayload is the largest payload read, in bytes; a larger one is
	// Garbage. Default 65536, at most 1 MiB.
	MaxPayload int `json:"maxPayload,omitempty"`
	// MaxMetrics is the most metrics of a birth listed in the properties
	// (the count says how many there were). Default 256, at most 4096.
	MaxMetrics int `json:"maxMetrics,omitempty"`
}

// TLS tunes the TLS connection to the broker.
type TLS struct {
	// ServerName is the name the broker's certificate must carry (default:
	// the URL's host).
	ServerName string `json:"serverName,omitempty"`
	// InsecureSkipVerify accepts any certificate. For tests only.
	InsecureSkipVerify bool `json:"insecureSkipVerify,omitempty"`
}

// Sparkplug selects Sparkplug B edge nodes and devices.
type Sparkplug struct {
	// Groups are the group ids followed (exactly); empty: every group.
	Groups []string `json:"groups,omitempty"`
	// EdgeNode, an RE2 expression, keeps only edge nodes (and their
	// devices) whose id matches.
	EdgeNode string `json:"edgeNode,omitempty"`
	// Device, an RE2 expression, keeps only devices whose id matches.
	Device string `json:"device,omitempty"`
	// DevicesOnly lists devices (DBIRTH) only, not the edge nodes
	// themselves (NBIRTH).
	DevicesOnly bool `json:"devicesOnly,omitempty"`
	// RequestRebirth publishes an NCMD "Node Control/Rebirth" to an edge
	// node seen sending data (NDATA, DDATA) before its birth was seen, as a
	// Sparkplug host application does, so that nodes born before the
	// handler connected are found. Off by default: it writes to the nodes.
	RequestRebirth bool `json:"requestRebirth,omitempty"`

	edgeRe, deviceRe *regexp.Regexp
}

// HomeAssistant selects Home Assistant MQTT discovery entities.
type HomeAssistant struct {
	// Prefix is the discovery prefix. Default "homeassistant".
	Prefix string `json:"prefix,omitempty"`
	// Components are the components followed (sensor, binary_sensor,
	// switch...); empty: every component.
	Components []string `json:"components,omitempty"`
	// NodeID, ObjectID, DeviceManufacturer and DeviceModel are RE2
	// expressions the entity's node id, object id and its device's
	// manufacturer and model must match.
	NodeID             string `json:"nodeId,omitempty"`
	ObjectID           string `json:"objectId,omitempty"`
	DeviceManufacturer string `json:"deviceManufacturer,omitempty"`
	DeviceModel        string `json:"deviceModel,omitempty"`

	nodeRe, objectRe, mfRe, modelRe *regexp.Regexp
}

var (
	haComponentRe = regexp.MustCompile(`^[a-z_]{1,64}$`)
	haIDRe        = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,255}$`)
)

// ParseDetails parses and validates discovery_details (JSON or YAML) and
// fills in defaults. Unknown fields are errors; errors are InvalidArgument
// statuses naming the field.
func ParseDetails(s string) (*Details, error) {
	var d Details
	if err := yaml.UnmarshalStrict([]byte(s), &d); err != nil {
		return nil, handler.InvalidDetails("%v", err)
	}
	if d.Broker == "" {
		return nil, handler.InvalidDetails("broker: the broker's URL (tcp://host:1883) is required")
	}
	u, err := url.Parse(d.Broker)
	if err != nil {
		return nil, handler.InvalidDetails("broker: %v", err)
	}
	switch u.Scheme {
	case "tcp", "mqtt", "ssl", "tls", "mqtts", "ws", "wss":
	default:
		return nil, handler.InvalidDetails("broker: %q: the scheme must be tcp, mqtt, ssl, tls, mqtts, ws or wss", d.Broker)
	}
	if u.Hostname() == "" || u.Port() == "" {
		return nil, handler.InvalidDetails("broker: %q: a host and a port are required", d.Broker)
	}
	if len(d.ClientID) > 128 {
		return nil, handler.InvalidDetails("clientId: longer than 128 bytes")
	}
	if d.Sparkplug == nil && d.HomeAssistant == nil {
		return nil, handler.InvalidDetails("one of sparkplug and homeAssistant is required")
	}
	if sp := d.Sparkplug; sp != nil {
		if len(sp.Groups) > maxGroups {
			return nil, handler.InvalidDetails("sparkplug.groups: %d groups, at most %d", len(sp.Groups), maxGroups)
		}
		for i, g := range sp.Groups {
			if !sparkplug.ValidID(g) {
				return nil, handler.InvalidDetails("sparkplug.groups[%d]: %q is not a group id (no /, + or #)", i, g)
			}
		}
		if sp.edgeRe, err = compile("sparkplug.edgeNode", sp.EdgeNode); err != nil {
			return nil, err
		}
		if sp.deviceRe, err = compile("sparkplug.device", sp.Device); err != nil {
			return nil, err
		}
	}
	if ha := d.HomeAssistant; ha != nil {
		if ha.Prefix == "" {
			ha.Prefix = DefaultHAPrefix
		}
		if strings.ContainsAny(ha.Prefix, "+#") || strings.HasPrefix(ha.Prefix, "/") || strings.HasSuffix(ha.Prefix, "/") {
			return nil, handler.InvalidDetails("homeAssistant.prefix: %q is not a topic prefix", ha.Prefix)
		}
		if len(ha.Components) > maxComponents {
			return nil, handler.InvalidDetails("homeAssistant.components: %d, at most %d", len(ha.Components), maxComponents)
		}
		for i, c := range ha.Components {
			if !haComponentRe.MatchString(c) {
				return nil, handler.InvalidDetails("homeAssistant.components[%d]: %q is not a component such as sensor", i, c)
			}
		}
		for _, f := range []struct {
			field, expr string
			re          **regexp.Regexp
		}{{"nodeId", ha.NodeID, &ha.nodeRe}, {"objectId", ha.ObjectID, &ha.objectRe},
			{"deviceManufacturer", ha.DeviceManufacturer, &ha.mfRe}, {"deviceModel", ha.DeviceModel, &ha.modelRe}} {
			if *f.re, err = compile("homeAssistant."+f.field, f.expr); err != nil {
				return nil, err
			}
		}
	}
	for _, b := range []struct {
		field      string
		v          *int
		def, limit int
	}{{"maxDevices", &d.MaxDevices, DefaultMaxDevices, MaxMaxDevices}, {"maxPayload", &d.MaxPayload, DefaultMaxPayload, MaxMaxPayload},
		{"maxMetrics", &d.MaxMetrics, DefaultMaxMetrics, MaxMaxMetrics}} {
		if *b.v == 0 {
			*b.v = b.def
		}
		if *b.v < 1 || *b.v > b.limit {
			return nil, handler.InvalidDetails("%s: %d is not between 1 and %d", b.field, *b.v, b.limit)
		}
	}
	return &d, nil
}

func compile(field, expr string) (*regexp.Regexp, error) {
	if expr == "" {
		return nil, nil
	}
	re, err := regexp.Compile(expr)
	if err != nil {
		return nil, handler.InvalidDetails("%s: %v", field, err)
	}
	return re, nil
}

// topics are the subscriptions the details need.
func (d *Details) topics() []string {
	var out []string
	if sp := d.Sparkplug; sp != nil {
		groups := sp.Groups
		if len(groups) == 0 {
			groups = []string{"+"}
		}
		for _, g := range groups {
			base := sparkplug.Namespace + "/" + g + "/"
			out = append(out, base+sparkplug.NBIRTH+"/+", base+sparkplug.NDEATH+"/+", base+sparkplug.DBIRTH+"/+/+", base+sparkplug.DDEATH+"/+/+")
			if sp.RequestRebirth {
				out = append(out, base+sparkplug.NDATA+"/+", base+sparkplug.DDATA+"/+/+")
			}
		}
	}
	if ha := d.HomeAssistant; ha != nil {
		comps := ha.Components
		if len(comps) == 0 {
			comps = []string{"+"}
		}
		if len(ha.Components) > 0 {
			comps = append(slices.Clone(comps), haDeviceComponent) // device-based configs hold components too
		}
		for _, c := range comps {
			out = append(out, ha.Prefix+"/"+c+"/+/config", ha.Prefix+"/"+c+"/+/+/config")
		}
	}
	return out
}

// credentials are the sign-in the discovery properties give.
type credentials struct {
	username, password string
	tls                *tls.Config // nil: the defaults
}

// parseCredentials reads the broker's user, password and TLS material from
// the discovery properties; a half-given or unreadable pair is an
// InvalidArgument error, so that the person who set up the Secret finds out.
func parseCredentials(d *Details, props map[string]*discoveryv1.ByteData) (*credentials, error) {
	c := &credentials{username: string(props[UsernameProperty].GetVec()), password: string(props[PasswordProperty].GetVec())}
	ca, cert, key := props[CACertProperty].GetVec(), props[ClientCertProperty].GetVec(), props[ClientKeyProperty].GetVec()
	if ca == nil && cert == nil && key == nil && d.TLS == nil {
		return c, nil
	}
	u, _ := url.Parse(d.Broker)
	c.tls = &tls.Config{MinVersion: tls.VersionTLS12, ServerName: u.Hostname()}
	if d.TLS != nil {
		if d.TLS.ServerName != "" {
			c.tls.ServerName = d.TLS.ServerName
		}
		c.tls.InsecureSkipVerify = d.TLS.InsecureSkipVerify //nolint:gosec // the Configuration asked for it, for tests
	}
	if ca != nil {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(ca) {
			return nil, status.Errorf(codes.InvalidArgument, "discovery_properties: %s holds no PEM certificate", CACertProperty)
		}
		c.tls.RootCAs = pool
	}
	switch {
	case cert == nil && key == nil:
	case cert == nil:
		return nil, status.Errorf(codes.InvalidArgument, "discovery_properties: %s is set but %s is not", ClientKeyProperty, ClientCertProperty)
	case key == nil:
		return nil, status.Errorf(codes.InvalidArgument, "discovery_properties: %s is set but %s is not", ClientCertProperty, ClientKeyProperty)
	default:
		pair, err := tls.X509KeyPair(cert, key)
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "discovery_properties: %s/%s: %v", ClientCertProperty, ClientKeyProperty, err)
		}
		c.tls.Certificates = []tls.Certificate{pair}
	}
	return c, nil
}
