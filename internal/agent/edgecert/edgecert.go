// Package edgecert is the edge side of node identity on the cloud/edge
// link: it trades a bootstrap token for a client certificate naming
// "node:<name>" once, keeps the key, certificate and CA in the node's state
// directory, reuses them across restarts, and renews the certificate before
// it expires. The link's client takes GetClientCertificate and RootCAs.
//
// Trust in the cloud at bootstrap comes from a CA pin, "sha256:<hex>" of the
// CA's public key, as kubeadm's --discovery-token-ca-cert-hash: the token
// and the pin are two short strings an operator copies from `dowsectl token
// create` into the agent's flags, with no file to carry to the node, and the
// pin is not secret. The pin is checked inside the TLS handshake, against
// the CA certificate the server sends in its chain, before the token leaves
// the node: a man in the middle without the CA's key sees no token. A CA
// file (Config.CAPEM) is accepted instead, for sites that already ship
// files to their nodes.
package edgecert

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dowse-dev/dowse/internal/backoff"
	"github.com/dowse-dev/dowse/internal/link/pki"
)

// File names inside Config.Dir.
const (
	// CertFileName holds the node's certificate then its private key, in
	// one file (mode 0600) so that a renewal replaces both with one rename:
	// a crash can never leave a key beside another key's certificate.
	CertFileName = "node.pem"
	// CAFileName holds the link CA the node trusts (mode 0644).
	CAFileName = "ca.crt"
	// bootstrapKeyFileName holds the key of a bootstrap not yet answered.
	bootstrapKeyFileName = "bootstrap-key.pem"
)

// Config wires a Manager.
type Config struct {
	// Dir holds the credentials, e.g. /var/lib/dowse/link; created 0700.
	Dir string
	// Node is this node's name; the certificate names "node:<Node>".
	Node string
	// URL is the cloud's bootstrap endpoint, "https://host:port".
	URL string
	// Token is the bootstrap token "<id>.<secret>". Needed only when Dir
	// holds no usable credentials; ignored otherwise, so it may stay in the
	// agent's flags after it was used.
	Token string
	// ServiceAccountTokenFile, instead of Token, is a projected service
	// account token of the agent's pod (audience pki.ServiceAccountAudience),
	// read afresh at each bootstrap since the kubelet rotates it. The cloud
	// issues the certificate for the node the pod runs on. Unlike a
	// bootstrap token it stays valid, so a node whose certificate expired
	// while offline bootstraps again by itself.
	ServiceAccountTokenFile string
	// CAPin ("sha256:<hex>") or CAPEM tells the edge which CA to trust at
	// bootstrap; one of them is needed with Token or ServiceAccountTokenFile. When CAPin is set and
	// the stored CA does not match it, the stored credentials belong to
	// another cluster and are replaced by bootstrapping with Token.
	CAPin string
	CAPEM []byte
	// RenewFraction is the part of a certificate's lifetime after which it
	// is renewed; each renewal draws it afresh within ±0.075 so that nodes
	// bootstrapped together do not renew together. Default 2/3.
	RenewFraction float64
	// RequestTimeout bounds one bootstrap or renew request. Default 30 s.
	RequestTimeout time.Duration
	// Metrics may be nil.
	Metrics *Metrics
}

// Refused is a request the cloud turned down (4xx): retrying it unchanged
// cannot succeed (a used or expired token, a certificate of another CA).
type Refused struct {
	Status int
	Msg    string
}

func (r *Refused) Error() string { return fmt.Sprintf("cloud refused (HTTP %d): %s", r.Status, r.Msg) }

// Manager holds the node's current credentials.
type Manager struct {
	cfg       Config
	serverURL *url.URL
	pin       string
	now       func() time.Time
	// jitter returns a value in [-1, 1).
	jitter func() float64

	cert     atomic.Pointer[tls.Certificate]
	ca       atomic.Pointer[x509.Certificate]
	obtained atomic.Int64 // UnixNano when the current certificate was received
	ready    chan struct{}
	// readyOnce closes ready.
	readyOnce sync.Once
	// renewNow wakes Start's renewal wait (RenewNow).
	renewNow chan struct{}
}

