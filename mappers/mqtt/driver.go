// Package mqtt is Dowse's MQTT mapper: a Driver for the mapper SDK
// (mappers/mapper) for devices on an MQTT broker, as the MQTT discovery
// handler finds them. Every property is pushed (the SDK's Subscriber):
//
//   - Sparkplug B: a metric's value from the device's (or edge node's)
//     births and data (DBIRTH/DDATA, NBIRTH/NDATA), with aliases resolved
//     from the latest birth; a desired value is sent as a DCMD (NCMD for
//     an edge node) with the metric's name, its alias when the birth gave
//     one, and the data type the birth declared. A death certificate
//     (DDEATH, or the edge node's NDEATH, also the broker's will) makes the
//     device offline (mapper.ErrDeviceOffline) with the reason on every
//     property until its next birth or data.
//     Arrays (Int8Array ... DateTimeArray) are reported as JSON arrays
//     and a DataSet as a JSON object {"columns": [...], "types": [...],
//     "rows": [[...], ...]}, for a STRING property, at most MaxJSON bytes.
//   - Home Assistant: the value published on the entity's state topic
//     (a JSON object's field when the visitor names one); a desired value
//     is published on its command topic (a BOOLEAN as payloadOn/payloadOff).
//
// Protocol configData (Device spec.protocol.configData; the discovery
// handler's properties fill it through a deviceTemplate's ${...}):
//
//	broker        tcp://, ssl://, ws://, wss:// URL (${MQTT_BROKER}), required
//	source        sparkplug or homeassistant (${MQTT_SOURCE}), required
//	group, edgeNode, device   the Sparkplug ids (device empty: the edge node)
//	stateTopic, commandTopic  the Home Assistant entity's topics
//	clientId      default dowse-mapper-<random>
//	username, password (or usernameFile, passwordFile: a mounted Secret)
//	caFile        PEM certificates to trust (instead of the system's)
//	timeout       connect, subscribe and publish (default 5s)
//	qos           of subscriptions and commands, 0 or 1 (default 1; Sparkplug
//	              commands are always QoS 0, as the specification says)
//	primaryHostId Sparkplug: be this primary host application (host.go):
//	              a retained spBv1.0/STATE/<id> {"online":true,...} with
//	              a Last Will of online false, one connection per broker
//	              and id for all the mapper's devices naming it
//
// Visitor configData (each property's visitors.configData):
//
//	metric      Sparkplug: the metric's name (default: the property's name)
//	datatype    Sparkplug: the data type a command is sent with when no
//	            birth declared one (Int32, Double, Boolean, String...)
//	field       Home Assistant: the key of a JSON state to read (default:
//	            the whole payload)
//	stateTopic, commandTopic   Home Assistant: this property's own topics
//	payloadOn, payloadOff      Home Assistant: a BOOLEAN's payloads (ON, OFF)
//	scale, offset, deadband: see the mapper SDK
package mqtt

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"sync"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/eclipse/paho.mqtt.golang/packets"

	"github.com/dowse-dev/dowse/internal/sparkplug"
	"github.com/dowse-dev/dowse/mappers/mapper"
	"github.com/dowse-dev/dowse/shared/twinvalue"
)

// Protocol is the protocol name the mapper registers.
const Protocol = "mqtt"

// Sources.
const (
	SourceSparkplug     = "sparkplug"
	SourceHomeAssistant = "homeassistant"
)

// Bounds.
const (
	DefaultTimeout = 5 * time.Second
	// MaxPayload bounds a message read; a larger one is an error on the
	// properties it would feed.
	MaxPayload = 256 << 10
	maxMetrics = 4096
)

type deviceConfig struct {
	broker, clientID                   string
	username, password                 string
	usernameFile, passwordFile, caFile string
	source                             string
	group, edgeNode, device            string
	stateTopic, commandTopic           string
	primaryHostID                      string
	timeout                            time.Duration
	qos                                byte
}

