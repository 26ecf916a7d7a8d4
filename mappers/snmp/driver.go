// Package snmp is Dowse's SNMP mapper: a Driver for the mapper SDK
// (mappers/mapper) that reads OIDs of an agent as properties (GET, the
// properties of one collect cycle in as few requests as maxOids allows)
// and SETs writable ones, typed by the visitor's SNMP type and the model's
// property type. It speaks v1, v2c and v3 through internal/snmpclient, as
// the SNMP discovery handler does.
//
// Protocol configData (Device spec.protocol.configData, or the model's
// protocolConfigData):
//
//	address      the agent, "host" or "host:port" (e.g. ${SNMP_ADDRESS})
//	port         its UDP port when address has none (default 161; e.g.
//	             ${SNMP_PORT})
//	version      v1, v2c (default) or v3
//	community    v1/v2c community (default public); communityFile: the
//	             same from a file (a mounted Secret), read at each connect
//	user, authPassphrase, privPassphrase (or userFile, authPassphraseFile,
//	             privPassphraseFile): the v3 USM user
//	securityLevel, authProtocol, privProtocol, contextName: as the
//	             handler's v3 settings (defaults authPriv with both
//	             passphrases, SHA, AES)
//	timeout      per request: "1s" or milliseconds (default 1s)
//	retries      resends of a request that got no answer, 0-3 (default 1)
//	maxOids      OIDs per GET, 1-60 (default 16): bounds the request and
//	             its response
//
// Visitor configData (each property's visitors.configData):
//
//	oid     the object's numeric OID, e.g. 1.3.6.1.2.1.1.5.0 (required)
//	type    its SNMP type, which a SET sends and a read checks: integer,
//	        octetString, objectIdentifier, ipAddress, counter32, gauge32
//	        (also unsigned32), timeTicks, counter64. Default: octetString
//	        for STRING and BYTES properties, integer otherwise. A BOOLEAN
//	        property on an integer is a TruthValue (true 1, false 2).
//	scale, offset, deadband: see the mapper SDK
package snmp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/gosnmp/gosnmp"

	"github.com/dowse-dev/dowse/internal/snmpclient"
	"github.com/dowse-dev/dowse/mappers/mapper"
	"github.com/dowse-dev/dowse/shared/twinvalue"
)

// Protocol is the protocol name the mapper registers.
const Protocol = "snmp"

// SNMP types of a visitor.
const (
	TypeInteger          = "integer"
	TypeOctetString      = "octetString"
	TypeObjectIdentifier = "objectIdentifier"
	TypeIPAddress        = "ipAddress"
	TypeCounter32        = "counter32"
	TypeGauge32          = "gauge32"
	TypeTimeTicks        = "timeTicks"
	TypeCounter64        = "counter64"
)

var types = map[string]gosnmp.Asn1BER{
	"integer": gosnmp.Integer, "integer32": gosnmp.Integer, "octetstring": gosnmp.OctetString, "string": gosnmp.OctetString,
	"objectidentifier": gosnmp.ObjectIdentifier, "oid": gosnmp.ObjectIdentifier, "ipaddress": gosnmp.IPAddress,
	"counter32": gosnmp.Counter32, "gauge32": gosnmp.Gauge32, "unsigned32": gosnmp.Gauge32, "timeticks": gosnmp.TimeTicks,
	"counter64": gosnmp.Counter64,
}

// Bounds.
const (
	DefaultMaxOids = 16
	DefaultTimeout = time.Second
	// maxOctets bounds an OCTET STRING a SET sends: a request stays well
	// within the 484 bytes every agent must take (RFC 3416) plus headers
	// of any reasonable OID.
	maxOctets = 255
)

type deviceConfig struct {
	host    string
	port    int
	sec     snmpclient.Security
	files   map[string]string // credential field -> file, read at each Connect
	timeout time.Duration
	retries int
	maxOids int
}

// Driver is one SNMP agent.
type Driver struct {
	cfg deviceConfig
	sec *snmpclient.Security // with the files read, at Connect
	g   *gosnmp.GoSNMP
}