// New loads the credentials stored in cfg.Dir, if any, without touching the
// network. It fails when the stored credentials name another node, or when
// there are none usable and no token (with a pin or CA) to get them.
func New(cfg Config) (*Manager, error) {
	if err := pki.ValidateNodeName(cfg.Node); err != nil {
		return nil, err
	}
	if cfg.Dir == "" {
		return nil, errors.New("edgecert: a credentials directory is required")
	}
	u, err := url.Parse(cfg.URL)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("edgecert: cloud URL %q: want https://host[:port]", cfg.URL)
	}
	if cfg.RenewFraction <= 0 || cfg.RenewFraction >= 1 {
		cfg.RenewFraction = 2.0 / 3
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = 30 * time.Second
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	m := &Manager{cfg: cfg, serverURL: u, now: time.Now, jitter: func() float64 { return rand.Float64()*2 - 1 }, ready: make(chan struct{}), renewNow: make(chan struct{}, 1)}
	if cfg.CAPin != "" {
		if m.pin, err = pki.ParsePin(cfg.CAPin); err != nil {
			return nil, err
		}
	}
	if len(cfg.CAPEM) > 0 {
		if _, err := parseCert(cfg.CAPEM); err != nil {
			return nil, fmt.Errorf("edgecert: CA: %w", err)
		}
	}
	if cfg.Token != "" {
		if _, err := pki.ParseToken(cfg.Token); err != nil {
			return nil, err
		}
		if cfg.ServiceAccountTokenFile != "" {
			return nil, errors.New("edgecert: give a bootstrap token or a service account token file, not both")
		}
	}
	stored, err := m.load()
	if err != nil {
		return nil, err
	}
	if !stored && !m.canBootstrap() {
		return nil, fmt.Errorf("edgecert: no usable credentials in %s and no bootstrap token (or service account token file) with a CA pin: create a token with `dowsectl token create --node %s`", cfg.Dir, cfg.Node)
	}
	return m, nil
}

func (m *Manager) canBootstrap() bool {
	return (m.cfg.Token != "" || m.cfg.ServiceAccountTokenFile != "") && (m.pin != "" || len(m.cfg.CAPEM) > 0)
}

// load reads Dir. It reports false, with no error, when there is nothing
// usable there to keep: no files, an expired certificate, or a CA other
// than the pinned one.
func (m *Manager) load() (bool, error) {
	certPath, caPath := filepath.Join(m.cfg.Dir, CertFileName), filepath.Join(m.cfg.Dir, CAFileName)
	pemBytes, err := os.ReadFile(certPath)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("edgecert: %w", err)
	}
	st, err := os.Stat(certPath)
	if err != nil {
		return false, fmt.Errorf("edgecert: %w", err)
	}
	caPEM, err := os.ReadFile(caPath)
	if err != nil {
		return false, fmt.Errorf("edgecert: %s is there but its CA is not: %w", certPath, err)
	}
	ca, err := parseCert(caPEM)
	if err != nil {
		return false, fmt.Errorf("edgecert: %s: %w", caPath, err)
	}
	pair, err := tls.X509KeyPair(pemBytes, pemBytes)
	if err != nil {
		return false, fmt.Errorf("edgecert: %s: %w", certPath, err)
	}
	node, err := pki.NodeFromCert(pair.Leaf)
	if err != nil {
		return false, fmt.Errorf("edgecert: %s: %w", certPath, err)
	}
	if node != m.cfg.Node {
		return false, fmt.Errorf("edgecert: %s is node %q's identity, not %q's: remove %s to bootstrap this node anew", certPath, node, m.cfg.Node, m.cfg.Dir)
	}
	if m.pin != "" && !pki.MatchesPin(ca, m.pin) {
		return false, nil // another cluster's credentials: bootstrap with the token
	}
	if len(m.cfg.CAPEM) > 0 {
		if want, _ := parseCert(m.cfg.CAPEM); !want.Equal(ca) {
			return false, nil
		}
	}
	if !m.now().Before(pair.Leaf.NotAfter) {
		return false, nil
	}
	// The file is written when the certificate arrives: its time is when
	// the lifetime started for the renewal schedule (NotBefore is backdated
	// for clock skew and would make renewals late).
	obtained := st.ModTime()
	if obtained.Before(pair.Leaf.NotBefore) || obtained.After(pair.Leaf.NotAfter) {
		obtained = pair.Leaf.NotBefore
	}
	m.install(&pair, ca, obtained)
	return true, nil
}

