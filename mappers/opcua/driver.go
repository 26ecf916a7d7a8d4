// Package opcua is Dowse's OPC UA mapper: a Driver for the mapper SDK
// (mappers/mapper) that reads node values (the properties of one device
// sharing a cycle in one Read request), writes them, and subscribes to
// properties whose visitor asks for it (monitored items: each change is
// pushed by the server and reported without polling).
//
// Protocol configData:
//
//	endpoint        opc.tcp://host:port[/path] (required; "url" too)
//	securityPolicy  None (default), Basic256Sha256, Aes128_Sha256_RsaOaep, ...
//	securityMode    None (default), Sign or SignAndEncrypt
//	username, password   user-name authentication (default anonymous)
//	usernameFile, passwordFile the same from files (a mounted Secret),
//	                read at each sign-in: a refused login is tried again at
//	                once when they change, else with backoff (mapper SDK)
//	certificate, privateKey          the client's certificate and key, PEM
//	certificateFile, privateKeyFile  the same from files (a mounted Secret)
//	                without either, a secured channel uses a self-signed
//	                certificate made at start
//	timeout         per request: "5s" or milliseconds (default 5s)
//	publishingInterval   of the subscription (default 100ms)
//
// Visitor configData:
//
//	nodeId          e.g. "ns=2;s=Static_Scalar_Int32" or "i=2258" (required)
//	subscribe       true: a monitored item instead of the collect cycle
//	samplingInterval of the monitored item (default: the publishing interval)
//	scale, offset, deadband: see the mapper SDK
package opcua

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math"
	"math/big"
	"net/url"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/gopcua/opcua"
	"github.com/gopcua/opcua/ua"

	"github.com/dowse-dev/dowse/mappers/mapper"
)

// Protocol is the protocol name the mapper registers.
const Protocol = "opcua"

type deviceConfig struct {
	endpoint           string
	policy             string
	mode               ua.MessageSecurityMode
	username, password string
	// usernameFile and passwordFile, when set, are read at each Connect.
	usernameFile, passwordFile string
	certDER                    []byte
	key                        *rsa.PrivateKey
	timeout                    time.Duration
	publishing                 time.Duration
}

// Driver is one OPC UA server session.
type Driver struct {
	cfg    deviceConfig
	client *opcua.Client
}

// NewDriver is the mapper.NewDriver of OPC UA.
func NewDriver(dev mapper.DeviceInfo) (mapper.Driver, error) {
	cfg, err := parseDevice(dev.Protocol)
	if err != nil {
		return nil, err
	}
	return &Driver{cfg: cfg}, nil
}

func parseDevice(p mapper.Params) (deviceConfig, error) {
	var c deviceConfig
	var err error
	if c.endpoint, err = p.String("endpoint", ""); err != nil {
		return c, err
	}
	if c.endpoint == "" {
		if c.endpoint, err = p.String("url", ""); err != nil {
			return c, err
		}
	}
	u, err := url.Parse(c.endpoint)
	if c.endpoint == "" || err != nil || u.Scheme != "opc.tcp" || u.Host == "" {
		return c, fmt.Errorf("endpoint %q: want opc.tcp://host:port", c.endpoint)
	}
	if c.policy, err = p.String("securityPolicy", "None"); err != nil {
		return c, err
	}
	c.policy = strings.TrimPrefix(c.policy, ua.SecurityPolicyURIPrefix)
	switch c.policy {
	case "None", "Basic128Rsa15", "Basic256", "Basic256Sha256", "Aes128_Sha256_RsaOaep", "Aes256_Sha256_RsaPss":
	default:
		return c, fmt.Errorf("securityPolicy %q: want None, Basic256Sha256, Aes128_Sha256_RsaOaep, Aes256_Sha256_RsaPss, Basic256 or Basic128Rsa15", c.policy)
	}
	mode, err := p.String("securityMode", "None")
	if err != nil {
		return c, err
	}
	switch strings.ToLower(mode) {
	case "none", "":
		c.mode = ua.MessageSecurityModeNone
	case "sign":
		c.mode = ua.MessageSecurityModeSign
	case "signandencrypt":
		c.mode = ua.MessageSecurityModeSignAndEncrypt
	default:
		return c, fmt.Errorf("securityMode %q: want None, Sign or SignAndEncrypt", mode)
	}
	if (c.mode == ua.MessageSecurityModeNone) != (c.policy == "None") {
		return c, fmt.Errorf("securityPolicy %s and securityMode %s do not go together (None goes with None)", c.policy, mode)
	}
	if c.username, err = p.String("username", ""); err != nil {
		return c, err
	}
	if c.password, err = p.String("password", ""); err != nil {
		return c, err
	}
	if c.usernameFile, err = p.String("usernameFile", ""); err != nil {
		return c, err
	}
	if c.passwordFile, err = p.String("passwordFile", ""); err != nil {
		return c, err
	}
	if (c.username != "" && c.usernameFile != "") || (c.password != "" && c.passwordFile != "") {
		return c, errors.New("give username or usernameFile, password or passwordFile, not both")
	}
	if c.certDER, c.key, err = credentials(p); err != nil {
		return c, err
	}
	if c.timeout, err = p.Duration("timeout", 5*time.Second); err != nil {
		return c, err
	}
	if c.publishing, err = p.Duration("publishingInterval", 100*time.Millisecond); err != nil {
		return c, err
	}
	return c, nil
}

