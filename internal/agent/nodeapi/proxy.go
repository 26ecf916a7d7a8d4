// Package nodeapi serves the API server to its node's kubelet and agent and
// keeps what they read, so that it can answer their reads from the node's
// disk while the API server cannot be reached, across a reboot too.
package nodeapi

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"github.com/dowse-dev/dowse/internal/events"
)

// Config configures a Server.
type Config struct {
	// Listen is the loopback address the kubelet and the agent dial.
	Listen string
	// Dir holds the store, its seal key and the serving certificate.
	Dir string
	// Upstream is the API server as the kubelet reached it: its address,
	// its CA and the node's client certificate, which the Server presents
	// for callers that present that same certificate to it.
	Upstream *rest.Config
	// ProbeEvery is how often the API server's /readyz is asked.
	ProbeEvery time.Duration
	// ProbeTimeout bounds one probe and one dial.
	ProbeTimeout time.Duration
	// PodResourcesSocket is the kubelet's pod-resources API. When set,
	// pods that ask for resources named GatedPrefix are handed to the
	// kubelet offline only once their devices are allocatable (see
	// deviceGate).
	PodResourcesSocket string
	GatedPrefix        string
	// NodeName, when set, is the Node an Event tells about each time the
	// API server is reached again after a cut: how long it was away, how
	// much was answered from the store meanwhile.
	NodeName string
	Log      logr.Logger
	Metrics  prometheus.Registerer
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

// Server is the node-local API proxy.
type Server struct {
	cfg      Config
	store    *store
	server   *url.URL
	node     http.RoundTripper // presents the node's certificate
	anon     http.RoundTripper // presents nothing: bearer tokens pass through
	serving  tls.Certificate
	metrics  *metrics
	proxy    *httputil.ReverseProxy
	listener net.Listener
	gate     *deviceGate // nil: none
	events   *events.Recorder

	// served and refused count offline answers since the last cut.
	served, refused atomic.Int64

	mu          sync.Mutex
	offline     bool
	offlineFrom time.Time
	// lostBefore is when an earlier process of the proxy lost the API
	// server, until it is reached.
	lostBefore time.Time
	// reconnect is closed when the API server is reached again after a cut:
	// watches held open offline end then, so their clients list afresh.
	reconnect chan struct{}
	// cut is closed when the API server is lost: watches passed through end
	// then, so their clients come back and are held here.
	cut chan struct{}
}

// New opens the store and prepares the serving certificate.
func New(cfg Config) (*Server, error) {
	if cfg.Upstream == nil {
		return nil, errors.New("node API: no upstream API server")
	}
	if cfg.ProbeEvery == 0 {
		cfg.ProbeEvery = 2 * time.Second
	}
	if cfg.ProbeTimeout == 0 {
		cfg.ProbeTimeout = 3 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	server, err := url.Parse(cfg.Upstream.Host)
	if err != nil || server.Host == "" {
		return nil, fmt.Errorf("node API: upstream address %q: %w", cfg.Upstream.Host, err)
	}
	if _, err := upstreamClientCert(cfg.Upstream); err != nil {
		return nil, err
	}
	dialer := &net.Dialer{Timeout: cfg.ProbeTimeout, KeepAlive: 15 * time.Second}
	transport := func(c *rest.Config) (http.RoundTripper, error) {
		c = rest.CopyConfig(c)
		c.Dial = dialer.DialContext
		return rest.TransportFor(c)
	}
	node, err := transport(cfg.Upstream)
	if err != nil {
		return nil, err
	}
	anonCfg := rest.AnonymousClientConfig(cfg.Upstream)
	anon, err := transport(anonCfg)
	if err != nil {
		return nil, err
	}
	serving, err := ensureServing(cfg.Dir)
	if err != nil {
		return nil, err
	}
	st, err := openStore(cfg.Dir)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		st.close()
		return nil, fmt.Errorf("node API: %w", err)
	}
	s := &Server{cfg: cfg, store: st, server: server, node: node, anon: anon, serving: serving, metrics: newMetrics(cfg.Metrics, st),
		reconnect: make(chan struct{}), cut: make(chan struct{}), listener: ln, lostBefore: st.offlineSince()}
	if cfg.NodeName != "" {
		cs, err := kubernetes.NewForConfig(cfg.Upstream)
		if err != nil {
			return nil, err
		}
		s.events = events.New(cs.EventsV1(), clientgoscheme.Scheme, "dowse-node-api", "dowse_node_api", 16, cfg.Metrics)
	}
	if cfg.PodResourcesSocket != "" && cfg.GatedPrefix != "" {
		s.gate = newDeviceGate(cfg.PodResourcesSocket, cfg.GatedPrefix)
	}
	s.proxy = &httputil.ReverseProxy{
		Rewrite:        s.rewrite,
		Transport:      roundTripperFunc(s.roundTrip),
		FlushInterval:  -1,
		ModifyResponse: s.keep,
		ErrorHandler:   s.upstreamFailed,
		ErrorLog:       nil,
	}
	return s, nil
}

// Addr is the address the proxy listens at.
func (s *Server) Addr() string { return s.listener.Addr().String() }

// Start serves until ctx ends, then closes the store.
func (s *Server) Start(ctx context.Context) error {
	defer s.store.close()
	ln := s.listener
	hs := &http.Server{
		Handler:           s,
		ReadHeaderTimeout: 10 * time.Second,
		TLSConfig: &tls.Config{
			MinVersion:       tls.VersionTLS12,
			Certificates:     []tls.Certificate{s.serving},
			ClientAuth:       tls.RequestClientCert,
			VerifyConnection: s.verifyNodeCert,
			NextProtos:       []string{"h2", "http/1.1"},
		},
		BaseContext: func(net.Listener) context.Context { return ctx },
	}
	errc := make(chan error, 1)
	go func() { errc <- hs.ServeTLS(ln, "", "") }()
	go s.probe(ctx)
	if s.events != nil {
		go func() { _ = s.events.Start(ctx) }()
	}
	if s.gate != nil {
		go s.gate.run(ctx)
	}
	flush := time.NewTicker(time.Second)
	defer flush.Stop()
	s.cfg.Log.Info("serving the API server to the node", "listen", ln.Addr().String(), "upstream", s.server.String())
	for {
		select {
		case <-ctx.Done():
			shut, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_ = hs.Shutdown(shut)
			return nil
		case err := <-errc:
			return fmt.Errorf("node API: %w", err)
		case <-flush.C:
			if err := s.store.flush(); err != nil {
				s.cfg.Log.Error(err, "writing the node API store")
			}
		}
	}
}

// Offline says whether the API server is out of reach, and since when.
func (s *Server) Offline() (bool, time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.offline, s.offlineFrom
}

// probe asks the API server whether it is there, and switches between
// passing through and answering from the store.
func (s *Server) probe(ctx context.Context) {
	t := time.NewTicker(s.cfg.ProbeEvery)
	defer t.Stop()
	for {
		s.setOnline(s.reachable(ctx))
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// verifyNodeCert ends a handshake whose client presents a certificate other
// than the node's current one (the kubelet renews it in its file): the
// handshake proved the client holds that certificate's key, and requests
// with it are passed on as the node. Checked once per connection, not per
// request; a client without a certificate goes on to present a token.
func (s *Server) verifyNodeCert(cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 {
		return nil
	}
	node, err := upstreamClientCert(s.cfg.Upstream)
	if err != nil {
		return err
	}
	if peer := cs.PeerCertificates[0]; !bytes.Equal(peer.RawSubjectPublicKeyInfo, node.RawSubjectPublicKeyInfo) {
		return fmt.Errorf("certificate of %q: only the node's own (%q) is passed on", peer.Subject.CommonName, node.Subject.CommonName)
	}
	return nil
}

func (s *Server) reachable(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.ProbeTimeout)
	defer cancel()
	u := *s.server
	u.Path = strings.TrimSuffix(u.Path, "/") + "/readyz"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return false
	}
	resp, err := s.node.RoundTrip(req)
	if err != nil {
		s.cfg.Log.V(1).Info("API server not reached", "err", err)
		return false
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

func (s *Server) setOnline(online bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if online && !s.lostBefore.IsZero() {
		s.lostBefore = time.Time{}
		if !s.offline {
			if err := s.store.setOfflineSince(time.Time{}); err != nil {
				s.cfg.Log.Error(err, "recording that the API server is reached")
			}
		}
	}
	switch {
	case online && s.offline:
		s.offline = false
		if s.gate != nil {
			s.gate.reset()
		}
		close(s.reconnect)
		s.reconnect = make(chan struct{})
		s.metrics.offline.Set(0)
		s.metrics.cuts.WithLabelValues("reconnected").Inc()
		if err := s.store.setOfflineSince(time.Time{}); err != nil {
			s.cfg.Log.Error(err, "recording that the API server is reached again")
		}
		away := s.cfg.Now().Sub(s.offlineFrom).Round(time.Second)
		served, refused := s.served.Load(), s.refused.Load()
		s.cfg.Log.Info("API server reached again: clients list afresh", "offlineFor", away.String(), "served", served, "refused", refused)
		if s.events != nil {
			s.events.Eventf(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: s.cfg.NodeName}}, nil, corev1.EventTypeNormal, "ServedOffline", "Reconnect",
				"the API server was out of reach for %s (since %s); the node API proxy answered %d requests from the node's store and refused %d",
				away, s.offlineFrom.UTC().Format(time.RFC3339), served, refused)
		}
	case !online && !s.offline:
		s.offline, s.offlineFrom = true, s.cfg.Now()
		if !s.lostBefore.IsZero() {
			// Lost before this process started (a reboot while cut off).
			s.offlineFrom = s.lostBefore
		} else if err := s.store.setOfflineSince(s.offlineFrom); err != nil {
			s.cfg.Log.Error(err, "recording when the API server was lost")
		}
		s.served.Store(0)
		s.refused.Store(0)
		close(s.cut)
		s.cut = make(chan struct{})
		s.metrics.offline.Set(1)
		s.metrics.offlineSince.Set(float64(s.offlineFrom.Unix()))
		s.metrics.cuts.WithLabelValues("lost").Inc()
		s.cfg.Log.Info("API server out of reach: answering reads from the node's store")
	}
}

// caller is who sent a request, and how to pass it on.
type caller struct {
	identity string
	// tokenHash is set for a bearer token.
	tokenHash string
	expires   time.Time
	transport http.RoundTripper
}

type callerKey struct{}

type requestKey struct{}

func (s *Server) identify(r *http.Request) (caller, error) {
	if tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && tok != "" {
		sum := sha256.Sum256([]byte(tok))
		c := caller{tokenHash: hex.EncodeToString(sum[:]), transport: s.anon}
		sub, exp, err := tokenClaims(tok)
		if err != nil {
			return c, err
		}
		c.identity, c.expires = "token:"+sub, exp
		return c, nil
	}
	if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
		// verifyNodeCert let only the node's own certificate through.
		return caller{identity: "cert:" + r.TLS.PeerCertificates[0].Subject.CommonName, transport: s.node}, nil
	}
	return caller{}, errors.New("no credentials: present the node's certificate or a bearer token")
}

