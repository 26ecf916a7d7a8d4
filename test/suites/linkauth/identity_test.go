package linkauth_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dowse-dev/dowse/dowsectl"
	"github.com/dowse-dev/dowse/internal/agent/edgecert"
	"github.com/dowse-dev/dowse/internal/bootstrap"
	"github.com/dowse-dev/dowse/internal/controller/link/linkauth"
	"github.com/dowse-dev/dowse/internal/link/pki"
	"github.com/dowse-dev/dowse/test/framework/testwait"
)

// Concurrent starters (controller replicas, dowsectl) all end with the one
// CA that is stored, and a later start reads it back.
func TestCACreatedOnceConcurrently(t *testing.T) {
	ns := suite.Namespace(t)
	secrets := suite.Clientset.CoreV1().Secrets(ns)
	const starters = 8
	cas := make([]*pki.CA, starters)
	errs := make([]error, starters)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range starters {
		wg.Go(func() {
			<-start
			cas[i], errs[i] = bootstrap.LoadOrCreateCA(context.Background(), secrets, time.Hour)
		})
	}
	close(start)
	wg.Wait()
	stored, err := secrets.Get(context.Background(), bootstrap.CASecretName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	storedCA, err := pki.LoadCA(stored.Data["tls.crt"], stored.Data["tls.key"])
	if err != nil {
		t.Fatal(err)
	}
	for i := range starters {
		if errs[i] != nil {
			t.Fatalf("starter %d: %v", i, errs[i])
		}
		if !cas[i].Cert.Equal(storedCA.Cert) {
			t.Errorf("starter %d uses a CA other than the stored one", i)
		}
	}
	again, err := bootstrap.LoadOrCreateCA(context.Background(), secrets, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if !again.Cert.Equal(storedCA.Cert) {
		t.Error("a later start made a new CA instead of reading the stored one")
	}
}

// racingSecrets makes the race certain: another replica stores its CA
// between our Get (NotFound) and our Create.
type racingSecrets struct {
	bootstrap.SecretClient
	other *pki.CA
	once  sync.Once
}

func (r *racingSecrets) Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1Secret, error) {
	var raced bool
	r.once.Do(func() {
		raced = true
		key, _ := r.other.KeyPEM()
		_, err := r.SecretClient.Create(ctx, &corev1Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Type:       "kubernetes.io/tls",
			Data:       map[string][]byte{"tls.crt": r.other.CertPEM, "tls.key": key},
		}, metav1.CreateOptions{})
		if err != nil {
			panic(err)
		}
	})
	if raced {
		return nil, apierrors.NewNotFound(schemaSecrets, name)
	}
	return r.SecretClient.Get(ctx, name, opts)
}

