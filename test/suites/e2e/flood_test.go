package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dowse-dev/dowse/internal/link/pki"
	"github.com/dowse-dev/dowse/test/framework/dowse"
	"github.com/dowse-dev/dowse/test/framework/procs"
	"github.com/dowse-dev/dowse/test/framework/testwait"
)

// TestAgentJoinsThroughAFlood: one address (127.0.0.2) holds every TCP
// connection to the link it can, re-opening each the hub drops, and
// sends bootstrap requests with made-up tokens as fast as it can; a real
// agent (dialling from 127.0.0.1) still bootstraps and holds a session
// within 15 s, because the flood spends its own address's share of the
// handshake slots and of the bootstrap endpoint's budget.
func TestAgentJoinsThroughAFlood(t *testing.T) {
	dir, kubeconfig, cs, _ := controlPlane(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if _, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "edge-f"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	link, err := dowse.FreeLink()
	if err != nil {
		t.Fatal(err)
	}
	link.QUIC = 0
	ctlMetrics, agentMetrics := freePort(t), freePort(t)
	dowse.Controller{Kubeconfig: kubeconfig, Metrics: ctlMetrics, Link: link}.StartLogged(t, dir, "controller")
	var tok struct{ Token, CACertHash string }
	testwait.For(t, 30*time.Second, func() error {
		b, err := exec.CommandContext(ctx, filepath.Join(procs.BinDir(), "dowsectl"), "token", "create",
			"--kubeconfig", kubeconfig, "--node", "edge-f", "--ttl", "10m", "--output", "json").CombinedOutput()
		if err != nil {
			return fmt.Errorf("%w: %s", err, b)
		}
		return json.Unmarshal(b, &tok)
	})

	// The flood, until the test ends.
	fctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	t.Cleanup(func() { stop(); wg.Wait() })
	attacker := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}, Timeout: time.Second}
	var held atomic.Int64
	for range 300 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for fctx.Err() == nil {
				c, err := attacker.DialContext(fctx, "tcp", fmt.Sprintf("127.0.0.1:%d", link.WebSocket))
				if err != nil {
					time.Sleep(10 * time.Millisecond)
					continue
				}
				held.Add(1)
				// Hold it, sending nothing, until the hub drops it.
				_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
				_, _ = c.Read(make([]byte, 1))
				c.Close()
			}
		}()
	}
	var bootstraps atomic.Int64
	httpc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DialContext: attacker.DialContext,
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, MaxIdleConnsPerHost: 8}} //nolint:gosec // the attacker trusts anything
	body := []byte(`{"token":"abcdef.0123456789abcdef","csr":"AAAA"}`)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for fctx.Err() == nil {
				resp, err := httpc.Post(fmt.Sprintf("https://127.0.0.1:%d%s", link.Auth, pki.BootstrapPath), "application/json", bytes.NewReader(body))
				if err == nil {
					resp.Body.Close()
					bootstraps.Add(1)
				}
			}
		}()
	}
	time.Sleep(3 * time.Second) // the flood in full swing

	edge := link.Edge("websocket")
	edge.CACertHash, edge.BootstrapToken = tok.CACertHash, tok.Token
	start := time.Now()
	dowse.Agent{Kubeconfig: kubeconfig, Node: "edge-f", StateDir: filepath.Join(dir, "edge-f"), Metrics: agentMetrics, Link: edge}.StartLogged(t, dir, "agent")
	testwait.For(t, 15*time.Second, func() error { return metricIs(agentMetrics, "dowse_edgehub_connected", 1) })
	t.Logf("the agent joined in %s through a flood of %d connections and %d bootstrap requests from one address",
		time.Since(start).Round(10*time.Millisecond), held.Load(), bootstraps.Load())
	// The flood was on, and met its address's share.
	if err := metricAtLeast(ctlMetrics, `dowse_cloudhub_refused_connections_total{reason="source-busy"}`, 1); err != nil {
		t.Error(err)
	}
	if err := metricAtLeast(ctlMetrics, `dowse_linkauth_requests_refused_total{reason="rate_limited",request="bootstrap"}`, 1); err != nil {
		t.Error(err)
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	p, err := procs.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return p
}