// tokenClaims reads a JWT's subject and expiry without checking its
// signature: the API server checks it when online; offline only a token it
// accepted before is taken (store.credential).
func tokenClaims(tok string) (string, time.Time, error) {
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return "", time.Time{}, errors.New("bearer token is not a JWT")
	}
	raw, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return "", time.Time{}, fmt.Errorf("bearer token: %w", err)
	}
	var claims struct {
		Sub string `json:"sub"`
		Exp int64  `json:"exp"`
	}
	if err := json.Unmarshal(raw, &claims); err != nil || claims.Sub == "" {
		return "", time.Time{}, errors.New("bearer token names no subject")
	}
	var exp time.Time
	if claims.Exp > 0 {
		exp = time.Unix(claims.Exp, 0)
	}
	return claims.Sub, exp, nil
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c, err := s.identify(r)
	if err != nil {
		writeStatus(w, http.StatusUnauthorized, "Unauthorized", "dowse node API: "+err.Error())
		return
	}
	req, err := parseRequest(r.Method, r.URL)
	if err != nil {
		writeStatus(w, http.StatusBadRequest, "BadRequest", "dowse node API: "+err.Error())
		return
	}
	if isTokenRequest(req) {
		body, err := io.ReadAll(io.LimitReader(r.Body, maxTokenRequest+1))
		if err != nil || len(body) > maxTokenRequest {
			writeStatus(w, http.StatusBadRequest, "BadRequest", "dowse node API: token request unreadable or too large")
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		r = r.WithContext(context.WithValue(r.Context(), tokenKey{}, tokenRequestKey(c.identity, r.URL.Path, body)))
	}
	if off, _ := s.Offline(); off {
		s.serveOffline(w, r, c, req)
		return
	}
	ctx := context.WithValue(r.Context(), callerKey{}, c)
	ctx = context.WithValue(ctx, requestKey{}, req)
	if req.verb == "watch" {
		// A watch passed through ends when the API server is lost, so that
		// its client comes back to be held here.
		s.mu.Lock()
		cut := s.cut
		s.mu.Unlock()
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		go func() {
			select {
			case <-cut:
				cancel()
			case <-ctx.Done():
			}
		}()
	}
	s.proxy.ServeHTTP(w, r.WithContext(ctx))
}

