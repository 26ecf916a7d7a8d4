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
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	konnectivity "sigs.k8s.io/apiserver-network-proxy/konnectivity-client/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/dowse-dev/dowse/internal/agent/edgehub"
	"github.com/dowse-dev/dowse/internal/agent/edgereach"
	"github.com/dowse-dev/dowse/internal/controller/link/cloudhub"
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

// egressToEdge is a hub, edge-a connected to it over TLS with its kubelet
// at a listener of the test's, and the egress on a Unix socket.
type egressToEdge struct {
	hub                         *hubRun
	sock                        string
	egressReg, edgeReg, hubRegs prometheus.Gatherer
}

func startEgressToEdge(t *testing.T, kl net.Listener, protocol string, tweak ...func(*cloudhub.Config)) *egressToEdge {
	t.Helper()
	c := newCluster(t)
	logs := &logBuf{}
	hub := startHub(t, c, "127.0.0.1:0", "", newRecorder(), logs, tweak...)
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
	eg, err := egress.New(egress.Config{UDS: sock, Protocol: protocol, Nodes: objects, Pods: objects, Hub: hub.hub, Registerer: egressReg, Log: logs.logger()})
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
	return &egressToEdge{hub: hub, sock: sock, egressReg: egressReg, edgeReg: edgeReg, hubRegs: hub.reg}
}

// TestEgressReachesANodeThroughItsLink: the API server's egress (HTTP
// CONNECT on a Unix socket, as kube-apiserver's EgressSelectorConfiguration
// sends it) reaches a node's kubelet port over the node's link, through
// the real hub and edgehub over TLS, and the edge's own policy refuses a
// port of the node that is not its kubelet's; a destination that is no
// node is dialled from the cloud side.
func TestEgressReachesANodeThroughItsLink(t *testing.T) {
	kubelet := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "kubelet of edge-a") }), ReadHeaderTimeout: 5 * time.Second}
	kl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = kubelet.Serve(kl) }()
	t.Cleanup(func() { _ = kubelet.Close() })
	e := startEgressToEdge(t, kl, egress.HTTPConnect)
	sock, egressReg, edgeReg := e.sock, e.egressReg, e.edgeReg

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

// TestEgressBoundsStreamsPerNode: a node's link carries at most the hub's
// MaxStreamsPerNode streams at once; one more CONNECT is answered 503
// naming the node and the bound, and counted; once a stream ends a new
// one opens. The node's streams, refusals and bytes each way are counted
// under its name.
func TestEgressBoundsStreamsPerNode(t *testing.T) {
	// edge-a's "kubelet" echoes each connection until its end of stream.
	kl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = kl.Close() })
	go func() {
		for {
			c, err := kl.Accept()
			if err != nil {
				return
			}
			go func() {
				_, _ = io.Copy(c, c)
				_ = c.(*net.TCPConn).CloseWrite()
			}()
		}
	}()
	e := startEgressToEdge(t, kl, egress.HTTPConnect, func(cfg *cloudhub.Config) { cfg.MaxStreamsPerNode = 2 })
	echo := func(c net.Conn, br *bufio.Reader, msg string) {
		t.Helper()
		if _, err := io.WriteString(c, msg); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(br, got); err != nil || string(got) != msg {
			t.Fatalf("echo through the link: %q, %v; want %q", got, err, msg)
		}
	}
	target := kl.Addr().String()
	var tunnels []net.Conn
	for i := range 2 {
		c, br, refused := connect(t, e.sock, target)
		if refused != "" {
			t.Fatalf("stream %d of a bound of 2 refused: %s", i+1, refused)
		}
		echo(c, br, fmt.Sprintf("stream %d through edge-a's link", i+1)) // 30 bytes each way
		tunnels = append(tunnels, c)
	}

	_, _, refused := connect(t, e.sock, target)
	for _, want := range []string{"503", "node edge-a", "--max-streams-per-node", "2 open"} {
		if !strings.Contains(refused, want) {
			t.Fatalf("a third stream with a bound of 2: %q, want it refused with %q", refused, want)
		}
	}
	node := map[string]string{"node": "edge-a"}
	expectCount(t, e.hubRegs, "dowse_cloudhub_node_streams_open", node, 2)
	expectCount(t, e.hubRegs, "dowse_cloudhub_node_streams_opened_total", node, 2)
	expectCount(t, e.hubRegs, "dowse_cloudhub_node_streams_refused_total", map[string]string{"node": "edge-a", "reason": "bound"}, 1)
	expectCount(t, e.hubRegs, "dowse_cloudhub_node_streams_refused_total", map[string]string{"node": "edge-a", "reason": "edge"}, 0)
	expectCount(t, e.hubRegs, "dowse_cloudhub_node_stream_bytes_total", map[string]string{"node": "edge-a", "direction": "out"}, 60)
	expectCount(t, e.hubRegs, "dowse_cloudhub_node_stream_bytes_total", map[string]string{"node": "edge-a", "direction": "in"}, 60)
	expectCount(t, e.egressReg, "dowse_egress_connections_total", map[string]string{"route": "refused"}, 1)

	// One ends (both ways): a new stream fits again.
	_ = tunnels[0].Close()
	waitFor(t, 10*time.Second, "the closed stream forgotten", func() error {
		if n := promtest.Sum(t, e.hubRegs, "dowse_cloudhub_node_streams_open", node); n != 1 {
			return fmt.Errorf("%v streams open", n)
		}
		return nil
	})
	c, br, refused := connect(t, e.sock, target)
	if refused != "" {
		t.Fatalf("a stream after one ended: %s", refused)
	}
	echo(c, br, "again")
	expectCount(t, e.hubRegs, "dowse_cloudhub_node_streams_opened_total", node, 3)
	expectCount(t, e.hubRegs, "dowse_cloudhub_node_streams_reset_total", node, 0)

	// The edge's refusal (a port of the node not its kubelet's) is the
	// edge's, not the bound's.
	_ = c.Close()
	waitFor(t, 10*time.Second, "the closed stream forgotten", func() error {
		if n := promtest.Sum(t, e.hubRegs, "dowse_cloudhub_node_streams_open", node); n != 1 {
			return fmt.Errorf("%v streams open", n)
		}
		return nil
	})
	if _, _, refused := connect(t, e.sock, "127.0.0.1:22"); !strings.Contains(refused, "502") {
		t.Fatalf("CONNECT to edge-a's port 22: %q, want the edge's refusal", refused)
	}
	expectCount(t, e.hubRegs, "dowse_cloudhub_node_streams_refused_total", map[string]string{"node": "edge-a", "reason": "edge"}, 1)
	expectCount(t, e.hubRegs, "dowse_cloudhub_node_streams_reset_total", node, 1)
}