func (m *Manager) install(c *tls.Certificate, ca *x509.Certificate, obtained time.Time) {
	m.ca.Store(ca)
	m.obtained.Store(obtained.UnixNano())
	m.cert.Store(c)
	m.cfg.Metrics.expiry.Set(float64(c.Leaf.NotAfter.Unix()))
	m.readyOnce.Do(func() { close(m.ready) })
}

// GetClientCertificate returns the current certificate; the link's TLS
// client calls it on every handshake, so a renewed certificate is used from
// the next connection on. Before bootstrap it fails.
func (m *Manager) GetClientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	c := m.cert.Load()
	if c == nil {
		return nil, errors.New("no link client certificate yet: bootstrap has not completed")
	}
	return c, nil
}

// RootCAs is a pool holding the link CA, for verifying the cloud's server
// certificate; nil before bootstrap.
func (m *Manager) RootCAs() *x509.CertPool {
	ca := m.ca.Load()
	if ca == nil {
		return nil
	}
	p := x509.NewCertPool()
	p.AddCert(ca)
	return p
}

// CA is the link CA, which verifies the cloud's server certificate; nil
// before bootstrap.
func (m *Manager) CA() *x509.Certificate { return m.ca.Load() }

// Ready is closed once a certificate is available.
func (m *Manager) Ready() <-chan struct{} { return m.ready }

// Start bootstraps when there are no stored credentials (retrying network
// and cloud-side errors with backoff), then renews the certificate at about
// RenewFraction of each lifetime until ctx ends, returning nil then. It
// returns a *Refused when the cloud refuses the bootstrap (a used, expired
// or unknown token): only a new token helps. A refused or failed renewal
// is retried with backoff while the current certificate keeps serving;
// once it has expired, only a restart with a new token helps (New then
// bootstraps over the expired credentials), or, with a service account
// token file, a bootstrap with it, which Start then tries.
func (m *Manager) Start(ctx context.Context) error {
	log := logr.FromContextOrDiscard(ctx).WithName("edgecert").WithValues("node", m.cfg.Node)
	ctx = logr.NewContext(ctx, log)
	if m.cert.Load() == nil {
		if err := retry(ctx, func() error { return m.Bootstrap(ctx) }); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
	for {
		at := m.renewAt()
		log.V(1).Info("next certificate renewal", "at", at)
		early := false
		t := time.NewTimer(at.Sub(m.now()))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		case <-m.renewNow:
			t.Stop()
			early = true
			log.Info("renewing the link certificate early: the cloud refused the link with it")
		}
		err := retry(ctx, func() error {
			var err error
			if m.cfg.ServiceAccountTokenFile != "" && m.now().After(m.cert.Load().Leaf.NotAfter) {
				// Too late to renew (the node was offline): the pod's
				// token still says who it is.
				err = m.Bootstrap(ctx)
			} else {
				err = m.Renew(ctx)
			}
			var ref *Refused
			if errors.As(err, &ref) && ref.Status == http.StatusForbidden && m.cfg.ServiceAccountTokenFile != "" {
				// The certificate names a Node that is gone (made again
				// under its name): the pod's token names the one there is.
				log.Info("the cloud no longer renews this certificate; bootstrapping again with the pod's token", "reason", ref.Msg)
				err = m.Bootstrap(ctx)
			}
			if early && errors.As(err, &ref) {
				// An early renewal is a guess at a cure, not due: wait for
				// the next refusal or the certificate's time rather than
				// hammer the endpoint.
				log.Error(err, "early certificate renewal refused", "notAfter", m.cert.Load().Leaf.NotAfter)
				return nil
			}
			if errors.As(err, &ref) {
				// A renewal the cloud refuses today may pass tomorrow
				// (a replica with a stale CA, a clock off): keep trying
				// while the certificate lasts, but say so loudly.
				log.Error(err, "certificate renewal refused", "notAfter", m.cert.Load().Leaf.NotAfter)
				return retryable{err}
			}
			return err
		})
		if err != nil && ctx.Err() != nil {
			return nil
		}
	}
}