type tokenKey struct{}

// isDiscovery says whether a request asks what the API server serves:
// /api, /apis, a group or a group version, /version.
func isDiscovery(method string, r apiRequest) bool {
	return method == http.MethodGet && r.verb == "" && r.resource == "" && r.discovery
}

// discoveryKey tells discovery answers apart by path and Accept (the same
// path answers a plain list or an aggregated document).
func discoveryKey(identity string, r *http.Request) string {
	return identity + "\x00" + r.URL.Path + "\x00" + r.Header.Get("Accept")
}

const maxTokenRequest = 64 << 10

func isTokenRequest(r apiRequest) bool {
	return r.verb == "create" && r.groupVersion == "v1" && r.resource == "serviceaccounts" && r.subresource == "token"
}

func tokenRequestKey(identity, path string, body []byte) string {
	sum := sha256.Sum256(append([]byte(identity+"\x00"+path+"\x00"), body...))
	return hex.EncodeToString(sum[:])
}

// kept says whether reads of a request are kept: objects and collections,
// not subresources (logs, scale) or discovery.
func kept(r apiRequest) bool {
	switch r.verb {
	case "get", "list", "watch":
		return r.resource != "" && r.subresource == ""
	}
	return false
}

func (s *Server) rewrite(pr *httputil.ProxyRequest) {
	pr.SetURL(s.server)
	pr.Out.Host = s.server.Host
	// The client's certificate is not passed on (it cannot be); the node's
	// transport presents it again.
	pr.Out.Header.Del("X-Forwarded-For")
	req, _ := pr.In.Context().Value(requestKey{}).(apiRequest)
	if kept(req) || isTokenRequest(req) {
		// Kept answers are read here, so they come as JSON and unzipped;
		// every Kubernetes client takes JSON.
		pr.Out.Header.Set("Accept", "application/json")
		pr.Out.Header.Del("Accept-Encoding")
	}
}

