package e2e

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/internal/link/pki"
	"github.com/dowse-dev/dowse/internal/scheme"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/framework/dowse"
	"github.com/dowse-dev/dowse/test/framework/procs"
	"github.com/dowse-dev/dowse/test/framework/testwait"
)

// TestLinkBinaries joins two nodes to the controller's cloud/edge link with
// the real binaries, as an operator would: dowsectl mints a token per node,
// each dowse-agent trades it for a certificate and connects, one over
// WebSocket and one over QUIC. A restarted agent reconnects with what it
// stored; a token used for another node is refused without stopping the
// agent.
func TestLinkBinaries(t *testing.T) {
	dir, kubeconfig, cs, cp := controlPlane(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	ports := make([]int, 4)
	for i := range ports {
		var err error
		if ports[i], err = procs.FreePort(); err != nil {
			t.Fatal(err)
		}
	}
	ctlMetrics, wsPort, quicPort, authPort := ports[0], ports[1], ports[2], ports[3]
	start := func(name, logName string, args ...string) *procs.Proc {
		t.Helper()
		return procs.StartLogged(t, dir, name, logName, args...)
	}
	link := &dowse.Link{WebSocket: wsPort, QUIC: quicPort, Auth: authPort, Heartbeat: time.Second}
	dowse.Controller{Kubeconfig: kubeconfig, Metrics: ctlMetrics, Link: link}.StartLogged(t, dir, "controller")

	type tokenOut struct {
		Token, Node, CACertHash string
	}
	token := func(node string) tokenOut {
		t.Helper()
		var out tokenOut
		// The controller creates the CA as it starts; dowsectl would
		// create it too, but the test wants the controller's.
		testwait.For(t, 30*time.Second, func() error {
			if _, err := cs.CoreV1().Secrets("dowse-system").Get(ctx, "dowse-link-ca", metav1.GetOptions{}); err != nil {
				return err
			}
			b, err := exec.CommandContext(ctx, filepath.Join(procs.BinDir(), "dowsectl"), "token", "create",
				"--kubeconfig", kubeconfig, "--node", node, "--ttl", "10m", "--output", "json").CombinedOutput()
			if err != nil {
				return fmt.Errorf("%w: %s", err, b)
			}
			return json.Unmarshal(b, &out)
		})
		return out
	}
	agentMetrics := map[string]int{}
	// agent starts an agent of node that bootstraps with tok, or with the
	// service account token in saTokenFile when set.
	agent := func(node, transport string, tok tokenOut, saTokenFile ...string) *procs.Proc {
		t.Helper()
		port, err := procs.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		agentMetrics[node] = port
		edge := link.Edge(transport)
		edge.CACertHash = tok.CACertHash
		if len(saTokenFile) > 0 {
			edge.ServiceAccountTokenFile = saTokenFile[0]
		} else {
			edge.BootstrapToken = tok.Token
		}
		return dowse.Agent{Kubeconfig: kubeconfig, Node: node, StateDir: filepath.Join(dir, node), Metrics: port,
			Link: edge}.StartLogged(t, dir, node+"-"+strconv.Itoa(port))
	}

	// Only nodes of the cluster may connect (a deleted Node is out).
	for _, n := range []string{"edge-ws", "edge-quic"} {
		if _, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	wsTok, quicTok := token("edge-ws"), token("edge-quic")
	wsAgent := agent("edge-ws", "websocket", wsTok)
	agent("edge-quic", "quic", quicTok)
	testwait.For(t, time.Minute, func() error {
		return metricIs(ctlMetrics, "dowse_cloudhub_connected_nodes", 2)
	})
	for _, node := range []string{"edge-ws", "edge-quic"} {
		testwait.For(t, 10*time.Second, func() error { return metricIs(agentMetrics[node], "dowse_edgehub_connected", 1) })
		if _, err := os.Stat(filepath.Join(dir, node, "link", "node.pem")); err != nil {
			t.Fatalf("%s stored no credentials: %v", node, err)
		}
		// On connecting, the cloud told the node which devices are its.
		testwait.For(t, 10*time.Second, func() error {
			logs, _ := filepath.Glob(filepath.Join(dir, node+"-*.log"))
			for _, l := range logs {
				if b, _ := os.ReadFile(l); bytes.Contains(b, []byte("device membership from the cloud")) {
					return nil
				}
			}
			return fmt.Errorf("%s got no device membership", node)
		})
	}

	// Each node's certificate is bound to its Node object; the CA's
	// certificate (never its key) is published for the chart's agents, and
	// put back when deleted.
	for _, node := range []string{"edge-ws", "edge-quic"} {
		b, err := os.ReadFile(filepath.Join(dir, node, "link", "node.pem"))
		if err != nil {
			t.Fatal(err)
		}
		block, _ := pem.Decode(b)
		if block == nil {
			t.Fatalf("%s: node.pem holds no PEM", node)
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		n, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := pki.NodeUIDFromCert(cert); got != string(n.UID) {
			t.Errorf("%s's certificate is bound to %q, want its Node's UID %s", node, got, n.UID)
		}
	}
	caSecret, err := cs.CoreV1().Secrets("dowse-system").Get(ctx, "dowse-link-ca", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	published := func() error {
		cm, err := cs.CoreV1().ConfigMaps("dowse-system").Get(ctx, "dowse-link-ca-cert", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if cm.Data["ca.crt"] != string(caSecret.Data["tls.crt"]) || len(cm.Data) != 1 {
			return fmt.Errorf("configmap dowse-link-ca-cert holds %v, want the CA's certificate alone", cm.Data)
		}
		return nil
	}
	testwait.For(t, 30*time.Second, published)
	if err := cs.CoreV1().ConfigMaps("dowse-system").Delete(ctx, "dowse-link-ca-cert", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 30*time.Second, published)

	t.Run("RestartReusesCredentials", func(t *testing.T) {
		wsAgent.Stop()
		testwait.For(t, 30*time.Second, func() error { return metricIs(ctlMetrics, "dowse_cloudhub_connected_nodes", 1) })
		// The token is spent; the stored certificate is what connects.
		agent("edge-ws", "websocket", wsTok)
		testwait.For(t, 30*time.Second, func() error { return metricIs(ctlMetrics, "dowse_cloudhub_connected_nodes", 2) })
	})
	t.Run("MembershipFollowsInstances", func(t *testing.T) {
		// Devices found on edge-ws become Instances; the cloud tells edge-ws
		// its new set over the link.
		start("dowse-debug-echo-discovery", "debug-echo", "--state-dir", filepath.Join(dir, "edge-ws"))
		sch, err := scheme.New()
		if err != nil {
			t.Fatal(err)
		}
		cl, err := client.New(cp.Config, client.Options{Scheme: sch})
		if err != nil {
			t.Fatal(err)
		}
		cfg := &v1alpha1.Configuration{ObjectMeta: metav1.ObjectMeta{Name: "echo", Namespace: "default"}}
		cfg.Spec.DiscoveryHandler.Name = "debug-echo"
		cfg.Spec.DiscoveryHandler.DiscoveryDetails = &apiextensionsv1.JSON{Raw: []byte(`{"descriptions":["a","b"]}`)}
		if err := cl.Create(ctx, cfg); err != nil {
			t.Fatal(err)
		}
		told := regexp.MustCompile(`device membership from the cloud.*"devices":\s*2`)
		testwait.For(t, 30*time.Second, func() error {
			logs, _ := filepath.Glob(filepath.Join(dir, "edge-ws-*.log"))
			for _, l := range logs {
				if b, _ := os.ReadFile(l); told.Match(b) {
					return nil
				}
			}
			return errors.New("edge-ws was not told of its 2 devices")
		})
	})
	t.Run("TokenOfAnotherNodeRefused", func(t *testing.T) {
		spare := token("edge-spare")
		p := agent("edge-thief", "websocket", spare)
		testwait.For(t, 30*time.Second, func() error {
			return metricIs(ctlMetrics, `dowse_linkauth_requests_refused_total{reason="wrong_node",request="bootstrap"}`, 1)
		})
		time.Sleep(time.Second)
		if p.Exited() {
			t.Fatal("the agent stopped: a refused link must leave discovery running")
		}
		if err := metricIs(ctlMetrics, "dowse_cloudhub_connected_nodes", 2); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join(dir, "edge-thief", "link", "node.pem")); !os.IsNotExist(err) {
			t.Fatalf("the refused node stored credentials: %v", err)
		}
	})
	t.Run("DaemonSetAgentJoinsWithServiceAccount", func(t *testing.T) {
		// deploy/agent/agent.yaml's pod: service account dowse-agent, a
		// projected token with audience dowse-link, no per-node token. The
		// API server binds the token to the pod object; no kubelet needed.
		if _, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "edge-ds"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := cs.CoreV1().ServiceAccounts("dowse-system").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "dowse-agent"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		pod, err := cs.CoreV1().Pods("dowse-system").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "dowse-agent-edge-ds"},
			Spec: corev1.PodSpec{ServiceAccountName: "dowse-agent", NodeName: "edge-ds", Containers: []corev1.Container{{Name: "agent", Image: "dowse-agent"}}}},
			metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		tr, err := cs.CoreV1().ServiceAccounts("dowse-system").CreateToken(ctx, "dowse-agent", &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{
			Audiences:      []string{pki.ServiceAccountAudience},
			BoundObjectRef: &authnv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		tokenFile := filepath.Join(dir, "edge-ds-sa-token")
		if err := os.WriteFile(tokenFile, []byte(tr.Status.Token), 0o600); err != nil {
			t.Fatal(err)
		}
		// The CA pin, without minting a token.
		pin, err := exec.CommandContext(ctx, filepath.Join(procs.BinDir(), "dowsectl"), "ca-hash", "--kubeconfig", kubeconfig).CombinedOutput()
		if err != nil {
			t.Fatalf("dowsectl ca-hash: %v: %s", err, pin)
		}
		if got := strings.TrimSpace(string(pin)); got != wsTok.CACertHash {
			t.Fatalf("dowsectl ca-hash printed %q, token create %q", got, wsTok.CACertHash)
		}
		agent("edge-ds", "quic", tokenOut{CACertHash: strings.TrimSpace(string(pin))}, tokenFile)
		testwait.For(t, 30*time.Second, func() error { return metricIs(ctlMetrics, "dowse_cloudhub_connected_nodes", 3) })
		testwait.For(t, 10*time.Second, func() error { return metricIs(agentMetrics["edge-ds"], "dowse_edgehub_connected", 1) })
		if _, err := os.Stat(filepath.Join(dir, "edge-ds", "link", "node.pem")); err != nil {
			t.Fatalf("edge-ds stored no credentials: %v", err)
		}
	})
	t.Run("DeletedNodeLeavesTheLink", func(t *testing.T) {
		// Its certificate is still valid for hours; the Node is what counts.
		if err := cs.CoreV1().Nodes().Delete(ctx, "edge-quic", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		testwait.For(t, 30*time.Second, func() error { return metricIs(ctlMetrics, "dowse_cloudhub_connected_nodes", 2) })
		// The agent dials again and is refused, while the others stay.
		testwait.For(t, 30*time.Second, func() error {
			return metricAtLeast(ctlMetrics, `dowse_cloudhub_refused_connections_total{reason="node-not-allowed"}`, 1)
		})
		testwait.For(t, 10*time.Second, func() error { return metricIs(agentMetrics["edge-quic"], "dowse_edgehub_connected", 0) })
		if err := metricIs(ctlMetrics, "dowse_cloudhub_connected_nodes", 2); err != nil {
			t.Fatal(err)
		}
		// A Node made again under the name is another Node: the key of
		// the earlier one (stolen, say) still does not connect.
		if _, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "edge-quic"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		testwait.For(t, 30*time.Second, func() error {
			return metricAtLeast(ctlMetrics, `dowse_cloudhub_refused_connections_total{reason="node-replaced"}`, 1)
		})
		if err := metricIs(agentMetrics["edge-quic"], "dowse_edgehub_connected", 0); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("RemadeNodeRejoinsWithServiceAccount", func(t *testing.T) {
		// A DaemonSet's agent whose Node is made again (a node reinstalled
		// under its name) is refused with its stored certificate, and
		// bootstraps again with its pod's token by itself.
		if err := cs.CoreV1().Nodes().Delete(ctx, "edge-ds", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		testwait.For(t, 30*time.Second, func() error { return metricIs(agentMetrics["edge-ds"], "dowse_edgehub_connected", 0) })
		n, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "edge-ds"}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		testwait.For(t, time.Minute, func() error { return metricIs(agentMetrics["edge-ds"], "dowse_edgehub_connected", 1) })
		b, err := os.ReadFile(filepath.Join(dir, "edge-ds", "link", "node.pem"))
		if err != nil {
			t.Fatal(err)
		}
		block, _ := pem.Decode(b)
		if block == nil {
			t.Fatal("node.pem holds no PEM")
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		if got := pki.NodeUIDFromCert(cert); got != string(n.UID) {
			t.Fatalf("edge-ds's new certificate is bound to %q, want the new Node's UID %s", got, n.UID)
		}
	})
}

// metricIs checks that the metrics endpoint on port shows the sample
// (name with labels, as Prometheus prints it) at want.
func metricIs(port int, sample string, want float64) error {
	return metricCheck(port, sample, want, func(v float64) bool { return v == want })
}

// metricAtLeast is metricIs for a counter that may have gone past min.
func metricAtLeast(port int, sample string, min float64) error {
	return metricCheck(port, sample, min, func(v float64) bool { return v >= min })
}

func metricCheck(port int, sample string, want float64, holds func(float64) bool) error {
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", port))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	for _, line := range bytes.Split(body, []byte("\n")) {
		name, value, ok := strings.Cut(string(line), " ")
		if !ok || name != sample {
			continue
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			return err
		}
		if !holds(v) {
			return fmt.Errorf("%s = %v, want %v", sample, v, want)
		}
		return nil
	}
	return fmt.Errorf("no %s on :%d", sample, port)
}