// Driver is one device on a broker.
type Driver struct {
	cfg    deviceConfig
	client paho.Client
	hosts  *hosts
	// host is the primary host connection held (primaryHostId), released
	// with the client.
	host *hostKey

	// deliver orders pushes: held while a message is handled (its state
	// changed, its updates noted and pushed), and while a new
	// subscription's replay is taken and pushed (Subscribe).
	deliver sync.Mutex
	mu      sync.Mutex
	// closing disconnects client a while after Close, unless Connect came
	// first (see Close).
	closing *time.Timer
	// From the latest birth: metric names by alias, aliases and data types
	// by name.
	names   map[uint64]string
	aliases map[string]uint64
	types   map[string]sparkplug.DataType
	// last is each property's latest value, for the SDK's read-back and
	// for a new subscription; dead is a death certificate's error, until
	// a birth or data.
	last map[string]any
	dead error
	// bdSeq is the edge node's session, from its latest NBIRTH.
	bdSeq    uint64
	hasBdSeq bool
	// sink is the current subscription's push (nil between them); subs
	// counts subscriptions.
	sink func(*mapper.Property, any, error)
	subs uint64
	ps   []*mapper.Property
}

// linger is how long Close keeps the broker connection for a Connect to
// take up again.
const linger = 10 * time.Second

// NewDriver is the mapper.NewDriver of MQTT, for one device alone (its
// primaryHostId's connection is its own); a mapper uses NewDrivers.
func NewDriver(dev mapper.DeviceInfo) (mapper.Driver, error) {
	return NewDrivers()(dev)
}

// NewDrivers returns the mapper.NewDriver of one mapper: the devices it
// makes share a Sparkplug primary host connection per broker and
// primaryHostId (host.go).
func NewDrivers() mapper.NewDriver {
	hs := &hosts{m: map[hostKey]*host{}}
	return func(dev mapper.DeviceInfo) (mapper.Driver, error) {
		c, err := parseDevice(dev.Protocol)
		if err != nil {
			return nil, err
		}
		return &Driver{cfg: c, last: map[string]any{}, hosts: hs}, nil
	}
}

func parseDevice(p mapper.Params) (deviceConfig, error) {
	var c deviceConfig
	var err error
	str := func(key string) string {
		if err != nil {
			return ""
		}
		var s string
		s, err = p.String(key, "")
		return strings.TrimSpace(s)
	}
	c.broker, c.clientID, c.source = str("broker"), str("clientId"), strings.ToLower(str("source"))
	c.username, c.password, c.usernameFile, c.passwordFile, c.caFile = str("username"), str("password"), str("usernameFile"), str("passwordFile"), str("caFile")
	c.group, c.edgeNode, c.device = str("group"), str("edgeNode"), str("device")
	c.stateTopic, c.commandTopic = str("stateTopic"), str("commandTopic")
	c.primaryHostID = str("primaryHostId")
	if err != nil {
		return c, err
	}
	if c.primaryHostID != "" && c.source != SourceSparkplug {
		return c, errors.New("primaryHostId is for source sparkplug")
	}
	if c.primaryHostID != "" && !sparkplug.ValidID(c.primaryHostID) {
		return c, fmt.Errorf("primaryHostId %q: a Sparkplug host id is not empty and has no /, + or #", c.primaryHostID)
	}
	if c.broker == "" {
		return c, errors.New("broker (the broker's URL, e.g. ${MQTT_BROKER}) is required")
	}
	switch c.source {
	case SourceSparkplug:
		if !sparkplug.ValidID(c.group) || !sparkplug.ValidID(c.edgeNode) || (c.device != "" && !sparkplug.ValidID(c.device)) {
			return c, fmt.Errorf("group %q, edgeNode %q, device %q: Sparkplug ids are not empty and have no /, + or #", c.group, c.edgeNode, c.device)
		}
	case SourceHomeAssistant:
	default:
		return c, fmt.Errorf("source %q: want sparkplug or homeassistant", c.source)
	}
	if c.timeout, err = p.Duration("timeout", DefaultTimeout); err != nil {
		return c, err
	}
	if c.timeout <= 0 {
		c.timeout = DefaultTimeout
	}
	q, err := p.Int("qos", 1)
	if err != nil || q < 0 || q > 1 {
		return c, errors.New("qos: want 0 or 1")
	}
	c.qos = byte(q)
	return c, nil
}

