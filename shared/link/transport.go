package link

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"
	"github.com/go-logr/logr"
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
	// hand-over (DefaultMaxHandshakes when 0).
	MaxHandshakes int
	// Refused, when set, is called each time a connection attempt is turned
	// away because MaxHandshakes are in progress (QUIC: a retransmitted
	// Initial may count twice; WebSocket attempts wait in the kernel's
	// backlog instead).
	Refused func()
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
	return &wsListener{l: l, tls: conf, gate: newHandshakeGate(opts.MaxHandshakes)}, nil
}

type wsListener struct {
	l    net.Listener
	tls  *tls.Config
	gate *handshakeGate
}

func (w *wsListener) Addr() net.Addr { return w.l.Addr() }

func (w *wsListener) Serve(ctx context.Context, handle func(Conn)) error {
	srv := &http.Server{
		// Bounds the TLS handshake and the upgrade request too.
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       30 * time.Second,
		ConnContext:       connAdmission,
		// TLS handshake failures (a certificate of another CA, none at
		// all) are refusals worth a line in the hub's log.
		ErrorLog: log.New(httpErrorLog{logr.FromContextOrDiscard(ctx)}, "", 0),
		Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			releaseFrom(r.Context()) // the handshake is over
			if r.URL.Path != WebSocketPath || r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
				http.NotFound(rw, r)
				return
			}
			c, err := websocket.Accept(rw, r, &websocket.AcceptOptions{CompressionMode: websocket.CompressionDisabled})
			if err != nil {
				return
			}
			// The frame codec bounds frame sizes; a WebSocket message is only
			// a chunk of the byte stream and is never buffered whole.
			c.SetReadLimit(-1)
			conn := newWSConn(c, r.TLS.PeerCertificates, r.RemoteAddr)
			defer conn.Close()
			handle(conn)
		}),
	}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	err := srv.Serve(tls.NewListener(&gatedListener{Listener: w.l, gate: w.gate, done: ctx.Done()}, w.tls))
	if ctx.Err() != nil {
		return nil
	}
	return err
}

type httpErrorLog struct{ log logr.Logger }

func (h httpErrorLog) Write(p []byte) (int, error) {
	line := strings.TrimSpace(string(p))
	if strings.Contains(line, "TLS handshake error") {
		h.log.Info("refusing connection: TLS handshake failed", "detail", line)
	} else {
		h.log.V(1).Info("http server error", "detail", line)
	}
	return len(p), nil
}

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
		d.client = &http.Client{Transport: &http.Transport{TLSClientConfig: conf, ForceAttemptHTTP2: false, DisableKeepAlives: true}}
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
	gate := newHandshakeGate(opts.MaxHandshakes)
	tr := &quic.Transport{Conn: udp,
		ConnContext: func(ctx context.Context, _ *quic.ClientInfo) (context.Context, error) {
			a := gate.tryEnter()
			if a == nil {
				if opts.Refused != nil {
					opts.Refused()
				}
				return nil, errTooManyHandshakes
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
			c := &quicConn{Stream: st, qc: qc}
			defer c.Close()
			handle(c)
		}()
	}
}

type quicConn struct {
	*quic.Stream
	qc *quic.Conn
}

func (c *quicConn) PeerCertificates() []*x509.Certificate {
	return c.qc.ConnectionState().TLS.PeerCertificates
}
func (c *quicConn) RemoteAddr() string { return c.qc.RemoteAddr().String() }
func (c *quicConn) Close() error {
	c.Stream.CancelRead(0)
	_ = c.Stream.Close()
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
