package edgecert

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dowse-dev/dowse/internal/link/pki"
)

const testToken = "abcdef.0123456789abcdef"

func newCA(t *testing.T) *pki.CA {
	t.Helper()
	ca, err := pki.NewCA("test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// writeCreds stores a certificate for node from ca in dir, as a bootstrap
// would have.
func writeCreds(t *testing.T, dir string, ca *pki.CA, node string, validity time.Duration) *tls.Certificate {
	t.Helper()
	c, err := ca.IssueNode(node, "", validity)
	if err != nil {
		t.Fatal(err)
	}
	key, err := x509.MarshalPKCS8PrivateKey(c.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	data := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Certificate[0]})
	data = append(data, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: key})...)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, CAFileName), ca.CertPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, CertFileName), data, 0o600); err != nil {
		t.Fatal(err)
	}
	return &c
}

func TestNewLoadsOrNeedsToken(t *testing.T) {
	ca, other := newCA(t), newCA(t)
	pin := pki.CAPin(ca.Cert)
	base := Config{Node: "edge-a", URL: "https://127.0.0.1:9747"}
	for _, tc := range []struct {
		name     string
		setup    func(dir string)
		token    string
		pin      string
		node     string
		loaded   bool   // the stored certificate is in use
		errWords string // New fails with these words
	}{
		{name: "nothing stored, no token", setup: func(string) {}, errWords: "no usable credentials"},
		{name: "nothing stored, token without pin", setup: func(string) {}, token: testToken, errWords: "no usable credentials"},
		{name: "nothing stored, token and pin", setup: func(string) {}, token: testToken, pin: pin},
		{name: "stored, no token", setup: func(d string) { writeCreds(t, d, ca, "edge-a", time.Hour) }, loaded: true},
		{name: "stored, used token still given", setup: func(d string) { writeCreds(t, d, ca, "edge-a", time.Hour) }, token: testToken, pin: pin, loaded: true},
		{name: "stored expired, no token", setup: func(d string) { writeCreds(t, d, ca, "edge-a", -time.Minute) }, errWords: "no usable credentials"},
		{name: "stored expired, new token", setup: func(d string) { writeCreds(t, d, ca, "edge-a", -time.Minute) }, token: testToken, pin: pin},
		{name: "stored from another cluster, its token and pin", setup: func(d string) { writeCreds(t, d, other, "edge-a", time.Hour) }, token: testToken, pin: pin},
		{name: "stored for another node", setup: func(d string) { writeCreds(t, d, ca, "edge-b", time.Hour) }, errWords: `node "edge-b"'s identity, not "edge-a"'s`},
		{name: "stored without CA", setup: func(d string) {
			writeCreds(t, d, ca, "edge-a", time.Hour)
			os.Remove(filepath.Join(d, CAFileName))
		}, errWords: "its CA is not"},
		{name: "stored garbage", setup: func(d string) {
			writeCreds(t, d, ca, "edge-a", time.Hour)
			os.WriteFile(filepath.Join(d, CertFileName), []byte("junk"), 0o600)
		}, errWords: CertFileName},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "link")
			tc.setup(dir)
			cfg := base
			cfg.Dir, cfg.Token, cfg.CAPin = dir, tc.token, tc.pin
			m, err := New(cfg)
			if tc.errWords != "" {
				if err == nil || !strings.Contains(err.Error(), tc.errWords) {
					t.Fatalf("New: %v, want an error with %q", err, tc.errWords)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			_, err = m.GetClientCertificate(nil)
			if tc.loaded != (err == nil) {
				t.Fatalf("loaded = %v, want %v", err == nil, tc.loaded)
			}
			select {
			case <-m.Ready():
				if !tc.loaded {
					t.Fatal("Ready closed without a certificate")
				}
			default:
				if tc.loaded {
					t.Fatal("Ready open with a stored certificate")
				}
			}
		})
	}
}

