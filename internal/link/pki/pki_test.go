package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

func TestCARoundTrip(t *testing.T) {
	ca, err := NewCA("dowse-link-ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := ca.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	loaded, err := LoadCA(ca.CertPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	if !loaded.Cert.Equal(ca.Cert) {
		t.Fatal("loaded CA differs")
	}
	leaf, err := loaded.IssueNode("edge-1", "", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := leaf.Leaf.Verify(x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("certificate from the loaded CA does not verify against the original: %v", err)
	}
	other, _ := NewCA("other", time.Hour)
	otherKey, _ := other.KeyPEM()
	if _, err := LoadCA(ca.CertPEM, otherKey); err == nil {
		t.Fatal("a CA certificate with another CA's key was loaded")
	}
}

func TestSignNodeCSR(t *testing.T) {
	ca, _ := NewCA("ca", time.Hour)
	_, csr, err := NewNodeKeyAndCSR("edge-1")
	if err != nil {
		t.Fatal(err)
	}
	certPEM, err := ca.SignNodeCSR(csr, "edge-1", "", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(certPEM)
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if node, err := NodeFromCert(cert); err != nil || node != "edge-1" {
		t.Fatalf("NodeFromCert = %q, %v", node, err)
	}
	if cert.NotAfter.After(time.Now().Add(time.Minute + time.Second)) {
		t.Fatalf("validity not honoured: NotAfter %v", cert.NotAfter)
	}
	if uid := NodeUIDFromCert(cert); uid != "" {
		t.Fatalf("a certificate signed without a UID is bound to %q", uid)
	}
	boundPEM, err := ca.SignNodeCSR(csr, "edge-1", "9f1c2a7e-0b1d-4c55-8d2e-1a2b3c4d5e6f", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	block, _ = pem.Decode(boundPEM)
	bound, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if uid := NodeUIDFromCert(bound); uid != "9f1c2a7e-0b1d-4c55-8d2e-1a2b3c4d5e6f" {
		t.Fatalf("NodeUIDFromCert = %q, want the UID it was signed with", uid)
	}

	rsaKey, _ := rsa.GenerateKey(rand.Reader, 2048)
	rsaCSR, _ := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "node:edge-1"}}, rsaKey)
	tampered := append([]byte(nil), csr...)
	tampered[len(tampered)-5] ^= 0xff
	for name, tc := range map[string]struct {
		csr  []byte
		node string
		want string
	}{
		"other node":    {csr, "edge-2", `names "node:edge-1", not "node:edge-2"`},
		"garbage":       {[]byte("nope"), "edge-1", "certificate request"},
		"bad signature": {tampered, "edge-1", "certificate request"},
		"rsa key":       {rsaCSR, "edge-1", "not accepted"},
		"bad node name": {csr, "Edge_1", "node name"},
	} {
		if _, err := ca.SignNodeCSR(tc.csr, tc.node, "", time.Minute); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want it to mention %q", name, err, tc.want)
		}
	}
}

func TestNodeFromCertRefusesServerAndForeignNames(t *testing.T) {
	ca, _ := NewCA("ca", time.Hour)
	srv, _ := ca.IssueServer([]string{"127.0.0.1", "cloudhub.dowse"}, time.Hour)
	if _, err := NodeFromCert(srv.Leaf); err == nil {
		t.Fatal("a server certificate was taken for a node")
	}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := clientTemplate("x", "", time.Hour)
	tmpl.Subject.CommonName = "admin"
	der, _ := ca.sign(tmpl, key.Public())
	c, _ := x509.ParseCertificate(der)
	if _, err := NodeFromCert(c); err == nil {
		t.Fatal("a certificate without the node: prefix was taken for a node")
	}
}

