// Package egress serves the API server's egress to the cluster (what
// kube-apiserver's EgressSelectorConfiguration sends to konnectivity in
// HTTPConnect mode): each HTTP CONNECT to a node's address or to a pod on
// a node whose link this replica holds goes over that link as a byte
// stream; any other destination is dialled from here, so webhooks and
// aggregated APIs keep working. It listens on a Unix socket (the control
// plane beside the replica; the socket's mode is the check) and on TCP
// with mutual TLS.
package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/internal/controller/link/cloudhub"
	"github.com/dowse-dev/dowse/internal/link"
	"github.com/dowse-dev/dowse/internal/link/pki"
)

// Opener opens a byte stream to target through node's link (the hub).
type Opener interface {
	OpenStream(ctx context.Context, node, target string) (*link.Stream, error)
}

// Config is the egress server's.
type Config struct {
	// UDS is the Unix socket to listen on (mode 0600: only its owner, the
	// API server's user, may connect); empty: none.
	UDS string
	// Addr is the TCP address to listen on with TLS; TLS must require and
	// verify client certificates. Empty: none.
	Addr string
	TLS  *tls.Config
	// Protocol is what the API server speaks on UDS and Addr (its
	// EgressSelectorConfiguration's proxyProtocol): HTTPConnect (the
	// default) or GRPC (konnectivity's ProxyService). The replicas'
	// forwards are HTTP CONNECT whatever it is.
	Protocol string
	// Nodes reads Nodes (the manager's cache), Pods lists Pods by IP (the
	// API server, with the status.podIP field selector).
	Nodes, Pods client.Reader
	Hub         Opener
	// PeerAddr is where the other replicas forward what they do not hold
	// (TCP with PeerTLS, which must require and verify client
	// certificates; each must name a replica: pki.ReplicaFromCert). Empty:
	// none.
	PeerAddr string
	PeerTLS  *tls.Config
	// Forward, when set, reaches target through the replica holding node's
	// session (DialPeer); ErrNoHolder when none does.
	Forward    func(ctx context.Context, node, target string) (net.Conn, error)
	Registerer prometheus.Registerer
	Log        logr.Logger
}

// ErrNoHolder: no replica holds the node's session.
var ErrNoHolder = errors.New("no replica holds the node's session")

// errAtBound is the holding replica's 503: the node's streams are at
// their bound there.
var errAtBound = fmt.Errorf("%w on the replica holding the node", link.ErrTooManyStreams)

// Server is the egress server.
type Server struct {
	cfg    Config
	dialer net.Dialer
	opened *prometheus.CounterVec
}

// New checks cfg and makes the server.
func New(cfg Config) (*Server, error) {
	if cfg.UDS == "" && cfg.Addr == "" && cfg.PeerAddr == "" {
		return nil, errors.New("egress: no socket and no address")
	}
	if cfg.Addr != "" && (cfg.TLS == nil || cfg.TLS.ClientAuth != tls.RequireAndVerifyClientCert) {
		return nil, errors.New("egress: a TCP address needs TLS that requires and verifies client certificates")
	}
	if cfg.PeerAddr != "" && (cfg.PeerTLS == nil || cfg.PeerTLS.ClientAuth != tls.RequireAndVerifyClientCert) {
		return nil, errors.New("egress: the peer address needs TLS that requires and verifies client certificates")
	}
	switch cfg.Protocol {
	case "":
		cfg.Protocol = HTTPConnect
	case HTTPConnect, GRPC:
	default:
		return nil, fmt.Errorf("egress: protocol %q: %s or %s", cfg.Protocol, HTTPConnect, GRPC)
	}
	if cfg.Nodes == nil || cfg.Pods == nil || cfg.Hub == nil {
		return nil, errors.New("egress: Nodes, Pods and Hub are required")
	}
	s := &Server{cfg: cfg, opened: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "dowse", Subsystem: "egress", Name: "connections_total",
		Help: "The API server's egress connections, by route: link (over a node's link held here), forwarded (to the replica holding it), direct (dialled from the cloud side) or refused."}, []string{"route"})}
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(s.opened)
	}
	return s, nil
}