// Credentials is mapper.Credentialed: a broker signs in with a user and
// password when one is given.
func (d *Driver) Credentials() (bool, []string) {
	var files []string
	for _, f := range []string{d.cfg.usernameFile, d.cfg.passwordFile} {
		if f != "" {
			files = append(files, f)
		}
	}
	return d.cfg.username != "" || d.cfg.usernameFile != "", files
}

// point is a prepared property.
type point struct {
	metric                string
	datatype              sparkplug.DataType
	field                 string
	stateTopic, cmdTopic  string
	payloadOn, payloadOff string
	typ                   twinvalue.Type
}

var datatypes = func() map[string]sparkplug.DataType {
	m := map[string]sparkplug.DataType{}
	for t := sparkplug.Int8; t <= sparkplug.DateTimeArray; t++ {
		m[strings.ToLower(t.String())] = t
	}
	return m
}()

// Prepare parses a property's visitor; every property is pushed.
func (d *Driver) Prepare(p *mapper.Property) error {
	pt := &point{typ: p.Type}
	var err error
	str := func(key, def string) string {
		if err != nil {
			return ""
		}
		var s string
		s, err = p.Visitor.String(key, def)
		return s
	}
	switch d.cfg.source {
	case SourceSparkplug:
		pt.metric = str("metric", p.Name)
		if dt := str("datatype", ""); dt != "" {
			t, ok := datatypes[strings.ToLower(dt)]
			if !ok {
				return fmt.Errorf("datatype %q is not a Sparkplug B data type (Int32, Double, Boolean, String...)", dt)
			}
			pt.datatype = t
		}
	case SourceHomeAssistant:
		pt.field = str("field", "")
		pt.stateTopic, pt.cmdTopic = str("stateTopic", d.cfg.stateTopic), str("commandTopic", d.cfg.commandTopic)
		pt.payloadOn, pt.payloadOff = str("payloadOn", "ON"), str("payloadOff", "OFF")
		if err == nil && pt.stateTopic == "" {
			return errors.New("stateTopic is required (the entity's, or the visitor's)")
		}
		if err == nil && p.Writable && pt.cmdTopic == "" {
			return errors.New("a ReadWrite property needs a commandTopic (the entity's, or the visitor's)")
		}
	}
	if err != nil {
		return err
	}
	p.Subscribe = true
	p.Data = pt
	return nil
}

func randomID() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return "dowse-mapper-" + hex.EncodeToString(b)
}

func readFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	return strings.TrimRight(string(b), "\r\n"), err
}

// Connect connects to the broker; a refused login wraps
// mapper.ErrAuthFailed.
func (d *Driver) Connect(ctx context.Context) error {
	d.mu.Lock()
	if d.closing != nil {
		d.closing.Stop()
		d.closing = nil
	}
	if d.client != nil && d.client.IsConnectionOpen() {
		d.mu.Unlock()
		return nil // kept by Close: nothing published meanwhile was missed
	}
	if d.client != nil {
		d.client.Disconnect(0)
		d.client = nil
	}
	d.releaseHost()
	d.mu.Unlock()
	c := d.cfg
	id := c.clientID
	if id == "" {
		id = randomID()
	}
	o := paho.NewClientOptions().AddBroker(c.broker).SetClientID(id).SetCleanSession(true).SetOrderMatters(true).
		SetAutoReconnect(false).SetConnectRetry(false).SetConnectTimeout(c.timeout).SetKeepAlive(30 * time.Second).
		SetWriteTimeout(c.timeout)
	user, pass := c.username, c.password
	var err error
	if c.usernameFile != "" {
		if user, err = readFile(c.usernameFile); err != nil {
			return mapper.Permanentf("usernameFile: %w", err)
		}
	}
	if c.passwordFile != "" {
		if pass, err = readFile(c.passwordFile); err != nil {
			return mapper.Permanentf("passwordFile: %w", err)
		}
	}
	if user != "" {
		o.SetUsername(user)
	}
	if pass != "" {
		o.SetPassword(pass)
	}
	if c.caFile != "" {
		pem, err := os.ReadFile(c.caFile)
		if err != nil {
			return mapper.Permanentf("caFile: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return mapper.Permanentf("caFile %s holds no PEM certificate", c.caFile)
		}
		o.SetTLSConfig(&tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool})
	}
	client := paho.NewClient(o)
	tok := client.Connect()
	select {
	case <-tok.Done():
	case <-ctx.Done():
		client.Disconnect(0)
		return ctx.Err()
	case <-time.After(c.timeout + time.Second):
		client.Disconnect(0)
		return fmt.Errorf("connecting to %s: no answer within %v", c.broker, c.timeout)
	}
	if err := tok.Error(); err != nil {
		if errors.Is(err, packets.ErrorRefusedBadUsernameOrPassword) || errors.Is(err, packets.ErrorRefusedNotAuthorised) {
			return fmt.Errorf("broker %s: %w: %w", c.broker, mapper.ErrAuthFailed, err)
		}
		return fmt.Errorf("connecting to %s: %w", c.broker, err)
	}
	if c.primaryHostID != "" {
		k := hostKey{broker: c.broker, user: user, hostID: c.primaryHostID}
		if err := d.hosts.acquire(k, o, c.timeout); err != nil {
			client.Disconnect(0)
			return err
		}
		d.mu.Lock()
		d.host = &k
		d.mu.Unlock()
	}
	d.mu.Lock()
	d.client = client
	d.mu.Unlock()
	return nil
}