func TestCACreateConflictReadsTheWinner(t *testing.T) {
	other, err := pki.NewCA("other replica", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	secrets := &racingSecrets{SecretClient: suite.Clientset.CoreV1().Secrets(suite.Namespace(t)), other: other}
	ca, err := bootstrap.LoadOrCreateCA(context.Background(), secrets, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if !ca.Cert.Equal(other.Cert) {
		t.Fatal("after losing the create race, LoadOrCreateCA did not return the winner's CA")
	}
}

// A token bootstraps its node once: the certificate names the node and
// verifies against the CA, the files are stored with the key private, and
// a second use is refused and logged.
func TestTokenBootstrapsOnce(t *testing.T) {
	c := startCloud(t, time.Hour)
	tok := c.token(t, "edge-a", time.Hour)
	cfg := c.edgeConfig(t, "edge-a", tok)
	m, err := edgecert.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.GetClientCertificate(nil); err == nil {
		t.Fatal("GetClientCertificate returned a certificate before bootstrap")
	}
	if err := m.Bootstrap(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-m.Ready():
	default:
		t.Fatal("Ready is not closed after bootstrap")
	}
	cert, err := m.GetClientCertificate(nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := pki.NodeFromCert(cert.Leaf); err != nil || got != "edge-a" {
		t.Fatalf("certificate names %q (%v), want edge-a", cert.Leaf.Subject.CommonName, err)
	}
	if _, err := cert.Leaf.Verify(x509.VerifyOptions{Roots: c.ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("certificate does not verify against the cluster CA: %v", err)
	}
	if left := time.Until(cert.Leaf.NotAfter); left > time.Hour || left < 50*time.Minute {
		t.Errorf("certificate lasts %s more, want the configured hour", left)
	}
	if !m.RootCAs().Equal(c.ca.Pool()) {
		t.Error("RootCAs is not the cluster CA")
	}
	st, err := os.Stat(filepath.Join(cfg.Dir, edgecert.CertFileName))
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("key file mode %v, want 0600", st.Mode().Perm())
	}
	if c.counter(t, "dowse_linkauth_certificates_issued_total", map[string]string{"request": "bootstrap"}) != 1 {
		t.Error("issued metric is not 1")
	}
	if c.logs.find("issued node certificate", `"node"="edge-a"`) == "" {
		t.Error("no log line for the issued certificate")
	}

	// The same token again, from another edge of the same name.
	again, err := edgecert.New(c.edgeConfig(t, "edge-a", tok))
	if err != nil {
		t.Fatal(err)
	}
	err = again.Bootstrap(context.Background())
	expectRefused(t, err, http.StatusUnauthorized, "already used")
	if _, err := again.GetClientCertificate(nil); err == nil {
		t.Error("the refused edge has a certificate")
	}
	c.expectRefusal(t, "bootstrap", linkauth.ReasonReusedToken)
}

// The cloud spent the token but its answer was lost: the edge's retry,
// with the key it kept on disk, is granted; another key is not.
func TestBootstrapRetryAfterLostAnswer(t *testing.T) {
	c := startCloud(t, time.Hour)
	tok := c.token(t, "edge-l", time.Hour)
	cfg := c.edgeConfig(t, "edge-l", tok)
	keyPEM, csr, err := pki.NewNodeKeyAndCSR("edge-l")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cfg.Dir, "bootstrap-key.pem"), keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	req, err := x509.ParseCertificateRequest(csr)
	if err != nil {
		t.Fatal(err)
	}
	// The first attempt, whose answer never arrived.
	if _, err := c.tokens.Consume(context.Background(), tok, "edge-l", req.RawSubjectPublicKeyInfo); err != nil {
		t.Fatal(err)
	}
	m, err := edgecert.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Bootstrap(context.Background()); err != nil {
		t.Fatalf("retry with the same key: %v", err)
	}
	cert, _ := m.GetClientCertificate(nil)
	if !bytes.Equal(cert.Leaf.RawSubjectPublicKeyInfo, req.RawSubjectPublicKeyInfo) {
		t.Error("the retry's certificate is not for the kept key")
	}
	if _, err := os.Stat(filepath.Join(cfg.Dir, "bootstrap-key.pem")); !os.IsNotExist(err) {
		t.Errorf("the bootstrap key is left behind after success: %v", err)
	}
	if c.logs.find("issued node certificate", `"retry"=true`) == "" {
		t.Error("no log line for the retried bootstrap")
	}
	other, err := edgecert.New(c.edgeConfig(t, "edge-l", tok))
	if err != nil {
		t.Fatal(err)
	}
	expectRefused(t, other.Bootstrap(context.Background()), http.StatusUnauthorized, "already used")
}

// Concurrent uses of one token: exactly one wins.
func TestTokenRaceOneWins(t *testing.T) {
	c := startCloud(t, time.Hour)
	tok := c.token(t, "edge-race", time.Hour)
	const racers = 6
	keys := make([][]byte, racers)
	for i := range keys {
		_, csr, err := pki.NewNodeKeyAndCSR("edge-race")
		if err != nil {
			t.Fatal(err)
		}
		req, err := x509.ParseCertificateRequest(csr)
		if err != nil {
			t.Fatal(err)
		}
		keys[i] = req.RawSubjectPublicKeyInfo
	}
	errs := make([]error, racers)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range racers {
		wg.Go(func() {
			<-start
			_, errs[i] = c.tokens.Consume(context.Background(), tok, "edge-race", keys[i])
		})
	}
	close(start)
	wg.Wait()
	won := 0
	for _, err := range errs {
		var ref *linkauth.Refused
		switch {
		case err == nil:
			won++
		case errors.As(err, &ref) && ref.Reason == linkauth.ReasonReusedToken:
		default:
			t.Errorf("unexpected error: %v", err)
		}
	}
	if won != 1 {
		t.Fatalf("%d of %d racing uses of one token succeeded, want exactly 1", won, racers)
	}
}

func TestExpiredTokenRefused(t *testing.T) {
	c := startCloud(t, time.Hour)
	tok := c.token(t, "edge-old", time.Millisecond) // stored to the second, rounded down: already expired
	m, err := edgecert.New(c.edgeConfig(t, "edge-old", tok))
	if err != nil {
		t.Fatal(err)
	}
	expectRefused(t, m.Bootstrap(context.Background()), http.StatusUnauthorized, "expired")
	c.expectRefusal(t, "bootstrap", linkauth.ReasonExpiredToken)
	// Start gives up at once on a refused bootstrap instead of retrying.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	expectRefused(t, m.Start(ctx), http.StatusUnauthorized, "expired")

	// The cleaner removes it, and leaves a live token alone.
	live := c.token(t, "edge-new", time.Hour)
	n, err := c.tokens.DeleteExpired(context.Background())
	if err != nil || n != 1 {
		t.Fatalf("DeleteExpired removed %d (%v), want 1", n, err)
	}
	list, err := c.tokens.List(context.Background())
	if err != nil || len(list) != 1 || !strings.HasPrefix(live, list[0].ID+".") {
		t.Fatalf("after cleanup: %+v (%v), want only the live token", list, err)
	}
	expectRefused(t, m.Bootstrap(context.Background()), http.StatusUnauthorized, "unknown")
}

func TestUnknownAndWrongSecretRefused(t *testing.T) {
	c := startCloud(t, time.Hour)
	tok := c.token(t, "edge-s", time.Hour)
	wrong := tok[:7] + strings.Repeat("0", 16)
	if wrong == tok {
		wrong = tok[:7] + strings.Repeat("1", 16)
	}
	m, err := edgecert.New(c.edgeConfig(t, "edge-s", wrong))
	if err != nil {
		t.Fatal(err)
	}
	expectRefused(t, m.Bootstrap(context.Background()), http.StatusUnauthorized, "secret part is wrong")
	c.expectRefusal(t, "bootstrap", linkauth.ReasonInvalidToken)
	m, err = edgecert.New(c.edgeConfig(t, "edge-s", "zzzzzz.0123456789abcdef"))
	if err != nil {
		t.Fatal(err)
	}
	expectRefused(t, m.Bootstrap(context.Background()), http.StatusUnauthorized, "unknown")
	// Neither spent the real token.
	m, err = edgecert.New(c.edgeConfig(t, "edge-s", tok))
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Bootstrap(context.Background()); err != nil {
		t.Fatalf("the real token after wrong attempts: %v", err)
	}
}

// A token for node A with a CSR for node B is refused, and does not spend
// the token.
func TestTokenForAnotherNodeRefused(t *testing.T) {
	c := startCloud(t, time.Hour)
	tok := c.token(t, "edge-a", time.Hour)
	b, err := edgecert.New(c.edgeConfig(t, "edge-b", tok))
	if err != nil {
		t.Fatal(err)
	}
	expectRefused(t, b.Bootstrap(context.Background()), http.StatusForbidden, `for node "edge-a", but the certificate request names node "edge-b"`)
	c.expectRefusal(t, "bootstrap", linkauth.ReasonWrongNode)
	a, err := edgecert.New(c.edgeConfig(t, "edge-a", tok))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Bootstrap(context.Background()); err != nil {
		t.Fatalf("the token was spent by the refused request: %v", err)
	}
}

// A wrong CA pin stops the edge before it sends its token.
func TestWrongPinSendsNoToken(t *testing.T) {
	c := startCloud(t, time.Hour)
	tok := c.token(t, "edge-p", time.Hour)
	other, err := pki.NewCA("impostor", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cfg := c.edgeConfig(t, "edge-p", tok)
	cfg.CAPin = pki.CAPin(other.Cert)
	m, err := edgecert.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	err = m.Bootstrap(context.Background())
	if err == nil || !strings.Contains(err.Error(), "no CA matching pin") {
		t.Fatalf("bootstrap with a wrong pin: %v", err)
	}
	if list, _ := c.tokens.List(context.Background()); len(list) != 1 || !list[0].UsedAt.IsZero() {
		t.Fatalf("token after a wrong-pin bootstrap: %+v, want unused", list)
	}
	// A CA file works as well as a pin.
	cfg.CAPin, cfg.CAPEM = "", c.ca.CertPEM
	if m, err = edgecert.New(cfg); err != nil {
		t.Fatal(err)
	}
	if err := m.Bootstrap(context.Background()); err != nil {
		t.Fatalf("bootstrap with the CA file: %v", err)
	}
}

// Renewal with the current certificate returns a fresh certificate for a
// fresh key; the edge stores and uses it, and a restart without the token
// reuses what is stored.
func TestRenewAndRestart(t *testing.T) {
	c := startCloud(t, time.Hour)
	cfg := c.edgeConfig(t, "edge-r", c.token(t, "edge-r", time.Hour))
	m, err := edgecert.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Bootstrap(context.Background()); err != nil {
		t.Fatal(err)
	}
	first, _ := m.GetClientCertificate(nil)
	if err := m.Renew(context.Background()); err != nil {
		t.Fatal(err)
	}
	renewed, _ := m.GetClientCertificate(nil)
	if renewed.Leaf.SerialNumber.Cmp(first.Leaf.SerialNumber) == 0 {
		t.Fatal("renewal returned the same certificate")
	}
	if renewed.Leaf.Equal(first.Leaf) || bytes.Equal(renewed.Leaf.RawSubjectPublicKeyInfo, first.Leaf.RawSubjectPublicKeyInfo) {
		t.Error("renewal kept the old key")
	}
	if node, _ := pki.NodeFromCert(renewed.Leaf); node != "edge-r" {
		t.Errorf("renewed certificate names %q", renewed.Leaf.Subject.CommonName)
	}
	if _, err := renewed.Leaf.Verify(x509.VerifyOptions{Roots: c.ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatal(err)
	}
	if c.counter(t, "dowse_linkauth_certificates_issued_total", map[string]string{"request": "renew"}) != 1 {
		t.Error("renew metric is not 1")
	}

	// Restart: no token, no pin; the stored credentials are used as they are.
	restartCfg := cfg
	restartCfg.Token, restartCfg.CAPin = "", ""
	restarted, err := edgecert.New(restartCfg)
	if err != nil {
		t.Fatalf("restart without the token: %v", err)
	}
	got, err := restarted.GetClientCertificate(nil)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Leaf.Equal(renewed.Leaf) {
		t.Fatal("the restarted edge does not use the stored (renewed) certificate")
	}
	if !restarted.RootCAs().Equal(c.ca.Pool()) {
		t.Error("the restarted edge lost the CA")
	}
	// Start does not bootstrap (the token is absent) and the stored
	// certificate still renews.
	if err := restarted.Renew(context.Background()); err != nil {
		t.Fatalf("renewal after restart: %v", err)
	}
	// The token line left in the flags after use does no harm.
	withToken, err := edgecert.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := withToken.GetClientCertificate(nil); got == nil {
		t.Fatal("with the used token still configured, the edge did not load its stored certificate")
	}
	// Another node's name over this directory is an error, not a silent
	// identity swap.
	wrong := restartCfg
	wrong.Node = "edge-other"
	if _, err := edgecert.New(wrong); err == nil || !strings.Contains(err.Error(), `node "edge-r"'s identity`) {
		t.Fatalf("New as another node over edge-r's directory: %v", err)
	}
}

// Renewal refuses a certificate from another CA, no certificate, and a CSR
// for another node.
func TestRenewRefusals(t *testing.T) {
	c := startCloud(t, time.Hour)
	other, err := pki.NewCA("other cluster", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := other.IssueNode("edge-f", "", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	status, msg := c.renewRaw(t, &foreign, "edge-f")
	if status != http.StatusUnauthorized || !strings.Contains(msg, "not valid for this cluster's link CA") {
		t.Fatalf("renew with another CA's certificate: %d %q", status, msg)
	}
	c.expectRefusal(t, "renew", linkauth.ReasonBadClientCert)

	status, msg = c.renewRaw(t, nil, "edge-f")
	if status != http.StatusUnauthorized || !strings.Contains(msg, "needs the node's current client certificate") {
		t.Fatalf("renew without a certificate: %d %q", status, msg)
	}

	own, err := c.ca.IssueNode("edge-f", "", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	status, msg = c.renewRaw(t, &own, "edge-g")
	if status != http.StatusForbidden || !strings.Contains(msg, `for node "edge-f", but the certificate request names node "edge-g"`) {
		t.Fatalf("renew for another node: %d %q", status, msg)
	}
	c.expectRefusal(t, "renew", linkauth.ReasonWrongNode)
	if status, msg = c.renewRaw(t, &own, "edge-f"); status != http.StatusOK {
		t.Fatalf("renew with a good certificate: %d %q", status, msg)
	}
}

// With NodeUID set, a node not in the cluster cannot renew, nor can a
// certificate bound to an earlier Node of the same name (deleted and made
// again: a key stolen from the old one is useless); the check's errors are
// retryable.
func TestRenewOfRemovedNodeRefused(t *testing.T) {
	var mu sync.Mutex
	allowed, failing, uid := true, false, "uid-1"
	c := startCloud(t, time.Hour, func(cfg *linkauth.Config) {
		cfg.NodeUID = func(_ context.Context, node string) (string, bool, error) {
			mu.Lock()
			defer mu.Unlock()
			if failing {
				return "", false, errors.New("API server unavailable")
			}
			return uid, allowed && node == "edge-n", nil
		}
	})
	m, err := edgecert.New(c.edgeConfig(t, "edge-n", c.token(t, "edge-n", time.Hour)))
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Bootstrap(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := m.Renew(context.Background()); err != nil {
		t.Fatalf("renew while allowed: %v", err)
	}
	if cert, _ := m.GetClientCertificate(nil); pki.NodeUIDFromCert(cert.Leaf) != "uid-1" {
		t.Fatalf("certificate bound to %q, want the Node's UID uid-1", pki.NodeUIDFromCert(cert.Leaf))
	}
	// The Node deleted and made again under its name: the certificate
	// bound to the earlier one renews no more.
	mu.Lock()
	uid = "uid-2"
	mu.Unlock()
	expectRefused(t, m.Renew(context.Background()), http.StatusForbidden, "earlier Node")
	mu.Lock()
	uid = "uid-1"
	failing = true
	mu.Unlock()
	err = m.Renew(context.Background())
	var ref *edgecert.Refused
	if err == nil || errors.As(err, &ref) || !strings.Contains(err.Error(), "503") {
		t.Fatalf("renew while the check fails: %v, want a retryable 503", err)
	}
	mu.Lock()
	failing, allowed = false, false
	mu.Unlock()
	expectRefused(t, m.Renew(context.Background()), http.StatusForbidden, "may no longer renew")
	c.expectRefusal(t, "renew", linkauth.ReasonNodeNotAllowed)
}

// A 6 s certificate is renewed before it expires, again with the renewed
// one, and GetClientCertificate hands out each new one. Renewing at a third
// of the lifetime keeps the test's length (a renewal about every 2 s) and
// leaves the renewal about 3 s before the expiry; at the default two
// thirds of 3 s (NotAfter is in whole seconds, so as little as 2 s from
// when it arrived) the renewal had half a second, which a loaded machine
// under the race detector (a key made, a TLS handshake, the API server's
// checks) did not always give it.
func TestEdgeRenewsShortLivedCert(t *testing.T) {
	c := startCloud(t, 6*time.Second)
	cfg := c.edgeConfig(t, "edge-short", c.token(t, "edge-short", time.Hour))
	cfg.RenewFraction = 1.0 / 3
	m, err := edgecert.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Start(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Start: %v", err)
		}
	}()
	select {
	case <-m.Ready():
	case <-time.After(5 * time.Second):
		t.Fatal("no bootstrap within 5 s")
	}
	cur, _ := m.GetClientCertificate(nil)
	for i := range 2 {
		deadline := cur.Leaf.NotAfter
		for {
			next, _ := m.GetClientCertificate(nil)
			if next.Leaf.SerialNumber.Cmp(cur.Leaf.SerialNumber) != 0 {
				if now := time.Now(); !now.Before(deadline) {
					t.Fatalf("renewal %d came at %s, after the old certificate expired at %s", i+1, now, deadline)
				}
				if !next.Leaf.NotAfter.After(deadline) {
					t.Fatalf("renewal %d does not extend the expiry", i+1)
				}
				cur = next
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("certificate %d expired at %s without renewal", i+1, deadline)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if got := c.counter(t, "dowse_linkauth_certificates_issued_total", map[string]string{"request": "renew"}); got < 2 {
		t.Errorf("renew metric %v, want at least 2", got)
	}
}

// dowsectl's token and pin bootstrap an edge against the controller's CA.
func TestDowsectlTokenBootstraps(t *testing.T) {
	c := startCloud(t, time.Hour)
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := suite.Kubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	if err := dowsectl.Run(context.Background(), []string{"token", "create", "--kubeconfig", kubeconfig, "--namespace", c.ns, "--node", "edge-ctl", "--ttl", "10m", "--output", "json"}, &out, &errOut); err != nil {
		t.Fatalf("%v: %s", err, errOut.String())
	}
	var res dowsectl.Result
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	if res.CACertHash != pki.CAPin(c.ca.Cert) {
		t.Fatalf("dowsectl printed pin %s, the controller's CA is %s", res.CACertHash, pki.CAPin(c.ca.Cert))
	}
	if d := time.Until(res.Expires); d > 10*time.Minute || d < 9*time.Minute {
		t.Errorf("token expires in %s, want 10m", d)
	}
	m, err := edgecert.New(edgecert.Config{Dir: t.TempDir(), Node: "edge-ctl", URL: c.url, Token: res.Token, CAPin: res.CACertHash})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Bootstrap(context.Background()); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := dowsectl.Run(context.Background(), []string{"token", "list", "--kubeconfig", kubeconfig, "--namespace", c.ns}, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	if id, _, _ := strings.Cut(res.Token, "."); !strings.Contains(out.String(), id) || !strings.Contains(out.String(), "edge-ctl") || strings.Contains(out.String(), res.Token) {
		t.Fatalf("token list:\n%s", out.String())
	}
	// Usage errors are told apart from failures.
	if err := dowsectl.Run(context.Background(), []string{"token", "create", "--kubeconfig", kubeconfig}, &out, &errOut); !errors.Is(err, dowsectl.ErrUsage) {
		t.Fatalf("create without --node: %v", err)
	}
}

// The running endpoint deletes expired tokens by itself.
func TestServerCleansExpiredTokens(t *testing.T) {
	c := startCloud(t, time.Hour, func(cfg *linkauth.Config) { cfg.TokenCleanupInterval = 50 * time.Millisecond })
	c.token(t, "edge-x", time.Millisecond)
	live := c.token(t, "edge-y", time.Hour)
	testwait.For(t, 5*time.Second, func() error {
		list, err := c.tokens.List(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		// The metric is counted just after the deletion: wait for both.
		deleted := c.counter(t, "dowse_linkauth_expired_tokens_deleted_total", nil)
		if len(list) == 1 && strings.HasPrefix(live, list[0].ID+".") && deleted == 1 {
			return nil
		}
		return fmt.Errorf("tokens %+v, deleted metric %v; want the live token alone and 1", list, deleted)
	})
}

// Requests that are not well-formed get a 4xx and a reason.
func TestMalformedRequestsRefused(t *testing.T) {
	c := startCloud(t, time.Hour)
	tok := c.token(t, "edge-m", time.Hour)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: c.ca.Pool(), ServerName: "127.0.0.1"}}, Timeout: 10 * time.Second}
	defer hc.CloseIdleConnections()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	badCN, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "edge-m"}}, key)
	if err != nil {
		t.Fatal(err)
	}
	badCNBody, _ := json.Marshal(pki.BootstrapRequest{Token: tok, CSR: badCN})
	for _, tc := range []struct {
		name   string
		body   []byte
		status int
		words  string
	}{
		{"not JSON", []byte("{"), http.StatusBadRequest, "request body"},
		{"oversized", append([]byte(`{"token":"`), bytes.Repeat([]byte("a"), 100<<10)...), http.StatusBadRequest, "too large"},
		{"no CSR", []byte(`{"token":"` + tok + `"}`), http.StatusBadRequest, "certificate request"},
		{"garbage CSR", []byte(`{"token":"` + tok + `","csr":"AAAA"}`), http.StatusBadRequest, "certificate request"},
		{"CSR without node: prefix", badCNBody, http.StatusBadRequest, `names "edge-m", not "node:"<node>`},
	} {
		resp, err := hc.Post(c.url+pki.BootstrapPath, "application/json", bytes.NewReader(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		var e pki.ErrorResponse
		_ = json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if resp.StatusCode != tc.status || !strings.Contains(e.Error, tc.words) {
			t.Errorf("%s: %d %q, want %d with %q", tc.name, resp.StatusCode, e.Error, tc.status, tc.words)
		}
	}
	resp, err := hc.Get(c.url + pki.BootstrapPath)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET: %d, want 405", resp.StatusCode)
	}
	c.expectRefusal(t, "bootstrap", linkauth.ReasonMalformed)
	if list, _ := c.tokens.List(context.Background()); len(list) != 1 || !list[0].UsedAt.IsZero() {
		t.Errorf("token after malformed requests: %+v, want unused", list)
	}
}

func expectRefused(t *testing.T, err error, status int, words string) {
	t.Helper()
	var ref *edgecert.Refused
	if !errors.As(err, &ref) {
		t.Fatalf("want a refusal (%d, %q), got %v", status, words, err)
	}
	if ref.Status != status || !strings.Contains(ref.Msg, words) {
		t.Fatalf("refusal %d %q, want %d with %q", ref.Status, ref.Msg, status, words)
	}
}

func (c *cloud) expectRefusal(t *testing.T, request, reason string) {
	t.Helper()
	if c.counter(t, "dowse_linkauth_requests_refused_total", map[string]string{"request": request, "reason": reason}) < 1 {
		t.Errorf("no %s refusal counted for %s", reason, request)
	}
	if c.logs.find("refused node certificate request", `"reason"="`+reason+`"`) == "" {
		t.Errorf("no log line for the %s refusal", reason)
	}
}

// renewRaw posts a renewal for a CSR naming node, presenting cert (or
// none), and returns the status and error message.
func (c *cloud) renewRaw(t *testing.T, cert *tls.Certificate, node string) (int, string) {
	t.Helper()
	_, csr, err := pki.NewNodeKeyAndCSR(node)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(pki.RenewRequest{CSR: csr})
	tlsCfg := pki.ClientTLSConfig(func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		if cert == nil {
			return &tls.Certificate{}, nil
		}
		return cert, nil
	}, c.ca.Pool(), "127.0.0.1")
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsCfg}, Timeout: 10 * time.Second}
	defer hc.CloseIdleConnections()
	resp, err := hc.Post(c.url+pki.RenewPath, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var e pki.ErrorResponse
	_ = json.NewDecoder(resp.Body).Decode(&e)
	return resp.StatusCode, e.Error
}
