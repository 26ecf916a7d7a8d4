package linkauth

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	stdlog "log"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/time/rate"
	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dowse-dev/dowse/internal/link/pki"
)

// Defaults for Config's zero values.
const (
	DefaultCertValidity         = 24 * time.Hour
	DefaultServerCertValidity   = 30 * 24 * time.Hour
	DefaultTokenCleanupInterval = 10 * time.Minute
	DefaultRequestRate          = 20
	DefaultRequestBurst         = 100
	DefaultSourceRate           = 2
	DefaultSourceBurst          = 20
	// maxBody bounds a request: a CSR is a few hundred bytes.
	maxBody = 64 << 10
)

// Config wires a Server.
type Config struct {
	// CA signs node certificates and the endpoint's own server certificate
	// (bootstrap.LoadOrCreateCA). Required.
	CA *pki.CA
	// Tokens is the bootstrap token store. Required.
	Tokens *Tokens
	// CertValidity is the lifetime of node client certificates; edges renew
	// at about two thirds of it. Short, because certificates are never
	// revoked: a node refused renewal (NodeUID) or stolen key loses the
	// link when its certificate expires.
	CertValidity time.Duration
	// NodeUID, when set, tells the UID of the Node object of a name, and
	// whether it is in the cluster. Certificates are bound to that UID when
	// issued, so that a key stolen from a Node deleted and made again under
	// its name neither renews nor connects. A renewal for a node not in the
	// cluster, or with a certificate bound to another UID, is refused
	// (reason node_not_allowed); an error is retryable. Bootstrap does not
	// refuse a node that is not in the cluster yet (a token is the
	// operator's word that it may join): its certificate is issued unbound
	// and bound at its first renewal.
	NodeUID func(ctx context.Context, node string) (uid string, inCluster bool, err error)
	// Hosts are the DNS names and IP addresses edges dial to reach this
	// endpoint; they go into its server certificate. Required.
	Hosts []string
	// ServerCertValidity is the lifetime of the endpoint's server
	// certificate, which is issued from CA in memory and re-issued at two
	// thirds of it (nothing is stored: every replica issues its own).
	ServerCertValidity time.Duration
	// Addr is where Start listens, e.g. ":9747"; Listener, when set, is
	// used instead (tests).
	Addr     string
	Listener net.Listener
	// TokenCleanupInterval is how often Start deletes expired tokens;
	// negative disables.
	TokenCleanupInterval time.Duration
	// TokenReviews, when set, lets agents bootstrap with a service account
	// token bound to their pod (pki.ServiceAccountAudience) instead of a
	// bootstrap token: the API server authenticates it, and the node it
	// names (the pod's) must be the one the CSR names. This is how agents
	// of a DaemonSet join, each as its own node. Normally the clientset's
	// AuthenticationV1().TokenReviews().
	TokenReviews TokenReviewer
	// AgentServiceAccounts are the service accounts ("namespace/name")
	// whose tokens are taken; any other is refused.
	AgentServiceAccounts []string
	// RequestRate and RequestBurst pace bootstrap requests (20/s, burst
	// 100), and renewals that present a client certificate apart, at the
	// same pace: a flood of bootstraps cannot keep renewals out. Each
	// costs API reads, and a refused one costs them too, so a flood of bad
	// tokens must not reach the API server at its own pace; a request over
	// the limit is answered 429 with Retry-After, which edges retry with
	// backoff.
	RequestRate  float64
	RequestBurst int
	// SourceRate and SourceBurst pace the requests of one source address
	// without a client certificate (2/s, burst 20), so that one host's
	// flood spends its own share, not the others'. Edges behind one NAT
	// share it, and retry.
	SourceRate  float64
	SourceBurst int
	// Metrics may be nil.
	Metrics *Metrics
}

// Server is the bootstrap and renew endpoint (pki.BootstrapPath,
// pki.RenewPath). It keeps no state of its own beyond its request rate
// limiter (each replica paces its own requests).
type Server struct {
	cfg    Config
	caPool *x509.CertPool
	now    func() time.Time
	limit  *rate.Limiter
	// renewLimit paces renewals with a client certificate, apart.
	renewLimit *rate.Limiter
	sources    *sourceLimits
	// agents are the user names of Config.AgentServiceAccounts.
	agents map[string]bool

	serverCert  *pki.Rotating
	handlerOnce sync.Once
	handler     http.Handler
}