// Close lets go of the connection: it is kept for linger, so that the
// SDK's reconnect (a changed protocol config, a property update) takes it
// up again and misses no message (births are not retained), and closed
// after it, when the device was removed.
func (d *Driver) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.client == nil || d.closing != nil {
		return nil
	}
	client := d.client
	d.closing = time.AfterFunc(linger, func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		if d.client == client {
			d.client, d.closing = nil, nil
			d.releaseHost()
		}
		client.Disconnect(100)
	})
	return nil
}

// releaseHost lets go of the primary host connection held; d.mu is held.
func (d *Driver) releaseHost() {
	if d.host != nil {
		k := *d.host
		d.host = nil
		go d.hosts.release(k) // it publishes and waits: not under d.mu
	}
}

// Read returns the latest value pushed (the SDK reads back after a write;
// the device's next message says what it took).
func (d *Driver) Read(_ context.Context, p *mapper.Property) (any, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	v, ok := d.last[p.Name]
	if !ok {
		return nil, mapper.Permanentf("no value received yet")
	}
	return v, nil
}

// Subscribe subscribes to what feeds the properties, and pushes at once
// the values that arrived since the last subscription ended (unless a
// death certificate came after them).
func (d *Driver) Subscribe(ctx context.Context, ps []*mapper.Property, push func(*mapper.Property, any, error)) error {
	d.mu.Lock()
	client := d.client
	d.mu.Unlock()
	if client == nil {
		return fmt.Errorf("%w: not connected", mapper.ErrDisconnected)
	}
	filters := map[string]byte{}
	var handler paho.MessageHandler
	switch d.cfg.source {
	case SourceSparkplug:
		t := sparkplug.Topic{Group: d.cfg.group, EdgeNode: d.cfg.edgeNode, Device: d.cfg.device}
		types := []string{sparkplug.NBIRTH, sparkplug.NDATA, sparkplug.NDEATH}
		if t.Device != "" {
			types = []string{sparkplug.DBIRTH, sparkplug.DDATA, sparkplug.DDEATH}
		}
		for _, typ := range types {
			t.Type = typ
			filters[t.String()] = d.cfg.qos
		}
		if t.Device != "" {
			filters[sparkplug.Topic{Group: t.Group, Type: sparkplug.NDEATH, EdgeNode: t.EdgeNode}.String()] = d.cfg.qos
			filters[sparkplug.Topic{Group: t.Group, Type: sparkplug.NBIRTH, EdgeNode: t.EdgeNode}.String()] = d.cfg.qos
		}
		handler = func(_ paho.Client, m paho.Message) { d.sparkplugMessage(m.Topic(), m.Payload()) }
	case SourceHomeAssistant:
		for _, p := range ps {
			filters[p.Data.(*point).stateTopic] = d.cfg.qos
		}
		handler = func(_ paho.Client, m paho.Message) { d.haMessage(m.Topic(), m.Payload()) }
	}
	d.mu.Lock()
	d.ps, d.sink = ps, func(p *mapper.Property, v any, err error) {
		if ctx.Err() == nil {
			push(p, v, err)
		}
	}
	d.subs++
	sink, sub := d.sink, d.subs
	d.mu.Unlock()
	context.AfterFunc(ctx, func() {
		d.mu.Lock()
		if d.subs == sub { // not a newer subscription's (the SDK's resubscribe)
			d.sink = nil
		}
		d.mu.Unlock()
	})
	tok := client.SubscribeMultiple(filters, handler)
	if !tok.WaitTimeout(d.cfg.timeout) {
		return fmt.Errorf("subscribing: no answer within %v", d.cfg.timeout)
	}
	if err := tok.Error(); err != nil {
		return fmt.Errorf("subscribing: %w", err)
	}
	// What arrived since the last subscription (or the death after it),
	// pushed apart from the SDK's goroutine (which drains the pushes) and
	// in order with the messages: a message applied after this snapshot
	// is pushed after it.
	go func() {
		d.deliver.Lock()
		defer d.deliver.Unlock()
		d.mu.Lock()
		var replay []update
		for _, p := range ps {
			if d.dead != nil {
				replay = append(replay, update{p, nil, d.dead})
			} else if v, ok := d.last[p.Name]; ok {
				replay = append(replay, update{p, v, nil})
			}
		}
		d.mu.Unlock()
		for _, u := range replay {
			sink(u.p, u.v, u.err)
		}
	}()
	// A lost connection reaches the SDK as an error on every property.
	go func() {
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				if !client.IsConnectionOpen() {
					for _, p := range ps {
						push(p, nil, fmt.Errorf("%w: the broker connection dropped", mapper.ErrDisconnected))
					}
					return
				}
			}
		}
	}()
	return nil
}

