// Command streams measures the byte streams the cloud opens through one
// edge's link (kubectl logs, exec, port-forward and cloud-side Services
// ride them), with the real cloudhub and edgehub over TLS on loopback, and
// prints:
//   - 1,000 streams opened at once through one node's link, each a small
//     round trip: per-stream latency (open and first answer) p50/p99, and,
//     with all of them open and idle, the memory each holds on the cloud
//     side (hub and the stream objects its caller holds) and on the edge
//     (edgehub and its dials), measured apart;
//   - 1,000 streams at once each echoing -bytes through the edge:
//     throughput each way, per-stream latency p50/p99;
//   - a twin's round trip (a desired value to the edge, its reported value
//     back) idle, then while a -bulk transfer runs over a stream on the
//     same link, both directions in turn; the ratio busy/idle is the cost
//     of bulk traffic to twins (twins go first: the goal is at most 2).
//
// Three processes: this one is the cloud (hub), children run the edge
// (this binary with -role edge) and the targets the edge dials (-role
// target: echo, sink, source), so that each side's memory is its own.
// Everything ends by itself.
package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dowse-dev/dowse/internal/agent/edgehub"
	"github.com/dowse-dev/dowse/internal/controller/link/cloudhub"
	"github.com/dowse-dev/dowse/internal/link"
	"github.com/dowse-dev/dowse/internal/link/pki"
	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
)

func main() {
	role := flag.String("role", "", "internal: edge or target (a child)")
	dir := flag.String("dir", "", "internal: directory with the CA")
	hubAddr := flag.String("hub", "", "internal: the hub's address (edge)")
	transport := flag.String("transport", link.WebSocket, "internal: the edge's transport")
	streams := flag.Int("streams", 1000, "streams open at once through the node's link")
	size := flag.Int("bytes", 64<<10, "bytes each stream echoes in the throughput run")
	bulk := flag.Int("bulk", 100<<20, "bytes of the bulk transfer during the twin round trips")
	rtts := flag.Int("rtts", 50, "idle twin round trips measured")
	transports := flag.String("transports", "websocket,quic", "transports measured, comma-separated")
	konn := flag.String("konnectivity", "bin/k8s", "folder with konnectivity's proxy-server and proxy-agent (make k8s): the egress through the link is compared with them; empty: no comparison")
	only := flag.Bool("compare-only", false, "measure only the comparison with konnectivity")
	cpuProfile := flag.String("cpuprofile", "", "write CPU profiles to this path with -edge-<transport> (the edge's process), -target and -hub-<transport> (the hub's process while it measures the egress) appended")
	flag.Parse()
	if *cpuProfile != "" {
		childProfile = *cpuProfile
		name := *cpuProfile
		switch *role {
		case "edge":
			name += "-edge-" + *transport
		case "target":
			name += "-target"
		default:
			name = "" // the hub profiles each transport's egress figures alone (compare)
		}
		if name != "" {
			stop, err := startCPUProfile(name)
			if err != nil {
				fmt.Fprintln(os.Stderr, "bench:", err)
				os.Exit(1)
			}
			defer stop()
		}
	}
	var err error
	switch *role {
	case "edge":
		err = runEdge(*dir, *hubAddr, *transport)
	case "target":
		err = runTarget(*bulk)
	case "":
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		err = run(ctx, *streams, *size, *bulk, *rtts, strings.Split(*transports, ","), *konn, *only)
	default:
		err = fmt.Errorf("unknown role %q", *role)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1) //nolint:gocritic // the profile is lost with a failed run
	}
}

// startCPUProfile profiles this process's CPU into path until stop.
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); _ = f.Close() }, nil
}

// mem is a process's memory in use after its collections settled.
type mem struct {
	heap, stack uint64
	goroutines  int
}

func (m mem) bytes() float64 { return float64(m.heap + m.stack) }