// NewServer checks cfg and fills its defaults.
func NewServer(cfg Config) (*Server, error) {
	if cfg.CA == nil || cfg.Tokens == nil {
		return nil, errors.New("linkauth: CA and Tokens are required")
	}
	if len(cfg.Hosts) == 0 {
		return nil, errors.New("linkauth: at least one host name or address is required for the server certificate")
	}
	agents := map[string]bool{}
	for _, sa := range cfg.AgentServiceAccounts {
		ns, name, ok := strings.Cut(sa, "/")
		if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
			return nil, fmt.Errorf("linkauth: agent service account %q: want namespace/name", sa)
		}
		agents["system:serviceaccount:"+ns+":"+name] = true
	}
	if cfg.CertValidity <= 0 {
		cfg.CertValidity = DefaultCertValidity
	}
	if cfg.ServerCertValidity <= 0 {
		cfg.ServerCertValidity = DefaultServerCertValidity
	}
	if cfg.TokenCleanupInterval == 0 {
		cfg.TokenCleanupInterval = DefaultTokenCleanupInterval
	}
	if cfg.RequestRate <= 0 {
		cfg.RequestRate = DefaultRequestRate
	}
	if cfg.RequestBurst <= 0 {
		cfg.RequestBurst = DefaultRequestBurst
	}
	if cfg.SourceRate <= 0 {
		cfg.SourceRate = DefaultSourceRate
	}
	if cfg.SourceBurst <= 0 {
		cfg.SourceBurst = DefaultSourceBurst
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	s := &Server{cfg: cfg, caPool: cfg.CA.Pool(), now: time.Now, agents: agents,
		limit:      rate.NewLimiter(rate.Limit(cfg.RequestRate), cfg.RequestBurst),
		renewLimit: rate.NewLimiter(rate.Limit(cfg.RequestRate), cfg.RequestBurst),
		sources:    newSourceLimits(rate.Limit(cfg.SourceRate), cfg.SourceBurst)}
	s.serverCert = &pki.Rotating{Now: func() time.Time { return s.now() }, Issue: func() (tls.Certificate, error) {
		c, err := cfg.CA.IssueServer(cfg.Hosts, cfg.ServerCertValidity)
		if err != nil {
			return c, fmt.Errorf("issuing linkauth server certificate: %w", err)
		}
		c.Certificate = append(c.Certificate, cfg.CA.Cert.Raw)
		return c, nil
	}}
	return s, nil
}

// TLSConfig is the endpoint's TLS: 1.3 only, the server certificate chain
// includes the CA (an edge bootstrapping with only a CA pin finds the CA
// there), and a client certificate is asked for but not required, because
// a bootstrapping edge has none. Renew verifies it itself, so that a wrong
// certificate gets a clear HTTP answer instead of a failed handshake. In
// TLS 1.3 the handshake still proves the client holds the certificate's key.
func (s *Server) TLSConfig() *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS13,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return s.currentServerCert() },
		ClientAuth:     tls.RequestClientCert,
	}
}

// ServerCertificate is the endpoint's current server certificate, for a
// tls.Config's GetCertificate: the cloudhub serves the same one.
func (s *Server) ServerCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return s.currentServerCert()
}

func (s *Server) currentServerCert() (*tls.Certificate, error) { return s.serverCert.Get() }

// Handler serves both paths; it must be served with TLSConfig (renew reads
// the client certificate from the connection). The request's context
// carries the logger.
func (s *Server) Handler() http.Handler {
	s.handlerOnce.Do(func() {
		mux := http.NewServeMux()
		mux.HandleFunc("POST "+pki.BootstrapPath, s.limited(requestBootstrap, s.bootstrap))
		mux.HandleFunc("POST "+pki.RenewPath, s.limited(requestRenew, s.renew))
		s.handler = mux
	})
	return s.handler
}

// Start serves HTTPS on cfg.Addr (or cfg.Listener) and deletes expired
// tokens every TokenCleanupInterval, until ctx ends; then it stops
// accepting, lets requests in flight finish for up to five seconds, and
// returns nil. Its errors are the listener's.
func (s *Server) Start(ctx context.Context) error {
	log := logr.FromContextOrDiscard(ctx).WithName("linkauth")
	ctx = logr.NewContext(ctx, log)
	lis := s.cfg.Listener
	if lis == nil {
		var err error
		if lis, err = net.Listen("tcp", s.cfg.Addr); err != nil {
			return fmt.Errorf("linkauth: listening: %w", err)
		}
	}
	// Issue the server certificate now, so that a CA that cannot sign is
	// an error at start rather than at the first edge's handshake.
	if _, err := s.currentServerCert(); err != nil {
		_ = lis.Close()
		return err
	}
	srv := &http.Server{
		Handler:           s.Handler(),
		TLSConfig:         s.TLSConfig(),
		BaseContext:       func(net.Listener) context.Context { return ctx },
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          stdlog.New(logWriter{log}, "", 0),
	}
	var wg sync.WaitGroup
	if s.cfg.TokenCleanupInterval > 0 {
		wg.Go(func() { s.cleanTokens(ctx) })
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.ServeTLS(lis, "", "") }()
	log.Info("serving link bootstrap and renewal", "address", lis.Addr().String(), "hosts", s.cfg.Hosts, "caPin", pki.CAPin(s.cfg.CA.Cert))
	var err error
	select {
	case <-ctx.Done():
		shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_ = srv.Shutdown(shutdownCtx)
		cancel()
	case err = <-errc:
		err = fmt.Errorf("linkauth: serving: %w", err)
	}
	wg.Wait()
	return err
}