// NewDriver is the mapper.NewDriver of SNMP.
func NewDriver(dev mapper.DeviceInfo) (mapper.Driver, error) {
	cfg, err := parseDevice(dev.Protocol)
	if err != nil {
		return nil, err
	}
	return &Driver{cfg: cfg}, nil
}

func parseDevice(p mapper.Params) (deviceConfig, error) {
	c := deviceConfig{files: map[string]string{}}
	addr, err := p.String("address", "")
	if err != nil {
		return c, err
	}
	if addr == "" {
		if addr, err = p.String("ip", ""); err != nil {
			return c, err
		}
	}
	addr = strings.TrimPrefix(strings.TrimSpace(addr), "udp://")
	if addr == "" {
		return c, errors.New("address (the agent's host or host:port) is required")
	}
	port, err := p.Int("port", 161)
	if err != nil {
		return c, err
	}
	if host, ps, err := net.SplitHostPort(addr); err == nil {
		addr = host
		if port, err = strconv.ParseInt(ps, 10, 64); err != nil {
			return c, fmt.Errorf("address %q: bad port", addr)
		}
	}
	addr = strings.Trim(addr, "[]")
	if addr == "" || strings.ContainsAny(addr, " /") {
		return c, fmt.Errorf("address %q: want a host or host:port", addr)
	}
	if port < 1 || port > 65535 {
		return c, fmt.Errorf("port %d: want 1 to 65535", port)
	}
	c.host, c.port = addr, int(port)
	str := func(key string) string {
		if err != nil {
			return ""
		}
		var s string
		s, err = p.String(key, "")
		return s
	}
	c.sec = snmpclient.Security{Version: str("version"), Community: str("community"), User: str("user"), Level: str("securityLevel"),
		AuthProtocol: str("authProtocol"), PrivProtocol: str("privProtocol"), AuthPassphrase: str("authPassphrase"),
		PrivPassphrase: str("privPassphrase"), ContextName: str("contextName")}
	for _, k := range []string{"community", "user", "authPassphrase", "privPassphrase"} {
		if f := str(k + "File"); f != "" {
			c.files[k] = f
		}
	}
	if err != nil {
		return c, err
	}
	// Check with the files read now: a file that is not there, or
	// settings that cannot work, are a clear error at once.
	s, err := c.security()
	if err != nil {
		return c, err
	}
	c.sec.Version = s.Version
	if c.timeout, err = p.Duration("timeout", DefaultTimeout); err != nil {
		return c, err
	}
	if c.timeout <= 0 {
		c.timeout = DefaultTimeout
	}
	retries, err := p.Int("retries", 1)
	if err != nil || retries < 0 || retries > 3 {
		return c, fmt.Errorf("retries: want 0 to 3")
	}
	c.retries = int(retries)
	n, err := p.Int("maxOids", DefaultMaxOids)
	if err != nil || n < 1 || n > gosnmp.MaxOids {
		return c, fmt.Errorf("maxOids: want 1 to %d", gosnmp.MaxOids)
	}
	c.maxOids = int(n)
	return c, nil
}

// security returns the settings with the credential files read and
// checked.
func (c deviceConfig) security() (*snmpclient.Security, error) {
	s := c.sec
	for k, f := range c.files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("%sFile: %w", k, err)
		}
		v := strings.TrimRight(string(b), "\r\n")
		switch k {
		case "community":
			s.Community = v
		case "user":
			s.User = v
		case "authPassphrase":
			s.AuthPassphrase = v
		case "privPassphrase":
			s.PrivPassphrase = v
		}
	}
	if err := s.Check(); err != nil {
		return nil, err
	}
	return &s, nil
}

// Credentials is mapper.Credentialed: a v3 user signs in (a v1/v2c agent
// drops a wrong community without a word, so there is nothing to tell).
func (d *Driver) Credentials() (bool, []string) {
	var files []string
	for _, f := range d.cfg.files {
		files = append(files, f)
	}
	return d.cfg.sec.Version == snmpclient.V3, files
}

