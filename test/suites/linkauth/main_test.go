// Package linkauth_test proves node identity on the cloud/edge link
// (internal/controller/link/linkauth, internal/agent/edgecert, dowsectl) against a real
// kube-apiserver and etcd, over real HTTPS on loopback.
package linkauth_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"

	"github.com/dowse-dev/dowse/internal/agent/edgecert"
	"github.com/dowse-dev/dowse/internal/bootstrap"
	"github.com/dowse-dev/dowse/internal/controller/link/linkauth"
	"github.com/dowse-dev/dowse/internal/link/pki"
	"github.com/dowse-dev/dowse/test/framework/kube"
	"github.com/dowse-dev/dowse/test/framework/promtest"
)

// Each test gets its own controller namespace.
var suite = &kube.Suite{NamespacePrefix: "linkauth-"}

func TestMain(m *testing.M) { os.Exit(suite.Run(m)) }

// logLines records log lines as "message key=value ..." strings.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) logger(t *testing.T) logr.Logger {
	return funcr.New(func(prefix, args string) {
		l.mu.Lock()
		l.lines = append(l.lines, prefix+" "+args)
		l.mu.Unlock()
		t.Log(prefix, args)
	}, funcr.Options{Verbosity: 1})
}

// find returns the first line holding every part.
func (l *logLines) find(parts ...string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
next:
	for _, line := range l.lines {
		for _, p := range parts {
			if !strings.Contains(line, p) {
				continue next
			}
		}
		return line
	}
	return ""
}

// cloud is a running linkauth endpoint in its own namespace.
type cloud struct {
	ns      string
	secrets bootstrap.SecretClient
	ca      *pki.CA
	tokens  *linkauth.Tokens
	url     string
	reg     *prometheus.Registry
	logs    *logLines
}

func startCloud(t *testing.T, certValidity time.Duration, opts ...func(*linkauth.Config)) *cloud {
	t.Helper()
	c := &cloud{ns: suite.Namespace(t), reg: prometheus.NewRegistry(), logs: &logLines{}}
	ctx, cancel := context.WithCancel(logr.NewContext(context.Background(), c.logs.logger(t)))
	c.secrets = suite.Clientset.CoreV1().Secrets(c.ns)
	var err error
	if c.ca, err = bootstrap.LoadOrCreateCA(ctx, c.secrets, 0); err != nil {
		t.Fatal(err)
	}
	c.tokens = linkauth.NewTokens(c.secrets)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := linkauth.Config{
		CA: c.ca, Tokens: c.tokens, CertValidity: certValidity,
		Hosts: []string{"127.0.0.1"}, Listener: lis, Metrics: linkauth.NewMetrics(c.reg),
		// Tests that want expired tokens around call DeleteExpired themselves.
		TokenCleanupInterval: -1,
	}
	for _, o := range opts {
		o(&cfg)
	}
	srv, err := linkauth.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("linkauth server: %v", err)
		}
	})
	c.url = "https://" + lis.Addr().String()
	return c
}

func (c *cloud) token(t *testing.T, node string, ttl time.Duration) string {
	t.Helper()
	tok, _, err := c.tokens.Create(context.Background(), node, ttl)
	if err != nil {
		t.Fatal(err)
	}
	return tok.String()
}

// edgeConfig is an edge of node with its own state dir, bootstrapping with
// token and the CA pin.
func (c *cloud) edgeConfig(t *testing.T, node, token string) edgecert.Config {
	return edgecert.Config{Dir: filepath.Join(t.TempDir(), "link"), Node: node, URL: c.url, Token: token, CAPin: pki.CAPin(c.ca.Cert)}
}

// counter sums the samples of a metric with these labels in the cloud's registry.
func (c *cloud) counter(t *testing.T, name string, labels map[string]string) float64 {
	t.Helper()
	return promtest.Sum(t, c.reg, name, labels)
}

type corev1Secret = corev1.Secret

var schemaSecrets = corev1.Resource("secrets")
