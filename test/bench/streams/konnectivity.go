package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/dowse-dev/dowse/internal/controller/link/egress"
	"github.com/dowse-dev/dowse/internal/link"
	"github.com/dowse-dev/dowse/internal/link/pki"
)

// The comparison with konnectivity (apiserver-network-proxy, its
// proxy-server and proxy-agent built by make k8s into bin/k8s): the same
// targets reached the way kube-apiserver reaches a node, an HTTP CONNECT
// on a Unix socket, once through the controller's egress and a node's link
// (each transport), once through konnectivity's server and agent (gRPC
// over mutual TLS), all on this machine in the same run.

// connectUDS opens target through the HTTP CONNECT proxy on the Unix
// socket uds, as kube-apiserver's HTTPConnect egress does.
func connectUDS(ctx context.Context, uds, target string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", uds)
	if err != nil {
		return nil, err
	}
	if _, err := fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target); err != nil {
		_ = c.Close()
		return nil, err
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		_ = c.Close()
		return nil, fmt.Errorf("CONNECT %s: %s", target, resp.Status)
	}
	if br.Buffered() > 0 {
		return &readAhead{Conn: c, r: br}, nil
	}
	return c, nil
}

// readAhead is a connection whose first bytes a bufio.Reader holds.
type readAhead struct {
	net.Conn
	r *bufio.Reader
}

func (c *readAhead) Read(p []byte) (int, error) { return c.r.Read(p) }

// closeWrite half-closes c (a Unix socket or the read-ahead around one).
func closeWrite(c net.Conn) error {
	if ra, ok := c.(*readAhead); ok {
		c = ra.Conn
	}
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.New("no half-close")
}

// frontendFigures measures a CONNECT proxy on uds: time to the first byte
// of a new connection (CONNECT, a 4-byte echo), n at once, and one
// stream's bulk throughput each way.
func frontendFigures(ctx context.Context, name, uds string, n, bulk int, echo, sink, source string) error {
	ping := func() (time.Duration, error) {
		start := time.Now()
		c, err := connectUDS(ctx, uds, echo)
		if err != nil {
			return 0, err
		}
		defer c.Close()
		buf := []byte("ping")
		if _, err := c.Write(buf); err != nil {
			return 0, err
		}
		if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
			return 0, fmt.Errorf("ping back %q: %w", buf, err)
		}
		return time.Since(start), nil
	}
	var seq []time.Duration
	for range 50 {
		d, err := ping()
		if err != nil {
			return err
		}
		seq = append(seq, d)
	}
	p50, p99 := percentiles(seq)
	fmt.Printf("%s: a new connection to its first byte back (CONNECT, 4-byte echo), one at a time: p50 %s p99 %s\n", name, p50.Round(time.Microsecond), p99.Round(time.Microsecond))

	lat := make([]time.Duration, n)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	began := time.Now()
	for i := range n {
		wg.Go(func() {
			d, err := ping()
			if err != nil {
				errs <- fmt.Errorf("connection %d: %w", i, err)
				return
			}
			lat[i] = d
		})
	}
	wg.Wait()
	all := time.Since(began)
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	p50, p99 = percentiles(lat)
	fmt.Printf("%s: %d at once, each a ping: all in %s, p50 %s p99 %s\n", name, n, all.Round(time.Millisecond), p50.Round(10*time.Microsecond), p99.Round(10*time.Microsecond))

	for _, dir := range []string{"to the edge", "from the edge"} {
		target := sink
		if dir == "from the edge" {
			target = source
		}
		c, err := connectUDS(ctx, uds, target)
		if err != nil {
			return err
		}
		start := time.Now()
		var moved int64
		if target == sink {
			chunk := make([]byte, 64<<10)
			for left := bulk; left > 0; left -= len(chunk) {
				w, err := c.Write(chunk[:min(left, len(chunk))])
				moved += int64(w)
				if err != nil {
					break
				}
			}
			_ = closeWrite(c)
			_, _ = io.Copy(io.Discard, c) // the sink's end: all taken
		} else if _, err := c.Write([]byte{1}); err == nil { // the source's start
			moved, _ = io.Copy(io.Discard, c)
		}
		took := time.Since(start)
		_ = c.Close()
		if moved != int64(bulk) {
			return fmt.Errorf("%s: bulk %s: %d bytes of %d", name, dir, moved, bulk)
		}
		fmt.Printf("%s: one stream, %d MiB %s: %.1f MiB/s\n", name, bulk>>20, dir, float64(bulk)/(1<<20)/took.Seconds())
	}
	return nil
}

// startEgress serves the controller's egress on a Unix socket in dir for
// node "edge" at 127.0.0.1 (where the targets are), through cl's hub.
func startEgress(ctx context.Context, cl *cloud, dir string) (string, error) {
	scheme := clientgoscheme.Scheme
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "edge"},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}}}}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(node).
		WithIndex(&corev1.Pod{}, "status.podIP", func(o client.Object) []string {
			if p, ok := o.(*corev1.Pod); ok && p.Status.PodIP != "" {
				return []string{p.Status.PodIP}
			}
			return nil
		}).Build()
	uds := filepath.Join(dir, "egress.sock")
	s, err := egress.New(egress.Config{UDS: uds, Nodes: c, Pods: c, Hub: cl.hub, Log: logr.Discard()})
	if err != nil {
		return "", err
	}
	go func() { _ = s.Start(ctx) }()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(uds); err == nil {
			return uds, nil
		}
		if time.Now().After(deadline) {
			return "", errors.New("the egress socket never appeared")
		}
	}
}