func readMem() mem {
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	for range 9 {
		// Each collection halves the stack of a goroutine that uses little
		// of it, as a long-lived process's collections do.
		before := ms.StackInuse
		runtime.GC()
		runtime.ReadMemStats(&ms)
		if ms.StackInuse >= before {
			break
		}
	}
	debug.FreeOSMemory()
	runtime.ReadMemStats(&ms)
	return mem{heap: ms.HeapInuse, stack: ms.StackInuse, goroutines: runtime.NumGoroutine()}
}

// serveMem answers each "MEM" line on stdin with the process's memory and
// returns when stdin closes (the parent is gone or done).
func serveMem() {
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		if sc.Text() == "MEM" {
			m := readMem()
			fmt.Printf("MEM %d %d %d\n", m.heap, m.stack, m.goroutines)
		}
	}
}

func loadCA(dir string) (*pki.CA, error) {
	certPEM, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		return nil, err
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, "ca.key"))
	if err != nil {
		return nil, err
	}
	return pki.LoadCA(certPEM, keyPEM)
}

func device() *linkv1.DeviceRef { return &linkv1.DeviceRef{Namespace: "default", Name: "edge-plc"} }

// runEdge is the edge child: an edgehub whose streams dial anything on
// loopback, and whose "mapper" reports each desired setpoint back at once.
func runEdge(dir, hubAddr, transport string) error {
	ca, err := loadCA(dir)
	if err != nil {
		return err
	}
	cert, err := ca.IssueNode("edge", "", time.Hour)
	if err != nil {
		return err
	}
	dl, err := link.NewDialer(transport, hubAddr, pki.ClientTLSConfig(pki.Static[*tls.CertificateRequestInfo](cert), ca.Pool(), "127.0.0.1"))
	if err != nil {
		return err
	}
	state, err := os.MkdirTemp("", "dowse-streams-bench-edge")
	if err != nil {
		return err
	}
	defer os.RemoveAll(state)
	var d net.Dialer
	var e *edgehub.EdgeHub
	e, err = edgehub.New(edgehub.Config{Node: "edge", Dialer: dl, StateDir: state, Heartbeat: 5 * time.Second, NoSync: true,
		BackoffMin: 10 * time.Millisecond, BackoffMax: 200 * time.Millisecond,
		Reach: func(ctx context.Context, target string) (net.Conn, error) { return d.DialContext(ctx, "tcp", target) }},
		func(_ context.Context, env *linkv1.Envelope) {
			for _, p := range env.GetDeviceUpdate().GetDevice().GetProperties() {
				if p.GetName() == "setpoint" && p.GetDesired() != nil {
					_, _ = e.Report(device(), "setpoint", p.GetDesired(), time.Now())
				}
			}
		}, prometheus.NewRegistry())
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Start(ctx) }()
	fmt.Println("READY")
	serveMem()
	cancel()
	return <-done
}

// runTarget is the targets child: an echo server (each connection echoed
// until its end of stream), a sink (reads to the end) and a source (after
// the client's first byte, sends bulk bytes, then its end of stream).
func runTarget(bulk int) error {
	var ls [3]net.Listener
	for i := range ls {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		defer l.Close()
		ls[i] = l
	}
	serve := func(l net.Listener, f func(c *net.TCPConn)) {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				f(c.(*net.TCPConn))
			}()
		}
	}
	go serve(ls[0], func(c *net.TCPConn) {
		// A small buffer: an idle echo holds it all its life.
		buf := make([]byte, 4<<10)
		for {
			n, err := c.Read(buf)
			if n > 0 {
				if _, err := c.Write(buf[:n]); err != nil {
					return
				}
			}
			if err != nil {
				_ = c.CloseWrite()
				return
			}
			if n == len(buf) && len(buf) < 64<<10 {
				buf = make([]byte, 2*len(buf))
			}
		}
	})
	go serve(ls[1], func(c *net.TCPConn) { _, _ = io.Copy(io.Discard, c) })
	go serve(ls[2], func(c *net.TCPConn) {
		// The client's first byte starts it: through a CONNECT proxy the
		// data must not race the proxy's answer (konnectivity's server
		// has been seen to pass it on first).
		if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
			return
		}
		chunk := make([]byte, 64<<10)
		for left := bulk; left > 0; left -= len(chunk) {
			if _, err := c.Write(chunk[:min(left, len(chunk))]); err != nil {
				return
			}
		}
		_ = c.CloseWrite()
		_, _ = io.Copy(io.Discard, c)
	})
	fmt.Printf("READY %s %s %s\n", ls[0].Addr(), ls[1].Addr(), ls[2].Addr())
	serveMem()
	return nil
}

