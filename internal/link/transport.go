package link

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/coder/websocket"
	"github.com/go-logr/logr"
	"github.com/gobwas/ws"
	"github.com/quic-go/quic-go"
)

// Conn is one established transport connection: a reliable, ordered byte
// stream over mutual TLS 1.3. Close may be called more than once and from
// any goroutine; it unblocks pending Reads and Writes.
type Conn interface {
	io.ReadWriteCloser
	// PeerCertificates are the peer's verified certificates, leaf first.
	PeerCertificates() []*x509.Certificate
	RemoteAddr() string
}

// Listener accepts connections of one transport.
type Listener interface {
	// Serve accepts connections until ctx ends, calling handle for each in
	// its own goroutine; the connection is closed when handle returns.
	Serve(ctx context.Context, handle func(Conn)) error
	Addr() net.Addr
}

// Dialer opens connections of one transport to one server.
type Dialer interface {
	Dial(ctx context.Context) (Conn, error)
}

// Transport names.
const (
	WebSocket = "websocket"
	QUIC      = "quic"
)

// WebSocketPath is the HTTP path the WebSocket transport is served on.
const WebSocketPath = "/link/v1"

// ALPN is the QUIC application protocol.
const ALPN = "dowse-link/1"

// ListenOptions bound a listener.
type ListenOptions struct {
	// MaxHandshakes bounds the connections held between accept and
	// hand-over (DefaultMaxHandshakes when 0), MaxHandshakesPerSource those
	// of one source address among them (DefaultMaxHandshakesPerSource).
	MaxHandshakes, MaxHandshakesPerSource int
	// Refused, when set, is called each time a connection attempt is turned
	// away, with why: "handshakes-full", MaxHandshakes are in progress
	// (QUIC: a retransmitted Initial may count twice; WebSocket attempts
	// wait in the kernel's backlog instead), or "source-busy", its source
	// address holds MaxHandshakesPerSource.
	Refused func(reason string)
}

// ListenWebSocket listens on addr (TLS over TCP) with tlsConf, which should
// come from pki.ServerTLSConfig (client certificates required and verified).
// At most opts.MaxHandshakes connections are held before their upgrade;
// more wait in the kernel's backlog.
func ListenWebSocket(addr string, tlsConf *tls.Config, opts ListenOptions) (Listener, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	conf := tlsConf.Clone()
	// HTTP/1.1 only: the WebSocket upgrade needs it.
	conf.NextProtos = []string{"http/1.1"}
	return &wsListener{l: l, tls: conf, gate: newHandshakeGate(opts.MaxHandshakes, opts.MaxHandshakesPerSource), refused: opts.Refused}, nil
}

type wsListener struct {
	l       net.Listener
	tls     *tls.Config
	gate    *handshakeGate
	refused func(reason string)
}

// prefixedConn gives back, first, the byte read ahead of the TLS handshake.
type prefixedConn struct {
	net.Conn
	first  byte
	unread bool
}

func (p *prefixedConn) Read(b []byte) (int, error) {
	if p.unread && len(b) > 0 {
		p.unread = false
		b[0] = p.first
		return 1, nil
	}
	return p.Conn.Read(b)
}

func (w *wsListener) Addr() net.Addr { return w.l.Addr() }

// handshakeTimeout bounds a connection's TLS handshake and WebSocket
// upgrade together.
const handshakeTimeout = 10 * time.Second

// Serve accepts connections, each with a goroutine of its own that does the
// TLS handshake and the WebSocket upgrade and then becomes the
// connection's reader (handle): no HTTP server stays behind a connection,
// so an idle one holds its TLS state and little else.
func (w *wsListener) Serve(ctx context.Context, handle func(Conn)) error {
	log := logr.FromContextOrDiscard(ctx)
	gl := &gatedListener{Listener: w.l, gate: w.gate, done: ctx.Done(), refused: w.refused}
	stop := context.AfterFunc(ctx, func() { _ = w.l.Close() })
	defer stop()
	for {
		c, err := gl.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				time.Sleep(10 * time.Millisecond)
				continue
			}
			return err
		}
		go func() {
			conn, err := w.upgrade(c)
			if err != nil {
				_ = c.Close()
				if !errors.Is(err, errNotUpgraded) {
					log.Info("refusing connection: TLS handshake failed", "remote", c.RemoteAddr().String(), "detail", err.Error())
				}
				return
			}
			// The connection gets a goroutine of its own: the handshake's
			// (deep, for certificate checks) is not kept for its life.
			go func() {
				defer conn.Close()
				handle(conn)
			}()
		}()
	}
}