func (s *Server) cleanTokens(ctx context.Context) {
	log := logr.FromContextOrDiscard(ctx)
	t := time.NewTicker(s.cfg.TokenCleanupInterval)
	defer t.Stop()
	for {
		n, err := s.cfg.Tokens.DeleteExpired(ctx)
		s.cfg.Metrics.tokensExpired.Add(float64(n))
		if err != nil && ctx.Err() == nil {
			log.Error(err, "deleting expired bootstrap tokens")
		} else if n > 0 {
			log.Info("deleted expired bootstrap tokens", "count", n)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// limited answers 429 when requests come faster than Config.RequestRate.
// Refusals are counted, and logged only at V(1): a flood would flood the log.
func (s *Server) limited(request string, next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var allowed bool
		if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
			// A node's certificate (renew checks it against the CA): its
			// own budget, which no flood without one spends.
			allowed = s.renewLimit.Allow()
		} else {
			allowed = s.sources.allow(r.RemoteAddr) && s.limit.Allow()
		}
		if allowed {
			next(w, r)
			return
		}
		logr.FromContextOrDiscard(r.Context()).V(1).Info("refused node certificate request", "request", request,
			"remote", r.RemoteAddr, "reason", ReasonRateLimited)
		s.cfg.Metrics.refused.WithLabelValues(request, ReasonRateLimited).Inc()
		w.Header().Set("Retry-After", "1")
		writeJSON(w, http.StatusTooManyRequests, pki.ErrorResponse{Error: "too many certificate requests; retry later"})
	}
}

// TokenReviewer asks the API server about a token.
type TokenReviewer interface {
	Create(ctx context.Context, review *authnv1.TokenReview, opts metav1.CreateOptions) (*authnv1.TokenReview, error)
}

// The node a bound service account token's pod runs on, in the reviewed
// user's extra (Kubernetes 1.32+).
const (
	extraNodeName = "authentication.kubernetes.io/node-name"
	extraPodName  = "authentication.kubernetes.io/pod-name"
)

// serviceAccountNode authenticates a service account token and returns the
// node of the pod it is bound to, and who it is for the log.
func (s *Server) serviceAccountNode(ctx context.Context, token string) (node string, who []any, err error) {
	if s.cfg.TokenReviews == nil || len(s.agents) == 0 {
		return "", nil, refuse(ReasonSABootstrapOff, http.StatusForbidden, "this cloud does not take service account tokens; bootstrap with a token from `dowsectl token create`")
	}
	review, err := s.cfg.TokenReviews.Create(ctx, &authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{
		Token: token, Audiences: []string{pki.ServiceAccountAudience}}}, metav1.CreateOptions{})
	if err != nil {
		return "", nil, fmt.Errorf("reviewing the service account token: %w", err)
	}
	st := review.Status
	if !st.Authenticated {
		// The API server's reason (expired, audience, pod deleted) is about
		// the caller's own token: safe and useful to send back.
		return "", nil, refuse(ReasonInvalidSAToken, http.StatusUnauthorized, "the service account token is not valid for audience %q: %s", pki.ServiceAccountAudience, st.Error)
	}
	if !s.agents[st.User.Username] {
		return "", nil, refuse(ReasonSANotAllowed, http.StatusForbidden, "%s may not join nodes to the link (allowed: %s)", st.User.Username, strings.Join(s.cfg.AgentServiceAccounts, ", "))
	}
	nodes := st.User.Extra[extraNodeName]
	if len(nodes) != 1 || nodes[0] == "" {
		return "", nil, refuse(ReasonSATokenNotBound, http.StatusUnauthorized, "the service account token is not bound to a pod on a node: mount a projected service account token with audience %q", pki.ServiceAccountAudience)
	}
	return nodes[0], []any{"serviceAccount", st.User.Username, "pod", strings.Join(st.User.Extra[extraPodName], ",")}, nil
}