// freePort is a TCP port on loopback between 20000 and 49151 that nothing
// listens on (konnectivity refuses ephemeral ports).
func freePort() (int, error) {
	for range 100 {
		p := 20000 + rand.IntN(49151-20000)
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err == nil {
			_ = l.Close()
			return p, nil
		}
	}
	return 0, errors.New("no free port")
}

// konnectivity runs proxy-server (HTTP CONNECT on a Unix socket, agents
// on TCP with mutual TLS) and one proxy-agent from bin (the edge), and
// returns the socket once the server has its agent, and a stop.
func konnectivity(ctx context.Context, bin, dir string, ca *pki.CA) (string, func(), error) {
	srv, err := ca.IssueServer([]string{"127.0.0.1"}, time.Hour)
	if err != nil {
		return "", nil, err
	}
	agent, err := ca.IssueNode("edge", "", time.Hour)
	if err != nil {
		return "", nil, err
	}
	files := map[string][]byte{"ca.crt": ca.CertPEM}
	for prefix, pair := range map[string]tls.Certificate{"konn-server": srv, "konn-agent": agent} {
		certPEM, keyPEM, err := pki.PairPEM(pair)
		if err != nil {
			return "", nil, err
		}
		files[prefix+".crt"], files[prefix+".key"] = certPEM, keyPEM
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			return "", nil, err
		}
	}
	var ports [5]int
	for i := range ports {
		if ports[i], err = freePort(); err != nil {
			return "", nil, err
		}
	}
	uds := filepath.Join(dir, "konnectivity.sock")
	logf, err := os.Create(filepath.Join(dir, "konnectivity.log"))
	if err != nil {
		return "", nil, err
	}
	f := func(name string) string { return filepath.Join(dir, name) }
	server := exec.Command(filepath.Join(bin, "proxy-server"), "--mode=http-connect", "--uds-name="+uds, "--delete-existing-uds-file", "--server-port=0",
		"--cluster-cert="+f("konn-server.crt"), "--cluster-key="+f("konn-server.key"), "--cluster-ca-cert="+f("ca.crt"),
		"--agent-bind-address=127.0.0.1", "--agent-port="+strconv.Itoa(ports[0]), "--admin-bind-address=127.0.0.1", "--admin-port="+strconv.Itoa(ports[1]),
		"--health-bind-address=127.0.0.1", "--health-port="+strconv.Itoa(ports[2]), "--server-count=1")
	agentCmd := exec.Command(filepath.Join(bin, "proxy-agent"), "--proxy-server-host=127.0.0.1", "--proxy-server-port="+strconv.Itoa(ports[0]),
		"--ca-cert="+f("ca.crt"), "--agent-cert="+f("konn-agent.crt"), "--agent-key="+f("konn-agent.key"), "--agent-id=edge",
		"--admin-bind-address=127.0.0.1", "--admin-server-port="+strconv.Itoa(ports[3]), "--health-server-host=127.0.0.1", "--health-server-port="+strconv.Itoa(ports[4]))
	var started []*exec.Cmd
	stop := func() {
		for _, c := range started {
			_ = c.Process.Signal(syscall.SIGTERM)
			done := make(chan struct{})
			go func() { _ = c.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				_ = c.Process.Kill()
				<-done
			}
		}
		_ = logf.Close()
	}
	for _, c := range []*exec.Cmd{server, agentCmd} {
		c.Stdout, c.Stderr = logf, logf
		if err := c.Start(); err != nil {
			stop()
			return "", nil, fmt.Errorf("%s (make k8s builds it): %w", c.Path, err)
		}
		started = append(started, c)
	}
	ready := "http://127.0.0.1:" + strconv.Itoa(ports[2]) + "/readyz"
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, ready, nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			stop()
			return "", nil, fmt.Errorf("konnectivity never ready (its log: %s)", logf.Name())
		}
	}
	return uds, stop, nil
}

// compare measures the egress through each transport's link and
// konnectivity, one after another, in this run.
func compare(ctx context.Context, cl *cloud, dir, konnBin string, ca *pki.CA, transports []string, n, bulk int, echo, sink, source string) error {
	uds, err := startEgress(ctx, cl, dir)
	if err != nil {
		return err
	}
	ws, q := cl.hub.Addrs()
	for _, tr := range transports {
		addr := ws.String()
		if tr == link.QUIC {
			addr = q.String()
		}
		edge, err := startChild("-role", "edge", "-dir", dir, "-hub", addr, "-transport", tr)
		if err != nil {
			return err
		}
		for deadline := time.Now().Add(15 * time.Second); !cl.hub.IsConnected("edge"); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				edge.stop()
				return errors.New("the edge never connected")
			}
		}
		stopProfile := func() {}
		if childProfile != "" {
			if stopProfile, err = startCPUProfile(childProfile + "-hub-" + tr); err != nil {
				edge.stop()
				return err
			}
		}
		err = frontendFigures(ctx, "egress, link over "+tr, uds, n, bulk, echo, sink, source)
		stopProfile()
		edge.stop()
		if err != nil {
			return err
		}
		for deadline := time.Now().Add(15 * time.Second); cl.hub.IsConnected("edge") && time.Now().Before(deadline); {
			time.Sleep(50 * time.Millisecond)
		}
	}
	kuds, stop, err := konnectivity(ctx, konnBin, dir, ca)
	if err != nil {
		return err
	}
	defer stop()
	return frontendFigures(ctx, "konnectivity", kuds, n, bulk, echo, sink, source)
}