// childProfile, when set, is the -cpuprofile each child is started with.
var childProfile string

// child is a child process of this binary.
type child struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Scanner
	ready []string // the READY line's words after READY
}

func startChild(args ...string) (*child, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	if childProfile != "" {
		args = append(args, "-cpuprofile", childProfile)
	}
	cmd := exec.Command(self, args...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &child{cmd: cmd, stdin: stdin, out: bufio.NewScanner(stdout)}
	for c.out.Scan() {
		if f := strings.Fields(c.out.Text()); len(f) > 0 && f[0] == "READY" {
			c.ready = f[1:]
			return c, nil
		}
	}
	c.stop()
	return nil, fmt.Errorf("child %v ended before it was ready", args)
}

func (c *child) mem() (mem, error) {
	if _, err := io.WriteString(c.stdin, "MEM\n"); err != nil {
		return mem{}, err
	}
	for c.out.Scan() {
		f := strings.Fields(c.out.Text())
		if len(f) == 4 && f[0] == "MEM" {
			h, _ := strconv.ParseUint(f[1], 10, 64)
			s, _ := strconv.ParseUint(f[2], 10, 64)
			g, _ := strconv.Atoi(f[3])
			return mem{heap: h, stack: s, goroutines: g}, nil
		}
	}
	return mem{}, errors.New("child ended")
}

func (c *child) stop() {
	_ = c.stdin.Close()
	done := make(chan struct{})
	go func() { _ = c.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = c.cmd.Process.Kill()
		<-done
	}
}

type allowAll struct{}

func (allowAll) AuthorizeDevice(context.Context, string, *linkv1.DeviceRef) error { return nil }

// cloud is the hub and the twin values reported back through it.
type cloud struct {
	hub      *cloudhub.Hub
	mu       sync.Mutex
	waiting  map[int64]chan struct{}
	at       map[int64]time.Time // when the edge reported each value (its clock: this machine's)
	reported atomic.Int64
}

// trip is one twin round trip, split at the edge's report (both ends read
// the same machine's wall clock): down is the desired value's way to the
// edge, up the reported value's way back.
type trip struct{ total, down, up time.Duration }

func (c *cloud) handle(_ context.Context, m cloudhub.Inbound) error {
	r := m.Env.GetTwinReported()
	if r == nil {
		return nil
	}
	v, err := strconv.ParseInt(r.GetReported().GetValue(), 10, 64)
	if err != nil {
		return nil
	}
	c.reported.Add(1)
	c.mu.Lock()
	if ch := c.waiting[v]; ch != nil {
		c.at[v] = r.GetTime().AsTime()
		close(ch)
		delete(c.waiting, v)
	}
	c.mu.Unlock()
	return nil
}

// roundTrip sends desired value v to the edge and waits for it to come
// back reported.
func (c *cloud) roundTrip(ctx context.Context, v int64) (trip, error) {
	ch := make(chan struct{})
	c.mu.Lock()
	c.waiting[v] = ch
	c.mu.Unlock()
	start := time.Now()
	env := &linkv1.Envelope{Kind: &linkv1.Envelope_DeviceUpdate{DeviceUpdate: &linkv1.DeviceUpdate{Device: &linkv1.EdgeDevice{
		Ref: device(), Generation: v + 1, Model: "plc",
		Properties: []*linkv1.EdgeDeviceProperty{{Name: "setpoint", Desired: &linkv1.TwinValue{Value: strconv.FormatInt(v, 10)}}}}}}}
	if _, err := c.hub.Send("edge", env); err != nil {
		return trip{}, err
	}
	select {
	case <-ch:
		end := time.Now()
		c.mu.Lock()
		at := c.at[v]
		delete(c.at, v)
		c.mu.Unlock()
		return trip{total: end.Sub(start), down: at.Sub(start), up: end.Sub(at)}, nil
	case <-time.After(30 * time.Second):
		return trip{}, fmt.Errorf("twin round trip %d never came back", v)
	case <-ctx.Done():
		return trip{}, ctx.Err()
	}
}

// split are the p50s of trips' totals and of each way.
func split(trips []trip) (p50, p99, down, up time.Duration) {
	var t, d, u []time.Duration
	for _, x := range trips {
		t, d, u = append(t, x.total), append(d, x.down), append(u, x.up)
	}
	p50, p99 = percentiles(t)
	down, _ = percentiles(d)
	up, _ = percentiles(u)
	return p50, p99, down, up
}

func run(ctx context.Context, n, size, bulk, rtts int, transports []string, konnBin string, compareOnly bool) error {
	dir, err := os.MkdirTemp("", "dowse-streams-bench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	ca, err := pki.NewCA("dowse-streams-bench", time.Hour)
	if err != nil {
		return err
	}
	keyPEM, err := ca.KeyPEM()
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "ca.crt"), ca.CertPEM, 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "ca.key"), keyPEM, 0o600); err != nil {
		return err
	}
	srv, err := ca.IssueServer([]string{"127.0.0.1"}, time.Hour)
	if err != nil {
		return err
	}
	cl := &cloud{waiting: map[int64]chan struct{}{}, at: map[int64]time.Time{}}
	cl.hub, err = cloudhub.New(cloudhub.Config{WebSocketAddr: "127.0.0.1:0", QUICAddr: "127.0.0.1:0",
		TLS: pki.ServerTLSConfig(pki.Static[*tls.ClientHelloInfo](srv), ca.Pool()), Heartbeat: 5 * time.Second,
		QueueSize: 4096, RateLimit: 1e6, RateBurst: 1 << 20, MaxStreamsPerNode: link.DefaultMaxStreams, DrainPeriod: -1},
		allowAll{}, cl.handle, nil)
	if err != nil {
		return err
	}
	hctx, hcancel := context.WithCancel(ctx)
	defer hcancel()
	hubDone := make(chan error, 1)
	go func() { hubDone <- cl.hub.Start(hctx) }()
	select {
	case <-cl.hub.Ready():
	case err := <-hubDone:
		return err
	}
	targets, err := startChild("-role", "target", "-bulk", strconv.Itoa(bulk))
	if err != nil {
		return err
	}
	defer targets.stop()
	echo, sink, source := targets.ready[0], targets.ready[1], targets.ready[2]
	fmt.Printf("streams through one node's link: %d at once, %d CPUs, GOMAXPROCS %d\n", n, runtime.NumCPU(), runtime.GOMAXPROCS(0))

	ws, q := cl.hub.Addrs()
	var v int64
	for _, tr := range transports {
		if compareOnly {
			break
		}
		addr := ws.String()
		if tr == link.QUIC {
			addr = q.String()
		}
		edge, err := startChild("-role", "edge", "-dir", dir, "-hub", addr, "-transport", tr)
		if err != nil {
			return err
		}
		err = measure(ctx, cl, edge, targets, tr, n, size, bulk, rtts, echo, sink, source, &v)
		edge.stop()
		if err != nil {
			return fmt.Errorf("%s: %w", tr, err)
		}
		// The next edge's session replaces this one's.
		for deadline := time.Now().Add(15 * time.Second); cl.hub.IsConnected("edge") && time.Now().Before(deadline); {
			time.Sleep(50 * time.Millisecond)
		}
	}
	if konnBin == "" {
		return nil
	}
	if _, err := os.Stat(filepath.Join(konnBin, "proxy-server")); err != nil {
		fmt.Printf("no comparison with konnectivity: %v (make k8s builds it)\n", err)
		return nil
	}
	return compare(ctx, cl, dir, konnBin, ca, transports, n, bulk, echo, sink, source)
}