func (s *Server) bootstrap(w http.ResponseWriter, r *http.Request) {
	log := logr.FromContextOrDiscard(r.Context()).WithValues("request", requestBootstrap, "remote", r.RemoteAddr)
	var req pki.BootstrapRequest
	if err := decode(w, r, &req); err != nil {
		s.refused(w, log, requestBootstrap, err)
		return
	}
	node, key, err := csrNode(req.CSR)
	if err != nil {
		s.refused(w, log, requestBootstrap, err)
		return
	}
	log = log.WithValues("node", node)
	uid, err := s.bootstrapUID(r.Context(), node)
	if err != nil {
		s.refused(w, log, requestBootstrap, err)
		return
	}
	// Sign before consuming the token: signing checks the rest of the CSR
	// (signature, key type), and a CSR the CA refuses must not burn the
	// token. A certificate signed for a refused token is just dropped.
	certPEM, err := s.cfg.CA.SignNodeCSR(req.CSR, node, uid, s.cfg.CertValidity)
	if err != nil {
		s.refused(w, log, requestBootstrap, refuse(ReasonMalformed, http.StatusBadRequest, "%v", err))
		return
	}
	switch {
	case req.Token != "" && req.ServiceAccountToken != "":
		s.refused(w, log, requestBootstrap, refuse(ReasonMalformed, http.StatusBadRequest, "a bootstrap request carries a bootstrap token or a service account token, not both"))
		return
	case req.ServiceAccountToken != "":
		podNode, who, err := s.serviceAccountNode(r.Context(), req.ServiceAccountToken)
		if err == nil && podNode != node {
			err = refuse(ReasonWrongNode, http.StatusForbidden, "the service account token is of a pod on node %q, but the certificate request names node %q", podNode, node)
		}
		if err != nil {
			s.refused(w, log, requestBootstrap, err)
			return
		}
		log.Info("issued node certificate", append(who, "validity", s.cfg.CertValidity)...)
		s.cfg.Metrics.issued.WithLabelValues(requestBootstrap).Inc()
		writeJSON(w, http.StatusOK, pki.CertificateResponse{CertificatePEM: certPEM, CAPEM: s.cfg.CA.CertPEM})
		return
	}
	info, err := s.cfg.Tokens.Consume(r.Context(), req.Token, node, key)
	if err != nil {
		s.refused(w, log, requestBootstrap, err)
		return
	}
	log.Info("issued node certificate", "token", info.ID, "validity", s.cfg.CertValidity, "retry", info.Retry)
	s.cfg.Metrics.issued.WithLabelValues(requestBootstrap).Inc()
	writeJSON(w, http.StatusOK, pki.CertificateResponse{CertificatePEM: certPEM, CAPEM: s.cfg.CA.CertPEM})
}

func (s *Server) renew(w http.ResponseWriter, r *http.Request) {
	log := logr.FromContextOrDiscard(r.Context()).WithValues("request", requestRenew, "remote", r.RemoteAddr)
	node, err := s.clientNode(r)
	if err != nil {
		s.refused(w, log, requestRenew, err)
		return
	}
	log = log.WithValues("node", node)
	var req pki.RenewRequest
	if err := decode(w, r, &req); err != nil {
		s.refused(w, log, requestRenew, err)
		return
	}
	asked, _, err := csrNode(req.CSR)
	if err != nil {
		s.refused(w, log, requestRenew, err)
		return
	}
	if asked != node {
		s.refused(w, log, requestRenew, refuse(ReasonWrongNode, http.StatusForbidden, "the client certificate is for node %q, but the certificate request names node %q", node, asked))
		return
	}
	var uid string
	if s.cfg.NodeUID != nil {
		var ok bool
		uid, ok, err = s.cfg.NodeUID(r.Context(), node)
		certUID := pki.NodeUIDFromCert(r.TLS.PeerCertificates[0])
		switch {
		case err != nil:
			err = fmt.Errorf("looking up node %q: %w", node, err)
		case !ok:
			err = refuse(ReasonNodeNotAllowed, http.StatusForbidden, "node %q may no longer renew its link certificate: it was removed from the cluster; bootstrap it again with a new token", node)
		case certUID != "" && certUID != uid:
			err = refuse(ReasonNodeNotAllowed, http.StatusForbidden, "this certificate was issued to an earlier Node named %q (UID %s), deleted since; bootstrap the node again with a new token", node, certUID)
		}
		if err != nil {
			s.refused(w, log, requestRenew, err)
			return
		}
	}
	certPEM, err := s.cfg.CA.SignNodeCSR(req.CSR, node, uid, s.cfg.CertValidity)
	if err != nil {
		s.refused(w, log, requestRenew, refuse(ReasonMalformed, http.StatusBadRequest, "%v", err))
		return
	}
	log.V(1).Info("renewed node certificate", "validity", s.cfg.CertValidity)
	s.cfg.Metrics.issued.WithLabelValues(requestRenew).Inc()
	writeJSON(w, http.StatusOK, pki.CertificateResponse{CertificatePEM: certPEM, CAPEM: s.cfg.CA.CertPEM})
}

