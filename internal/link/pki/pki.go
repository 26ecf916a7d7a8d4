// Package pki is the link's certificate authority: it issues the cloudhub's
// server certificate and each node's client certificate (CN "node:<name>"),
// and builds the TLS 1.3 mutual-TLS configurations both ends use.
package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
)

// NodeCNPrefix starts the common name of every node's client certificate.
const NodeCNPrefix = "node:"

// NodeUIDURIPrefix starts the URI SAN that binds a node's client
// certificate to one Node object: a Node deleted and created again under
// the same name has a new UID, so a key stolen from the old one no longer
// connects or renews.
const NodeUIDURIPrefix = "urn:dowse:node-uid:"

// clockSkew backdates NotBefore so that a peer whose clock runs slightly
// behind still accepts a certificate issued a moment ago.
const clockSkew = 5 * time.Minute

// CA is the cluster's link CA. Key never leaves the cloud side.
type CA struct {
	Cert    *x509.Certificate
	Key     crypto.Signer
	CertPEM []byte
}

// NewCA creates a self-signed P-256 CA.
func NewCA(commonName string, validity time.Duration) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: key, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// LoadCA reads a CA from PEM, as NewCA and KeyPEM write it.
func LoadCA(certPEM, keyPEM []byte) (*CA, error) {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("link CA: %w", err)
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("link CA: %w", err)
	}
	if !cert.IsCA {
		return nil, errors.New("link CA: certificate is not a CA")
	}
	signer, ok := pair.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, errors.New("link CA: private key cannot sign")
	}
	return &CA{Cert: cert, Key: signer, CertPEM: certPEM}, nil
}

