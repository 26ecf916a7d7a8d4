package pki

import (
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"regexp"
)

// The bootstrap/renew protocol between internal/agent/edgecert (the edge) and
// internal/controller/link/linkauth (the cloud): JSON over HTTPS, POST only.
const (
	// BootstrapPath takes a BootstrapRequest. Only the server is
	// authenticated by TLS (the edge has no certificate yet); the token
	// authenticates the edge.
	BootstrapPath = "/linkauth/v1/bootstrap"
	// RenewPath takes a RenewRequest over mutual TLS: the client
	// certificate, issued by the link CA and still valid, names the node.
	RenewPath = "/linkauth/v1/renew"
)

// ServiceAccountAudience is the audience of the Kubernetes service account
// tokens an agent bootstraps with (a projected token in its pod).
const ServiceAccountAudience = "dowse-link"

// BootstrapRequest trades a bootstrap token, or a service account token of
// an agent pod, for a node client certificate. Exactly one is set.
type BootstrapRequest struct {
	// Token is "<id>.<secret>" as dowsectl printed it.
	Token string `json:"token,omitempty"`
	// ServiceAccountToken is a token of the agent's service account, bound
	// to its pod and so to the pod's node, with ServiceAccountAudience: an
	// agent run by a DaemonSet gets its own node's identity without a token
	// per node.
	ServiceAccountToken string `json:"serviceAccountToken,omitempty"`
	// CSR is a DER certificate request whose CN is "node:<node>", the node
	// the token was made for (NewNodeKeyAndCSR).
	CSR []byte `json:"csr"`
}

// RenewRequest asks for a fresh certificate for the node the presented
// client certificate names; the CSR carries a new key.
type RenewRequest struct {
	CSR []byte `json:"csr"`
}

// CertificateResponse answers both requests.
type CertificateResponse struct {
	// CertificatePEM is the node's new client certificate.
	CertificatePEM []byte `json:"certificate"`
	// CAPEM is the link CA, which the edge then trusts for the link and
	// for renewals.
	CAPEM []byte `json:"ca"`
}

// ErrorResponse is the body of every non-2xx answer: Error says why, in
// words meant for the operator reading the edge's log.
type ErrorResponse struct {
	Error string `json:"error"`
}

// A bootstrap token has kubeadm's shape, "[a-z0-9]{6}.[a-z0-9]{16}": the id
// is public (it names the Secret), the secret is about 82 random bits.
var tokenRE = regexp.MustCompile(`^([a-z0-9]{6})\.([a-z0-9]{16})$`)

const tokenAlphabet = "abcdefghijklmnopqrstuvwxyz0123456789"

// Token is a parsed bootstrap token.
type Token struct {
	ID     string
	Secret string
}

// String is the token as the operator passes it to the edge.
func (t Token) String() string { return t.ID + "." + t.Secret }

// ErrMalformedToken is returned by ParseToken for anything not shaped like
// a token; it never echoes the input, which may be a mistyped secret.
var ErrMalformedToken = errors.New(`malformed bootstrap token: want "<6 of [a-z0-9]>.<16 of [a-z0-9]>"`)

// ParseToken splits "<id>.<secret>".
func ParseToken(s string) (Token, error) {
	m := tokenRE.FindStringSubmatch(s)
	if m == nil {
		return Token{}, ErrMalformedToken
	}
	return Token{ID: m[1], Secret: m[2]}, nil
}

// NewToken makes a random token from crypto/rand.
func NewToken() (Token, error) {
	id, err := randomString(6)
	if err != nil {
		return Token{}, err
	}
	secret, err := randomString(16)
	if err != nil {
		return Token{}, err
	}
	return Token{ID: id, Secret: secret}, nil
}

// randomString draws n characters uniformly from tokenAlphabet: bytes at or
// above the largest multiple of 36 are rejected, so no character is likelier
// than another.
func randomString(n int) (string, error) {
	const limit = 256 - 256%len(tokenAlphabet)
	out := make([]byte, 0, n)
	buf := make([]byte, 2*n)
	for len(out) < n {
		if _, err := rand.Read(buf); err != nil {
			return "", fmt.Errorf("random token: %w", err)
		}
		for _, b := range buf {
			if int(b) < limit && len(out) < n {
				out = append(out, tokenAlphabet[int(b)%len(tokenAlphabet)])
			}
		}
	}
	return string(out), nil
}

// NodeCSR makes a CSR (DER) naming node for an existing key: the edge keeps
// its bootstrap key across retries, so that a retry after a lost answer
// asks for the same key and the cloud can recognise it.
func NodeCSR(node string, key crypto.Signer) ([]byte, error) {
	if err := ValidateNodeName(node); err != nil {
		return nil, err
	}
	return x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: NodeCNPrefix + node},
	}, key)
}

// ParseKeyPEM reads a PKCS#8 PEM private key, as NewNodeKeyAndCSR writes it.
func ParseKeyPEM(keyPEM []byte) (crypto.Signer, error) {
	b, _ := pem.Decode(keyPEM)
	if b == nil || b.Type != "PRIVATE KEY" {
		return nil, errors.New("no PKCS#8 PEM private key")
	}
	k, err := x509.ParsePKCS8PrivateKey(b.Bytes)
	if err != nil {
		return nil, err
	}
	s, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("private key %T cannot sign", k)
	}
	return s, nil
}