// errNotUpgraded: the peer spoke TLS but asked for something else than the
// link's WebSocket (answered with an HTTP error).
var errNotUpgraded = errors.New("link: not a WebSocket upgrade to " + WebSocketPath)

func (w *wsListener) upgrade(c net.Conn) (*wsServerConn, error) {
	// The first byte soon, then the whole handshake in its own time.
	_ = c.SetDeadline(time.Now().Add(FirstByteTimeout))
	var first [1]byte
	if _, err := io.ReadFull(c, first[:]); err != nil {
		return nil, fmt.Errorf("nothing sent within %s of connecting: %w", FirstByteTimeout, err)
	}
	_ = c.SetDeadline(time.Now().Add(handshakeTimeout))
	tc := tls.Server(&prefixedConn{Conn: c, first: first[0], unread: true}, w.tls)
	if err := tc.Handshake(); err != nil {
		return nil, err
	}
	certs := tc.ConnectionState().PeerCertificates
	u := ws.Upgrader{OnRequest: func(uri []byte) error {
		if path, _, _ := strings.Cut(string(uri), "?"); path != WebSocketPath || len(certs) == 0 {
			return ws.RejectConnectionError(ws.RejectionStatus(http.StatusNotFound))
		}
		return nil
	}}
	if _, err := u.Upgrade(tc); err != nil {
		return nil, errNotUpgraded
	}
	_ = c.SetDeadline(time.Time{})
	if gc, ok := c.(*gatedConn); ok {
		gc.adm.release() // the handshake is over
	}
	conn := &wsServerConn{tls: tc, raw: c, certs: certs, remote: c.RemoteAddr().String()}
	inner := c
	if gc, ok := c.(*gatedConn); ok {
		inner = gc.Conn
	}
	if sc, ok := inner.(syscall.Conn); ok {
		conn.rc, _ = sc.SyscallConn()
		if conn.rc != nil {
			setNotSentLowat(conn.rc, NotSentLowat)
		}
	}
	return conn, nil
}

// NotSentLowat is the most bytes a WebSocket connection's socket holds
// written and not yet sent (TCP_NOTSENT_LOWAT, on Linux): the kernel's
// queue stays short and the link's writer, which puts twins first, decides
// what goes next. Sent bytes not yet acknowledged are not counted: those
// are the link's bandwidth-delay product, which the streams' bound keeps
// (see StreamReceipt).
const NotSentLowat = 16 << 10

// wsServerConn is the server end of the WebSocket transport: binary frames
// read straight from the TLS connection (client frames are masked; control
// frames are answered), one frame per Write. The byte stream is the link's;
// a WebSocket message is only a chunk of it.
type wsServerConn struct {
	tls    *tls.Conn
	raw    net.Conn
	rc     syscall.RawConn // the socket's, to wait for data (nil: cannot)
	certs  []*x509.Certificate
	remote string

	// The reader's, one goroutine.
	left   int64 // payload bytes left in the current frame
	masked bool
	mask   [4]byte
	off    int
	hdr    [ws.MaxHeaderSize - 2]byte
	one    [1]byte
	peeked bool // one holds a byte of TLS plaintext read by WaitReadable

	wmu sync.Mutex
}

func (c *wsServerConn) PeerCertificates() []*x509.Certificate { return c.certs }
func (c *wsServerConn) RemoteAddr() string                    { return c.remote }

// Close drops the connection at once: a dead peer must not hold us in a
// closing handshake (nor in TLS's close_notify).
func (c *wsServerConn) Close() error { return c.raw.Close() }

// next reads frame headers until a data frame with payload begins.
func (c *wsServerConn) next() error {
	for c.left == 0 {
		h, err := ws.ReadHeaderBuffer(plain{c}, c.hdr[:])
		if err != nil {
			return err
		}
		if !h.Masked {
			return fmt.Errorf("%w: unmasked WebSocket frame from a client", ErrMalformed)
		}
		switch h.OpCode {
		case ws.OpBinary, ws.OpContinuation:
			c.left, c.masked, c.mask, c.off = h.Length, h.Masked, h.Mask, 0
		case ws.OpPing, ws.OpPong:
			if h.Length > 125 {
				return fmt.Errorf("%w: WebSocket control frame of %d bytes", ErrMalformed, h.Length)
			}
			var p [125]byte
			if _, err := io.ReadFull(plain{c}, p[:h.Length]); err != nil {
				return err
			}
			if h.OpCode == ws.OpPing {
				ws.Cipher(p[:h.Length], h.Mask, 0)
				if err := c.writeFrame(ws.OpPong, p[:h.Length]); err != nil {
					return err
				}
			}
		case ws.OpClose:
			_ = c.writeFrame(ws.OpClose, nil)
			return io.EOF
		default:
			return fmt.Errorf("%w: WebSocket frame of opcode %d", ErrMalformed, h.OpCode)
		}
	}
	return nil
}