// KeyPEM encodes the CA key (PKCS#8) for storage in a Secret.
func (ca *CA) KeyPEM() ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(ca.Key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// Pool is a pool holding only this CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// IssueNode creates a key and a client certificate for node, bound to the
// Node of UID uid when it is not empty (as SignNodeCSR). The cloud side
// uses it for tests and for nodes it provisions itself; edges normally send a
// CSR (SignNodeCSR) so their key never travels.
func (ca *CA) IssueNode(node, uid string, validity time.Duration) (tls.Certificate, error) {
	if err := ValidateNodeName(node); err != nil {
		return tls.Certificate{}, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	der, err := ca.sign(clientTemplate(node, uid, validity), key.Public())
	if err != nil {
		return tls.Certificate{}, err
	}
	return pairOf(der, key)
}

// IssueServer creates a key and a server certificate for the given DNS
// names and IP addresses.
func (ca *CA) IssueServer(hosts []string, validity time.Duration) (tls.Certificate, error) {
	if len(hosts) == 0 {
		return tls.Certificate{}, errors.New("server certificate needs at least one host name or address")
	}
	return ca.leaf(hosts[0], hosts, "", validity, x509.ExtKeyUsageServerAuth)
}

// leaf creates a key and a certificate of cn for hosts (DNS names and IP
// addresses), naming uri in a URI SAN when it is not empty.
func (ca *CA) leaf(cn string, hosts []string, uri string, validity time.Duration, usages ...x509.ExtKeyUsage) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    now.Add(-clockSkew),
		NotAfter:     now.Add(validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  usages,
	}
	if uri != "" {
		id, err := url.Parse(uri)
		if err != nil {
			return tls.Certificate{}, err
		}
		tmpl.URIs = []*url.URL{id}
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := ca.sign(tmpl, key.Public())
	if err != nil {
		return tls.Certificate{}, err
	}
	return pairOf(der, key)
}

// uriNamed returns the name a verified certificate's URI SAN gives after
// prefix, or an error naming what it is for (what).
func uriNamed(c *x509.Certificate, prefix, what string) (string, error) {
	if c == nil {
		return "", errors.New("no certificate")
	}
	for _, u := range c.URIs {
		if r, ok := strings.CutPrefix(u.String(), prefix); ok && r != "" {
			return url.PathUnescape(r)
		}
	}
	return "", fmt.Errorf("certificate of %q %s", c.Subject.CommonName, what)
}

// ReplicaURIPrefix starts the URI SAN naming the controller replica a
// replica certificate is for; no node certificate carries one.
const ReplicaURIPrefix = "urn:dowse:replica:"

// IssueReplica creates a key and a certificate for a controller replica,
// for both ends of a replica-to-replica connection: served at hosts, and
// presented as a client, naming replica in a URI SAN (ReplicaFromCert).
func (ca *CA) IssueReplica(replica string, hosts []string, validity time.Duration) (tls.Certificate, error) {
	if replica == "" || len(hosts) == 0 {
		return tls.Certificate{}, errors.New("replica certificate needs the replica and a host")
	}
	return ca.leaf("replica:"+replica, hosts, ReplicaURIPrefix+url.PathEscape(replica), validity, x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth)
}

// ReplicaFromCert returns the replica a verified certificate names, or an
// error for any other (a node's, a server's).
func ReplicaFromCert(c *x509.Certificate) (string, error) {
	return uriNamed(c, ReplicaURIPrefix, "names no controller replica")
}

// EgressClientURIPrefix starts the URI SAN of a certificate that may open
// connections through the controller's egress (the API server's).
const EgressClientURIPrefix = "urn:dowse:egress-client:"

// IssueEgressClient creates a key and a client certificate that may use
// the controller's egress on TCP (EgressClientFromCert), for the API
// server named name.
func (ca *CA) IssueEgressClient(name string, validity time.Duration) (tls.Certificate, error) {
	if name == "" {
		return tls.Certificate{}, errors.New("egress client certificate needs a name")
	}
	return ca.leaf("egress-client:"+name, nil, EgressClientURIPrefix+url.PathEscape(name), validity, x509.ExtKeyUsageClientAuth)
}

// EgressClientFromCert returns the egress client a verified certificate
// names, or an error for any other (a node's, a replica's).
func EgressClientFromCert(c *x509.Certificate) (string, error) {
	return uriNamed(c, EgressClientURIPrefix, "may not use the egress")
}

// SignNodeCSR issues a client certificate for node from a DER CSR, bound to
// the Node object whose UID is uid (unbound when uid is empty: the Node is
// not known yet). The CSR must be self-signed and name exactly
// "node:<node>"; anything else it asks for (SANs, extensions, usages) is
// ignored: the certificate is built from our template, so a CSR cannot
// widen what the node may do.
func (ca *CA) SignNodeCSR(csrDER []byte, node, uid string, validity time.Duration) ([]byte, error) {
	if err := ValidateNodeName(node); err != nil {
		return nil, err
	}
	csr, err := x509.ParseCertificateRequest(csrDER)
	if err != nil {
		return nil, fmt.Errorf("certificate request: %w", err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("certificate request signature: %w", err)
	}
	if want := NodeCNPrefix + node; csr.Subject.CommonName != want {
		return nil, fmt.Errorf("certificate request names %q, not %q", csr.Subject.CommonName, want)
	}
	switch k := csr.PublicKey.(type) {
	case *ecdsa.PublicKey:
		if k.Curve != elliptic.P256() && k.Curve != elliptic.P384() {
			return nil, fmt.Errorf("certificate request key: curve %s not accepted", k.Curve.Params().Name)
		}
	default:
		return nil, fmt.Errorf("certificate request key: %T not accepted, use ECDSA P-256", csr.PublicKey)
	}
	der, err := ca.sign(clientTemplate(node, uid, validity), csr.PublicKey)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}

// NewNodeKeyAndCSR creates a P-256 key (PKCS#8 PEM) and a CSR (DER) naming
// node, for the edge's bootstrap and renewal.
func NewNodeKeyAndCSR(node string) (keyPEM, csrDER []byte, err error) {
	if err := ValidateNodeName(node); err != nil {
		return nil, nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	csrDER, err = x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: NodeCNPrefix + node},
	}, key)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), csrDER, nil
}

// NodeFromCert returns the node a client certificate names. It does not
// verify the chain: call it on a certificate TLS has already verified.
func NodeFromCert(c *x509.Certificate) (string, error) {
	if c == nil {
		return "", errors.New("no client certificate")
	}
	node, ok := strings.CutPrefix(c.Subject.CommonName, NodeCNPrefix)
	if !ok {
		return "", fmt.Errorf("client certificate names %q, not %q<node>", c.Subject.CommonName, NodeCNPrefix)
	}
	clientAuth := false
	for _, u := range c.ExtKeyUsage {
		clientAuth = clientAuth || u == x509.ExtKeyUsageClientAuth
	}
	if !clientAuth {
		return "", errors.New("client certificate is not for client authentication")
	}
	if err := ValidateNodeName(node); err != nil {
		return "", err
	}
	return node, nil
}

