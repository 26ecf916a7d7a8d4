package link_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/dowse-dev/dowse/internal/agent/edgehub"
	"github.com/dowse-dev/dowse/internal/agent/edgereach"
	"github.com/dowse-dev/dowse/internal/controller/link/egress"
	"github.com/dowse-dev/dowse/internal/link"
	"github.com/dowse-dev/dowse/test/framework/promtest"
)

// connect asks the egress on sock for target and returns the tunnel, or
// the refusal's status line and body.
func connect(t *testing.T, sock, target string) (net.Conn, *bufio.Reader, string) {
	t.Helper()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if _, err := fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return nil, nil, resp.Status + ": " + string(b)
	}
	return c, br, ""
}

// get sends a GET over a tunnel and returns the body.
func get(t *testing.T, c net.Conn, br *bufio.Reader) string {
	t.Helper()
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: kubelet\r\nConnection: close\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestEgressReachesANodeThroughItsLink: the API server's egress (HTTP
// CONNECT on a Unix socket, as kube-apiserver's EgressSelectorConfiguration
// sends it) reaches a node's kubelet port over the node's link, through
// the real hub and edgehub over TLS, and the edge's own policy refuses a
// port of the node that is not its kubelet's; a destination that is no
// node is dialled from the cloud side.
func TestEgressReachesANodeThroughItsLink(t *testing.T) {
	c := newCluster(t)
	logs := &logBuf{}
	hub := startHub(t, c, "127.0.0.1:0", "", newRecorder(), logs)

	kubelet := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "kubelet of edge-a") }), ReadHeaderTimeout: 5 * time.Second}
	kl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = kubelet.Serve(kl) }()
	t.Cleanup(func() { _ = kubelet.Close() })
	kubeletPort, _ := strconv.Atoi(strings.TrimPrefix(kl.Addr().String(), "127.0.0.1:"))

	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "edge-a"},
		Spec: corev1.NodeSpec{PodCIDRs: []string{"10.244.7.0/24"}},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}},
			DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: int32(kubeletPort)}}}}
	// The API server selects pods by status.podIP; the fake, by an index.
	objects := fake.NewClientBuilder().WithObjects(node).WithIndex(&corev1.Pod{}, "status.podIP", func(o client.Object) []string {
		return []string{o.(*corev1.Pod).Status.PodIP}
	}).Build()

	edgeReg := prometheus.NewRegistry()
	reach := edgereach.New("edge-a", objects, edgeReg)
	d, err := link.NewDialer(link.WebSocket, hub.addr(link.WebSocket), c.clientTLS(t, c.ca, "edge-a"))
	if err != nil {
		t.Fatal(err)
	}
	startEdge(t, "edge-a", d, t.TempDir(), newRecorder(), logs, func(cfg *edgehub.Config) { cfg.Reach = reach.Dial })
	waitFor(t, 10*time.Second, "edge-a connected", func() error {
		if !hub.hub.IsConnected("edge-a") {
			return fmt.Errorf("not connected")
		}
		return nil
	})

	sock := filepath.Join(t.TempDir(), "egress.sock")
	egressReg := prometheus.NewRegistry()
	eg, err := egress.New(egress.Config{UDS: sock, Nodes: objects, Pods: objects, Hub: hub.hub, Registerer: egressReg, Log: logs.logger()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- eg.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	waitFor(t, 10*time.Second, "the egress socket", func() error {
		c, err := net.Dial("unix", sock)
		if err == nil {
			_ = c.Close()
		}
		return err
	})

	tunnel, br, refused := connect(t, sock, kl.Addr().String())
	if refused != "" {
		t.Fatalf("CONNECT to edge-a's kubelet refused: %s", refused)
	}
	if body := get(t, tunnel, br); body != "kubelet of edge-a" {
		t.Fatalf("through the link: %q", body)
	}
	expectCount(t, egressReg, "dowse_egress_connections_total", map[string]string{"route": "link"}, 1)
	expectCount(t, edgeReg, "dowse_edgehub_streams_opened_total", nil, 1)

	// The node's address, another port: the edge refuses, saying why.
	_, _, refused = connect(t, sock, "127.0.0.1:22")
	if !strings.Contains(refused, "502") || !strings.Contains(refused, "only port reachable is its kubelet's") {
		t.Fatalf("CONNECT to edge-a's port 22: %q, want the edge's refusal", refused)
	}
	expectCount(t, edgeReg, "dowse_edgehub_streams_refused_total", map[string]string{"reason": "node-port"}, 1)

	// No node's: dialled from here.
	other := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "a webhook") }), ReadHeaderTimeout: 5 * time.Second}
	ol, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = other.Serve(ol) }()
	t.Cleanup(func() { _ = other.Close() })
	tunnel, br, refused = connect(t, sock, ol.Addr().String())
	if refused != "" {
		t.Fatalf("CONNECT to a webhook: %s", refused)
	}
	if body := get(t, tunnel, br); body != "a webhook" {
		t.Fatalf("direct: %q", body)
	}
	expectCount(t, egressReg, "dowse_egress_connections_total", map[string]string{"route": "direct"}, 1)
}

func expectCount(t *testing.T, g prometheus.Gatherer, name string, labels map[string]string, want float64) {
	t.Helper()
	if got := promtest.Sum(t, g, name, labels); got != want {
		t.Errorf("%s%v = %v, want %v", name, labels, got, want)
	}
}
