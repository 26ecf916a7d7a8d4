package opcua_test

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dowse-dev/dowse/discovery-handlers/opcua"
	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
	"github.com/dowse-dev/dowse/shared/handler/handlertest"
	"github.com/dowse-dev/dowse/test/peers/npmpeer"
)

const (
	peerStart = npmpeer.OPCUAStart
	wait      = 20 * time.Second
)

// peers starts real node-opcua processes for one test.
type peers struct {
	t      *testing.T
	pkiDir string
}

func newPeers(t *testing.T) *peers {
	t.Helper()
	modules := npmpeer.OPCUAModules(t)
	// Certificates are kept beside the packages, one folder per application,
	// so that later runs skip generating keys.
	return &peers{t: t, pkiDir: filepath.Join(filepath.Dir(modules), "pki")}
}

type server struct {
	*npmpeer.Process
	name, uri, url string
	port           int
	cfg            map[string]any
}

// lds starts a local discovery server and returns its URL.
func (p *peers) lds() (*npmpeer.Process, string) {
	port := npmpeer.FreePort(p.t, "127.0.0.1")
	proc := npmpeer.StartOPCUA(p.t, "lds", map[string]any{"kind": "lds", "port": port, "pkiDir": p.pkiDir})
	return proc, fmt.Sprintf("opc.tcp://127.0.0.1:%d", port)
}

// server starts a conformance-testing server, registering with ldsURL when
// it is not empty. It does not wait for it to be ready.
func (p *peers) server(name, ldsURL string) *server {
	port := npmpeer.FreePort(p.t, "127.0.0.1")
	s := &server{name: name, uri: "urn:dowse:test:" + name, port: port, url: fmt.Sprintf("opc.tcp://127.0.0.1:%d", port)}
	s.cfg = map[string]any{"kind": "server", "port": port, "pkiDir": p.pkiDir, "applicationName": name, "applicationUri": s.uri, "ldsUrl": ldsURL}
	s.start(p)
	return s
}

func (s *server) start(p *peers) {
	s.Process = npmpeer.StartOPCUA(p.t, s.name, s.cfg)
}

// runHandler runs the handler with a fake agent and returns its endpoint.
func runHandler(t *testing.T) string {
	t.Helper()
	cfg := opcua.Handler()
	cfg.Logger = testr.New(t)
	reg := handlertest.Run(t, cfg)
	if reg.GetName() != opcua.DefaultName || !reg.GetShared() {
		t.Errorf("registration = %v, want name %s, shared", reg, opcua.DefaultName)
	}
	return reg.GetEndpoint()
}

// waitFor reads the stream until its list has exactly the ids want, and
// returns that list.
func waitFor(t *testing.T, s *handlertest.Stream, want ...string) []*discoveryv1.Device {
	t.Helper()
	slices.Sort(want)
	deadline := time.Now().Add(wait)
	for {
		devs := s.Next(t, time.Until(deadline))
		if got := handlertest.IDs(devs); slices.Equal(got, want) || (len(got) == 0 && len(want) == 0) {
			return devs
		} else {
			t.Logf("devices %q, waiting for %q", got, want)
		}
	}
}

func details(interval string, threshold int, filter string, urls ...string) string {
	quoted := make([]string, len(urls))
	for i, u := range urls {
		quoted[i] = strconv.Quote(u)
	}
	d := fmt.Sprintf(`{"discoveryUrls": [%s], "rediscoveryInterval": %q, "timeout": "2s", "failureThreshold": %d`,
		joinComma(quoted), interval, threshold)
	if filter != "" {
		d += `, "applicationNames": ` + filter
	}
	return d + "}"
}

func joinComma(s []string) string {
	out := ""
	for i, v := range s {
		if i > 0 {
			out += ", "
		}
		out += v
	}
	return out
}