// update is one value (or error) for one property.
type update struct {
	p   *mapper.Property
	v   any
	err error
}

// apply notes updates (values as the latest, for a read-back and the next
// subscription) and pushes them to the current subscription; its caller
// holds deliver.
func (d *Driver) apply(us []update) {
	d.mu.Lock()
	for _, u := range us {
		if u.err == nil {
			d.last[u.p.Name] = u.v
		}
	}
	sink := d.sink
	d.mu.Unlock()
	if sink == nil {
		return
	}
	for _, u := range us {
		sink(u.p, u.v, u.err)
	}
}

func (d *Driver) haMessage(topic string, payload []byte) {
	d.deliver.Lock()
	defer d.deliver.Unlock()
	d.mu.Lock()
	ps := d.ps
	d.mu.Unlock()
	var us []update
	for _, p := range ps {
		if p.Data.(*point).stateTopic == topic {
			v, err := haValue(p, payload)
			us = append(us, update{p, v, err})
		}
	}
	d.apply(us)
}

func (d *Driver) sparkplugMessage(topic string, payload []byte) {
	d.deliver.Lock()
	defer d.deliver.Unlock()
	t, ok := sparkplug.ParseTopic(topic)
	if !ok {
		return
	}
	d.mu.Lock()
	ps := d.ps
	d.mu.Unlock()
	var us []update
	fail := func(err error) {
		for _, p := range ps {
			us = append(us, update{p, nil, err})
		}
		d.apply(us)
	}
	if t.Type == sparkplug.NBIRTH || t.Type == sparkplug.NDEATH {
		// The edge node's session: an NDEATH whose bdSeq is not the one
		// of the latest NBIRTH is an older session's (a will the broker
		// sent late) and says nothing of this one.
		var seq uint64
		var has bool
		if len(payload) <= MaxPayload {
			if pl, err := sparkplug.Decode(payload, maxMetrics); err == nil {
				if m, ok := pl.Metric("bdSeq"); ok && m.Kind == sparkplug.LongValue {
					seq, has = m.Uint, true
				}
			}
		}
		d.mu.Lock()
		stale := t.Type == sparkplug.NDEATH && has && d.hasBdSeq && seq != d.bdSeq
		if t.Type == sparkplug.NBIRTH {
			d.bdSeq, d.hasBdSeq = seq, has
		}
		d.mu.Unlock()
		if stale || (t.Type == sparkplug.NBIRTH && d.cfg.device != "") {
			return // a device's values never come in its edge node's birth
		}
	}
	if t.Type == sparkplug.NDEATH || t.Type == sparkplug.DDEATH {
		what := "the edge node"
		if t.Type == sparkplug.DDEATH {
			what = "the device"
		}
		err := fmt.Errorf("%w: %s sent its death certificate (%s)", mapper.ErrDeviceOffline, what, t.Type)
		d.mu.Lock()
		d.dead = err
		d.mu.Unlock()
		fail(err)
		return
	}
	if len(payload) > MaxPayload {
		fail(fmt.Errorf("%s: a %d-byte payload, more than %d", t.Type, len(payload), MaxPayload))
		return
	}
	pl, err := sparkplug.Decode(payload, maxMetrics)
	if err != nil {
		fail(fmt.Errorf("%s: %w", t.Type, err))
		return
	}
	birth := t.Type == sparkplug.NBIRTH || t.Type == sparkplug.DBIRTH
	d.mu.Lock()
	d.dead = nil
	if birth {
		d.names, d.aliases, d.types = map[uint64]string{}, map[string]uint64{}, map[string]sparkplug.DataType{}
		for _, m := range pl.Metrics {
			if !m.HasName {
				continue
			}
			d.types[m.Name] = m.Datatype
			if m.HasAlias {
				d.names[m.Alias], d.aliases[m.Name] = m.Name, m.Alias
			}
		}
	}
	values := map[string]sparkplug.Metric{}
	for _, m := range pl.Metrics {
		name := m.Name
		if !m.HasName && m.HasAlias {
			name = d.names[m.Alias]
		}
		if name != "" {
			values[name] = m
		}
	}
	d.mu.Unlock()
	for _, p := range ps {
		m, ok := values[p.Data.(*point).metric]
		if !ok {
			continue
		}
		v, err := metricValue(m)
		us = append(us, update{p, v, err})
	}
	d.apply(us)
}