func TestNewRefusesBadConfig(t *testing.T) {
	good := Config{Dir: t.TempDir(), Node: "edge-a", URL: "https://cloud:9747", Token: testToken, CAPin: pki.CAPin(newCA(t).Cert)}
	for name, mutate := range map[string]func(*Config){
		"http URL":                        func(c *Config) { c.URL = "http://cloud:9747" },
		"no host":                         func(c *Config) { c.URL = "https://" },
		"bad node":                        func(c *Config) { c.Node = "Edge_A" },
		"no dir":                          func(c *Config) { c.Dir = "" },
		"bad pin":                         func(c *Config) { c.CAPin = "sha256:abc" },
		"bad token":                       func(c *Config) { c.Token = "abcdef" },
		"bad CA":                          func(c *Config) { c.CAPin, c.CAPEM = "", []byte("junk") },
		"token and service account token": func(c *Config) { c.ServiceAccountTokenFile = "/var/run/secrets/dowse.dev/link/token" },
		"service account token, no CA":    func(c *Config) { c.Token, c.CAPin, c.ServiceAccountTokenFile = "", "", "/token" },
	} {
		cfg := good
		mutate(&cfg)
		if _, err := New(cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := New(good); err != nil {
		t.Fatalf("good config: %v", err)
	}
	sa := good
	sa.Token, sa.ServiceAccountTokenFile = "", "/var/run/secrets/dowse.dev/link/token"
	if _, err := New(sa); err != nil {
		t.Fatalf("service account token config: %v", err)
	}
}

// Renewal is scheduled from when the certificate arrived, not from its
// NotBefore (backdated for clock skew), at RenewFraction ± 0.075.
func TestRenewAt(t *testing.T) {
	ca := newCA(t)
	dir := t.TempDir()
	c := writeCreds(t, dir, ca, "edge-a", 3*time.Hour)
	m, err := New(Config{Dir: dir, Node: "edge-a", URL: "https://cloud"})
	if err != nil {
		t.Fatal(err)
	}
	obtained := c.Leaf.NotAfter.Add(-3 * time.Hour)
	m.obtained.Store(obtained.UnixNano())
	for _, tc := range []struct {
		jitter float64
		want   time.Duration
	}{
		{0, 2 * time.Hour},
		{-1, time.Duration(float64(3*time.Hour) * (2.0/3 - 0.075))},
		{0.999999, time.Duration(float64(3*time.Hour) * (2.0/3 + 0.075))},
	} {
		m.jitter = func() float64 { return tc.jitter }
		got := m.renewAt().Sub(obtained)
		if d := got - tc.want; d > time.Second || d < -time.Second {
			t.Errorf("jitter %v: renew %s after receipt, want %s", tc.jitter, got, tc.want)
		}
	}
	// The file's time is the receipt time after a restart.
	past := time.Now().Add(-2 * time.Minute) // after the backdated NotBefore
	if err := os.Chtimes(filepath.Join(dir, CertFileName), past, past); err != nil {
		t.Fatal(err)
	}
	m, err = New(Config{Dir: dir, Node: "edge-a", URL: "https://cloud"})
	if err != nil {
		t.Fatal(err)
	}
	m.jitter = func() float64 { return 0 }
	want := past.Add(c.Leaf.NotAfter.Sub(past) * 2 / 3)
	if d := m.renewAt().Sub(want); d > time.Second || d < -time.Second {
		t.Errorf("after restart: renew at %s, want %s", m.renewAt(), want)
	}
}

func TestVerifyPinned(t *testing.T) {
	ca, other := newCA(t), newCA(t)
	srv, err := ca.IssueServer([]string{"cloud.example"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	leaf := srv.Leaf
	pin := pki.CAPin(ca.Cert)
	for _, tc := range []struct {
		name  string
		chain []*x509.Certificate
		host  string
		pin   string
		ok    bool
	}{
		{"pinned CA in chain", []*x509.Certificate{leaf, ca.Cert}, "cloud.example", pin, true},
		{"no CA in chain", []*x509.Certificate{leaf}, "cloud.example", pin, false},
		{"other CA in chain", []*x509.Certificate{leaf, other.Cert}, "cloud.example", pki.CAPin(other.Cert), false},
		{"wrong host", []*x509.Certificate{leaf, ca.Cert}, "elsewhere.example", pin, false},
		{"wrong pin", []*x509.Certificate{leaf, ca.Cert}, "cloud.example", pki.CAPin(other.Cert), false},
		{"leaf pinned as CA", []*x509.Certificate{leaf, leaf}, "cloud.example", pki.CAPin(leaf), false},
	} {
		got, err := verifyPinned(tls.ConnectionState{PeerCertificates: tc.chain}, tc.pin, tc.host)
		if tc.ok != (err == nil) {
			t.Errorf("%s: err = %v, want ok = %v", tc.name, err, tc.ok)
		}
		if tc.ok && !got.Equal(ca.Cert) {
			t.Errorf("%s: returned another CA", tc.name)
		}
	}
}