// RenewNow asks Start to renew the certificate now rather than at its
// time: the cloud refused the link with it. Calls while a renewal is
// pending are one.
func (m *Manager) RenewNow() {
	select {
	case m.renewNow <- struct{}{}:
	default:
	}
}

// renewAt is when the current certificate should be renewed: RenewFraction
// of the way from when it was received to when it expires, ±0.075 of that.
func (m *Manager) renewAt() time.Time {
	c := m.cert.Load()
	from := time.Unix(0, m.obtained.Load())
	life := c.Leaf.NotAfter.Sub(from)
	frac := m.cfg.RenewFraction + 0.075*m.jitter()
	frac = min(max(frac, 0.05), 0.95)
	return from.Add(time.Duration(float64(life) * frac))
}

// Bootstrap trades the token for a certificate, stores it and uses it.
// Errors other than *Refused are retryable.
func (m *Manager) Bootstrap(ctx context.Context) error {
	log := logr.FromContextOrDiscard(ctx)
	if !m.canBootstrap() {
		return &Refused{Msg: "no bootstrap token with a CA pin or CA to bootstrap with"}
	}
	var pinned *x509.Certificate
	tlsCfg := &tls.Config{MinVersion: tls.VersionTLS13, ServerName: m.serverURL.Hostname()}
	if len(m.cfg.CAPEM) > 0 {
		pinned, _ = parseCert(m.cfg.CAPEM)
		tlsCfg.RootCAs = x509.NewCertPool()
		tlsCfg.RootCAs.AddCert(pinned)
	} else {
		// The chain is verified in VerifyConnection against the pinned CA
		// instead of a root pool, which the edge does not have yet.
		tlsCfg.InsecureSkipVerify = true
		tlsCfg.VerifyConnection = func(cs tls.ConnectionState) error {
			ca, err := verifyPinned(cs, m.pin, m.serverURL.Hostname())
			pinned = ca
			return err
		}
	}
	keyPEM, csr, err := m.bootstrapKey()
	if err != nil {
		return err
	}
	req := pki.BootstrapRequest{Token: m.cfg.Token, CSR: csr}
	if m.cfg.ServiceAccountTokenFile != "" {
		b, err := os.ReadFile(m.cfg.ServiceAccountTokenFile)
		if err == nil && len(bytes.TrimSpace(b)) == 0 {
			err = errors.New("empty")
		}
		if err != nil {
			// Retryable: the kubelet may not have written it yet.
			err = fmt.Errorf("edgecert: service account token: %w", err)
			m.count(m.cfg.Metrics.bootstraps, err)
			log.Error(err, "bootstrap failed")
			return err
		}
		req.ServiceAccountToken = string(bytes.TrimSpace(b))
	}
	resp, err := m.post(ctx, tlsCfg, pki.BootstrapPath, req)
	if err != nil {
		m.count(m.cfg.Metrics.bootstraps, err)
		log.Error(err, "bootstrap failed", "url", m.cfg.URL)
		return err
	}
	ca, err := parseCert(resp.CAPEM)
	if err != nil || !ca.Equal(pinned) {
		// The handshake proved the server holds a key the pinned CA
		// certified; a different CA in the answer is a broken cloud.
		m.count(m.cfg.Metrics.bootstraps, errors.New("bad CA"))
		return fmt.Errorf("bootstrap answer carries a CA other than the pinned one")
	}
	if err := m.store(ctx, resp.CertificatePEM, keyPEM, resp.CAPEM, ca); err != nil {
		m.count(m.cfg.Metrics.bootstraps, err)
		return err
	}
	_ = os.Remove(filepath.Join(m.cfg.Dir, bootstrapKeyFileName))
	m.cfg.Metrics.bootstraps.WithLabelValues(resultSuccess).Inc()
	log.Info("bootstrapped link identity", "notAfter", m.cert.Load().Leaf.NotAfter, "caPin", pki.CAPin(ca))
	return nil
}