// metricValue is a metric's raw value.
func metricValue(m sparkplug.Metric) (any, error) {
	if m.IsNull {
		return nil, mapper.Permanentf("metric %q is null", m.Name)
	}
	switch m.Kind {
	case sparkplug.IntValue:
		switch m.Datatype {
		case sparkplug.Int8, sparkplug.Int16, sparkplug.Int32:
			return int64(int32(uint32(m.Uint))), nil
		}
		return int64(uint32(m.Uint)), nil
	case sparkplug.LongValue:
		if m.Datatype == sparkplug.Int64 {
			return int64(m.Uint), nil
		}
		return m.Uint, nil
	case sparkplug.FloatValue, sparkplug.DoubleValue:
		return m.Float, nil
	case sparkplug.BoolValue:
		return m.Bool, nil
	case sparkplug.StringValue:
		return m.String, nil
	case sparkplug.BytesValue:
		if m.Datatype.IsArray() {
			v, err := sparkplug.DecodeArray(m.Datatype, m.Bytes)
			if err != nil {
				return nil, mapper.Permanentf("metric %q: %w", m.Name, err)
			}
			return jsonValue(m, arrayJSON(v))
		}
		return m.Bytes, nil
	case sparkplug.DataSetKind:
		t, err := sparkplug.DecodeDataSet(m.Bytes)
		if err != nil {
			return nil, mapper.Permanentf("metric %q: %w", m.Name, err)
		}
		return jsonValue(m, tableJSON(t))
	}
	return nil, mapper.Permanentf("metric %q: a %s value is not read", m.Name, m.Datatype)
}

// MaxJSON bounds the JSON text an array or a DataSet becomes.
const MaxJSON = 64 << 10

// jsonValue is v as the JSON text a STRING property reports.
func jsonValue(m sparkplug.Metric, v any) (any, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, mapper.Permanentf("metric %q: %w", m.Name, err)
	}
	if len(b) > MaxJSON {
		return nil, mapper.Permanentf("metric %q: a %s of %d bytes as JSON, more than %d", m.Name, m.Datatype, len(b), MaxJSON)
	}
	return string(b), nil
}

// finite is f, or nil (JSON null) for a NaN or an infinity, which JSON
// cannot say.
func finite(f float64) any {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return nil
	}
	return f
}