// credentials reads the client certificate and key (PEM text or files),
// or makes a self-signed pair when neither is given.
func credentials(p mapper.Params) ([]byte, *rsa.PrivateKey, error) {
	read := func(textKey, fileKey string) ([]byte, error) {
		if s, err := p.String(textKey, ""); err != nil || s != "" {
			return []byte(s), err
		}
		f, err := p.String(fileKey, "")
		if err != nil || f == "" {
			return nil, err
		}
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", fileKey, err)
		}
		return b, nil
	}
	certPEM, err := read("certificate", "certificateFile")
	if err != nil {
		return nil, nil, err
	}
	keyPEM, err := read("privateKey", "privateKeyFile")
	if err != nil {
		return nil, nil, err
	}
	if len(certPEM) == 0 && len(keyPEM) == 0 {
		return nil, nil, nil
	}
	if len(certPEM) == 0 || len(keyPEM) == 0 {
		return nil, nil, errors.New("certificate and privateKey go together")
	}
	cb, _ := pem.Decode(certPEM)
	if cb == nil {
		return nil, nil, errors.New("certificate: no PEM block")
	}
	if _, err := x509.ParseCertificate(cb.Bytes); err != nil {
		return nil, nil, fmt.Errorf("certificate: %w", err)
	}
	kb, _ := pem.Decode(keyPEM)
	if kb == nil {
		return nil, nil, errors.New("privateKey: no PEM block")
	}
	var key *rsa.PrivateKey
	if k, err := x509.ParsePKCS1PrivateKey(kb.Bytes); err == nil {
		key = k
	} else if k, err := x509.ParsePKCS8PrivateKey(kb.Bytes); err == nil {
		rk, ok := k.(*rsa.PrivateKey)
		if !ok {
			return nil, nil, errors.New("privateKey: OPC UA needs an RSA key")
		}
		key = rk
	} else {
		return nil, nil, fmt.Errorf("privateKey: %w", err)
	}
	return cb.Bytes, key, nil
}

// selfSigned makes an application instance certificate for a secured
// channel when none is configured.
func selfSigned() ([]byte, *rsa.PrivateKey, error) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, nil, err
	}
	host, _ := os.Hostname()
	appURI, _ := url.Parse("urn:" + host + ":dowse:opcua-mapper")
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(time.Now().UnixNano()),
		Subject:               pkix.Name{CommonName: "dowse-opcua-mapper", Organization: []string{"Dowse"}},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().AddDate(1, 0, 0),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment | x509.KeyUsageDataEncipherment | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		URIs:                  []*url.URL{appURI},
		DNSNames:              []string{host},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	return der, key, err
}

type point struct {
	id     *ua.NodeID
	typ    ua.TypeID // the node's value type, learned from a read
	handle uint32
	sample time.Duration
}

