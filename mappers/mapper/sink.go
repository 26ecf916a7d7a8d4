package mapper

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/go-logr/logr"

	"github.com/dowse-dev/dowse/internal/backoff"
	dmiv1beta1 "github.com/dowse-dev/dowse/proto/dmi/v1beta1"
	"github.com/dowse-dev/dowse/shared/twinvalue"
)

// Sinks: a property's pushMethod (KubeEdge's DMI field) sends its readings
// to an MQTT broker, an HTTP endpoint, Redis or MySQL besides the twin. One sink per
// destination (and credentials) is shared by every property and device of
// the mapper that names it: one connection per broker, however many
// topics. A reading is pushed when the twin would report it (a change, the
// first value, and the reportCycle heartbeat), judged on its own: a failed
// report to the device manager does not push it twice, nor a sink down
// delay the twin.

// errSinkRefused, wrapped, is a sink's refusal (HTTP 4xx, MQTT not
// authorized, a database's error for a reading or a login): counted and
// logged at most once a minute, never retried for a reading, retried with
// backoff for a connection (a login).
var errSinkRefused = errors.New("refused")

// refusalLogEvery is how often a sink that keeps refusing is logged.
const refusalLogEvery = time.Minute

// sinkBatch is the most readings a sink hands a batch transport (HTTP,
// the databases) at once.
const sinkBatch = 256

// sinkWindow is the most readings a pipelined transport (MQTT) has in
// flight, published and not yet acknowledged. Acknowledgements come in
// bursts (a broker's Nagle, as mosquitto's default, holds each small
// PUBACK until the previous is acknowledged, up to the peer's delayed ACK,
// 40 ms on Linux): the window keeps publishing meanwhile.
const sinkWindow = 2048

// reading is one message to a sink.
type reading struct {
	seq      uint64
	topic    string // MQTT's topic, Redis's key, MySQL's table
	qos      byte
	retained bool
	payload  []byte
	value    string // the twin's value (MySQL)
	at       int64  // read time, Unix ms (databases)
}

func (r *reading) size() int { return len(r.payload) + len(r.topic) + len(r.value) + 64 }

// transport is a sink's protocol.
type transport interface {
	// connect opens the connection (an error wrapping errSinkRefused when
	// the peer refuses the credentials).
	connect(ctx context.Context) error
	// deliver sends msgs in order. The first done are finished: delivered,
	// or refused for good (refused of them, refusal the last reason). err
	// says the rest wait for a reconnect.
	deliver(ctx context.Context, msgs []*reading) (done, refused int, refusal, err error)
	close()
}

// pipelined is a transport that delivers readings without waiting for
// each (MQTT), one connection at a time: write buffers a reading with a
// packet id from nextID (none at QoS 0, done once flushed), flush sends
// what was written, acks gives the ids the peer has finished, and lost is
// closed, lostErr set, when the connection went.
type pipelined interface {
	transport
	nextID() uint16
	write(r *reading, id uint16) error
	flush() error
	acks() <-chan uint16
	lost() <-chan struct{}
	lostErr() error
}

// sinkSpec is what makes a sink: its kind, destination and credentials.
type sinkSpec struct {
	kind    string // "mqtt", "http", "redis", "mysql"
	address string // the broker's URL, the HTTP endpoint's URL, a database's host:port
	secret  string // the Secret's name (dowseSecretName), "" for the environment
	timeout time.Duration
	db      int    // Redis's database
	dbName  string // MySQL's database
	user    string // MySQL's userName
}

func (s sinkSpec) key() string {
	return s.kind + "\x00" + s.address + "\x00" + s.secret + "\x00" + s.timeout.String() + "\x00" + strconv.Itoa(s.db) + "\x00" + s.dbName + "\x00" + s.user
}

// label is the sink's address in metrics and logs.
func (s sinkSpec) label() string {
	switch s.kind {
	case "redis":
		return "redis://" + s.address + "/" + strconv.Itoa(s.db)
	case "mysql":
		return "mysql://" + s.address + "/" + s.dbName
	}
	return redact(s.address)
}