// Start serves until ctx ends.
func (s *Server) Start(ctx context.Context) error {
	var ls, tlsLs []net.Listener // tlsLs: TCP, for gRPC's own TLS
	defer func() {
		for _, l := range append(ls, tlsLs...) {
			_ = l.Close()
		}
	}()
	if s.cfg.UDS != "" {
		if err := os.MkdirAll(filepath.Dir(s.cfg.UDS), 0o700); err != nil {
			return err
		}
		if err := os.Remove(s.cfg.UDS); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		l, err := net.Listen("unix", s.cfg.UDS)
		if err != nil {
			return err
		}
		ls = append(ls, l)
		if err := os.Chmod(s.cfg.UDS, 0o600); err != nil {
			return err
		}
	}
	grpcMode := s.cfg.Protocol == GRPC
	if s.cfg.Addr != "" {
		if grpcMode {
			l, err := net.Listen("tcp", s.cfg.Addr)
			if err != nil {
				return err
			}
			tlsLs = append(tlsLs, l)
		} else {
			conf := s.cfg.TLS.Clone()
			conf.NextProtos = []string{"http/1.1"} // CONNECT is hijacked: no HTTP/2
			l, err := tls.Listen("tcp", s.cfg.Addr, conf)
			if err != nil {
				return err
			}
			ls = append(ls, l)
		}
	}
	srv := &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second, BaseContext: func(net.Listener) context.Context { return ctx }}
	peers := &http.Server{Handler: peerHandler{s}, ReadHeaderTimeout: 10 * time.Second, BaseContext: func(net.Listener) context.Context { return ctx }}
	errs := make(chan error, len(ls)+len(tlsLs)+1)
	var grpcs []interface{ Stop() }
	for _, l := range ls {
		s.cfg.Log.Info("serving the API server's egress", "address", l.Addr().String(), "protocol", s.cfg.Protocol)
		if grpcMode {
			g := s.newGRPCServer(false)
			grpcs = append(grpcs, g)
			go func() { errs <- g.Serve(l) }()
			continue
		}
		go func() { errs <- srv.Serve(l) }()
	}
	for _, l := range tlsLs {
		s.cfg.Log.Info("serving the API server's egress", "address", l.Addr().String(), "protocol", s.cfg.Protocol)
		g := s.newGRPCServer(true)
		grpcs = append(grpcs, g)
		go func() { errs <- g.Serve(l) }()
	}
	defer func() {
		for _, g := range grpcs {
			g.Stop()
		}
	}()
	if s.cfg.PeerAddr != "" {
		conf := s.cfg.PeerTLS.Clone()
		conf.NextProtos = []string{"http/1.1"}
		l, err := tls.Listen("tcp", s.cfg.PeerAddr, conf)
		if err != nil {
			_ = srv.Close()
			return err
		}
		s.cfg.Log.Info("serving the other replicas' egress forwards", "address", l.Addr().String())
		go func() { errs <- peers.Serve(l) }()
	}
	select {
	case <-ctx.Done():
		_ = srv.Close()
		_ = peers.Close()
		return nil
	case err := <-errs:
		_ = srv.Close()
		_ = peers.Close()
		return err
	}
}

// peerHandler serves another replica's forward: a node whose session is
// held here, never forwarded again.
type peerHandler struct{ s *Server }

func (h peerHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
		h.s.refuse(w, http.StatusForbidden, "a replica's certificate is required")
		return
	}
	if _, err := pki.ReplicaFromCert(r.TLS.PeerCertificates[0]); err != nil {
		h.s.refuse(w, http.StatusForbidden, err.Error())
		return
	}
	h.s.serve(w, r, true)
}