// point is a prepared property.
type point struct {
	oid string
	typ gosnmp.Asn1BER
}

// Prepare parses a property's visitor.
func (d *Driver) Prepare(p *mapper.Property) error {
	s, err := p.Visitor.String("oid", "")
	if err != nil {
		return err
	}
	if s == "" {
		return errors.New("oid is required (the object's numeric OID, e.g. 1.3.6.1.2.1.1.5.0)")
	}
	oid, err := snmpclient.NormalizeOID(s)
	if err != nil {
		return err
	}
	pt := &point{oid: oid, typ: gosnmp.Integer}
	if p.Type == twinvalue.String || p.Type == twinvalue.Bytes {
		pt.typ = gosnmp.OctetString
	}
	if t, err := p.Visitor.String("type", ""); err != nil {
		return err
	} else if t != "" {
		typ, ok := types[strings.ToLower(strings.TrimSpace(t))]
		if !ok {
			return fmt.Errorf("type %q: want integer, octetString, objectIdentifier, ipAddress, counter32, gauge32, timeTicks or counter64", t)
		}
		pt.typ = typ
	}
	switch {
	case p.Type == twinvalue.Boolean && pt.typ != gosnmp.Integer:
		return fmt.Errorf("a BOOLEAN property needs an integer object (a TruthValue), not %s", pt.typ)
	case p.Type == twinvalue.Bytes && pt.typ != gosnmp.OctetString:
		return fmt.Errorf("a BYTES property needs an octetString object, not %s", pt.typ)
	case p.Type.Numeric() && (pt.typ == gosnmp.OctetString || pt.typ == gosnmp.ObjectIdentifier || pt.typ == gosnmp.IPAddress):
		return fmt.Errorf("a %s property cannot hold a %s object (use STRING)", p.Type, pt.typ)
	}
	p.Data = pt
	return nil
}

// Connect opens the UDP socket and asks the agent for sysObjectID, so that
// an agent that is not there, or refuses the credentials, is known now.
func (d *Driver) Connect(ctx context.Context) error {
	sec, err := d.cfg.security()
	if err != nil {
		return mapper.Permanentf("credentials: %w", err)
	}
	g := snmpclient.New(ctx, d.cfg.host, d.cfg.port, sec, d.cfg.timeout)
	g.Retries = d.cfg.retries
	g.MaxOids = d.cfg.maxOids
	addr := net.JoinHostPort(d.cfg.host, strconv.Itoa(d.cfg.port))
	if err := snmpclient.Do(g.Connect); err != nil {
		return fmt.Errorf("connecting to %s: %w", addr, err)
	}
	var pkt *gosnmp.SnmpPacket
	err = snmpclient.Do(func() error {
		var err error
		pkt, err = g.Get([]string{".1.3.6.1.2.1.1.2.0"})
		return err
	})
	if err == nil && pkt.Error != gosnmp.NoError && pkt.Error != gosnmp.NoSuchName {
		err = fmt.Errorf("%w: error status %s", snmpclient.ErrGarbage, pkt.Error)
	}
	if err != nil {
		_ = g.Close()
		err = snmpclient.Classify(err)
		if errors.Is(err, snmpclient.ErrAuth) {
			// ErrAuthFailed says what ErrAuth does; its words once.
			return fmt.Errorf("SNMP agent at %s: %w%s", addr, mapper.ErrAuthFailed, strings.TrimPrefix(err.Error(), snmpclient.ErrAuth.Error()))
		}
		return fmt.Errorf("SNMP agent at %s: %w", addr, err)
	}
	d.g, d.sec = g, sec
	return nil
}

// Close closes the socket.
func (d *Driver) Close() error {
	if d.g == nil {
		return nil
	}
	err := d.g.Close()
	d.g = nil
	return err
}

