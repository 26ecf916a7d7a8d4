package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/dowse-dev/dowse/internal/link/pki"
	"github.com/dowse-dev/dowse/test/framework/dowse"
	"github.com/dowse-dev/dowse/test/framework/procs"
	"github.com/dowse-dev/dowse/test/framework/testwait"
)

// TestEgressOverTCP: the controller binary serves the API server's egress
// on TCP with mutual TLS; `dowsectl egress-config` writes the API
// server's files (the CA, a client certificate and key, and an
// EgressSelectorConfiguration naming them), with which a CONNECT gets
// through; a node's certificate of the same CA, or none, does not.
func TestEgressOverTCP(t *testing.T) {
	dir, kubeconfig, cs, _ := controlPlane(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	link, err := dowse.FreeLink()
	if err != nil {
		t.Fatal(err)
	}
	metrics, err := procs.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	egressPort, err := procs.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	server := "127.0.0.1:" + strconv.Itoa(egressPort)
	dowse.Controller{Kubeconfig: kubeconfig, Metrics: metrics, Link: link,
		Args: []string{"--egress-address", server, "--egress-hosts", "127.0.0.1"}}.StartLogged(t, dir, "controller")

	files := filepath.Join(dir, "apiserver")
	testwait.For(t, 30*time.Second, func() error {
		if _, err := cs.CoreV1().Secrets("dowse-system").Get(ctx, "dowse-link-ca", metav1.GetOptions{}); err != nil {
			return err
		}
		out, err := exec.CommandContext(ctx, filepath.Join(procs.BinDir(), "dowsectl"), "egress-config", "--kubeconfig", kubeconfig,
			"--server", server, "--dir", files, "--apiserver-dir", files).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%w: %s", err, out)
		}
		return nil
	})
	var selector struct {
		Kind             string
		EgressSelections []struct {
			Name       string
			Connection struct {
				ProxyProtocol string `json:"proxyProtocol"`
				Transport     struct {
					TCP struct {
						URL       string
						TLSConfig struct{ CABundle, ClientCert, ClientKey string } `json:"tlsConfig"`
					}
				}
			}
		} `json:"egressSelections"`
	}
	raw, err := os.ReadFile(filepath.Join(files, "egress-selector.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(raw, &selector); err != nil {
		t.Fatal(err)
	}
	if len(selector.EgressSelections) != 1 || selector.EgressSelections[0].Name != "cluster" || selector.EgressSelections[0].Connection.ProxyProtocol != "HTTPConnect" ||
		selector.EgressSelections[0].Connection.Transport.TCP.URL != "https://"+server {
		t.Fatalf("egress-selector.yaml:\n%s", raw)
	}
	tlsFiles := selector.EgressSelections[0].Connection.Transport.TCP.TLSConfig
	apiserverCert, err := tls.LoadX509KeyPair(tlsFiles.ClientCert, tlsFiles.ClientKey)
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(tlsFiles.CABundle)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		t.Fatal("ca.crt holds no certificate")
	}

	// Something the API server reaches: no node's, so dialled from the
	// cloud side.
	webhook := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "a webhook") }), ReadHeaderTimeout: 5 * time.Second}
	wl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = webhook.Serve(wl) }()
	t.Cleanup(func() { _ = webhook.Close() })

	connect := func(cert *tls.Certificate) (string, error) {
		conf := &tls.Config{RootCAs: roots, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
		if cert != nil {
			conf.Certificates = []tls.Certificate{*cert}
		}
		c, err := tls.Dial("tcp", server, conf)
		if err != nil {
			return "", err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", wl.Addr(), wl.Addr())
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
		if err != nil {
			return "", err
		}
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(resp.Body)
			return "", fmt.Errorf("%s: %s", resp.Status, b)
		}
		fmt.Fprint(c, "GET / HTTP/1.1\r\nHost: webhook\r\nConnection: close\r\n\r\n")
		resp, err = http.ReadResponse(br, nil)
		if err != nil {
			return "", err
		}
		b, err := io.ReadAll(resp.Body)
		return string(b), err
	}
	testwait.For(t, 30*time.Second, func() error {
		got, err := connect(&apiserverCert)
		if err != nil {
			return err
		}
		if got != "a webhook" {
			t.Fatalf("through the egress: %q", got)
		}
		return nil
	})

	// A node's certificate of the same CA: refused, saying why.
	caSecret, err := cs.CoreV1().Secrets("dowse-system").Get(ctx, "dowse-link-ca", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ca, err := pki.LoadCA(caSecret.Data["tls.crt"], caSecret.Data["tls.key"])
	if err != nil {
		t.Fatal(err)
	}
	nodeCert, err := ca.IssueNode("edge-1", "", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := connect(&nodeCert); err == nil || !strings.Contains(err.Error(), "403") || !strings.Contains(err.Error(), "may not use the egress") {
		t.Errorf("a node's certificate: %v, want 403 saying it may not use the egress", err)
	}
	// No certificate: the TLS handshake fails (read fails at the latest).
	if _, err := connect(nil); err == nil {
		t.Error("a connection without a client certificate got through")
	}
	testwait.For(t, 10*time.Second, func() error {
		return metricAtLeast(metrics, `dowse_egress_connections_total{route="direct"}`, 1)
	})
}