// Prepare parses a property's visitor.
func (d *Driver) Prepare(p *mapper.Property) error {
	s, err := p.Visitor.String("nodeId", "")
	if err != nil {
		return err
	}
	if s == "" {
		return errors.New("nodeId is required")
	}
	id, err := ua.ParseNodeID(s)
	if err != nil {
		return fmt.Errorf("nodeId %q: %w", s, err)
	}
	pt := &point{id: id}
	if pt.sample, err = p.Visitor.Duration("samplingInterval", 0); err != nil {
		return err
	}
	p.Data = pt
	return nil
}

// Connect opens a secure channel and a session.
func (d *Driver) Connect(ctx context.Context) error {
	c := d.cfg
	opts := []opcua.Option{opcua.AutoReconnect(false), opcua.DialTimeout(c.timeout), opcua.RequestTimeout(c.timeout),
		opcua.SessionTimeout(10 * time.Minute)}
	if c.mode != ua.MessageSecurityModeNone {
		cert, key := c.certDER, c.key
		if cert == nil {
			var err error
			if cert, key, err = selfSigned(); err != nil {
				return err
			}
			d.cfg.certDER, d.cfg.key = cert, key // one identity for the driver's life
		}
		opts = append(opts, opcua.Certificate(cert), opcua.PrivateKey(key))
	}
	eps, err := opcua.GetEndpoints(ctx, c.endpoint, opcua.DialTimeout(c.timeout), opcua.RequestTimeout(c.timeout))
	if err != nil {
		return fmt.Errorf("getting the endpoints of %s: %w", c.endpoint, err)
	}
	ep, err := opcua.SelectEndpoint(eps, c.policy, c.mode)
	if err != nil || ep == nil {
		return mapper.Permanentf("%s offers no endpoint with security policy %s and mode %s", c.endpoint, c.policy, c.mode)
	}
	user, password, err := c.userCredentials()
	if err != nil {
		return mapper.Permanentf("credentials: %w", err)
	}
	auth := ua.UserTokenTypeAnonymous
	if user != "" {
		auth = ua.UserTokenTypeUserName
		opts = append(opts, opcua.AuthUsername(user, password))
	} else {
		opts = append(opts, opcua.AuthAnonymous())
	}
	opts = append(opts, opcua.SecurityFromEndpoint(ep, auth))
	// The endpoint the server names may use a host name this node cannot
	// resolve; dial the address the user gave.
	client, err := opcua.NewClient(c.endpoint, opts...)
	if err != nil {
		return err
	}
	if err := client.Connect(ctx); err != nil {
		var sc ua.StatusCode
		if errors.As(err, &sc) && refusedIdentity(sc) {
			return fmt.Errorf("connecting to %s: %w: %w", c.endpoint, mapper.ErrAuthFailed, err)
		}
		return fmt.Errorf("connecting to %s: %w", c.endpoint, err)
	}
	d.client = client
	return nil
}

// refusedIdentity: the server refused the user identity (not the channel).
func refusedIdentity(sc ua.StatusCode) bool {
	switch sc {
	case ua.StatusBadUserAccessDenied, ua.StatusBadIdentityTokenInvalid, ua.StatusBadIdentityTokenRejected,
		ua.StatusBadUserSignatureInvalid:
		return true
	}
	return false
}

// userCredentials are the user name and password to sign in with, the
// files read afresh.
func (c *deviceConfig) userCredentials() (user, password string, err error) {
	user, password = c.username, c.password
	read := func(key, path string) (string, error) {
		b, err := os.ReadFile(path)
		if err != nil {
			return "", fmt.Errorf("%s: %w", key, err)
		}
		return strings.TrimRight(string(b), "\r\n"), nil
	}
	if c.usernameFile != "" {
		if user, err = read("usernameFile", c.usernameFile); err != nil {
			return "", "", err
		}
	}
	if c.passwordFile != "" {
		if password, err = read("passwordFile", c.passwordFile); err != nil {
			return "", "", err
		}
	}
	return user, password, nil
}