// TestMutualTLS proves the two configurations talk TLS 1.3 with each other,
// and that the server refuses a client certificate from another CA.
func TestMutualTLS(t *testing.T) {
	ca, _ := NewCA("ca", time.Hour)
	srvCert, _ := ca.IssueServer([]string{"127.0.0.1"}, time.Hour)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", ServerTLSConfig(Static[*tls.ClientHelloInfo](srvCert), ca.Pool()))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	nodes := make(chan string, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			tc := c.(*tls.Conn)
			if err := tc.Handshake(); err != nil {
				nodes <- "refused"
				c.Close()
				continue
			}
			st := tc.ConnectionState()
			node, err := NodeFromCert(st.PeerCertificates[0])
			if err != nil || st.Version != tls.VersionTLS13 {
				node = "bad"
			}
			nodes <- node
			_, _ = io.WriteString(c, "ok")
			c.Close()
		}
	}()

	dial := func(cert tls.Certificate) error {
		cfg := ClientTLSConfig(Static[*tls.CertificateRequestInfo](cert), ca.Pool(), "127.0.0.1")
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", ln.Addr().String(), cfg)
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = io.ReadAll(c)
		return err
	}
	good, _ := ca.IssueNode("edge-1", "", time.Hour)
	if err := dial(good); err != nil {
		t.Fatal(err)
	}
	if got := <-nodes; got != "edge-1" {
		t.Fatalf("server saw %q", got)
	}
	other, _ := NewCA("other", time.Hour)
	foreign, _ := other.IssueNode("edge-1", "", time.Hour)
	_ = dial(foreign) // TLS 1.3 reports the client's rejection on first read, if at all
	if got := <-nodes; got != "refused" {
		t.Fatalf("server accepted a certificate from another CA: %q", got)
	}
}

// TestPeerIdentities: a replica's certificate names its replica and serves
// and presents both ways; the egress client's names its client; neither
// passes for the other, nor a node's for either.
func TestPeerIdentities(t *testing.T) {
	ca, err := NewCA("test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	replica, err := ca.IssueReplica("dowse-controller-7f/x", []string{"10.0.0.7"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	egress, err := ca.IssueEgressClient("kube-apiserver", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	node, err := ca.IssueNode("edge-1", "", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	leaf := func(c tls.Certificate) *x509.Certificate {
		l, err := x509.ParseCertificate(c.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	if r, err := ReplicaFromCert(leaf(replica)); err != nil || r != "dowse-controller-7f/x" {
		t.Errorf("ReplicaFromCert(replica) = %q, %v", r, err)
	}
	if ip := leaf(replica).IPAddresses; len(ip) != 1 || ip[0].String() != "10.0.0.7" {
		t.Errorf("replica certificate serves %v", ip)
	}
	if n, err := EgressClientFromCert(leaf(egress)); err != nil || n != "kube-apiserver" {
		t.Errorf("EgressClientFromCert(egress) = %q, %v", n, err)
	}
	for name, c := range map[string]tls.Certificate{"node": node, "egress client": egress} {
		if _, err := ReplicaFromCert(leaf(c)); err == nil {
			t.Errorf("a %s certificate passes for a replica", name)
		}
	}
	for name, c := range map[string]tls.Certificate{"node": node, "replica": replica} {
		if _, err := EgressClientFromCert(leaf(c)); err == nil {
			t.Errorf("a %s certificate may use the egress", name)
		}
	}
}

// TestRotatingReissues: the same certificate is served until two thirds of
// its life have passed, then a new one.
func TestRotatingReissues(t *testing.T) {
	ca, err := NewCA("test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	issued := 0
	r := &Rotating{Now: func() time.Time { return now }, Issue: func() (tls.Certificate, error) {
		issued++
		return ca.IssueServer([]string{"127.0.0.1"}, 30*time.Minute)
	}}
	first, err := r.Get()
	if err != nil {
		t.Fatal(err)
	}
	now = now.Add(19 * time.Minute)
	if c, _ := r.Get(); c != first || issued != 1 {
		t.Fatalf("re-issued at 19 of 30 minutes (%d issued)", issued)
	}
	now = now.Add(2 * time.Minute)
	if c, _ := r.Get(); c == first || issued != 2 || c.Leaf == nil {
		t.Fatalf("not re-issued at 21 of 30 minutes (%d issued)", issued)
	}
}