// arrayJSON is a decoded array as JSON marshals it: floats that are not
// finite become null.
func arrayJSON(v any) any {
	fs, ok := v.([]float64)
	if !ok {
		return v
	}
	out := make([]any, len(fs))
	for i, f := range fs {
		out[i] = finite(f)
	}
	return out
}

// table is a DataSet as JSON: its columns, their Sparkplug types and its
// rows, each cell the value of its column's type (null when unset).
type table struct {
	Columns []string `json:"columns"`
	Types   []string `json:"types"`
	Rows    [][]any  `json:"rows"`
}

func tableJSON(t *sparkplug.Table) table {
	out := table{Columns: t.Columns, Types: make([]string, len(t.Types)), Rows: make([][]any, len(t.Rows))}
	if out.Columns == nil {
		out.Columns = []string{}
	}
	for i, ty := range t.Types {
		out.Types[i] = ty.String()
	}
	for i, r := range t.Rows {
		row := make([]any, len(r))
		for j, c := range r {
			row[j] = cellValue(t.Types[j], c)
		}
		out.Rows[i] = row
	}
	return out
}

func cellValue(ty sparkplug.DataType, c sparkplug.Cell) any {
	switch c.Kind {
	case sparkplug.IntValue:
		switch ty {
		case sparkplug.Int8, sparkplug.Int16, sparkplug.Int32:
			return int64(int32(uint32(c.Uint)))
		}
		return c.Uint
	case sparkplug.LongValue:
		if ty == sparkplug.Int64 {
			return int64(c.Uint)
		}
		return c.Uint
	case sparkplug.FloatValue, sparkplug.DoubleValue:
		return finite(c.Float)
	case sparkplug.BoolValue:
		return c.Bool
	case sparkplug.StringValue:
		return c.String
	}
	return nil
}

// haValue reads a state payload as the property's value.
func haValue(p *mapper.Property, payload []byte) (any, error) {
	if len(payload) > MaxPayload {
		return nil, fmt.Errorf("a %d-byte state, more than %d", len(payload), MaxPayload)
	}
	pt := p.Data.(*point)
	text := string(payload)
	if pt.field != "" {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(payload, &obj); err != nil {
			return nil, mapper.Permanentf("state is not a JSON object: %v", err)
		}
		raw, ok := obj[pt.field]
		if !ok {
			return nil, mapper.Permanentf("state has no field %q", pt.field)
		}
		var s string
		if json.Unmarshal(raw, &s) == nil {
			text = s
		} else {
			text = strings.TrimSpace(string(raw))
		}
	}
	if p.Type == twinvalue.Boolean {
		switch text {
		case pt.payloadOn:
			return true, nil
		case pt.payloadOff:
			return false, nil
		}
	}
	v, err := twinvalue.Parse(p.Type, text)
	if err != nil {
		return nil, mapper.Permanent(err)
	}
	return v, nil
}

// Write sends a desired value: a Sparkplug command, or the entity's
// command topic.
func (d *Driver) Write(ctx context.Context, p *mapper.Property, v any) error {
	d.mu.Lock()
	client := d.client
	d.mu.Unlock()
	if client == nil {
		return fmt.Errorf("%w: not connected", mapper.ErrDisconnected)
	}
	pt := p.Data.(*point)
	var topic string
	var payload []byte
	var qos byte
	switch d.cfg.source {
	case SourceSparkplug:
		d.mu.Lock()
		dt, known := d.types[pt.metric]
		alias, hasAlias := d.aliases[pt.metric]
		d.mu.Unlock()
		if !known {
			dt = pt.datatype
		}
		m, err := commandMetric(pt.metric, dt, p.Type, v)
		if err != nil {
			return mapper.Permanent(err)
		}
		m.Alias, m.HasAlias = alias, hasAlias
		now := uint64(time.Now().UnixMilli())
		m.Timestamp = now
		payload = sparkplug.Encode(&sparkplug.Payload{Timestamp: now, HasTimestamp: true, Metrics: []sparkplug.Metric{m}})
		t := sparkplug.Topic{Group: d.cfg.group, Type: sparkplug.NCMD, EdgeNode: d.cfg.edgeNode}
		if d.cfg.device != "" {
			t.Type, t.Device = sparkplug.DCMD, d.cfg.device
		}
		topic = t.String()
	case SourceHomeAssistant:
		topic, qos = pt.cmdTopic, d.cfg.qos
		if b, ok := v.(bool); ok {
			payload = []byte(pt.payloadOff)
			if b {
				payload = []byte(pt.payloadOn)
			}
		} else {
			s, err := twinvalue.Format(p.Type, v)
			if err != nil {
				return mapper.Permanent(err)
			}
			payload = []byte(s)
		}
	}
	tok := client.Publish(topic, qos, false, payload)
	select {
	case <-tok.Done():
	case <-ctx.Done():
		return ctx.Err()
	}
	if err := tok.Error(); err != nil {
		return fmt.Errorf("publishing to %s: %w", topic, err)
	}
	return nil
}

