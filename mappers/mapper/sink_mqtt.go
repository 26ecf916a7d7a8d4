package mapper

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/coder/websocket"
)

// mqttBroker checks a pushMethod's broker address (the schemes the CRD
// allows) and gives it a port when it names none.
func mqttBroker(addr string) (string, error) {
	u, err := url.Parse(addr)
	if err != nil {
		return "", fmt.Errorf("%q is not a URL: %w", addr, err)
	}
	switch u.Scheme {
	case "tcp", "mqtt", "ssl", "tls", "mqtts", "ws", "wss":
	default:
		return "", fmt.Errorf("%q: scheme must be tcp, mqtt, ssl, tls, mqtts, ws or wss", addr)
	}
	if u.Hostname() == "" {
		return "", fmt.Errorf("%q names no host", addr)
	}
	if u.Port() == "" {
		// MQTT's registered ports.
		port := "1883"
		switch u.Scheme {
		case "ssl", "tls", "mqtts":
			port = "8883"
		case "ws":
			port = "80"
		case "wss":
			port = "443"
		}
		u.Host += ":" + port
	}
	return u.String(), nil
}

// mqttTopic checks a topic a reading is published on: MQTT forbids
// wildcards and NUL in a topic name, and a broker closes the connection
// of a client that publishes one, which would stall the sink on it.
func mqttTopic(topic string) error {
	switch {
	case topic == "":
		return errors.New("empty")
	case len(topic) > 65535:
		return fmt.Errorf("%d bytes long: at most 65535", len(topic))
	case strings.ContainsAny(topic, "+#\x00"):
		return fmt.Errorf("%q: a topic name holds no wildcard (+, #) nor NUL", topic)
	case !utf8.ValidString(topic):
		return fmt.Errorf("%q is not UTF-8", topic)
	}
	return nil
}

// mqttClientID is unique per mapper process and sink (a broker drops the
// older of two connections with one id).
func mqttClientID(mapper, sum string) string {
	host, _ := os.Hostname()
	return fmt.Sprintf("dowse-%s-%s-%d-%s", mapper, host, os.Getpid(), sum)
}

// MQTT 3.1.1 control packet types (the first byte's high nibble).
const (
	mqttConnect  = 1
	mqttConnack  = 2
	mqttPublish  = 3
	mqttPuback   = 4
	mqttPubrec   = 5
	mqttPubrel   = 6
	mqttPubcomp  = 7
	mqttPingreq  = 12
	mqttPingresp = 13
	mqttDisconn  = 14
)

// mqttKeepAlive is the keep-alive a sink's connection announces; it
// pings at half of it, and takes a connection that sent nothing for
// mqttKeepAlive plus the call timeout as lost.
const mqttKeepAlive = 30 * time.Second

// mqttTransport publishes over MQTT 3.1.1 on one connection it opens
// itself (TCP, TLS, WebSocket), with a clean session and no
// subscriptions: the sink's buffer is the only store, so a reading is
// forgotten only after the broker acknowledged it (PUBACK at QoS 1,
// PUBCOMP at QoS 2) or it was written (QoS 0).
//
// It is Dowse's own rather than Eclipse Paho because a publisher is a
// small part of MQTT, and Paho's per-message token, timer, store entry,
// goroutine hand-offs and one write per packet were most of a busy
// mapper's CPU: here publishes go into one buffered writer flushed once
// per batch, acknowledgements come through a buffered reader, and
// nothing is allocated per message.
type mqttTransport struct {
	address, clientID string
	creds             credentialSource
	timeout           time.Duration // dialing, the CONNACK, a stuck write

	conn   net.Conn
	wmu    sync.Mutex // w: the sink publishes, the reader answers PUBRECs, the pinger pings
	w      *bufio.Writer
	id     uint16 // the last packet id; the sink's goroutine's
	ackCh  chan uint16
	lostCh chan struct{}
	lostMu sync.Mutex
	lostE  error
	stop   chan struct{}
	wg     sync.WaitGroup
}