// TestEgressOverGRPC: the egress in GRPC mode, dialled with
// konnectivity's own client as kube-apiserver's GRPC egress does (a
// single-use tunnel per connection over the Unix socket), reaches a
// node's kubelet over its link; the edge's refusal comes back as the
// dial's error, and the link's bound refuses naming the node.
func TestEgressOverGRPC(t *testing.T) {
	kubelet := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "kubelet of edge-a") }), ReadHeaderTimeout: 5 * time.Second}
	kl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = kubelet.Serve(kl) }()
	t.Cleanup(func() { _ = kubelet.Close() })
	e := startEgressToEdge(t, kl, egress.GRPC, func(cfg *cloudhub.Config) { cfg.MaxStreamsPerNode = 1 })
	dial := func(target string) (net.Conn, error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		tunnel, err := konnectivity.CreateSingleUseGrpcTunnelWithContext(ctx, context.Background(), e.sock,
			grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", e.sock)
			}), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return nil, err
		}
		return tunnel.DialContext(ctx, "tcp", target)
	}
	// Twice: each connection is a tunnel of its own, closed after.
	for i := range 2 {
		c, err := dial(kl.Addr().String())
		if err != nil {
			t.Fatalf("connection %d through the GRPC egress: %v", i+1, err)
		}
		if body := get(t, c, bufio.NewReader(c)); body != "kubelet of edge-a" {
			t.Fatalf("through the GRPC egress and the link: %q", body)
		}
		_ = c.Close()
		waitFor(t, 10*time.Second, "the stream forgotten", func() error {
			if n := promtest.Sum(t, e.hubRegs, "dowse_cloudhub_node_streams_open", map[string]string{"node": "edge-a"}); n != 0 {
				return fmt.Errorf("%v streams open", n)
			}
			return nil
		})
	}
	expectCount(t, e.egressReg, "dowse_egress_connections_total", map[string]string{"route": "link"}, 2)

	if _, err := dial("127.0.0.1:22"); err == nil || !strings.Contains(err.Error(), "only port reachable is its kubelet's") {
		t.Fatalf("a GRPC dial to edge-a's port 22: %v, want the edge's refusal", err)
	}
	// One stream held: a second is refused at the bound of 1.
	held, err := dial(kl.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if _, err := dial(kl.Addr().String()); err == nil || !strings.Contains(err.Error(), "node edge-a") || !strings.Contains(err.Error(), "--max-streams-per-node") {
		t.Fatalf("a second stream with a bound of 1: %v, want the bound's refusal", err)
	}
	expectCount(t, e.egressReg, "dowse_egress_connections_total", map[string]string{"route": "refused"}, 2)
}