// exchange runs one request, its panics and errors made clear; a failed
// exchange leaves the socket as it is (UDP keeps no state to repair), and
// the SDK reconnects after enough of them.
func (d *Driver) exchange(ctx context.Context, what string, f func(g *gosnmp.GoSNMP) (*gosnmp.SnmpPacket, error)) (*gosnmp.SnmpPacket, error) {
	if d.g == nil {
		return nil, fmt.Errorf("%w: not connected", mapper.ErrDisconnected)
	}
	d.g.Context = ctx
	var pkt *gosnmp.SnmpPacket
	err := snmpclient.Do(func() error {
		var err error
		pkt, err = f(d.g)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, snmpclient.Classify(err))
	}
	if pkt == nil {
		return nil, fmt.Errorf("%s: %w: an empty response", what, snmpclient.ErrGarbage)
	}
	return pkt, nil
}

// Read reads one property.
func (d *Driver) Read(ctx context.Context, p *mapper.Property) (any, error) {
	rs := d.ReadBatch(ctx, []*mapper.Property{p})
	return rs[0].Value, rs[0].Err
}

// ReadBatch reads the properties in GETs of at most maxOids OIDs. When
// the agent refuses a GET as a whole (v1's noSuchName for one of its OIDs,
// tooBig), its properties are read one by one, so the others still get
// their values.
func (d *Driver) ReadBatch(ctx context.Context, ps []*mapper.Property) []mapper.Result {
	rs := make([]mapper.Result, len(ps))
	for start := 0; start < len(ps); start += d.cfg.maxOids {
		end := min(start+d.cfg.maxOids, len(ps))
		d.readGroup(ctx, ps[start:end], rs[start:end])
	}
	return rs
}

func (d *Driver) readGroup(ctx context.Context, ps []*mapper.Property, rs []mapper.Result) {
	oids := make([]string, len(ps))
	for i, p := range ps {
		oids[i] = p.Data.(*point).oid
	}
	pkt, err := d.exchange(ctx, fmt.Sprintf("GET of %d OIDs", len(oids)), func(g *gosnmp.GoSNMP) (*gosnmp.SnmpPacket, error) { return g.Get(oids) })
	if err == nil && pkt.Error != gosnmp.NoError {
		if len(ps) > 1 && (pkt.Error == gosnmp.NoSuchName || pkt.Error == gosnmp.TooBig || pkt.Error == gosnmp.GenErr) {
			for i := range ps {
				d.readGroup(ctx, ps[i:i+1], rs[i:i+1])
			}
			return
		}
		err = mapper.Permanentf("GET %s: the agent answered %s", oids[0], pkt.Error)
	}
	if err == nil && len(pkt.Variables) != len(ps) {
		err = fmt.Errorf("GET of %d OIDs: %w: %d variables came back", len(ps), snmpclient.ErrGarbage, len(pkt.Variables))
	}
	for i, p := range ps {
		if err != nil {
			rs[i].Err = err
			continue
		}
		rs[i].Value, rs[i].Err = decode(p, pkt.Variables[i])
	}
}

// decode turns one variable into a raw value of the property's type.
func decode(p *mapper.Property, v gosnmp.SnmpPDU) (any, error) {
	pt := p.Data.(*point)
	if v.Name != pt.oid {
		return nil, fmt.Errorf("GET %s: %w: the agent answered for %s", pt.oid, snmpclient.ErrGarbage, snmpclient.Text(v.Name))
	}
	switch v.Type {
	case gosnmp.NoSuchObject, gosnmp.NoSuchInstance, gosnmp.EndOfMibView, gosnmp.Null:
		return nil, mapper.Permanentf("GET %s: the agent has no such object (%s)", pt.oid, v.Type)
	}
	if !sameKind(pt.typ, v.Type) {
		return nil, mapper.Permanentf("GET %s: the agent's object is %s, the visitor says %s", pt.oid, v.Type, pt.typ)
	}
	switch v.Type {
	case gosnmp.Integer:
		n, ok := v.Value.(int)
		if !ok {
			return nil, fmt.Errorf("GET %s: %w: an INTEGER of Go type %T", pt.oid, snmpclient.ErrGarbage, v.Value)
		}
		if p.Type == twinvalue.Boolean {
			switch n {
			case 1:
				return true, nil
			case 2:
				return false, nil
			}
			return nil, mapper.Permanentf("GET %s: %d is not a TruthValue (1 true, 2 false)", pt.oid, n)
		}
		return int64(n), nil
	case gosnmp.Counter32, gosnmp.Gauge32, gosnmp.TimeTicks, gosnmp.Uinteger32, gosnmp.Counter64:
		return gosnmp.ToBigInt(v.Value).Uint64(), nil
	case gosnmp.OctetString:
		b, _ := v.Value.([]byte)
		if p.Type == twinvalue.Bytes {
			return b, nil
		}
		return snmpclient.Text(b), nil
	case gosnmp.ObjectIdentifier, gosnmp.IPAddress:
		return snmpclient.Text(v.Value), nil
	}
	return nil, mapper.Permanentf("GET %s: objects of type %s are not read", pt.oid, v.Type)
}