func (t *mqttTransport) connect(ctx context.Context) error {
	c, err := t.creds.load()
	if err != nil {
		return err
	}
	if c.password != "" && c.username == "" {
		return errors.New("the sink's credentials have a password and no username: MQTT 3.1.1 sends a password only with a username")
	}
	u, err := url.Parse(t.address)
	if err != nil {
		return err
	}
	dctx, cancel := context.WithTimeout(ctx, t.timeout)
	defer cancel()
	conn, err := t.dial(ctx, dctx, u, c)
	if err != nil {
		return fmt.Errorf("connecting to broker %s: %w", redact(t.address), err)
	}
	w := bufio.NewWriterSize(conn, 16<<10)
	r := bufio.NewReaderSize(conn, 4<<10)
	_ = conn.SetDeadline(time.Now().Add(t.timeout))
	appendConnect(w, t.clientID, c.username, c.password)
	err = w.Flush()
	var typ byte
	var body []byte
	if err == nil {
		typ, body, err = readMQTTPacket(r, make([]byte, 0, 8))
	}
	if err == nil && (typ>>4 != mqttConnack || len(body) != 2) {
		err = fmt.Errorf("the broker answered CONNECT with packet type %d, not CONNACK", typ>>4)
	}
	if err != nil {
		conn.Close()
		return fmt.Errorf("connecting to broker %s: %w", redact(t.address), err)
	}
	switch code := body[1]; code {
	case 0:
	case 4, 5:
		conn.Close()
		return fmt.Errorf("broker %s %w the login: %s", redact(t.address), errSinkRefused, connackReason(code))
	default:
		conn.Close()
		return fmt.Errorf("connecting to broker %s: %s", redact(t.address), connackReason(code))
	}
	_ = conn.SetDeadline(time.Time{})
	t.conn, t.w = conn, w
	t.ackCh = make(chan uint16, sinkWindow)
	t.lostCh, t.lostE = make(chan struct{}), nil
	t.stop = make(chan struct{})
	t.wg.Go(func() { t.readLoop(conn, r) })
	t.wg.Go(t.pingLoop)
	return nil
}

func connackReason(code byte) string {
	switch code {
	case 1:
		return "unacceptable protocol version (the broker does not speak MQTT 3.1.1)"
	case 2:
		return "client identifier rejected"
	case 3:
		return "server unavailable"
	case 4:
		return "bad user name or password"
	case 5:
		return "not authorized"
	}
	return fmt.Sprintf("CONNACK return code %d", code)
}

// dial opens the byte stream to the broker: ctx is the connection's
// lifetime (a WebSocket's), dctx the dial's.
func (t *mqttTransport) dial(ctx, dctx context.Context, u *url.URL, c credentials) (net.Conn, error) {
	switch u.Scheme {
	case "ssl", "tls", "mqtts":
		tc, err := c.tlsConfig()
		if err != nil {
			return nil, err
		}
		return (&tls.Dialer{Config: tc}).DialContext(dctx, "tcp", u.Host)
	case "ws", "wss":
		opts := &websocket.DialOptions{Subprotocols: []string{"mqtt"}}
		if u.Scheme == "wss" {
			tc, err := c.tlsConfig()
			if err != nil {
				return nil, err
			}
			opts.HTTPClient = &http.Client{Transport: &http.Transport{TLSClientConfig: tc}}
		}
		wc, resp, err := websocket.Dial(dctx, u.String(), opts)
		if resp != nil && resp.Body != nil {
			resp.Body.Close()
		}
		if err != nil {
			return nil, err
		}
		// A WebSocket message may hold any part of an MQTT stream (MQTT
		// 3.1.1, 6.0): the broker's are small acknowledgements.
		wc.SetReadLimit(1 << 20)
		return websocket.NetConn(ctx, wc, websocket.MessageBinary), nil
	}
	return (&net.Dialer{}).DialContext(dctx, "tcp", u.Host)
}

// nextID is the next packet id, never 0; the sink has at most sinkWindow
// publishes in flight, far fewer than the ids.
func (t *mqttTransport) nextID() uint16 {
	t.id++
	if t.id == 0 {
		t.id = 1
	}
	return t.id
}

// write buffers r's PUBLISH with packet id id (0 at QoS 0).
func (t *mqttTransport) write(r *reading, id uint16) error {
	n := 2 + len(r.topic) + len(r.payload)
	if r.qos > 0 {
		n += 2
	}
	if n > 268435455 {
		return fmt.Errorf("a reading of %d bytes exceeds MQTT's largest packet", n)
	}
	t.wmu.Lock()
	defer t.wmu.Unlock()
	if t.w.Available() < n+5 {
		_ = t.conn.SetWriteDeadline(time.Now().Add(t.timeout))
	}
	b := t.w.AvailableBuffer()
	first := byte(mqttPublish<<4) | r.qos<<1
	if r.retained {
		first |= 1
	}
	b = append(b, first)
	b = appendVarint(b, n)
	b = binary.BigEndian.AppendUint16(b, uint16(len(r.topic)))
	b = append(b, r.topic...)
	if r.qos > 0 {
		b = binary.BigEndian.AppendUint16(b, id)
	}
	if _, err := t.w.Write(b); err != nil {
		return err
	}
	_, err := t.w.Write(r.payload)
	return err
}

// flush sends what write buffered.
func (t *mqttTransport) flush() error {
	t.wmu.Lock()
	defer t.wmu.Unlock()
	_ = t.conn.SetWriteDeadline(time.Now().Add(t.timeout))
	return t.w.Flush()
}

// control writes and flushes a control packet of two bytes and, with a
// packet id, two more.
func (t *mqttTransport) control(first byte, id uint16, withID bool) error {
	t.wmu.Lock()
	defer t.wmu.Unlock()
	_ = t.conn.SetWriteDeadline(time.Now().Add(t.timeout))
	b := t.w.AvailableBuffer()
	if withID {
		b = append(b, first, 2)
		b = binary.BigEndian.AppendUint16(b, id)
	} else {
		b = append(b, first, 0)
	}
	if _, err := t.w.Write(b); err != nil {
		return err
	}
	return t.w.Flush()
}