// ServeHTTP answers one CONNECT: 200 and the bytes both ways once the
// destination is reached; 503 (Retry-After) when the destination's node
// has as many streams open through its link as it may; 502 saying why
// not otherwise.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.TLS != nil {
		// On TCP only the API server's certificate opens connections (a
		// node's, of the same CA, never does).
		if len(r.TLS.PeerCertificates) == 0 {
			s.refuse(w, http.StatusForbidden, "a client certificate is required")
			return
		}
		if _, err := pki.EgressClientFromCert(r.TLS.PeerCertificates[0]); err != nil {
			s.refuse(w, http.StatusForbidden, err.Error())
			return
		}
	}
	s.serve(w, r, false)
}

// refuse answers code with why, counted. why is in the status line too:
// kube-apiserver reports a refused CONNECT by its status line alone, so
// that is where kubectl's user reads why (which node, which bound).
func (s *Server) refuse(w http.ResponseWriter, code int, why string) {
	s.opened.WithLabelValues("refused").Inc()
	hj, ok := w.(http.Hijacker)
	if !ok {
		http.Error(w, why, code)
		return
	}
	c, _, err := hj.Hijack()
	if err != nil {
		return
	}
	defer c.Close()
	reason := strings.Map(func(r rune) rune {
		if r < ' ' || r == 0x7f {
			return ' '
		}
		return r
	}, why)
	if len(reason) > 512 {
		reason = reason[:512] + "..."
	}
	retry := ""
	if ra := w.Header().Get("Retry-After"); ra != "" {
		retry = "Retry-After: " + ra + "\r\n"
	}
	body := why + "\n"
	_, _ = fmt.Fprintf(c, "HTTP/1.1 %d %s: %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\n%sConnection: close\r\n\r\n%s",
		code, http.StatusText(code), reason, len(body), retry, body)
}

// serve answers a CONNECT; forwarded ones (from another replica) go only
// over a link held here.
func (s *Server) serve(w http.ResponseWriter, r *http.Request, forwarded bool) {
	if r.Method != http.MethodConnect {
		http.Error(w, "only CONNECT host:port is served here", http.StatusMethodNotAllowed)
		return
	}
	target := r.Host
	ctx, cancel := context.WithTimeout(r.Context(), 15*time.Second)
	defer cancel()
	conn, route, err := s.dial(ctx, target, forwarded)
	if err != nil {
		s.cfg.Log.Info("egress refused", "target", target, "reason", err.Error())
		code := http.StatusBadGateway
		if errors.Is(err, link.ErrTooManyStreams) {
			// The node is at its bound: the caller may try again once
			// some of its streams end.
			code = http.StatusServiceUnavailable
			w.Header().Set("Retry-After", "1")
		}
		s.refuse(w, code, err.Error())
		return
	}
	s.opened.WithLabelValues(route).Inc()
	hj, ok := w.(http.Hijacker)
	if !ok {
		_ = conn.Close()
		http.Error(w, "connection cannot be taken over", http.StatusInternalServerError)
		return
	}
	c, buf, err := hj.Hijack()
	if err != nil {
		_ = conn.Close()
		return
	}
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		_ = c.Close()
		_ = conn.Close()
		return
	}
	// Bytes the client sent after its CONNECT, already read.
	if n := buf.Reader.Buffered(); n > 0 {
		early, _ := buf.Reader.Peek(n)
		if _, err := conn.Write(early); err != nil {
			_ = c.Close()
			_ = conn.Close()
			return
		}
	}
	link.Splice(conn, c)
}

// Dial reaches target as the API server's CONNECT would (package
// cloudservices relays with it).
func (s *Server) Dial(ctx context.Context, target string) (net.Conn, error) {
	c, _, err := s.dial(ctx, target, false)
	return c, err
}