func (c *wsServerConn) Read(p []byte) (int, error) {
	if err := c.next(); err != nil {
		return 0, err
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.plain(p)
	if c.masked {
		ws.Cipher(p[:n], c.mask, c.off)
	}
	c.off += n
	c.left -= int64(n)
	return n, err
}

// plain reads TLS plaintext, the byte WaitReadable took first.
func (c *wsServerConn) plain(p []byte) (int, error) {
	if c.peeked && len(p) > 0 {
		p[0], c.peeked = c.one[0], false
		return 1, nil
	}
	return c.tls.Read(p)
}

// plain is an io.Reader of the connection's TLS plaintext.
type plain struct{ c *wsServerConn }

func (p plain) Read(b []byte) (int, error) { return p.c.plain(b) }

// longAgo is a read deadline that has passed: a read then returns what is
// buffered and never waits.
var longAgo = time.Unix(1, 0)

// WaitReadable returns once there is something to read (or the connection
// failed), having waited, when it had to, right on the socket: an idle
// connection's goroutine is then parked a few frames deep instead of in
// the TLS and WebSocket readers, and the runtime shrinks its stack to fit
// (4 KiB rather than 8 per idle edge).
func (c *wsServerConn) WaitReadable() error {
	if c.left > 0 || c.peeked || c.rc == nil {
		return nil // inside a frame: the rest is on its way, read it
	}
	// TLS may hold plaintext already (a record with several frames):
	// take a byte of it without touching the socket (a read deadline that
	// has passed fails a socket read before it is tried; TLS keeps its
	// state across such a timeout).
	_ = c.raw.SetReadDeadline(longAgo)
	n, err := c.tls.Read(c.one[:])
	_ = c.raw.SetReadDeadline(time.Time{})
	if n == 1 {
		c.peeked = true
		return nil
	}
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		return err
	}
	return c.rc.Read(socketReadable)
}

// ReadByte lets the frame reader read lengths without a buffer of its own.
func (c *wsServerConn) ReadByte() (byte, error) {
	n, err := c.Read(c.one[:])
	for n == 0 && err == nil {
		n, err = c.Read(c.one[:])
	}
	if n == 0 {
		return 0, err
	}
	return c.one[0], nil
}

// smallFrame: frames up to this size go out in one TLS record with their
// header (one write), larger ones in two.
const smallFrame = 4 << 10

var framePool = sync.Pool{New: func() any { b := make([]byte, 0, smallFrame+ws.MaxHeaderSize); return &b }}