// bootstrapKey is the key bootstraps ask a certificate for, kept on disk
// until one succeeds: if the cloud's answer is lost after it spent the
// token (or the agent restarts then), the retry asks for the same key,
// which the cloud grants again, where a new key would find the token used.
func (m *Manager) bootstrapKey() (keyPEM, csr []byte, err error) {
	path := filepath.Join(m.cfg.Dir, bootstrapKeyFileName)
	keyPEM, err = os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		if keyPEM, _, err = pki.NewNodeKeyAndCSR(m.cfg.Node); err != nil {
			return nil, nil, err
		}
		if err := os.MkdirAll(m.cfg.Dir, 0o700); err != nil {
			return nil, nil, fmt.Errorf("edgecert: %w", err)
		}
		err = writeAtomic(path, keyPEM, 0o600)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("edgecert: bootstrap key: %w", err)
	}
	key, err := pki.ParseKeyPEM(keyPEM)
	if err != nil {
		return nil, nil, fmt.Errorf("edgecert: %s: %w", path, err)
	}
	csr, err = pki.NodeCSR(m.cfg.Node, key)
	return keyPEM, csr, err
}

// Renew asks for a new certificate with a new key, authenticated by the
// current one, stores it and uses it. Errors other than *Refused are
// retryable.
func (m *Manager) Renew(ctx context.Context) error {
	log := logr.FromContextOrDiscard(ctx)
	ca := m.ca.Load()
	if m.cert.Load() == nil || ca == nil {
		return errors.New("no certificate to renew: bootstrap first")
	}
	keyPEM, csr, err := pki.NewNodeKeyAndCSR(m.cfg.Node)
	if err != nil {
		return err
	}
	tlsCfg := pki.ClientTLSConfig(m.GetClientCertificate, m.RootCAs(), m.serverURL.Hostname())
	resp, err := m.post(ctx, tlsCfg, pki.RenewPath, pki.RenewRequest{CSR: csr})
	if err != nil {
		m.count(m.cfg.Metrics.renewals, err)
		var ref *Refused
		if !errors.As(err, &ref) {
			log.Error(err, "certificate renewal failed", "url", m.cfg.URL)
		}
		return err
	}
	if err := m.store(ctx, resp.CertificatePEM, keyPEM, pemOf(ca), ca); err != nil {
		m.count(m.cfg.Metrics.renewals, err)
		return err
	}
	m.cfg.Metrics.renewals.WithLabelValues(resultSuccess).Inc()
	log.V(1).Info("renewed link certificate", "notAfter", m.cert.Load().Leaf.NotAfter)
	return nil
}

func (m *Manager) count(c *prometheus.CounterVec, err error) {
	var ref *Refused
	if errors.As(err, &ref) {
		c.WithLabelValues(resultRefused).Inc()
	} else {
		c.WithLabelValues(resultError).Inc()
	}
}

// store checks the new certificate against the key and CA, writes it, and
// only then installs it: what is in use is always what is on disk.
func (m *Manager) store(ctx context.Context, certPEM, keyPEM, caPEM []byte, ca *x509.Certificate) error {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return fmt.Errorf("the cloud's certificate does not fit our key: %w", err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	if _, err := pair.Leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return fmt.Errorf("the cloud's certificate does not verify against the link CA: %w", err)
	}
	if node, err := pki.NodeFromCert(pair.Leaf); err != nil || node != m.cfg.Node {
		return fmt.Errorf("the cloud's certificate names %q, not node %q", pair.Leaf.Subject.CommonName, m.cfg.Node)
	}
	if err := os.MkdirAll(m.cfg.Dir, 0o700); err != nil {
		return fmt.Errorf("edgecert: %w", err)
	}
	// The CA first: a node.pem on disk always has its CA beside it.
	if err := writeAtomic(filepath.Join(m.cfg.Dir, CAFileName), caPEM, 0o644); err != nil {
		return err
	}
	if err := writeAtomic(filepath.Join(m.cfg.Dir, CertFileName), append(append([]byte{}, certPEM...), keyPEM...), 0o600); err != nil {
		return err
	}
	m.install(&pair, ca, m.now())
	return nil
}

