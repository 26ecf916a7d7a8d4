package cluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki is the cluster's generated key material. One client certificate in the
// system:masters group serves every component: this cluster lives for one test
// run on loopback, and per-component identities would add RBAC bootstrap time
// and nothing a test of Dowse needs.
type pki struct {
	caCert, caKey              string
	servingCert, servingKey    string
	adminCert, adminKey        string
	saKey, saPub               string
	caPEM, adminPEM, adminKPEM []byte
}

func writePEM(path, typ string, der []byte) ([]byte, error) {
	b := pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
	return b, os.WriteFile(path, b, 0o600)
}

// newPKI makes the cluster's CA and certificates; the API server's also
// names apiIPs.
func newPKI(dir string, apiIPs ...net.IP) (*pki, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	p := &pki{
		caCert: filepath.Join(dir, "ca.crt"), caKey: filepath.Join(dir, "ca.key"),
		servingCert: filepath.Join(dir, "apiserver.crt"), servingKey: filepath.Join(dir, "apiserver.key"),
		adminCert: filepath.Join(dir, "admin.crt"), adminKey: filepath.Join(dir, "admin.key"),
		saKey: filepath.Join(dir, "sa.key"), saPub: filepath.Join(dir, "sa.pub"),
	}
	now := time.Now().Add(-time.Hour) // tolerate small clock skew between processes
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "dowse-test-ca"},
		NotBefore: now, NotAfter: now.Add(10 * 365 * 24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, _ := x509.ParseCertificate(caDER)
	if p.caPEM, err = writePEM(p.caCert, "CERTIFICATE", caDER); err != nil {
		return nil, err
	}
	if err := writeKey(p.caKey, caKey); err != nil {
		return nil, err
	}
	leaf := func(serial int64, cn string, orgs []string, usage x509.ExtKeyUsage, dns []string, ips []net.IP, certPath, keyPath string) ([]byte, []byte, error) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, nil, err
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn, Organization: orgs},
			NotBefore: now, NotAfter: now.Add(365 * 24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			DNSNames: dns, IPAddresses: ips,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return nil, nil, err
		}
		certPEM, err := writePEM(certPath, "CERTIFICATE", der)
		if err != nil {
			return nil, nil, err
		}
		kder, _ := x509.MarshalECPrivateKey(key)
		keyPEM, err := writePEM(keyPath, "EC PRIVATE KEY", kder)
		return certPEM, keyPEM, err
	}
	// The API server is reached on loopback (or where the pod network
	// reaches the machine) and, from pods, through the kubernetes Service's
	// first address of the service range.
	if _, _, err := leaf(2, "kube-apiserver", nil, x509.ExtKeyUsageServerAuth,
		[]string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		append([]net.IP{net.ParseIP("127.0.0.1"), net.ParseIP(serviceIP)}, apiIPs...), p.servingCert, p.servingKey); err != nil {
		return nil, err
	}
	if p.adminPEM, p.adminKPEM, err = leaf(3, "dowse-admin", []string{"system:masters"}, x509.ExtKeyUsageClientAuth, nil, nil, p.adminCert, p.adminKey); err != nil {
		return nil, err
	}
	sa, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	if _, err := writePEM(p.saKey, "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(sa)); err != nil {
		return nil, err
	}
	pub, _ := x509.MarshalPKIXPublicKey(&sa.PublicKey)
	if _, err := writePEM(p.saPub, "PUBLIC KEY", pub); err != nil {
		return nil, err
	}
	return p, nil
}

func writeKey(path string, k *ecdsa.PrivateKey) error {
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		return err
	}
	_, err = writePEM(path, "EC PRIVATE KEY", der)
	return err
}