// sinkTarget is where one property's readings go.
type sinkTarget struct {
	sink     *sink
	topic    string
	qos      byte
	retained bool
}

// sinkSet is the mapper's sinks, by sinkSpec.key.
type sinkSet struct {
	m  *Mapper
	mu sync.Mutex
	by map[string]*sink
	wg sync.WaitGroup
}

// targets returns where a property's pushMethod sends its readings (none
// for a pushMethod Dowse's mappers do not serve: otel, influxdb2,
// tdengine), acquiring the sinks; release gives them back.
func (s *sinkSet) targets(ctx context.Context, ns, device, property string, pm *dmiv1beta1.PushMethod) ([]sinkTarget, error) {
	if pm == nil || s == nil {
		return nil, nil
	}
	var out []sinkTarget
	var errs []error
	if q := pm.GetMqtt(); q != nil {
		if q.GetQos() < 0 || q.GetQos() > 2 {
			errs = append(errs, fmt.Errorf("pushMethod.mqtt.qos %d: must be 0, 1 or 2", q.GetQos()))
		} else if addr, err := mqttBroker(q.GetAddress()); err != nil {
			errs = append(errs, fmt.Errorf("pushMethod.mqtt.address: %w", err))
		} else {
			topic := q.GetTopic()
			if topic == "" {
				topic = "dowse/" + ns + "/" + device
			}
			if err := mqttTopic(topic); err != nil {
				errs = append(errs, fmt.Errorf("pushMethod.mqtt.topic: %w", err))
			} else {
				out = append(out, sinkTarget{sink: s.acquire(ctx, sinkSpec{kind: "mqtt", address: addr, secret: pm.GetDowseSecretName()}),
					topic: topic, qos: byte(q.GetQos()), retained: q.GetRetained()})
			}
		}
	}
	if h := pm.GetHttp(); h != nil {
		u, err := httpEndpoint(h)
		if err != nil {
			errs = append(errs, fmt.Errorf("pushMethod.http: %w", err))
		} else {
			timeout := time.Duration(h.GetTimeout()) * time.Millisecond
			if timeout <= 0 {
				timeout = s.m.cfg.CallTimeout
			}
			out = append(out, sinkTarget{sink: s.acquire(ctx, sinkSpec{kind: "http", address: u, secret: pm.GetDowseSecretName(), timeout: timeout})})
		}
	}
	if pm.GetOtel() != nil {
		errs = append(errs, errors.New("pushMethod.otel: Dowse's mappers do not export to OpenTelemetry (KubeEdge's do)"))
	}
	if pm.GetAnomalyDetection() != nil {
		errs = append(errs, errors.New("pushMethod.anomalyDetection: Dowse's mappers do not serve KubeEdge's anomaly detection (KubeEdge's do)"))
	}
	if db := pm.GetDbMethod(); db != nil {
		table := ns + "/" + device + "/" + property
		switch {
		case db.GetRedis() != nil:
			c := db.GetRedis().GetRedisClientConfig()
			if addr, err := dbAddr(c.GetAddr()); err != nil {
				errs = append(errs, fmt.Errorf("pushMethod.dbMethod.redis.redisClientConfig.addr: %w", err))
			} else if c.GetDb() < 0 {
				errs = append(errs, fmt.Errorf("pushMethod.dbMethod.redis.redisClientConfig.db %d: must be 0 or more", c.GetDb()))
			} else {
				out = append(out, sinkTarget{sink: s.acquire(ctx, sinkSpec{kind: "redis", address: addr, secret: pm.GetDowseSecretName(), db: int(c.GetDb())}), topic: table})
			}
		case db.GetMysql() != nil:
			c := db.GetMysql().GetMysqlClientConfig()
			if addr, err := dbAddr(c.GetAddr()); err != nil {
				errs = append(errs, fmt.Errorf("pushMethod.dbMethod.mysql.mysqlClientConfig.addr: %w", err))
			} else if c.GetDatabase() == "" {
				errs = append(errs, errors.New("pushMethod.dbMethod.mysql.mysqlClientConfig.database: missing"))
			} else {
				out = append(out, sinkTarget{sink: s.acquire(ctx, sinkSpec{kind: "mysql", address: addr, secret: pm.GetDowseSecretName(),
					dbName: c.GetDatabase(), user: c.GetUserName()}), topic: table})
			}
		default:
			errs = append(errs, errors.New("pushMethod.dbMethod: Dowse's mappers write to redis and mysql, not yet to influxdb2 nor TDEngine (KubeEdge's do)"))
		}
	}
	return out, errors.Join(errs...)
}