// Credentials is mapper.Credentialed: a user name, given or in a file,
// signs in.
func (d *Driver) Credentials() (bool, []string) {
	var files []string
	for _, f := range []string{d.cfg.usernameFile, d.cfg.passwordFile} {
		if f != "" {
			files = append(files, f)
		}
	}
	return d.cfg.username != "" || d.cfg.usernameFile != "", files
}

// Close ends the session and channel.
func (d *Driver) Close() error {
	if d.client == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := d.client.Close(ctx)
	d.client = nil
	return err
}

func (d *Driver) classify(err error, what string) error {
	if err == nil {
		return nil
	}
	var sc ua.StatusCode
	if errors.As(err, &sc) {
		switch sc {
		case ua.StatusBadSessionIDInvalid, ua.StatusBadSessionClosed, ua.StatusBadSecureChannelClosed, ua.StatusBadSecureChannelIDInvalid,
			ua.StatusBadConnectionClosed, ua.StatusBadServerHalted, ua.StatusBadCommunicationError:
			return fmt.Errorf("%s: %w: %w", what, mapper.ErrDisconnected, err)
		case ua.StatusBadTimeout, ua.StatusBadTooManyOperations, ua.StatusBadResourceUnavailable:
			return fmt.Errorf("%s: %w", what, err)
		}
		return mapper.Permanentf("%s: %w", what, err)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%s: %w", what, err)
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || (d.client != nil && d.client.State() != opcua.Connected) {
		return fmt.Errorf("%s: %w: %w", what, mapper.ErrDisconnected, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// Read reads one node's value.
func (d *Driver) Read(ctx context.Context, p *mapper.Property) (any, error) {
	r := d.ReadBatch(ctx, []*mapper.Property{p})
	return r[0].Value, r[0].Err
}

// ReadBatch reads every node in one Read request.
func (d *Driver) ReadBatch(ctx context.Context, ps []*mapper.Property) []mapper.Result {
	rs := make([]mapper.Result, len(ps))
	fail := func(err error) []mapper.Result {
		for i := range rs {
			rs[i].Err = err
		}
		return rs
	}
	if d.client == nil {
		return fail(fmt.Errorf("%w: not connected", mapper.ErrDisconnected))
	}
	req := &ua.ReadRequest{TimestampsToReturn: ua.TimestampsToReturnNeither}
	for _, p := range ps {
		req.NodesToRead = append(req.NodesToRead, &ua.ReadValueID{NodeID: p.Data.(*point).id, AttributeID: ua.AttributeIDValue})
	}
	resp, err := d.client.Read(ctx, req)
	if err != nil {
		return fail(d.classify(err, fmt.Sprintf("reading %d nodes", len(ps))))
	}
	if len(resp.Results) != len(ps) {
		return fail(fmt.Errorf("the server answered %d values for %d nodes", len(resp.Results), len(ps)))
	}
	for i, dv := range resp.Results {
		pt := ps[i].Data.(*point)
		rs[i].Value, rs[i].Err = d.value(pt, dv)
	}
	return rs
}

func (d *Driver) value(pt *point, dv *ua.DataValue) (any, error) {
	what := "reading " + pt.id.String()
	if dv == nil {
		return nil, fmt.Errorf("%s: no value", what)
	}
	if bad(dv.Status) {
		return nil, d.classify(dv.Status, what)
	}
	if dv.Value == nil {
		return nil, mapper.Permanentf("%s: the node has no value", what)
	}
	pt.typ = dv.Value.Type()
	return raw(dv.Value.Value())
}

// bad says whether a status code's severity is Bad (Good and Uncertain
// values are taken).
func bad(s ua.StatusCode) bool { return uint32(s)>>30 == 2 }

// raw turns an OPC UA value into one of the SDK's raw kinds.
func raw(v any) (any, error) {
	switch x := v.(type) {
	case bool:
		return x, nil
	case int8:
		return int64(x), nil
	case int16:
		return int64(x), nil
	case int32:
		return int64(x), nil
	case int64:
		return x, nil
	case uint8:
		return int64(x), nil
	case uint16:
		return int64(x), nil
	case uint32:
		return int64(x), nil
	case uint64:
		return x, nil
	case float32:
		return float64(x), nil
	case float64:
		return x, nil
	case string:
		return x, nil
	case []byte:
		return x, nil
	case time.Time:
		return x.UTC().Format(time.RFC3339Nano), nil
	case *ua.LocalizedText:
		return x.Text, nil
	case *ua.QualifiedName:
		return x.Name, nil
	case *ua.NodeID:
		return x.String(), nil
	case ua.StatusCode:
		return int64(x), nil
	case nil:
		return nil, mapper.Permanentf("the node has a null value")
	}
	return fmt.Sprint(v), nil
}

// Write writes a value as the node's own type (learned from a read).
func (d *Driver) Write(ctx context.Context, p *mapper.Property, v any) error {
	pt := p.Data.(*point)
	if d.client == nil {
		return fmt.Errorf("%w: not connected", mapper.ErrDisconnected)
	}
	what := "writing " + pt.id.String()
	if pt.typ == 0 {
		if _, err := d.Read(ctx, p); err != nil {
			return err
		}
	}
	val, err := asType(pt.typ, v)
	if err != nil {
		return mapper.Permanentf("%s: %v", what, err)
	}
	variant, err := ua.NewVariant(val)
	if err != nil {
		return mapper.Permanentf("%s: %v", what, err)
	}
	resp, err := d.client.Write(ctx, &ua.WriteRequest{NodesToWrite: []*ua.WriteValue{{
		NodeID: pt.id, AttributeID: ua.AttributeIDValue,
		Value: &ua.DataValue{EncodingMask: ua.DataValueValue, Value: variant},
	}}})
	if err != nil {
		return d.classify(err, what)
	}
	if len(resp.Results) != 1 {
		return fmt.Errorf("%s: %d results", what, len(resp.Results))
	}
	if s := resp.Results[0]; bad(s) {
		return d.classify(s, what)
	}
	return nil
}

// asType converts a raw value to the Go type of an OPC UA built-in type.
func asType(t ua.TypeID, v any) (any, error) {
	num := func() (float64, error) {
		switch x := v.(type) {
		case int64:
			return float64(x), nil
		case uint64:
			return float64(x), nil
		case float64:
			return x, nil
		case bool:
			if x {
				return 1, nil
			}
			return 0, nil
		}
		return 0, fmt.Errorf("%v (%T) is not a number", v, v)
	}
	integer := func(lo, hi float64) (float64, error) {
		f, err := num()
		if err != nil {
			return 0, err
		}
		r := math.Round(f)
		if math.Abs(f-r) > 1e-9 {
			return 0, fmt.Errorf("%v is not an integer", f)
		}
		if r < lo || r > hi {
			return 0, fmt.Errorf("%v does not fit the node's %s", r, t)
		}
		return r, nil
	}
	switch t {
	case ua.TypeIDBoolean:
		switch x := v.(type) {
		case bool:
			return x, nil
		case string:
			return x == "true", nil
		}
		f, err := num()
		return f != 0, err
	case ua.TypeIDSByte:
		f, err := integer(math.MinInt8, math.MaxInt8)
		return int8(f), err
	case ua.TypeIDByte:
		f, err := integer(0, math.MaxUint8)
		return uint8(f), err
	case ua.TypeIDInt16:
		f, err := integer(math.MinInt16, math.MaxInt16)
		return int16(f), err
	case ua.TypeIDUint16:
		f, err := integer(0, math.MaxUint16)
		return uint16(f), err
	case ua.TypeIDInt32:
		f, err := integer(math.MinInt32, math.MaxInt32)
		return int32(f), err
	case ua.TypeIDUint32:
		f, err := integer(0, math.MaxUint32)
		return uint32(f), err
	case ua.TypeIDInt64:
		if x, ok := v.(int64); ok {
			return x, nil
		}
		f, err := integer(math.MinInt64, math.MaxInt64)
		return int64(f), err
	case ua.TypeIDUint64:
		if x, ok := v.(uint64); ok {
			return x, nil
		}
		f, err := integer(0, math.MaxUint64)
		return uint64(f), err
	case ua.TypeIDFloat:
		f, err := num()
		if err == nil && math.Abs(f) > math.MaxFloat32 {
			err = fmt.Errorf("%v does not fit a Float", f)
		}
		return float32(f), err
	case ua.TypeIDDouble:
		return num()
	case ua.TypeIDString:
		switch x := v.(type) {
		case string:
			return x, nil
		case []byte:
			return string(x), nil
		}
		return fmt.Sprint(v), nil
	case ua.TypeIDByteString:
		switch x := v.(type) {
		case []byte:
			return x, nil
		case string:
			return []byte(x), nil
		}
	}
	return nil, fmt.Errorf("writing a node of type %s is not supported", t)
}

// Subscribe creates one subscription with a monitored item per property;
// each data change is pushed until ctx ends.
func (d *Driver) Subscribe(ctx context.Context, ps []*mapper.Property, push func(*mapper.Property, any, error)) error {
	if d.client == nil {
		return fmt.Errorf("%w: not connected", mapper.ErrDisconnected)
	}
	ch := make(chan *opcua.PublishNotificationData, 64)
	sub, err := d.client.Subscribe(ctx, &opcua.SubscriptionParameters{Interval: d.cfg.publishing}, ch)
	if err != nil {
		return d.classify(err, "creating a subscription")
	}
	byHandle := map[uint32]*mapper.Property{}
	var items []*ua.MonitoredItemCreateRequest
	for i, p := range ps {
		pt := p.Data.(*point)
		pt.handle = uint32(i + 1)
		byHandle[pt.handle] = p
		item := opcua.NewMonitoredItemCreateRequestWithDefaults(pt.id, ua.AttributeIDValue, pt.handle)
		if pt.sample > 0 {
			item.RequestedParameters.SamplingInterval = float64(pt.sample.Milliseconds())
		}
		items = append(items, item)
	}
	res, err := sub.Monitor(ctx, ua.TimestampsToReturnBoth, items...)
	if err != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		_ = sub.Cancel(cctx)
		return d.classify(err, "monitoring nodes")
	}
	// Items the server refused (a node it does not have yet, say) are
	// asked for again with backoff while the others report.
	var retry []*ua.MonitoredItemCreateRequest
	var retryProps []*mapper.Property
	refused := func(res *ua.CreateMonitoredItemsResponse, asked []*ua.MonitoredItemCreateRequest, props []*mapper.Property) {
		retry, retryProps = retry[:0], retryProps[:0]
		for i, r := range res.Results {
			if bad(r.StatusCode) && i < len(props) {
				push(props[i], nil, d.classify(r.StatusCode, "monitoring "+props[i].Data.(*point).id.String()))
				retry, retryProps = append(retry, asked[i]), append(retryProps, props[i])
			}
		}
	}
	refused(res, items, ps)
	go func() {
		defer func() {
			// ctx has ended; the cancel call gets a moment of its own.
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			defer cancel()
			_ = sub.Cancel(cctx)
		}()
		wait := time.Second
		again := time.NewTimer(wait)
		defer again.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-again.C:
				if len(retry) > 0 {
					asked, props := slices.Clone(retry), slices.Clone(retryProps)
					if res, err := sub.Monitor(ctx, ua.TimestampsToReturnBoth, asked...); err == nil {
						refused(res, asked, props)
					}
					wait = min(2*wait, 30*time.Second)
				}
				again.Reset(wait)
			case msg := <-ch:
				if msg == nil {
					continue
				}
				if msg.Error != nil {
					for _, p := range ps {
						push(p, nil, d.classify(msg.Error, "subscription"))
					}
					continue
				}
				dc, ok := msg.Value.(*ua.DataChangeNotification)
				if !ok {
					continue
				}
				for _, item := range dc.MonitoredItems {
					p := byHandle[item.ClientHandle]
					if p == nil {
						continue
					}
					v, err := d.value(p.Data.(*point), item.Value)
					push(p, v, err)
				}
			}
		}
	}()
	return nil
}