// acks delivers the packet ids the broker finished (PUBACK, PUBCOMP).
func (t *mqttTransport) acks() <-chan uint16 { return t.ackCh }

func (t *mqttTransport) lost() <-chan struct{} { return t.lostCh }

func (t *mqttTransport) lostErr() error {
	t.lostMu.Lock()
	defer t.lostMu.Unlock()
	return t.lostE
}

func (t *mqttTransport) fail(err error) {
	t.lostMu.Lock()
	defer t.lostMu.Unlock()
	if t.lostE == nil {
		t.lostE = err
		close(t.lostCh)
	}
}

func (t *mqttTransport) readLoop(conn net.Conn, r *bufio.Reader) {
	buf := make([]byte, 0, 64)
	for {
		// The pinger's PINGREQs get answers at least every half keep-alive.
		_ = conn.SetReadDeadline(time.Now().Add(mqttKeepAlive + t.timeout))
		typ, body, err := readMQTTPacket(r, buf[:0])
		if err != nil {
			t.fail(fmt.Errorf("connection to broker %s lost: %w", redact(t.address), err))
			return
		}
		var id uint16
		if len(body) >= 2 {
			id = binary.BigEndian.Uint16(body)
		}
		switch typ >> 4 {
		case mqttPuback, mqttPubcomp:
			select {
			case t.ackCh <- id:
			case <-t.stop:
				return
			}
		case mqttPubrec:
			if err := t.control(mqttPubrel<<4|2, id, true); err != nil {
				t.fail(err)
				return
			}
		case mqttPingresp:
		default:
			// Nothing else comes to a client that never subscribes.
		}
	}
}

func (t *mqttTransport) pingLoop() {
	tick := time.NewTicker(mqttKeepAlive / 2)
	defer tick.Stop()
	for {
		select {
		case <-t.stop:
			return
		case <-t.lostCh:
			return
		case <-tick.C:
			if err := t.control(mqttPingreq<<4, 0, false); err != nil {
				t.fail(err)
				return
			}
		}
	}
}

// deliver is unused (the sink pipelines publishes), there for transport.
func (t *mqttTransport) deliver(context.Context, []*reading) (done, refused int, refusal, err error) {
	return 0, 0, nil, errors.New("mqtt delivers by publish")
}

func (t *mqttTransport) close() {
	if t.conn == nil {
		return
	}
	select {
	case <-t.lostCh:
		// Nothing to say goodbye on.
	default:
		_ = t.control(mqttDisconn<<4, 0, false)
	}
	close(t.stop)
	t.conn.Close()
	t.wg.Wait()
	t.conn, t.w = nil, nil
}

// appendConnect writes an MQTT 3.1.1 CONNECT with a clean session.
func appendConnect(w *bufio.Writer, clientID, username, password string) {
	var flags byte = 0x02 // clean session
	body := make([]byte, 0, 64)
	body = appendMQTTString(body, "MQTT")
	body = append(body, 4) // protocol level: 3.1.1
	if username != "" {
		flags |= 0x80
	}
	if password != "" {
		flags |= 0x40
	}
	body = append(body, flags)
	body = binary.BigEndian.AppendUint16(body, uint16(mqttKeepAlive/time.Second))
	body = appendMQTTString(body, clientID)
	if username != "" {
		body = appendMQTTString(body, username)
	}
	if password != "" {
		body = appendMQTTString(body, password)
	}
	b := append([]byte{mqttConnect << 4}, appendVarint(nil, len(body))...)
	_, _ = w.Write(append(b, body...))
}

func appendMQTTString(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

// appendVarint appends MQTT's remaining length.
func appendVarint(b []byte, n int) []byte {
	for {
		c := byte(n % 128)
		n /= 128
		if n > 0 {
			c |= 0x80
		}
		b = append(b, c)
		if n == 0 {
			return b
		}
	}
}

// readMQTTPacket reads one packet: its first byte, and its body (after
// the remaining length) in buf, or discarded past buf's capacity (no
// packet a publisher expects is larger).
func readMQTTPacket(r *bufio.Reader, buf []byte) (byte, []byte, error) {
	typ, err := r.ReadByte()
	if err != nil {
		return 0, nil, err
	}
	n, mul := 0, 1
	for i := 0; ; i++ {
		c, err := r.ReadByte()
		if err != nil {
			return 0, nil, err
		}
		n += int(c&0x7f) * mul
		if c&0x80 == 0 {
			break
		}
		if i == 3 {
			return 0, nil, errors.New("malformed remaining length")
		}
		mul *= 128
	}
	if n > cap(buf) {
		_, err := r.Discard(n)
		return typ, nil, err
	}
	buf = buf[:n]
	_, err = io.ReadFull(r, buf)
	return typ, buf, err
}