func (m *Manager) post(ctx context.Context, tlsCfg *tls.Config, path string, body any) (*pki.CertificateResponse, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, m.cfg.RequestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, m.serverURL.JoinPath(path).String(), bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	// A transport per request: these are rare, and a kept-alive connection
	// would keep presenting the old certificate after a renewal.
	tr := &http.Transport{TLSClientConfig: tlsCfg, DisableKeepAlives: true, Proxy: http.ProxyFromEnvironment, DialContext: (&net.Dialer{Timeout: 10 * time.Second}).DialContext}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		var e pki.ErrorResponse
		if json.Unmarshal(data, &e) != nil || e.Error == "" {
			e.Error = http.StatusText(resp.StatusCode)
		}
		if resp.StatusCode >= 400 && resp.StatusCode < 500 && resp.StatusCode != http.StatusTooManyRequests {
			return nil, &Refused{Status: resp.StatusCode, Msg: e.Error}
		}
		return nil, fmt.Errorf("cloud answered HTTP %d: %s", resp.StatusCode, e.Error)
	}
	var out pki.CertificateResponse
	if err := json.Unmarshal(data, &out); err != nil {
		return nil, fmt.Errorf("cloud's answer: %w", err)
	}
	return &out, nil
}

// verifyPinned finds the pinned CA in the server's chain and verifies the
// server's certificate for host against it alone.
func verifyPinned(cs tls.ConnectionState, pin, host string) (*x509.Certificate, error) {
	if len(cs.PeerCertificates) == 0 {
		return nil, errors.New("server sent no certificate")
	}
	for _, c := range cs.PeerCertificates[1:] {
		if !c.IsCA || !pki.MatchesPin(c, pin) {
			continue
		}
		roots := x509.NewCertPool()
		roots.AddCert(c)
		if _, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: roots, DNSName: host}); err != nil {
			return nil, fmt.Errorf("server certificate does not verify against the pinned CA: %w", err)
		}
		return c, nil
	}
	return nil, fmt.Errorf("no CA matching pin %s in the server's certificate chain: wrong pin, or not this cluster's endpoint", pin)
}

func parseCert(pemBytes []byte) (*x509.Certificate, error) {
	b, _ := pem.Decode(pemBytes)
	if b == nil || b.Type != "CERTIFICATE" {
		return nil, errors.New("no PEM certificate")
	}
	return x509.ParseCertificate(b.Bytes)
}

func pemOf(c *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
}

// writeAtomic replaces path with data: a temporary file in the same
// directory, synced, then renamed, then the directory synced, so that a
// crash leaves the old file or the new one, never a mix.
func writeAtomic(path string, data []byte, mode os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("edgecert: %w", err)
	}
	tmp := f.Name()
	defer os.Remove(tmp) // fails harmlessly after the rename
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return fmt.Errorf("edgecert: %w", err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("edgecert: writing %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("edgecert: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("edgecert: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("edgecert: %w", err)
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}

// retryable marks an error to retry even though it is a *Refused.
type retryable struct{ error }

func (r retryable) Unwrap() error { return r.error }

// retry calls f until it succeeds, returns a *Refused not wrapped in
// retryable, or ctx ends, waiting 1 s doubling to 1 min, less up to 25%,
// between tries.
func retry(ctx context.Context, f func() error) error {
	wait := backoff.Backoff{Initial: time.Second, Max: time.Minute, Jitter: 0.25}
	for {
		err := f()
		if err == nil {
			return nil
		}
		var ref *Refused
		var again retryable
		if errors.As(err, &ref) && !errors.As(err, &again) {
			return err
		}
		if !backoff.Sleep(ctx, wait.Next()) {
			return ctx.Err()
		}
	}
}