func (s *sinkSet) acquire(ctx context.Context, spec sinkSpec) *sink {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := spec.key()
	if sk := s.by[k]; sk != nil {
		sk.refs++
		return sk
	}
	sk := newSink(s.m, spec)
	sk.set = s
	sk.refs = 1
	if len(s.by) == 0 && s.m.cfg.OnSinks != nil {
		s.m.cfg.OnSinks(true)
	}
	s.by[k] = sk
	runCtx, cancel := context.WithCancel(ctx)
	sk.cancel = cancel
	s.wg.Go(func() { sk.run(runCtx) })
	return sk
}

// release gives back targets; a sink nobody uses stops.
func (s *sinkSet) release(ts []sinkTarget) {
	if len(ts) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, t := range ts {
		t.sink.refs--
		if t.sink.refs == 0 {
			t.sink.cancel()
			delete(s.by, t.sink.spec.key())
			if len(s.by) == 0 && s.m.cfg.OnSinks != nil {
				s.m.cfg.OnSinks(false)
			}
		}
	}
}

// stop stops every sink and waits for them.
func (s *sinkSet) stop() {
	s.mu.Lock()
	for k, sk := range s.by {
		sk.cancel()
		delete(s.by, k)
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// sink is one destination: a bounded buffer (count and bytes, the oldest
// dropped first) that one goroutine delivers, reconnecting with backoff.
type sink struct {
	m       *Mapper
	spec    sinkSpec
	labels  string
	log     logr.Logger
	t       transport
	set     *sinkSet
	refs    int // under sinkSet.mu
	cancel  context.CancelFunc
	wake    chan struct{}
	maxMsgs int
	maxSize int

	mu    sync.Mutex
	buf   []*reading // buf[head:] is waiting, oldest first
	head  int
	size  int
	seq   uint64
	drops uint64 // dropped since the last log
	// free holds readings forgotten or dropped, for push to reuse: a
	// busy sink then allocates nothing per reading.
	free []*reading

	// The goroutine's own.
	lastRefusalLog time.Time
	refusedSince   int
}

func newSink(m *Mapper, spec sinkSpec) *sink {
	s := &sink{m: m, spec: spec, wake: make(chan struct{}, 1), maxMsgs: m.cfg.SinkBufferMessages, maxSize: int(m.cfg.SinkBufferBytes),
		labels: `kind="` + spec.kind + `",address=` + strconv.Quote(spec.label()),
		log:    m.log.WithValues("sink", spec.kind, "address", spec.label())}
	creds := credentialSource{dir: m.cfg.SinkSecretsDir, secret: spec.secret}
	switch spec.kind {
	case "mqtt":
		sum := sha256.Sum256([]byte(spec.key()))
		s.t = &mqttTransport{address: spec.address, creds: creds, timeout: m.cfg.CallTimeout,
			clientID: mqttClientID(m.cfg.Name, hex.EncodeToString(sum[:4]))}
	case "http":
		s.t = newHTTPTransport(spec.address, spec.timeout, creds)
	case "redis":
		s.t = &redisTransport{addr: spec.address, db: spec.db, creds: creds, timeout: m.cfg.CallTimeout}
	case "mysql":
		s.t = &mysqlTransport{addr: spec.address, database: spec.dbName, user: spec.user, creds: creds, timeout: m.cfg.CallTimeout}
	}
	return s
}

// sinkFree is the most forgotten readings a sink keeps for reuse.
const sinkFree = 512

// push queues a reading of t's with a copy of payload; it never blocks on
// the sink.
func (s *sink) push(t *sinkTarget, payload []byte, value string, at int64) {
	s.mu.Lock()
	var r *reading
	if n := len(s.free); n > 0 {
		r = s.free[n-1]
		s.free[n-1] = nil
		s.free = s.free[:n-1]
	} else {
		r = &reading{}
	}
	s.seq++
	r.seq, r.topic, r.qos, r.retained = s.seq, t.topic, t.qos, t.retained
	r.payload = append(r.payload[:0], payload...)
	r.value, r.at = value, at
	s.buf = append(s.buf, r)
	s.size += r.size()
	dropped := 0
	for len(s.buf)-s.head > 1 && (len(s.buf)-s.head > s.maxMsgs || s.size > s.maxSize) {
		// Not reused: the sink's goroutine may be sending it.
		s.size -= s.buf[s.head].size()
		s.buf[s.head] = nil
		s.head++
		dropped++
	}
	s.drops += uint64(dropped)
	n := len(s.buf) - s.head
	s.mu.Unlock()
	if dropped > 0 {
		s.m.cfg.Metrics.add("dowse_mapper_sink_dropped_total", s.labels, float64(dropped))
	}
	s.m.cfg.Metrics.setGauge("dowse_mapper_sink_buffered", s.labels, float64(n))
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// recycleLocked keeps r, forgotten, for push to reuse: the sink's
// goroutine forgets only what it has finished sending (transports copy
// what they send).
func (s *sink) recycleLocked(r *reading) {
	if len(s.free) < sinkFree && cap(r.payload) <= 1024 {
		r.topic, r.value = "", ""
		s.free = append(s.free, r)
	}
}

// peek returns up to n waiting readings, oldest first, without taking
// them: push may drop them meanwhile (forget then skips what is gone).
func (s *sink) peek(n int) []*reading {
	s.mu.Lock()
	defer s.mu.Unlock()
	w := s.buf[s.head:]
	if len(w) > n {
		w = w[:n]
	}
	return append([]*reading(nil), w...)
}

// afterInto appends to dst up to n waiting readings after seq (those not
// yet handed to the transport), oldest first. The buffer's seqs are
// consecutive.
func (s *sink) afterInto(dst []*reading, seq uint64, n int) []*reading {
	s.mu.Lock()
	defer s.mu.Unlock()
	w := s.buf[s.head:]
	if len(w) == 0 {
		return dst
	}
	if skip := seq + 1 - w[0].seq; seq+1 > w[0].seq {
		if skip >= uint64(len(w)) {
			return dst
		}
		w = w[skip:]
	}
	if len(w) > n {
		w = w[:n]
	}
	return append(dst, w...)
}

// forget drops the readings up to seq, delivered or refused.
func (s *sink) forget(seq uint64) {
	s.mu.Lock()
	for s.head < len(s.buf) && s.buf[s.head].seq <= seq {
		s.size -= s.buf[s.head].size()
		s.recycleLocked(s.buf[s.head])
		s.buf[s.head] = nil
		s.head++
	}
	if s.head == len(s.buf) {
		s.buf, s.head = s.buf[:0], 0
	} else if s.head >= 1024 && s.head > len(s.buf)/2 {
		s.buf = append(s.buf[:0], s.buf[s.head:]...)
		s.head = 0
	}
	n := len(s.buf) - s.head
	drops := s.drops
	s.drops = 0
	s.mu.Unlock()
	s.m.cfg.Metrics.setGauge("dowse_mapper_sink_buffered", s.labels, float64(n))
	if drops > 0 {
		s.log.Info("sink buffer full; the oldest readings were dropped", "dropped", drops,
			"bufferMessages", s.maxMsgs, "bufferBytes", s.maxSize)
	}
}

func (s *sink) run(ctx context.Context) {
	defer s.t.close()
	defer s.stopped()
	bo := backoff.Backoff{Initial: s.m.cfg.ReconnectInitial, Max: s.m.cfg.ReconnectMax, Jitter: 0.2}
	connected := false
	for ctx.Err() == nil {
		if !connected {
			err := s.t.connect(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				s.failed(err, "connecting to the sink failed; retrying")
				backoff.Sleep(ctx, bo.Next())
				continue
			}
			connected = true
			s.m.cfg.Metrics.add("dowse_mapper_sink_connects_total", s.labels, 1)
			s.log.V(1).Info("sink connected")
		}
		if p, ok := s.t.(pipelined); ok {
			err := s.pipeline(ctx, p, &bo)
			if ctx.Err() != nil {
				return
			}
			connected = false
			s.t.close()
			s.failed(err, "delivering to the sink failed; reconnecting")
			backoff.Sleep(ctx, bo.Next())
			continue
		}
		batch := s.peek(sinkBatch)
		if len(batch) == 0 {
			select {
			case <-ctx.Done():
				return
			case <-s.wake:
			}
			continue
		}
		done, refused, refusal, err := s.t.deliver(ctx, batch)
		if done > 0 {
			s.forget(batch[done-1].seq)
			if done > refused {
				s.m.cfg.Metrics.add("dowse_mapper_sink_sent_total", s.labels, float64(done-refused))
				bo.Reset()
			}
		}
		if refused > 0 {
			s.m.cfg.Metrics.add("dowse_mapper_sink_refused_total", s.labels, float64(refused))
			s.refusedSince += refused
			s.logRefusal(refusal)
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			connected = false
			s.t.close()
			s.failed(err, "delivering to the sink failed; reconnecting")
			backoff.Sleep(ctx, bo.Next())
		}
	}
}

// stopped removes the sink's buffered gauge once its goroutine, the last
// to set it, is done, unless a new sink of the same destination took the
// series over meanwhile.
func (s *sink) stopped() {
	if s.set == nil {
		return
	}
	s.set.mu.Lock()
	defer s.set.mu.Unlock()
	if s.set.by[s.spec.key()] == nil {
		s.m.cfg.Metrics.deleteGauge("dowse_mapper_sink_buffered", s.labels)
	}
}

// pipeline delivers over a connected pipelined transport, up to
// sinkWindow readings in flight, forgetting the oldest as soon as it and
// every one before it are done, until the connection fails: what was in
// flight is then published again after the reconnect (at least once).
func (s *sink) pipeline(ctx context.Context, p pipelined, bo *backoff.Backoff) error {
	type flight struct {
		seq  uint64
		at   time.Time // written
		id   uint16
		done bool
	}
	ring := make([]flight, sinkWindow)
	head, n := 0, 0 // ring[head:head+n] (mod sinkWindow) is in flight, oldest first
	var sent uint64 // the last seq published on this connection
	if r := s.peek(1); len(r) > 0 {
		sent = r[0].seq - 1
	}
	batch := make([]*reading, 0, sinkBatch)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var delivered int
	flushMetrics := func() {
		if delivered > 0 {
			s.m.cfg.Metrics.add("dowse_mapper_sink_sent_total", s.labels, float64(delivered))
			delivered = 0
		}
	}
	defer flushMetrics()
	ack := func(id uint16) {
		for i := range n {
			f := &ring[(head+i)%sinkWindow]
			if !f.done && f.id == id {
				f.done = true
				return
			}
		}
	}
	for {
		if n < sinkWindow {
			batch = s.afterInto(batch[:0], sent, min(sinkWindow-n, sinkBatch))
			if len(batch) > 0 {
				now := time.Now()
				for _, r := range batch {
					var id uint16
					if r.qos > 0 {
						id = p.nextID()
					}
					if err := p.write(r, id); err != nil {
						return err
					}
					ring[(head+n)%sinkWindow] = flight{seq: r.seq, at: now, id: id, done: r.qos == 0}
					n++
					sent = r.seq
				}
				clear(batch)
				if err := p.flush(); err != nil {
					return err
				}
			}
		}
		k := 0
		for k < n && ring[(head+k)%sinkWindow].done {
			k++
		}
		if k > 0 {
			s.forget(ring[(head+k-1)%sinkWindow].seq)
			head, n = (head+k)%sinkWindow, n-k
			delivered += k
			bo.Reset()
			continue
		}
		if n == 0 {
			flushMetrics()
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-p.lost():
				return p.lostErr()
			case <-s.wake:
			}
			continue
		}
		select {
		case id := <-p.acks():
			ack(id)
		default:
			flushMetrics()
			wait := s.m.cfg.CallTimeout - time.Since(ring[head].at)
			if wait <= 0 {
				return fmt.Errorf("no acknowledgement within %s", s.m.cfg.CallTimeout)
			}
			timer.Reset(wait)
			select {
			case id := <-p.acks():
				ack(id)
			case <-s.wake:
			case <-p.lost():
				timer.Stop()
				return p.lostErr()
			case <-timer.C:
			case <-ctx.Done():
				timer.Stop()
				return ctx.Err()
			}
			timer.Stop()
		}
		// Take every acknowledgement that is there before forgetting.
		for more := true; more; {
			select {
			case id := <-p.acks():
				ack(id)
			default:
				more = false
			}
		}
	}
}

// failed counts a connection's failure; a refusal is logged at most once
// a minute, other failures at V(1) after the first.
func (s *sink) failed(err error, msg string) {
	if errors.Is(err, errSinkRefused) {
		s.m.cfg.Metrics.add("dowse_mapper_sink_refused_total", s.labels, 1)
		s.refusedSince++
		s.logRefusal(err)
		return
	}
	s.m.cfg.Metrics.add("dowse_mapper_sink_errors_total", s.labels, 1)
	s.log.V(1).Info(msg, "err", err)
}

func (s *sink) logRefusal(err error) {
	now := time.Now()
	if now.Sub(s.lastRefusalLog) < refusalLogEvery {
		return
	}
	s.log.Info("the sink refuses readings (logged at most once a minute; dowse_mapper_sink_refused_total counts them)",
		"refused", s.refusedSince, "err", err)
	s.lastRefusalLog, s.refusedSince = now, 0
}

// payload is a reading as sinks send it: one JSON object.
//
//	{"namespace":"default","device":"boiler-1","property":"temperature","value":"21.5","type":"double","timestamp":1764641234567}
//
// value is the twin's string; timestamp the read time in Unix milliseconds
// (KubeEdge's DataModel.TimeStamp).
func payload(ns, device, property, value string, typ twinvalue.Type, at time.Time) []byte {
	return appendPayload(make([]byte, 0, 96+len(ns)+len(device)+len(property)+len(value)), ns, device, property, value, typ, at)
}

// appendPayload appends payload's JSON to b.
func appendPayload(b []byte, ns, device, property, value string, typ twinvalue.Type, at time.Time) []byte {
	b = append(b, `{"namespace":`...)
	b = appendJSONString(b, ns)
	b = append(b, `,"device":`...)
	b = appendJSONString(b, device)
	b = append(b, `,"property":`...)
	b = appendJSONString(b, property)
	b = append(b, `,"value":`...)
	b = appendJSONString(b, value)
	b = append(b, `,"type":`...)
	b = appendJSONString(b, string(typ))
	b = append(b, `,"timestamp":`...)
	b = strconv.AppendInt(b, at.UnixMilli(), 10)
	return append(b, '}')
}

// appendJSONString quotes s as JSON does (strconv's Go quoting writes
// escapes such as \x01 that JSON has not), each byte that is not UTF-8 as
// U+FFFD (as encoding/json does): a payload is valid JSON whatever a
// property's name or a device's string holds.
func appendJSONString(b []byte, s string) []byte {
	const hexd = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20:
			b = append(b, '\\', 'u', '0', '0', hexd[c>>4], hexd[c&0xf])
		case c < utf8.RuneSelf:
			b = append(b, c)
		default:
			r, n := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && n == 1 {
				b = append(b, `\ufffd`...)
			} else {
				b = append(b, s[i:i+n]...)
			}
			i += n
			continue
		}
		i++
	}
	return append(b, '"')
}