func (c *wsServerConn) Write(p []byte) (int, error) {
	if err := c.writeFrame(ws.OpBinary, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (c *wsServerConn) writeFrame(op ws.OpCode, p []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	var hdr [10]byte
	h := appendWSHeader(hdr[:0], op, len(p))
	if len(p) <= smallFrame {
		bp, ok := framePool.Get().(*[]byte)
		if !ok { // the pool makes only these
			bp = new([]byte)
		}
		b := append(append((*bp)[:0], h...), p...)
		_, err := c.tls.Write(b)
		*bp = b[:0]
		framePool.Put(bp)
		return err
	}
	if _, err := c.tls.Write(h); err != nil {
		return err
	}
	_, err := c.tls.Write(p)
	return err
}

// appendWSHeader appends a final, unmasked (server) frame header.
func appendWSHeader(b []byte, op ws.OpCode, n int) []byte {
	b = append(b, 0x80|byte(op))
	switch {
	case n < 126:
		return append(b, byte(n))
	case n <= 0xffff:
		return binary.BigEndian.AppendUint16(append(b, 126), uint16(n))
	default:
		return binary.BigEndian.AppendUint64(append(b, 127), uint64(n))
	}
}

// wsConn is the client end of the WebSocket transport (coder/websocket).
type wsConn struct {
	net.Conn
	ws     *websocket.Conn
	cancel context.CancelFunc
	certs  []*x509.Certificate
	remote string
}

func newWSConn(c *websocket.Conn, certs []*x509.Certificate, remote string) *wsConn {
	ctx, cancel := context.WithCancel(context.Background())
	return &wsConn{Conn: websocket.NetConn(ctx, c, websocket.MessageBinary), ws: c, cancel: cancel, certs: certs, remote: remote}
}

func (c *wsConn) PeerCertificates() []*x509.Certificate { return c.certs }
func (c *wsConn) RemoteAddr() string                    { return c.remote }

// Close drops the connection at once: a dead peer must not hold us in a
// closing handshake.
func (c *wsConn) Close() error {
	c.cancel()
	return c.ws.CloseNow()
}

// WebSocketDialer dials wss://Addr/link/v1.
type WebSocketDialer struct {
	Addr string
	TLS  *tls.Config // from pki.ClientTLSConfig

	once   sync.Once
	client *http.Client
}

func (d *WebSocketDialer) Dial(ctx context.Context) (Conn, error) {
	d.once.Do(func() {
		conf := d.TLS.Clone()
		conf.NextProtos = []string{"http/1.1"}
		dialer := &net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
			setNotSentLowat(rc, NotSentLowat)
			return nil
		}}
		d.client = &http.Client{Transport: &http.Transport{DialContext: dialer.DialContext, TLSClientConfig: conf, ForceAttemptHTTP2: false, DisableKeepAlives: true}}
	})
	u := url.URL{Scheme: "wss", Host: d.Addr, Path: WebSocketPath}
	c, resp, err := websocket.Dial(ctx, u.String(), &websocket.DialOptions{HTTPClient: d.client, CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		return nil, err
	}
	c.SetReadLimit(-1)
	var certs []*x509.Certificate
	if resp != nil && resp.TLS != nil {
		certs = resp.TLS.PeerCertificates
	}
	return newWSConn(c, certs, d.Addr), nil
}

// quicConfig: the link's own heartbeats find dead peers, so QUIC's idle
// timeout only backs them up.
func quicConfig() *quic.Config {
	return &quic.Config{MaxIdleTimeout: 5 * time.Minute, HandshakeIdleTimeout: 10 * time.Second, MaxIncomingStreams: 1, MaxIncomingUniStreams: -1}
}

// ListenQUIC listens on addr (UDP) with tlsConf (see ListenWebSocket); each
// connection carries one bidirectional stream, opened by the client. At
// most opts.MaxHandshakes connections are held before their stream is
// open; more are refused, and once half of them are taken, new attempts
// must first prove their source address (a QUIC Retry).
func ListenQUIC(addr string, tlsConf *tls.Config, opts ListenOptions) (Listener, error) {
	conf := tlsConf.Clone()
	conf.NextProtos = []string{ALPN}
	// Edges do not resume TLS sessions; a ticket would only be one more
	// buffer kept by every connection's crypto stream.
	conf.SessionTicketsDisabled = true
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, err
	}
	udp, err := net.ListenUDP("udp", ua)
	if err != nil {
		return nil, err
	}
	// Our own socket and Transport, closed in order when Serve ends, so
	// that the port is free again when Serve returns (a restarted hub binds
	// it at once).
	gate := newHandshakeGate(opts.MaxHandshakes, opts.MaxHandshakesPerSource)
	tr := &quic.Transport{Conn: udp,
		ConnContext: func(ctx context.Context, ci *quic.ClientInfo) (context.Context, error) {
			a := gate.tryEnter()
			if a == nil {
				if opts.Refused != nil {
					opts.Refused("handshakes-full")
				}
				return nil, errTooManyHandshakes
			}
			if !gate.bind(a, ci.RemoteAddr) {
				a.release()
				if opts.Refused != nil {
					opts.Refused("source-busy")
				}
				return nil, errSourceBusy
			}
			// The context ends when the handshake fails or the connection
			// closes.
			context.AfterFunc(ctx, a.release)
			return context.WithValue(ctx, admissionKey{}, a), nil
		},
		VerifySourceAddress: func(net.Addr) bool { return gate.busy() },
	}
	l, err := tr.Listen(conf, quicConfig())
	if err != nil {
		udp.Close()
		return nil, err
	}
	return &quicListener{l: l, tr: tr, udp: udp}, nil
}