// NodeUIDFromCert returns the Node UID a client certificate is bound to, or
// "" for a certificate issued before its Node was known (or before
// certificates were bound).
func NodeUIDFromCert(c *x509.Certificate) string {
	if c == nil {
		return ""
	}
	for _, u := range c.URIs {
		if uid, ok := strings.CutPrefix(u.String(), NodeUIDURIPrefix); ok {
			return uid
		}
	}
	return ""
}

// ValidateNodeName accepts what Kubernetes accepts as a Node name.
func ValidateNodeName(node string) error {
	if errs := validation.IsDNS1123Subdomain(node); len(errs) > 0 {
		return fmt.Errorf("node name %q: %s", node, strings.Join(errs, "; "))
	}
	return nil
}

// ServerTLSConfig is the cloud side's mutual-TLS configuration: TLS 1.3 only,
// a client certificate from clientCAs required. getCert is asked on every
// handshake, so a re-issued server certificate is served without
// rebuilding the config.
func ServerTLSConfig(getCert func(*tls.ClientHelloInfo) (*tls.Certificate, error), clientCAs *x509.CertPool) *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS13,
		GetCertificate: getCert,
		ClientAuth:     tls.RequireAndVerifyClientCert,
		ClientCAs:      clientCAs,
	}
}

// Static serves one fixed certificate, for ServerTLSConfig and
// ClientTLSConfig.
func Static[Info any](cert tls.Certificate) func(Info) (*tls.Certificate, error) {
	return func(Info) (*tls.Certificate, error) { return &cert, nil }
}

// ClientTLSConfig is the edge side's mutual-TLS configuration. getCert is
// asked on every handshake, so a renewed certificate is used from the next
// connection on without rebuilding the config.
func ClientTLSConfig(getCert func(*tls.CertificateRequestInfo) (*tls.Certificate, error), rootCAs *x509.CertPool, serverName string) *tls.Config {
	return &tls.Config{
		MinVersion:           tls.VersionTLS13,
		RootCAs:              rootCAs,
		ServerName:           serverName,
		GetClientCertificate: getCert,
	}
}

func clientTemplate(node, uid string, validity time.Duration) *x509.Certificate {
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: NodeCNPrefix + node},
		NotBefore:    now.Add(-clockSkew),
		NotAfter:     now.Add(validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if uid != "" {
		tmpl.URIs = []*url.URL{{Scheme: "urn", Opaque: strings.TrimPrefix(NodeUIDURIPrefix, "urn:") + uid}}
	}
	return tmpl
}

func (ca *CA) sign(tmpl *x509.Certificate, pub crypto.PublicKey) ([]byte, error) {
	if tmpl.NotAfter.After(ca.Cert.NotAfter) {
		tmpl.NotAfter = ca.Cert.NotAfter
	}
	return x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, pub, ca.Key)
}

func pairOf(der []byte, key *ecdsa.PrivateKey) (tls.Certificate, error) {
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

// serial is a random 128-bit serial number, as RFC 5280 recommends.
func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return n
}

// PairPEM encodes a certificate made here (its leaf, and its key as
// PKCS#8) for files an operator copies (the API server's egress client).
func PairPEM(c tls.Certificate) (certPEM, keyPEM []byte, err error) {
	if len(c.Certificate) == 0 || c.PrivateKey == nil {
		return nil, nil, errors.New("pki: certificate without its key")
	}
	der, err := x509.MarshalPKCS8PrivateKey(c.PrivateKey)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Certificate[0]}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// Rotating holds a certificate Issue makes, and makes it again once two
// thirds of its life have passed (a server's, a replica's), for a
// tls.Config's GetCertificate or GetClientCertificate.
type Rotating struct {
	Issue func() (tls.Certificate, error)
	// Now is the clock (time.Now when nil).
	Now func() time.Time

	mu        sync.Mutex
	cert      *tls.Certificate
	reissueAt time.Time
}

// Get is the current certificate.
func (r *Rotating) Get() (*tls.Certificate, error) {
	now := time.Now()
	if r.Now != nil {
		now = r.Now()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cert != nil && now.Before(r.reissueAt) {
		return r.cert, nil
	}
	c, err := r.Issue()
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(c.Certificate[0])
	if err != nil {
		return nil, err
	}
	c.Leaf = leaf
	r.cert, r.reissueAt = &c, now.Add(leaf.NotAfter.Sub(now)*2/3)
	return r.cert, nil
}