// TestNodeOPCUA runs every scenario against one local discovery server and
// two conformance-testing servers registered with it, so that the slow
// node-opcua start-up is paid once.
func TestNodeOPCUA(t *testing.T) {
	p := newPeers(t)
	binary := buildBinary(t)
	endpoint := runHandler(t)

	lds, ldsURL := p.lds()
	lds.WaitLine(t, "READY", 0, peerStart)

	// The stream is open before the servers start, so that the time from
	// a server's registration to its device can be measured.
	viaLDS := handlertest.Discover(t, endpoint, &discoveryv1.DiscoverRequest{DiscoveryDetails: details("200ms", 3, "", ldsURL)})
	waitFor(t, viaLDS)

	alpha := p.server("alpha", ldsURL)
	beta := p.server("beta", ldsURL)
	registered, _ := alpha.WaitLine(t, "REGISTERED", 0, peerStart)
	ms, err := strconv.ParseInt(registered, 10, 64)
	if err != nil {
		t.Fatalf("REGISTERED %q: %v", registered, err)
	}
	regAt := time.UnixMilli(ms)
	// The stream is read as soon as alpha has registered, so the time seen
	// is at most a little late, never early.
	deadline := time.Now().Add(wait)
	var last []string
	for !slices.Contains(last, alpha.uri) {
		last = handlertest.IDs(viaLDS.Next(t, time.Until(deadline)))
	}
	t.Logf("FIGURE: OPC UA server registered with the LDS -> device in a Discover response: %v (rediscoveryInterval 200ms)",
		time.Since(regAt).Round(time.Millisecond))
	beta.WaitLine(t, "REGISTERED", 0, peerStart)

	t.Run("through the LDS", func(t *testing.T) {
		want := []string{alpha.uri, beta.uri}
		slices.Sort(want)
		// The list that brought alpha may have brought beta too; the SDK
		// would then send nothing more.
		if !slices.Equal(last, want) {
			waitFor(t, viaLDS, want...)
		}
	})

	t.Run("direct URL, properties", func(t *testing.T) {
		s := handlertest.Discover(t, endpoint, &discoveryv1.DiscoverRequest{DiscoveryDetails: details("200ms", 3, "", alpha.url)})
		dev := waitFor(t, s, alpha.uri)[0]
		want := map[string]string{
			opcua.DiscoveryURLProperty:    alpha.url,
			opcua.ApplicationURIProperty:  alpha.uri,
			opcua.ApplicationNameProperty: "alpha",
			opcua.SecurityModesProperty:   "None,Sign,SignAndEncrypt",
		}
		for k, v := range want {
			if got := dev.GetProperties()[k]; got != v {
				t.Errorf("%s = %q, want %q (all: %v)", k, got, v, dev.GetProperties())
			}
		}
		if dev.GetProperties()[opcua.SecurityPoliciesProperty] == "" {
			t.Errorf("%s is empty", opcua.SecurityPoliciesProperty)
		}
	})

	t.Run("filtered by application name", func(t *testing.T) {
		exclude := handlertest.Discover(t, endpoint, &discoveryv1.DiscoverRequest{DiscoveryDetails: details("200ms", 3, `{"action": "Exclude", "items": ["beta"]}`, ldsURL)})
		waitFor(t, exclude, alpha.uri)
		include := handlertest.Discover(t, endpoint, &discoveryv1.DiscoverRequest{DiscoveryDetails: details("200ms", 3, `{"action": "Include", "items": ["beta"]}`, ldsURL)})
		waitFor(t, include, beta.uri)
	})

	t.Run("stopped and started again", func(t *testing.T) {
		const interval, threshold = 300 * time.Millisecond, 4
		s := handlertest.Discover(t, endpoint, &discoveryv1.DiscoverRequest{DiscoveryDetails: details(interval.String(), threshold, "", beta.url, ldsURL)})
		waitFor(t, s, alpha.uri, beta.uri)

		// From before Stop: the server stops answering while Stop still
		// waits for its process to exit (CI saw a drop 660 ms after Stop
		// returned, with 4 failed checks).
		stopped := time.Now()
		beta.Stop()
		waitFor(t, s, alpha.uri)
		// The first failure can come at once; the last must wait for
		// threshold-1 further rounds, each an interval after the last scan.
		if gone, min := time.Since(stopped), time.Duration(threshold-1)*interval; gone < min {
			t.Errorf("beta dropped %v after it stopped, want at least %v (%d failed checks %v apart)", gone, min, threshold, interval)
		} else {
			t.Logf("beta dropped %v after it stopped (threshold %d, interval %v)", gone.Round(time.Millisecond), threshold, interval)
		}

		beta.start(p)
		beta.WaitLine(t, "READY", 0, peerStart)
		waitFor(t, s, alpha.uri, beta.uri)
	})

	t.Run("client certificate", func(t *testing.T) {
		cert, key := clientCertificate(t)
		s := handlertest.Discover(t, endpoint, &discoveryv1.DiscoverRequest{
			DiscoveryDetails: details("200ms", 3, "", alpha.url),
			DiscoveryProperties: map[string]*discoveryv1.ByteData{
				opcua.ClientCertificateProperty: {Vec: cert},
				opcua.ClientKeyProperty:         {Vec: key},
			},
		})
		dev := waitFor(t, s, alpha.uri)[0]
		// The launcher's servers trust any certificate, so the most secure
		// endpoint must accept this one.
		if got := dev.GetProperties()[opcua.SecureChannelProperty]; !strings.HasPrefix(got, "SignAndEncrypt ") {
			t.Errorf("%s = %q, want SignAndEncrypt <policy>", opcua.SecureChannelProperty, got)
		}
		t.Logf("secure channel with the client certificate: %s", dev.GetProperties()[opcua.SecureChannelProperty])

		err := handlertest.Discover(t, endpoint, &discoveryv1.DiscoverRequest{
			DiscoveryDetails:    details("200ms", 3, "", alpha.url),
			DiscoveryProperties: map[string]*discoveryv1.ByteData{opcua.ClientCertificateProperty: {Vec: cert}},
		}).Err(t, wait)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), opcua.ClientKeyProperty) {
			t.Errorf("stream error = %v, want InvalidArgument naming %s", err, opcua.ClientKeyProperty)
		}
	})

	t.Run("binary peak RSS", func(t *testing.T) {
		if testing.Short() {
			t.Skip("runs the built binary for 5s")
		}
		binaryPeakRSS(t, binary(), beta.uri, ldsURL, alpha.url)
	})

	t.Run("bad details", func(t *testing.T) {
		err := handlertest.Discover(t, endpoint, &discoveryv1.DiscoverRequest{DiscoveryDetails: `{"failureThreshold": -1}`}).Err(t, wait)
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("stream error = %v, want InvalidArgument", err)
		}
	})
}

// clientCertificate makes a self-signed OPC UA application instance
// certificate and its key, PEM, as a Secret would hold them.
func clientCertificate(t *testing.T) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	uri, _ := url.Parse("urn:dowse:test:client")
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(time.Now().UnixNano()),
		Subject:               pkix.Name{CommonName: "dowse test client", Organization: []string{"Dowse"}},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageContentCommitment | x509.KeyUsageKeyEncipherment | x509.KeyUsageDataEncipherment | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		URIs:                  []*url.URL{uri},
		DNSNames:              []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	certPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM = pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
	return certPEM, keyPEM
}