// bootstrapUID is the UID a bootstrapped node's certificate is bound to:
// its Node's, or none while the Node is not in the cluster.
func (s *Server) bootstrapUID(ctx context.Context, node string) (string, error) {
	if s.cfg.NodeUID == nil {
		return "", nil
	}
	uid, ok, err := s.cfg.NodeUID(ctx, node)
	if err != nil {
		return "", fmt.Errorf("looking up node %q: %w", node, err)
	}
	if !ok {
		return "", nil
	}
	return uid, nil
}

// clientNode verifies the connection's client certificate against the CA,
// as client authentication, now, and returns the node it names.
func (s *Server) clientNode(r *http.Request) (string, error) {
	if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
		return "", refuse(ReasonBadClientCert, http.StatusUnauthorized, "renewal needs the node's current client certificate; bootstrap with a token instead")
	}
	leaf := r.TLS.PeerCertificates[0]
	if _, err := leaf.Verify(x509.VerifyOptions{
		Roots:       s.caPool,
		CurrentTime: s.now(),
		KeyUsages:   []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}); err != nil {
		return "", refuse(ReasonBadClientCert, http.StatusUnauthorized, "client certificate %q is not valid for this cluster's link CA: %v", leaf.Subject.CommonName, err)
	}
	node, err := pki.NodeFromCert(leaf)
	if err != nil {
		return "", refuse(ReasonBadClientCert, http.StatusUnauthorized, "%v", err)
	}
	return node, nil
}

// csrNode is the node a CSR asks for, and its public key (DER
// SubjectPublicKeyInfo); its signature is checked later, by SignNodeCSR.
func csrNode(der []byte) (string, []byte, error) {
	csr, err := x509.ParseCertificateRequest(der)
	if err != nil {
		return "", nil, refuse(ReasonMalformed, http.StatusBadRequest, "certificate request: %v", err)
	}
	node, ok := strings.CutPrefix(csr.Subject.CommonName, pki.NodeCNPrefix)
	if !ok {
		return "", nil, refuse(ReasonMalformed, http.StatusBadRequest, "certificate request names %q, not %q<node>", csr.Subject.CommonName, pki.NodeCNPrefix)
	}
	if err := pki.ValidateNodeName(node); err != nil {
		return "", nil, refuse(ReasonMalformed, http.StatusBadRequest, "certificate request: %v", err)
	}
	return node, csr.RawSubjectPublicKeyInfo, nil
}

// refused answers err: a *Refused with its status and reason, anything
// else as a retryable 503.
func (s *Server) refused(w http.ResponseWriter, log logr.Logger, request string, err error) {
	var ref *Refused
	if !errors.As(err, &ref) {
		log.Error(err, "node certificate request failed")
		s.cfg.Metrics.failed.WithLabelValues(request).Inc()
		// The API server's words stay in our log: they name service
		// accounts and resources an unauthenticated caller need not see.
		writeJSON(w, http.StatusServiceUnavailable, pki.ErrorResponse{Error: "the cloud could not handle the request now; retry later"})
		return
	}
	log.Info("refused node certificate request", "reason", ref.Reason, "detail", ref.Msg)
	s.cfg.Metrics.refused.WithLabelValues(request, ref.Reason).Inc()
	writeJSON(w, ref.Status, pki.ErrorResponse{Error: ref.Msg})
}

func decode(w http.ResponseWriter, r *http.Request, v any) error {
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody)).Decode(v); err != nil {
		return refuse(ReasonMalformed, http.StatusBadRequest, "request body: %v", err)
	}
	return nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// logWriter turns net/http's own error lines (TLS handshake failures, for
// one) into log entries.
type logWriter struct{ log logr.Logger }

func (l logWriter) Write(p []byte) (int, error) {
	l.log.Info("https server error", "detail", strings.TrimSpace(string(p)))
	return len(p), nil
}