// commandMetric is a command's metric of data type dt (the birth's; from
// the model's type when unknown) holding v.
func commandMetric(name string, dt sparkplug.DataType, typ twinvalue.Type, v any) (sparkplug.Metric, error) {
	if dt == sparkplug.Unknown {
		switch typ {
		case twinvalue.Int:
			dt = sparkplug.Int64
		case twinvalue.Float:
			dt = sparkplug.Float
		case twinvalue.Double:
			dt = sparkplug.Double
		case twinvalue.Boolean:
			dt = sparkplug.Boolean
		case twinvalue.Bytes:
			dt = sparkplug.Bytes
		default:
			dt = sparkplug.String
		}
	}
	m := sparkplug.Metric{Name: name, HasName: true, Datatype: dt}
	f, isNum := twinvalue.AsFloat(v)
	switch dt {
	case sparkplug.Int8, sparkplug.Int16, sparkplug.Int32, sparkplug.UInt8, sparkplug.UInt16, sparkplug.UInt32:
		r := intRanges[dt]
		n, err := mapper.RawInt(v, r[0], r[1])
		if err != nil {
			return m, err
		}
		m.Kind, m.Uint = sparkplug.IntValue, uint64(uint32(n))
	case sparkplug.Int64, sparkplug.DateTime:
		n, err := mapper.RawInt(v, math.MinInt64, math.MaxInt64)
		if err != nil {
			return m, err
		}
		m.Kind, m.Uint = sparkplug.LongValue, uint64(n)
	case sparkplug.UInt64:
		n, err := mapper.RawInt(v, 0, math.MaxInt64)
		if err != nil {
			return m, err
		}
		m.Kind, m.Uint = sparkplug.LongValue, uint64(n)
	case sparkplug.Float, sparkplug.Double:
		if !isNum {
			return m, fmt.Errorf("%v is not a number for a %s metric", v, dt)
		}
		m.Kind, m.Float = sparkplug.DoubleValue, f
		if dt == sparkplug.Float {
			m.Kind = sparkplug.FloatValue
		}
	case sparkplug.Boolean:
		b, ok := v.(bool)
		if !ok {
			if !isNum {
				return m, fmt.Errorf("%v is not a BOOLEAN", v)
			}
			b = f != 0
		}
		m.Kind, m.Bool = sparkplug.BoolValue, b
	case sparkplug.String, sparkplug.Text, sparkplug.UUID:
		s, ok := v.(string)
		if !ok {
			var err error
			if s, err = twinvalue.Format(twinvalue.String, v); err != nil {
				return m, err
			}
		}
		m.Kind, m.String = sparkplug.StringValue, s
	case sparkplug.Bytes:
		b, ok := v.([]byte)
		if !ok {
			return m, fmt.Errorf("%v is not BYTES", v)
		}
		m.Kind, m.Bytes = sparkplug.BytesValue, b
	default:
		return m, fmt.Errorf("commands of data type %s are not sent", dt)
	}
	return m, nil
}

var intRanges = map[sparkplug.DataType][2]float64{sparkplug.Int8: {-128, 127}, sparkplug.Int16: {-32768, 32767},
	sparkplug.Int32: {math.MinInt32, math.MaxInt32}, sparkplug.UInt8: {0, 255}, sparkplug.UInt16: {0, 65535}, sparkplug.UInt32: {0, math.MaxUint32}}