// sameKind says whether what the agent sent fits the visitor's type:
// the unsigned 32-bit types stand for one another.
func sameKind(want, got gosnmp.Asn1BER) bool {
	unsigned := func(t gosnmp.Asn1BER) bool {
		return t == gosnmp.Counter32 || t == gosnmp.Gauge32 || t == gosnmp.Uinteger32 || t == gosnmp.TimeTicks
	}
	return want == got || unsigned(want) && unsigned(got)
}

// Write SETs a raw value (after the inverse transform), typed by the
// visitor.
func (d *Driver) Write(ctx context.Context, p *mapper.Property, v any) error {
	pt := p.Data.(*point)
	val, err := encode(p, pt, v)
	if err != nil {
		return mapper.Permanentf("SET %s: %v", pt.oid, err)
	}
	pdu := gosnmp.SnmpPDU{Name: pt.oid, Type: pt.typ, Value: val}
	pkt, err := d.exchange(ctx, "SET "+pt.oid, func(g *gosnmp.GoSNMP) (*gosnmp.SnmpPacket, error) { return g.Set([]gosnmp.SnmpPDU{pdu}) })
	if err != nil {
		return err
	}
	if pkt.Error != gosnmp.NoError {
		// notWritable, wrongType, noAccess, wrongValue...: about this
		// property, not the agent.
		return mapper.Permanentf("SET %s: the agent refused it: %s", pt.oid, pkt.Error)
	}
	return nil
}

// encode turns a raw value into what gosnmp sends for the visitor's type.
func encode(p *mapper.Property, pt *point, v any) (any, error) {
	switch pt.typ {
	case gosnmp.Integer:
		if b, ok := v.(bool); ok {
			if b {
				return 1, nil
			}
			return 2, nil
		}
		n, err := mapper.RawInt(v, -1<<31, 1<<31-1)
		return int(n), err
	case gosnmp.Counter32, gosnmp.Gauge32, gosnmp.TimeTicks:
		n, err := mapper.RawInt(v, 0, 1<<32-1)
		return uint32(n), err
	case gosnmp.Counter64:
		n, err := mapper.RawInt(v, 0, 1<<63-1)
		return uint64(n), err
	case gosnmp.OctetString:
		var s string
		switch x := v.(type) {
		case string:
			s = x
		case []byte:
			s = string(x)
		default:
			t, err := twinvalue.Format(p.Type, v)
			if err != nil {
				return nil, err
			}
			s = t
		}
		if len(s) > maxOctets {
			return nil, fmt.Errorf("%d bytes is more than %d", len(s), maxOctets)
		}
		return s, nil
	case gosnmp.ObjectIdentifier:
		s, _ := v.(string)
		return snmpclient.NormalizeOID(s)
	case gosnmp.IPAddress:
		s, _ := v.(string)
		a, err := netip.ParseAddr(strings.TrimSpace(s))
		if err != nil || !a.Is4() {
			return nil, fmt.Errorf("%q is not an IPv4 address", s)
		}
		return a.String(), nil
	}
	return nil, fmt.Errorf("objects of type %s are not written", pt.typ)
}