// dial reaches target: over its node's link when the node's session is
// here, else directly.
func (s *Server) dial(ctx context.Context, target string, forwarded bool) (net.Conn, string, error) {
	host, _, err := net.SplitHostPort(target)
	if err != nil {
		return nil, "", fmt.Errorf("CONNECT %q: %w", target, err)
	}
	node, err := s.nodeOf(ctx, host)
	if err != nil {
		return nil, "", err
	}
	if node != "" {
		st, err := s.cfg.Hub.OpenStream(ctx, node, target)
		switch {
		case err == nil:
			return st, "link", nil
		case errors.Is(err, link.ErrTooManyStreams):
			return nil, "", fmt.Errorf("%s: node %s has as many streams open through its link as it may (the controller's --max-streams-per-node): %w", target, node, err)
		case !errors.Is(err, cloudhub.ErrNoSession):
			return nil, "", fmt.Errorf("%s through node %s's link: %w", target, node, err)
		case forwarded:
			return nil, "", fmt.Errorf("%s: node %s's session is not held here (any more)", target, node)
		case s.cfg.Forward != nil:
			c, err := s.cfg.Forward(ctx, node, target)
			switch {
			case err == nil:
				return c, "forwarded", nil
			case errors.Is(err, link.ErrTooManyStreams):
				return nil, "", fmt.Errorf("%s through node %s's link on another replica: %w", target, node, err)
			case !errors.Is(err, ErrNoHolder):
				return nil, "", fmt.Errorf("%s through node %s's link on another replica: %w", target, node, err)
			}
		}
		// Held by no replica: the node may be one the cloud reaches itself.
	}
	c, err := s.dialer.DialContext(ctx, "tcp", target)
	if err != nil {
		return nil, "", err
	}
	return c, "direct", nil
}

// nodeOf is the node whose address or pod host is ("" for neither).
func (s *Server) nodeOf(ctx context.Context, host string) (string, error) {
	var nodes corev1.NodeList
	if err := s.cfg.Nodes.List(ctx, &nodes); err != nil {
		return "", fmt.Errorf("listing nodes: %w", err)
	}
	for _, n := range nodes.Items {
		if n.Name == host || slices.ContainsFunc(n.Status.Addresses, func(a corev1.NodeAddress) bool { return a.Address == host }) {
			return n.Name, nil
		}
	}
	if net.ParseIP(host) == nil {
		return "", nil
	}
	var pods corev1.PodList
	if err := s.cfg.Pods.List(ctx, &pods, client.MatchingFields{"status.podIP": host}); err != nil {
		return "", fmt.Errorf("the pod of %s: %w", host, err)
	}
	for _, p := range pods.Items {
		if p.Spec.NodeName != "" && !p.Spec.HostNetwork && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			return p.Spec.NodeName, nil
		}
	}
	return "", nil
}

// DialPeer reaches target through the replica whose egress peer listener
// is at addr (conf: this replica's certificate, the link CA).
func DialPeer(ctx context.Context, addr string, conf *tls.Config, target string) (net.Conn, error) {
	d := tls.Dialer{Config: conf}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	if _, err := fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target); err != nil {
		_ = c.Close()
		return nil, err
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("replica at %s: %w", addr, err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		_ = c.Close()
		if resp.StatusCode == http.StatusServiceUnavailable {
			// The node is at its bound on the replica holding it (the only
			// 503 a replica answers).
			return nil, fmt.Errorf("replica at %s: %w (%s)", addr, errAtBound, bytes.TrimSpace(b))
		}
		return nil, fmt.Errorf("replica at %s: %s: %s", addr, resp.Status, bytes.TrimSpace(b))
	}
	_ = c.SetDeadline(time.Time{})
	return &bufferedConn{Conn: c, r: br}, nil
}

// bufferedConn reads what the answer's reader holds first; it half-closes
// as its TLS connection does.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (b *bufferedConn) Read(p []byte) (int, error) { return b.r.Read(p) }

func (b *bufferedConn) CloseWrite() error {
	if cw, ok := b.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
