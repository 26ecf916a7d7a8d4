package node

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/dowse-dev/dowse/dowsectl"
	"github.com/dowse-dev/dowse/test/framework/cluster"
	"github.com/dowse-dev/dowse/test/framework/dowse"
	"github.com/dowse-dev/dowse/test/framework/kube"
	"github.com/dowse-dev/dowse/test/framework/procs"
	"github.com/dowse-dev/dowse/test/framework/promtest"
	"github.com/dowse-dev/dowse/test/framework/testwait"
)

// TestKubectlReachesAnEdgeThroughItsLink: the real node in its own network
// namespace drops every connection the machine opens to its kubelet, as a
// node behind NAT would be; the API server sends its cluster egress to
// Dowse's controller (EgressSelectorConfiguration, HTTPConnect on a Unix
// socket). Without the controller, a pod's logs cannot be read; with it,
// and the agent inside the node's namespace holding its link, `kubectl
// logs` (and `logs -f`), the API server's pod proxy, `kubectl exec -i`,
// `kubectl cp` both ways and `kubectl port-forward` reach the node's pods
// over the link, and a client on the
// cloud side reaches the broker through its Service's cloud side (a
// replica that relays over the link, through the one holding it).
// The API server speaks HTTPConnect (the whole test) and konnectivity's
// GRPC (up to port-forward) to the controller's socket, as `dowsectl
// egress-config --uds` tells it to.
func TestKubectlReachesAnEdgeThroughItsLink(t *testing.T) {
	t.Run(dowsectl.ProtocolHTTPConnect, func(t *testing.T) { reachEdgeThroughLink(t, dowsectl.ProtocolHTTPConnect, true) })
	t.Run(dowsectl.ProtocolGRPC, func(t *testing.T) { reachEdgeThroughLink(t, dowsectl.ProtocolGRPC, false) })
}