type quicListener struct {
	l   *quic.Listener
	tr  *quic.Transport
	udp *net.UDPConn
}

func (q *quicListener) Addr() net.Addr { return q.l.Addr() }

func (q *quicListener) Serve(ctx context.Context, handle func(Conn)) error {
	defer func() {
		_ = q.l.Close()
		_ = q.tr.Close()
		_ = q.udp.Close()
	}()
	for {
		qc, err := q.l.Accept(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		go func() {
			sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			st, err := qc.AcceptStream(sctx)
			cancel()
			releaseFrom(qc.Context())
			if err != nil {
				_ = qc.CloseWithError(0, "no stream")
				return
			}
			// The connection gets a goroutine of its own (as a WebSocket
			// one does): this one's frame is not kept for its life.
			go func() {
				c := &quicConn{Stream: st, qc: qc}
				defer c.Close()
				handle(c)
			}()
		}()
	}
}

type quicConn struct {
	*quic.Stream
	qc     *quic.Conn
	one    [1]byte
	peeked bool // one holds a byte WaitReadable took
}

// WaitReadable returns once the stream has something to read (or failed),
// having taken one byte of it: an idle connection's goroutine then waits
// a few small frames deep (see wsServerConn.WaitReadable), not under the
// frame reader, and the runtime keeps its stack small.
func (c *quicConn) WaitReadable() error {
	if c.peeked {
		return nil
	}
	n, err := c.Stream.Read(c.one[:])
	if n == 1 {
		c.peeked = true
		return nil
	}
	return err
}

func (c *quicConn) Read(p []byte) (int, error) {
	if c.peeked && len(p) > 0 {
		p[0], c.peeked = c.one[0], false
		return 1, nil
	}
	return c.Stream.Read(p)
}

// ReadByte lets the frame reader read lengths without a buffer of its own
// (the stream buffers what arrived).
func (c *quicConn) ReadByte() (byte, error) {
	if c.peeked {
		c.peeked = false
		return c.one[0], nil
	}
	for {
		n, err := c.Stream.Read(c.one[:])
		if n == 1 {
			return c.one[0], nil
		}
		if err != nil {
			return 0, err
		}
	}
}

func (c *quicConn) PeerCertificates() []*x509.Certificate {
	return c.qc.ConnectionState().TLS.PeerCertificates
}
func (c *quicConn) RemoteAddr() string { return c.qc.RemoteAddr().String() }

// Close resets the stream both ways, which unblocks a Write waiting for
// flow control (a Stream.Close meanwhile would leave it waiting: quic-go
// then ignores the connection's end for the stream), and closes the
// connection.
func (c *quicConn) Close() error {
	c.Stream.CancelRead(0)
	c.Stream.CancelWrite(0)
	return c.qc.CloseWithError(0, "")
}

// QUICDialer dials Addr over UDP. Transport, when set, is shared by every
// dial (one UDP socket for many connections, as the benchmark needs).
type QUICDialer struct {
	Addr      string
	TLS       *tls.Config // from pki.ClientTLSConfig
	Transport *quic.Transport
}

func (d *QUICDialer) Dial(ctx context.Context) (Conn, error) {
	conf := d.TLS.Clone()
	conf.NextProtos = []string{ALPN}
	var qc *quic.Conn
	var err error
	if d.Transport != nil {
		var ua *net.UDPAddr
		if ua, err = net.ResolveUDPAddr("udp", d.Addr); err != nil {
			return nil, err
		}
		qc, err = d.Transport.Dial(ctx, ua, conf, quicConfig())
	} else {
		qc, err = quic.DialAddr(ctx, d.Addr, conf, quicConfig())
	}
	if err != nil {
		return nil, err
	}
	st, err := qc.OpenStreamSync(ctx)
	if err != nil {
		_ = qc.CloseWithError(0, "")
		return nil, err
	}
	return &quicConn{Stream: st, qc: qc}, nil
}

// NewDialer returns the Dialer for transport ("websocket" or "quic").
func NewDialer(transport, addr string, tlsConf *tls.Config) (Dialer, error) {
	switch transport {
	case WebSocket:
		return &WebSocketDialer{Addr: addr, TLS: tlsConf}, nil
	case QUIC:
		return &QUICDialer{Addr: addr, TLS: tlsConf}, nil
	}
	return nil, errors.New("link: unknown transport " + transport + " (want websocket or quic)")
}
