package opcua

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/gopcua/opcua/ua"

	"github.com/dowse-dev/dowse/mappers/mapper"
)

// credentials reads the client certificate and key (PEM text or files),
// or makes a self-signed pair when neither is given.
func credentials(p mapper.Params) ([]byte, *rsa.PrivateKey, error) {
	read := func(textKey, fileKey string) ([]byte, error) {
		if s, err := p.String(textKey, ""); err != nil || s != "" {
			return []byte(s), err
		}
		f, err := p.String(fileKey, "")
		if err != nil || f == "" {
			return nil, err
		}
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", fileKey, err)
		}
		return b, nil
	}
	certPEM, err := read("certificate", "certificateFile")
	if err != nil {
		return nil, nil, err
	}
	keyPEM, err := read("privateKey", "privateKeyFile")
	if err != nil {
		return nil, nil, err
	}
	if len(certPEM) == 0 && len(keyPEM) == 0 {
		return nil, nil, nil
	}
	if len(certPEM) == 0 || len(keyPEM) == 0 {
		return nil, nil, errors.New("certificate and privateKey go together")
	}
	cb, _ := pem.Decode(certPEM)
	if cb == nil {
		return nil, nil, errors.New("certificate: no PEM block")
	}
	if _, err := x509.ParseCertificate(cb.Bytes); err != nil {
		return nil, nil, fmt.Errorf("certificate: %w", err)
	}
	kb, _ := pem.Decode(keyPEM)
	if kb == nil {
		return nil, nil, errors.New("privateKey: no PEM block")
	}
	var key *rsa.PrivateKey
	if k, err := x509.ParsePKCS1PrivateKey(kb.Bytes); err == nil {
		key = k
	} else if k, err := x509.ParsePKCS8PrivateKey(kb.Bytes); err == nil {
		rk, ok := k.(*rsa.PrivateKey)
		if !ok {
			return nil, nil, errors.New("privateKey: OPC UA needs an RSA key")
		}
		key = rk
	} else {
		return nil, nil, fmt.Errorf("privateKey: %w", err)
	}
	return cb.Bytes, key, nil
}

// selfSigned makes an application instance certificate for a secured
// channel when none is configured.
func selfSigned() ([]byte, *rsa.PrivateKey, error) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, nil, err
	}
	host, _ := os.Hostname()
	appURI, _ := url.Parse("urn:" + host + ":dowse:opcua-mapper")
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(time.Now().UnixNano()),
		Subject:               pkix.Name{CommonName: "dowse-opcua-mapper", Organization: []string{"Dowse"}},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().AddDate(1, 0, 0),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment | x509.KeyUsageDataEncipherment | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		URIs:                  []*url.URL{appURI},
		DNSNames:              []string{host},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	return der, key, err
}

// refusedIdentity: the server refused the user identity (not the channel).
func refusedIdentity(sc ua.StatusCode) bool {
	switch sc {
	case ua.StatusBadUserAccessDenied, ua.StatusBadIdentityTokenInvalid, ua.StatusBadIdentityTokenRejected,
		ua.StatusBadUserSignatureInvalid:
		return true
	}
	return false
}

// userCredentials are the user name and password to sign in with, the
// files read afresh.
func (c *deviceConfig) userCredentials() (user, password string, err error) {
	user, password = c.username, c.password
	read := func(key, path string) (string, error) {
		b, err := os.ReadFile(path)
		if err != nil {
			return "", fmt.Errorf("%s: %w", key, err)
		}
		return strings.TrimRight(string(b), "\r\n"), nil
	}
	if c.usernameFile != "" {
		if user, err = read("usernameFile", c.usernameFile); err != nil {
			return "", "", err
		}
	}
	if c.passwordFile != "" {
		if password, err = read("passwordFile", c.passwordFile); err != nil {
			return "", "", err
		}
	}
	return user, password, nil
}

// Credentials is mapper.Credentialed: a user name, given or in a file,
// signs in.
func (d *Driver) Credentials() (bool, []string) {
	var files []string
	for _, f := range []string{d.cfg.usernameFile, d.cfg.passwordFile} {
		if f != "" {
			files = append(files, f)
		}
	}
	return d.cfg.username != "" || d.cfg.usernameFile != "", files
}