func measure(ctx context.Context, cl *cloud, edge, targets *child, tr string, n, size, bulk, rtts int, echo, sink, source string, v *int64) error {
	for deadline := time.Now().Add(15 * time.Second); !cl.hub.IsConnected("edge"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			return errors.New("the edge never connected")
		}
	}
	// The twin path warm, then the baseline of every side's memory.
	for range 5 {
		*v++
		if _, err := cl.roundTrip(ctx, *v); err != nil {
			return err
		}
	}
	hubBefore := readMem()
	edgeBefore, err := edge.mem()
	if err != nil {
		return err
	}
	targetBefore, err := targets.mem()
	if err != nil {
		return err
	}

	// 1. n streams opened at once, a ping each, then held idle.
	held := make([]*link.Stream, n)
	lat := make([]time.Duration, n)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	began := time.Now()
	for i := range n {
		wg.Go(func() {
			start := time.Now()
			st, err := cl.hub.OpenStream(ctx, "edge", echo)
			if err != nil {
				errs <- fmt.Errorf("stream %d: %w", i, err)
				return
			}
			buf := []byte("ping")
			if _, err := st.Write(buf); err != nil {
				errs <- err
				return
			}
			if _, err := io.ReadFull(st, buf); err != nil || string(buf) != "ping" {
				errs <- fmt.Errorf("stream %d: ping back %q: %w", i, buf, err)
				return
			}
			lat[i] = time.Since(start)
			held[i] = st
		})
	}
	wg.Wait()
	openAll := time.Since(began)
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	hubAfter := readMem()
	edgeAfter, err := edge.mem()
	if err != nil {
		return err
	}
	targetAfter, err := targets.mem()
	if err != nil {
		return err
	}
	p50, p99 := percentiles(lat)
	per := func(b, a mem) string {
		return fmt.Sprintf("%.1f KB (heap %.1f, stacks %.1f; %.1f goroutines)", (a.bytes()-b.bytes())/float64(n)/1e3,
			(float64(a.heap)-float64(b.heap))/float64(n)/1e3, (float64(a.stack)-float64(b.stack))/float64(n)/1e3, float64(a.goroutines-b.goroutines)/float64(n))
	}
	fmt.Printf("%s: %d streams opened at once, each a ping: all in %s, per stream p50 %s p99 %s\n", tr, n, openAll.Round(time.Millisecond), p50.Round(10*time.Microsecond), p99.Round(10*time.Microsecond))
	fmt.Printf("%s: memory per idle stream: cloud side %s, edge %s, the echo targets %s\n", tr, per(hubBefore, hubAfter), per(edgeBefore, edgeAfter), per(targetBefore, targetAfter))
	for _, st := range held {
		_ = st.Close()
	}
	// The edge forgets a stream once its target closed too: wait until it
	// holds none, or the next n would meet its bound.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		m, err := edge.mem()
		if err != nil {
			return err
		}
		if m.goroutines <= edgeBefore.goroutines+5 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the edge still runs %d goroutines, %d before the streams", m.goroutines, edgeBefore.goroutines)
		}
	}

	// 2. n streams at once, each echoing size bytes.
	payload := make([]byte, size)
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	errs = make(chan error, n)
	began = time.Now()
	for i := range n {
		wg.Go(func() {
			start := time.Now()
			st, err := cl.hub.OpenStream(ctx, "edge", echo)
			if err != nil {
				errs <- fmt.Errorf("stream %d: %w", i, err)
				return
			}
			defer st.Close()
			go func() {
				_, _ = st.Write(payload)
				_ = st.CloseWrite()
			}()
			got, err := io.ReadAll(st)
			if err != nil || len(got) != size {
				errs <- fmt.Errorf("stream %d: %d bytes back of %d: %w", i, len(got), size, err)
				return
			}
			lat[i] = time.Since(start)
		})
	}
	wg.Wait()
	wall := time.Since(began)
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	p50, p99 = percentiles(lat)
	fmt.Printf("%s: %d streams at once each echoing %d KiB: %.1f MiB/s each way (%s), per stream p50 %s p99 %s\n",
		tr, n, size>>10, float64(n*size)/(1<<20)/wall.Seconds(), wall.Round(time.Millisecond), p50.Round(time.Millisecond), p99.Round(time.Millisecond))

	// 3. A twin's round trip idle, and during a bulk transfer each way.
	idle := make([]trip, 0, rtts)
	for range rtts {
		*v++
		d, err := cl.roundTrip(ctx, *v)
		if err != nil {
			return err
		}
		idle = append(idle, d)
	}
	idle50, idle99, idleDown, idleUp := split(idle)
	fmt.Printf("%s: twin round trip idle: p50 %s p99 %s (%d; p50 down %s, up %s)\n", tr, idle50.Round(time.Microsecond), idle99.Round(time.Microsecond), rtts,
		idleDown.Round(time.Microsecond), idleUp.Round(time.Microsecond))
	for _, dir := range []string{"to the edge", "from the edge"} {
		target := sink
		if dir == "from the edge" {
			target = source
		}
		st, err := cl.hub.OpenStream(ctx, "edge", target)
		if err != nil {
			return err
		}
		moved := make(chan int64, 1)
		start := time.Now()
		go func() {
			var n int64
			if target == sink {
				chunk := make([]byte, 64<<10)
				for left := bulk; left > 0; left -= len(chunk) {
					w, err := st.Write(chunk[:min(left, len(chunk))])
					n += int64(w)
					if err != nil {
						break
					}
				}
				_ = st.CloseWrite()
				_, _ = io.Copy(io.Discard, st) // the sink's end of stream: all taken
			} else if _, err := st.Write([]byte{1}); err == nil { // the source's start
				n, _ = io.Copy(io.Discard, st)
			}
			moved <- n
		}()
		var busy []trip
		var got int64
		var took time.Duration
	loop:
		for {
			select {
			case got = <-moved:
				took = time.Since(start)
				break loop
			default:
			}
			*v++
			d, err := cl.roundTrip(ctx, *v)
			if err != nil {
				return err
			}
			busy = append(busy, d)
		}
		_ = st.Close()
		if got != int64(bulk) {
			return fmt.Errorf("bulk %s: %d bytes of %d", dir, got, bulk)
		}
		if len(busy) == 0 {
			return fmt.Errorf("bulk %s: no round trip during it", dir)
		}
		b50, b99, bDown, bUp := split(busy)
		fmt.Printf("%s: twin round trip during %d MiB %s (%.1f MiB/s): p50 %s p99 %s (%d; p50 down %s, up %s), p50 busy/idle %.2f\n",
			tr, bulk>>20, dir, float64(bulk)/(1<<20)/took.Seconds(), b50.Round(time.Microsecond), b99.Round(time.Microsecond), len(busy),
			bDown.Round(time.Microsecond), bUp.Round(time.Microsecond), float64(b50)/float64(idle50))
	}
	return nil
}

// percentiles are d's p50 and p99 (d is sorted).
func percentiles(d []time.Duration) (p50, p99 time.Duration) {
	slices.Sort(d)
	return d[len(d)/2], d[min(len(d)-1, len(d)*99/100)]
}