func (s *Server) roundTrip(r *http.Request) (*http.Response, error) {
	c, _ := r.Context().Value(callerKey{}).(caller)
	if c.transport == nil {
		return nil, errors.New("no caller")
	}
	req, _ := r.Context().Value(requestKey{}).(apiRequest)
	s.metrics.upstream.WithLabelValues(req.verb).Inc()
	return c.transport.RoundTrip(r)
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// maxKeptBody bounds one list or object read into memory to keep.
const maxKeptBody = 64 << 20

// keep reads what an answer holds into the store as it passes.
func (s *Server) keep(resp *http.Response) error {
	ctx := resp.Request.Context()
	c, _ := ctx.Value(callerKey{}).(caller)
	req, _ := ctx.Value(requestKey{}).(apiRequest)
	if resp.StatusCode >= 200 && resp.StatusCode < 300 && c.tokenHash != "" {
		s.store.accepted(c.tokenHash, c.identity, c.expires)
	}
	if isTokenRequest(req) && resp.StatusCode == http.StatusCreated {
		body, err := io.ReadAll(io.LimitReader(resp.Body, maxTokenRequest))
		resp.Body.Close()
		if err != nil {
			return err
		}
		resp.Body = io.NopCloser(bytes.NewReader(body))
		var tr struct {
			Status struct {
				ExpirationTimestamp time.Time `json:"expirationTimestamp"`
			} `json:"status"`
		}
		if key, ok := ctx.Value(tokenKey{}).(string); ok && json.Unmarshal(body, &tr) == nil {
			s.store.keepToken(key, tokenAnswer{Body: body, Expires: tr.Status.ExpirationTimestamp})
		}
		return nil
	}
	if isDiscovery(resp.Request.Method, req) && resp.StatusCode == http.StatusOK {
		body, err := io.ReadAll(io.LimitReader(resp.Body, maxKeptBody))
		resp.Body.Close()
		if err != nil {
			return err
		}
		resp.Body = io.NopCloser(bytes.NewReader(body))
		s.store.keepDiscovery(discoveryKey(c.identity, resp.Request), rawAnswer{ContentType: resp.Header.Get("Content-Type"), Body: body})
		return nil
	}
	if !kept(req) || resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		return nil
	}
	if req.verb == "watch" {
		resp.Body = s.teeWatch(resp.Body, c.identity, req)
		return nil
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxKeptBody+1))
	if err != nil {
		resp.Body.Close()
		return err
	}
	if len(body) > maxKeptBody {
		s.cfg.Log.Info("answer too large to keep", "path", resp.Request.URL.Path)
		resp.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(body), resp.Body), resp.Body}
		return nil
	}
	resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(body))
	if err := s.keepRead(c.identity, req, body); err != nil {
		s.cfg.Log.Error(err, "keeping an answer", "path", resp.Request.URL.Path)
	}
	return nil
}