// reachEdgeThroughLink is TestKubectlReachesAnEdgeThroughItsLink with the
// API server's egress in protocol; full goes on past port-forward to the
// replicas' forwarding, the cloud-side Service, the twin during a bulk
// transfer and a replica's death.
func reachEdgeThroughLink(t *testing.T, protocol string, full bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	c := startClusterWith(t, ctx, cluster.Options{PodNetwork: true, Egress: true, EgressProtocol: protocol},
		[2]string{"./brokers/debug-echo/cmd/dowse-debug-echo-broker", "ghcr.io/dowse-dev/dowse-debug-echo-broker:latest"})
	cs := c.Client
	node, err := cs.CoreV1().Nodes().Get(ctx, c.NodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kubelet := net.JoinHostPort(c.PodNetwork.NodeIP, strconv.Itoa(int(node.Status.DaemonEndpoints.KubeletEndpoint.Port)))
	// The node's pod range, as a cluster's IPAM controller records it.
	patch, _ := json.Marshal(map[string]any{"spec": map[string]any{"podCIDR": c.PodNetwork.PodCIDR, "podCIDRs": []string{c.PodNetwork.PodCIDR}}})
	if _, err := cs.CoreV1().Nodes().Patch(ctx, c.NodeName, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}

	// The node drops what the machine sends its kubelet.
	rule := fmt.Sprintf("table inet dowse_unreachable {\n chain input {\n  type filter hook input priority -10;\n  iifname \"eth0\" tcp dport %d drop\n }\n}\n", node.Status.DaemonEndpoints.KubeletEndpoint.Port)
	name, args := c.PodNetwork.Command("nft", []string{"-f", "-"})
	nft := exec.CommandContext(ctx, name, args...)
	nft.Stdin = strings.NewReader(rule)
	if out, err := nft.CombinedOutput(); err != nil {
		t.Fatalf("nft: %v\n%s", err, out)
	}
	if conn, err := net.DialTimeout("tcp", kubelet, 2*time.Second); err == nil {
		_ = conn.Close()
		t.Fatalf("the machine still reaches the kubelet at %s", kubelet)
	}

	const marker = "DEBUG_ECHO_SITE"
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "behind-nat", Namespace: "default", Labels: map[string]string{"app": "behind-nat"}},
		Spec: corev1.PodSpec{NodeName: c.NodeName, Containers: []corev1.Container{{Name: "broker",
			Image: "ghcr.io/dowse-dev/dowse-debug-echo-broker:latest", ImagePullPolicy: corev1.PullNever,
			Env: []corev1.EnvVar{{Name: marker, Value: "plant-7"}}, Ports: []corev1.ContainerPort{{ContainerPort: 8080}}}}}}
	if _, err := cs.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 2*time.Minute, func() error {
		p, err := cs.CoreV1().Pods("default").Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil || p.Status.Phase != corev1.PodRunning {
			return fmt.Errorf("pod not running (%w)", err)
		}
		return nil
	})
	logs := func() (string, error) {
		b, err := cs.CoreV1().Pods("default").GetLogs(pod.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
		return string(b), err
	}
	// waitLogs waits until the pod's logs are read, with what it logs.
	waitLogs := func() {
		t.Helper()
		testwait.For(t, time.Minute, func() error {
			out, err := logs()
			if err != nil {
				return err
			}
			if !strings.Contains(out, "plant-7") {
				return fmt.Errorf("the pod's logs lack its environment: %q", out)
			}
			return nil
		})
	}
	if out, err := logs(); err == nil {
		t.Fatalf("the pod's logs were read with nothing serving the egress: %q", out)
	} else {
		t.Logf("without the egress: %v", err)
	}

	// Dowse: the controller on the machine, serving the egress; the agent
	// in the node's namespace.
	if err := kube.InstallCRDs(c.Config); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "dowse-system"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	host := c.PodNetwork.HostIP
	// Two replicas: a serves the API server's egress and b takes the agent
	// later, each taking the other's forwards.
	// Cloud-side Services: a relays them on the node network's host
	// address; both give ports when they lead.
	cloudPort, err := procs.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	cloudPorts := fmt.Sprintf("%d-%d", cloudPort, cloudPort)
	a := startReplica(t, dir, c.Kubeconfig, host, "a", "--egress-uds", c.EgressUDS, "--egress-protocol", protocol,
		"--cloud-service-ports", cloudPorts, "--cloud-service-address", host)
	b := startReplica(t, dir, c.Kubeconfig, host, "b", "--cloud-service-ports", cloudPorts)
	metrics := a.metrics
	var tok struct{ Token, CACertHash string }
	testwait.For(t, time.Minute, func() error {
		b, err := exec.CommandContext(ctx, filepath.Join(procs.BinDir(), "dowsectl"), "token", "create",
			"--kubeconfig", c.Kubeconfig, "--node", c.NodeName, "--ttl", "10m", "--output", "json").CombinedOutput()
		if err != nil {
			return fmt.Errorf("%w: %s", err, b)
		}
		return json.Unmarshal(b, &tok)
	})
	describeNode := func() string {
		out, err := exec.CommandContext(ctx, filepath.Join(procs.BinDir(), "dowsectl"), "describe", "node", c.NodeName, "--kubeconfig", c.Kubeconfig).CombinedOutput()
		if err != nil {
			t.Fatalf("dowsectl describe node: %v\n%s", err, out)
		}
		return string(out)
	}
	if out := describeNode(); !strings.Contains(out, "Reached:   directly") {
		t.Errorf("before its link, describe node says:\n%s", out)
	}
	agent := startEdgeAgent(t, c, dir, a, tok.CACertHash, tok.Token)
	waitMetric(t, ctx, metrics, "dowse_cloudhub_connected_nodes 1")
	testwait.For(t, 30*time.Second, func() error {
		if out := describeNode(); !strings.Contains(out, "Reached:   through its link, via replica") {
			return fmt.Errorf("with its link, describe node says:\n%s", out)
		}
		return nil
	})

	// kubectl logs, through the link.
	waitLogs()
	// The API server's pod proxy reaches the broker on the pod's address.
	testwait.For(t, 30*time.Second, func() error {
		b, err := cs.CoreV1().Pods("default").ProxyGet("http", pod.Name, "8080", "/", nil).DoRaw(ctx)
		if err != nil {
			return err
		}
		if !strings.Contains(string(b), "plant-7") {
			return fmt.Errorf("the broker answered %q", b)
		}
		return nil
	})
	// kubectl exec with stdin, and port-forward, through the link.
	kubectl := func(args ...string) *exec.Cmd {
		return exec.CommandContext(ctx, filepath.Join(kube.BinDir(), "kubectl"), append([]string{"--kubeconfig", c.Kubeconfig}, args...)...)
	}
	// Its tar is the probe's, for kubectl cp.
	probe := probePod("exec-target", "link:/bin/tar", "sleep:1h")
	probe.Spec.HostNetwork, probe.Spec.NodeName = false, c.NodeName
	if _, err := cs.CoreV1().Pods("default").Create(ctx, probe, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPodPhase(t, ctx, cs, probe.Name, corev1.PodRunning)
	const said = "typed at the cloud, echoed on the edge"
	execCmd := kubectl("exec", "-i", probe.Name, "--", "/dowse-node-probe", "cat:")
	execCmd.Stdin = strings.NewReader(said)
	if out, err := execCmd.Output(); err != nil || string(out) != said {
		t.Fatalf("kubectl exec -i: %q, %v", out, err)
	}
	// kubectl cp, to the pod and back (a tar through exec each way), every
	// byte as sent.
	upload := make([]byte, 3<<20+17)
	if _, err := io.ReadFull(rand.NewChaCha8([32]byte{'c', 'p'}), upload); err != nil {
		t.Fatal(err)
	}
	sent, back := filepath.Join(dir, "upload.bin"), filepath.Join(dir, "back.bin")
	if err := os.WriteFile(sent, upload, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := kubectl("cp", sent, probe.Name+":/tmp/upload.bin").CombinedOutput(); err != nil {
		t.Fatalf("kubectl cp to the pod: %v\n%s", err, out)
	}
	if out, err := kubectl("cp", probe.Name+":/tmp/upload.bin", back).CombinedOutput(); err != nil {
		t.Fatalf("kubectl cp from the pod: %v\n%s", err, out)
	}
	if got, err := os.ReadFile(back); err != nil || !bytes.Equal(got, upload) {
		t.Fatalf("kubectl cp there and back: %d bytes, %v; want the %d sent", len(got), err, len(upload))
	}
	// kubectl logs -f follows: lines the pod prints after it began arrive
	// through the same stream.
	ticker := probePod("ticker", "ticks:300ms")
	ticker.Spec.HostNetwork, ticker.Spec.NodeName = false, c.NodeName
	if _, err := cs.CoreV1().Pods("default").Create(ctx, ticker, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPodPhase(t, ctx, cs, ticker.Name, corev1.PodRunning)
	follow := kubectl("logs", "-f", "--tail=1", ticker.Name) // from its latest line on
	followed, err := follow.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := follow.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(followed)
	first, last := -1, -1
	for lines.Scan() {
		var n int
		if _, err := fmt.Sscanf(lines.Text(), "tick %d", &n); err != nil {
			t.Fatalf("kubectl logs -f: %q", lines.Text())
		}
		if first < 0 {
			first = n
		}
		if last = n; n >= first+3 { // logged since kubectl began following
			break
		}
	}
	if first < 0 || last < first+3 {
		t.Fatalf("kubectl logs -f ended (%v) at tick %d, from tick %d", lines.Err(), last, first)
	}
	_ = follow.Process.Kill()
	_ = follow.Wait()

	local := portForward(t, kubectl("port-forward", "pod/"+pod.Name, ":8080"))
	resp, err := http.Get("http://" + local + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if !strings.Contains(string(body), "plant-7") {
		t.Fatalf("through kubectl port-forward the broker answered %q", body)
	}

	samples, err := promtest.Scrape(fmt.Sprintf("http://127.0.0.1:%d/metrics", metrics), "dowse_egress_connections_total")
	if err != nil {
		t.Fatal(err)
	}
	if samples[`dowse_egress_connections_total{route="link"}`] < 4 {
		t.Errorf("egress connections %v: want the logs, the proxy, exec and port-forward over the link", samples)
	}
	t.Logf("egress (%s): %v", protocol, samples)
	if !full {
		return
	}

	// The agent moves to replica b (its stored credentials, b's address):
	// a no longer holds the node's session and forwards to b.
	agent.Stop()
	agent = startEdgeAgent(t, c, dir, b, tok.CACertHash, "")
	waitMetric(t, ctx, b.metrics, "dowse_cloudhub_connected_nodes 1")
	waitMetric(t, ctx, a.metrics, "dowse_cloudhub_connected_nodes 0")
	waitLogs()
	for _, want := range []struct {
		r     replica
		route string
	}{{a, "forwarded"}, {b, "link"}} {
		got, err := promtest.Scrape(fmt.Sprintf("http://127.0.0.1:%d/metrics", want.r.metrics), "dowse_egress_connections_total")
		if err != nil {
			t.Fatal(err)
		}
		if got[`dowse_egress_connections_total{route="`+want.route+`"}`] < 1 {
			t.Errorf("replica on port %d: egress connections %v, want some %s", want.r.ws, got, want.route)
		}
	}

	// A cloud-side client reaches the broker through its Service's cloud
	// side: its endpoint is replica a (b gives ports when it leads, and
	// relays none), which forwards to b, holding the node, and b over the
	// link.
	reach := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "behind-nat", Namespace: "default", Labels: map[string]string{"dowse.dev/reach-from-cloud": "true"}},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "behind-nat"}, Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}}}}
	if _, err := cs.CoreV1().Services("default").Create(ctx, reach, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var endpoints []string
	testwait.For(t, time.Minute, func() error {
		sl, err := cs.DiscoveryV1().EndpointSlices("default").Get(ctx, "behind-nat-cloud", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if len(sl.Endpoints) != 1 || sl.Endpoints[0].Addresses[0] != host || len(sl.Ports) != 1 || sl.Ports[0].Port == nil || *sl.Ports[0].Port != int32(cloudPort) {
			return fmt.Errorf("the cloud side's endpoints %+v ports %+v: want replica a (%s) at %d", sl.Endpoints, sl.Ports, host, cloudPort)
		}
		endpoints = []string{sl.Endpoints[0].Addresses[0]}
		return nil
	})
	if cloudSvc, err := cs.CoreV1().Services("default").Get(ctx, "behind-nat-cloud", metav1.GetOptions{}); err != nil ||
		len(cloudSvc.Spec.Ports) != 1 || cloudSvc.Spec.Ports[0].Port != 80 || cloudSvc.Spec.Ports[0].TargetPort.IntVal != int32(cloudPort) {
		t.Fatalf("the cloud-side Service: %+v, %v", cloudSvc, err)
	}
	for _, ep := range endpoints {
		testwait.For(t, 30*time.Second, func() error {
			resp, err := http.Get("http://" + net.JoinHostPort(ep, strconv.Itoa(cloudPort)) + "/")
			if err != nil {
				return err
			}
			body, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if !strings.Contains(string(body), "plant-7") {
				return fmt.Errorf("through the cloud side at %s the broker answered %q", ep, body)
			}
			return nil
		})
	}
	if got, err := promtest.Scrape(fmt.Sprintf("http://127.0.0.1:%d/metrics", a.metrics), "dowse_cloud_services_connections_total"); err != nil {
		t.Fatal(err)
	} else if got[`dowse_cloud_services_connections_total{result="relayed"}`] < 1 {
		t.Errorf("replica a relayed no cloud-side connection: %v", got)
	}

	// A Modbus twin next to the node, over the same link: its round trip
	// idle, then while 100 MiB move through a port-forward.
	twin := startLinkTwin(t, ctx, c, filepath.Join(dir, "agent"))
	idle, err := twin.roundTrips(ctx, 10, nil)
	if err != nil {
		t.Fatal(err)
	}

	// 100 MiB through kubectl port-forward, forwarded to b and over the
	// link, every byte as sent.
	bulk := probePod("bulk", "serve:8081")
	bulk.Spec.HostNetwork, bulk.Spec.NodeName = false, c.NodeName
	if _, err := cs.CoreV1().Pods("default").Create(ctx, bulk, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPodPhase(t, ctx, cs, bulk.Name, corev1.PodRunning)
	local = portForward(t, kubectl("port-forward", "pod/"+bulk.Name, ":8081"))
	const size = 100 << 20
	want := sha256.New()
	if _, err := io.CopyN(want, rand.NewChaCha8([32]byte{'d', 'o', 'w', 's', 'e'}), size); err != nil { // the probe's Bytes
		t.Fatal(err)
	}
	testwait.For(t, 30*time.Second, func() error { // until the probe listens
		resp, err := http.Get("http://" + local + "/bytes?n=1")
		if err != nil {
			return err
		}
		_, err = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return err
	})
	stop := make(chan struct{})
	busy := make(chan []time.Duration, 1)
	busyErr := make(chan error, 1)
	go func() {
		took, err := twin.roundTrips(ctx, 0, stop)
		busy <- took
		busyErr <- err
	}()
	transferBegan := time.Now()
	resp, err = http.Get("http://" + local + "/bytes?n=" + strconv.Itoa(size))
	if err != nil {
		t.Fatal(err)
	}
	got := sha256.New()
	n, err := io.Copy(got, resp.Body)
	_ = resp.Body.Close()
	moved := time.Since(transferBegan)
	close(stop)
	if err != nil || n != size {
		t.Fatalf("%d bytes of %d through port-forward (%v)", n, size, err)
	}
	if !bytes.Equal(got.Sum(nil), want.Sum(nil)) {
		t.Fatal("the 100 MiB arrived changed")
	}
	during := <-busy
	if err := <-busyErr; err != nil {
		t.Fatal(err)
	}
	// Twins go ahead of stream data: round trips complete while the
	// transfer moves, not after it.
	if len(during) < 1 {
		t.Errorf("no twin round trip completed during the %v transfer: the twin waited behind the stream", moved)
	}
	slices.Sort(idle)
	slices.Sort(during)
	if len(during) > 0 {
		t.Logf("FIGURE: 100 MiB through port-forward, replica a, replica b and the link in %v (%.0f MiB/s); Modbus twin round trip (desired in Device.spec -> reported and observed in Device.status, over the same link) idle p50 %v max %v (%d), during the transfer p50 %v max %v (%d): busy ÷ idle %.2f",
			moved.Round(time.Millisecond), float64(size>>20)/moved.Seconds(), idle[len(idle)/2].Round(time.Millisecond), idle[len(idle)-1].Round(time.Millisecond), len(idle),
			during[len(during)/2].Round(time.Millisecond), during[len(during)-1].Round(time.Millisecond), len(during), float64(during[len(during)/2])/float64(idle[len(idle)/2]))
	}

	// b, holding the node, is killed during the port-forward: the
	// forwarded stream fails within seconds, never hangs; once the edge is
	// on a again (as the link's Service would send it) logs are read
	// through a.
	b.proc.Kill()
	killed := time.Now()
	client := &http.Client{Timeout: 30 * time.Second}
	if resp, err := client.Get("http://" + local + "/bytes?n=1024"); err == nil {
		_, err = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if err == nil && resp.StatusCode == http.StatusOK {
			t.Fatal("a port-forward through the killed replica still answered")
		}
	}
	t.Logf("the port-forward through the killed replica failed after %v", time.Since(killed).Round(time.Millisecond))
	agent.Stop()
	startEdgeAgent(t, c, dir, a, tok.CACertHash, "")
	waitMetric(t, ctx, a.metrics, "dowse_cloudhub_connected_nodes 1")
	waitLogs()
}

// portForward starts kubectl port-forward and returns the local address it
// forwards from.
func portForward(t *testing.T, pf *exec.Cmd) string {
	t.Helper()
	out, err := pf.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := pf.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pf.Process.Kill(); _ = pf.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n') // Forwarding from 127.0.0.1:PORT -> 8080
	local, _, found := strings.Cut(strings.TrimPrefix(strings.TrimSpace(line), "Forwarding from "), " ->")
	if err != nil || !found {
		t.Fatalf("kubectl port-forward said %q (%v)", line, err)
	}
	return local
}

// replica is a controller replica run on the machine, serving the link on
// host and the egress's replica-to-replica forwards.
type replica struct {
	metrics, ws, auth int
	proc              *procs.Proc
}

func startReplica(t *testing.T, dir, kubeconfig, host, name string, args ...string) replica {
	t.Helper()
	ports := make([]int, 4)
	for i := range ports {
		var err error
		if ports[i], err = procs.FreePort(); err != nil {
			t.Fatal(err)
		}
	}
	r := replica{metrics: ports[0], ws: ports[1], auth: ports[2]}
	at := func(port int) string { return net.JoinHostPort(host, strconv.Itoa(port)) }
	r.proc = dowse.Controller{Kubeconfig: kubeconfig, Metrics: r.metrics, Link: &dowse.Link{WebSocket: r.ws, Auth: r.auth, Heartbeat: time.Second},
		Args: append([]string{"--link-hosts", host, "--link-websocket-address", at(r.ws), "--link-auth-bind-address", at(r.auth),
			"--egress-peer-address", at(ports[3]), "--egress-peer-advertise", at(ports[3])}, args...)}.StartLogged(t, dir, "controller-"+name)
	return r
}

// startEdgeAgent runs the agent in the node's network namespace, joining
// r's link (with token the first time; with its stored credentials after).
func startEdgeAgent(t *testing.T, c *cluster.Cluster, dir string, r replica, caHash, token string) *procs.Proc {
	t.Helper()
	host := c.PodNetwork.HostIP
	agent := dowse.Agent{Kubeconfig: c.Kubeconfig, Node: c.NodeName, StateDir: filepath.Join(dir, "agent"),
		Link: &dowse.AgentLink{Server: net.JoinHostPort(host, strconv.Itoa(r.ws)), Transport: "websocket", Heartbeat: time.Second,
			AuthURL: "https://" + net.JoinHostPort(host, strconv.Itoa(r.auth)), CACertHash: caHash, BootstrapToken: token}}
	logf, err := os.OpenFile(filepath.Join(dir, "agent.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	name, args := c.PodNetwork.Command(filepath.Join(procs.BinDir(), "dowse-agent"), agent.Flags())
	p, err := procs.Run("dowse-agent", name, args, procs.Options{Stdout: logf, Stderr: logf, DieWithCaller: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Stop()
		_ = logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("agent log:\n%s", b)
		}
	})
	return p
}