func (s *Server) keepRead(identity string, req apiRequest, body []byte) error {
	if req.verb == "get" {
		return s.store.put(identity, req, body)
	}
	var list struct {
		Kind       string            `json:"kind"`
		APIVersion string            `json:"apiVersion"`
		Items      []json.RawMessage `json:"items"`
		Metadata   struct {
			ResourceVersion string `json:"resourceVersion"`
			Continue        string `json:"continue"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return err
	}
	if list.Metadata.Continue != "" {
		// One page of many: keep its objects, but it cannot tell what is gone.
		for _, it := range list.Items {
			if err := s.store.put(identity, req, it); err != nil {
				return err
			}
		}
		return nil
	}
	return s.store.replace(identity, req, list.Kind, list.APIVersion, list.Metadata.ResourceVersion, list.Items)
}

// teeWatch passes a watch's events to the client and keeps them.
func (s *Server) teeWatch(body io.ReadCloser, identity string, req apiRequest) io.ReadCloser {
	pr, pw := io.Pipe()
	go func() {
		defer pr.Close()
		dec := json.NewDecoder(pr)
		// A watch list's initial events are the whole scope: collected,
		// then kept as a list once its end is bookmarked.
		collecting := req.initialEvents
		var initial []json.RawMessage
		for {
			var ev struct {
				Type   string          `json:"type"`
				Object json.RawMessage `json:"object"`
			}
			if err := dec.Decode(&ev); err != nil {
				if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrClosedPipe) {
					s.cfg.Log.V(1).Info("watch not kept", "resource", req.collection(), "err", err)
				}
				_, _ = io.Copy(io.Discard, pr)
				return
			}
			var m objectMeta
			_ = json.Unmarshal(ev.Object, &m)
			switch ev.Type {
			case "ADDED", "MODIFIED":
				if collecting {
					initial = append(initial, ev.Object)
				}
				if err := s.store.put(identity, req, ev.Object); err != nil {
					s.cfg.Log.V(1).Info("watch event not kept", "resource", req.collection(), "err", err)
				}
			case "DELETED":
				s.store.remove(identity, req, m.Metadata.Namespace, m.Metadata.Name)
			case "BOOKMARK":
				if collecting && m.Metadata.Annotations["k8s.io/initial-events-end"] == "true" {
					collecting = false
					if err := s.store.replace(identity, req, m.Kind+"List", m.APIVersion, m.Metadata.ResourceVersion, initial); err != nil {
						s.cfg.Log.V(1).Info("watch list not kept", "resource", req.collection(), "err", err)
					}
					initial = nil
					continue
				}
				s.store.bookmark(identity, req, m.Metadata.ResourceVersion)
			}
		}
	}()
	return &teeBody{Reader: io.TeeReader(body, pw), body: body, pw: pw}
}

type teeBody struct {
	io.Reader
	body io.Closer
	pw   *io.PipeWriter
}

func (t *teeBody) Close() error {
	_ = t.pw.Close()
	return t.body.Close()
}

// upstreamFailed answers when the API server could not be asked: a read
// from the store, anything else refused.
func (s *Server) upstreamFailed(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil {
		// The client went, or a watch was ended for a cut: nothing to answer.
		return
	}
	c, _ := r.Context().Value(callerKey{}).(caller)
	req, _ := r.Context().Value(requestKey{}).(apiRequest)
	var ne net.Error
	if errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, context.DeadlineExceeded) {
		s.setOnline(false)
		s.serveOffline(w, r, c, req)
		return
	}
	writeStatus(w, http.StatusBadGateway, "InternalError", "dowse node API: the API server: "+err.Error())
}

// serveOffline answers from the store.
func (s *Server) serveOffline(w http.ResponseWriter, r *http.Request, c caller, req apiRequest) {
	_, since := s.Offline()
	if c.tokenHash != "" {
		id, ok := s.store.credential(c.tokenHash, s.cfg.Now())
		if !ok {
			writeStatus(w, http.StatusUnauthorized, "Unauthorized", "dowse node API: the API server cannot be reached and this token was not seen accepted")
			return
		}
		c.identity = id
	}
	unavailable := func(why string) {
		s.countOffline(req.verb, "refused")
		writeStatus(w, http.StatusServiceUnavailable, "ServiceUnavailable",
			fmt.Sprintf("dowse node API: the API server cannot be reached (since %s) and %s", since.UTC().Format(time.RFC3339), why))
	}
	switch {
	case isDiscovery(r.Method, req):
		a, ok := s.store.discoveryAnswer(discoveryKey(c.identity, r))
		if !ok {
			unavailable(fmt.Sprintf("discovery of %s was not kept", r.URL.Path))
			return
		}
		s.countOffline("discovery", "served")
		w.Header().Set("Content-Type", a.ContentType)
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(a.Body)
	case isTokenRequest(req):
		key, _ := r.Context().Value(tokenKey{}).(string)
		body, ok := s.store.token(key, s.cfg.Now())
		if !ok {
			unavailable("no valid token was issued for this request before")
			return
		}
		s.countOffline(req.verb, "served")
		writeJSON(w, http.StatusCreated, body)
	case req.verb == "get" && kept(req):
		obj, err := s.store.get(c.identity, req)
		if err != nil {
			unavailable(fmt.Sprintf("%s %s/%s was %s", req.resource, req.namespace, req.name, err))
			return
		}
		s.countOffline(req.verb, "served")
		writeJSON(w, http.StatusOK, obj)
	case req.verb == "list" && kept(req):
		var keep func(json.RawMessage) bool
		if s.gate != nil && req.collection() == "v1/pods" {
			keep = s.gate.admitter(r.Context(), c.identity)
		}
		list, err := s.store.list(c.identity, req, keep)
		if err != nil {
			unavailable(fmt.Sprintf("the list of %s was %s", req.collection(), err))
			return
		}
		s.countOffline(req.verb, "served")
		writeJSON(w, http.StatusOK, list)
	case req.verb == "watch" && kept(req) && !req.initialEvents:
		s.holdWatch(w, r, c.identity, req)
	case req.verb == "watch":
		// A watch list cannot be answered from here; its client lists
		// instead (client-go falls back to a list).
		unavailable("a watch list is answered only by the API server")
	default:
		unavailable("only reads are answered meanwhile")
	}
}

// holdWatch keeps a watch open, sending nothing, until the API server is
// reached again; then it ends, so that its client watches there.
// A watch of the node's pods adds, meanwhile, the pods the device gate
// lets through.
func (s *Server) holdWatch(w http.ResponseWriter, r *http.Request, identity string, req apiRequest) {
	s.mu.Lock()
	reconnect := s.reconnect
	s.mu.Unlock()
	s.countOffline("watch", "held")
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	flush := func() {
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
	}
	flush()
	var timeout <-chan time.Time
	if secs, err := strconv.Atoi(r.URL.Query().Get("timeoutSeconds")); err == nil && secs > 0 {
		t := time.NewTimer(time.Duration(secs) * time.Second)
		defer t.Stop()
		timeout = t.C
	}
	gated := s.gate != nil && req.collection() == "v1/pods"
	sent := map[string]bool{}
	for {
		var more <-chan struct{}
		if gated {
			var pods []json.RawMessage
			pods, more = s.gate.releasedSince(identity, sent)
			for _, raw := range pods {
				if ok, _ := req.selects(raw); !ok {
					continue
				}
				ev, _ := json.Marshal(map[string]any{"type": "ADDED", "object": withKind(raw, "Pod", "v1")})
				if _, err := w.Write(append(ev, '\n')); err != nil {
					return
				}
				s.countOffline("watch", "released")
			}
			flush()
		}
		select {
		case <-reconnect:
			return
		case <-timeout:
			return
		case <-r.Context().Done():
			return
		case <-more:
		}
	}
}

func (s *Server) countOffline(verb, outcome string) {
	s.metrics.offlineAnswers.WithLabelValues(verb, outcome).Inc()
	if outcome == "refused" {
		s.refused.Add(1)
	} else {
		s.served.Add(1)
	}
}

func writeJSON(w http.ResponseWriter, code int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(body)
}

func writeStatus(w http.ResponseWriter, code int, reason, msg string) {
	body, _ := json.Marshal(map[string]any{
		"kind": "Status", "apiVersion": "v1", "metadata": map[string]any{},
		"status": "Failure", "message": msg, "reason": reason, "code": code,
	})
	writeJSON(w, code, body)
}
