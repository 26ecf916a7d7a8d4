// Command link measures the cloud/edge link on loopback and prints a table:
//   - idle connections held by one cloudhub and its memory per connection;
//   - messages per second through one connection and across 1,000, each
//     message echoed back by the hub, with p50/p99 round-trip time at that
//     load (edge enqueue to echo delivered);
//   - WebSocket and QUIC side by side, and the ratio of the link's
//     one-connection throughput to a bare coder/websocket echo (TLS, same
//     payload size, same window) measured in the same run.
//
// The hub runs in a child process (this binary re-executed with -hub) so
// that its memory is measured alone and hub and edges each stay within the
// file-descriptor limit; the edges run here. Everything ends by itself.
// LINK_BENCH_HUB_CPUPROFILE=<file> writes the hub child's CPU profile;
// LINK_BENCH_HUB_HEAPPROFILE=<file> its heap (and goroutine) profiles at
// each memory reading, as <file>.<n>, and with LINK_BENCH_HUB_HEAPDUMP set
// too a runtime heap dump, <file>.<n>.dump (debug.WriteHeapDump: it holds
// each goroutine's stack bounds and frames, which no profile shows).
package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"io"
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

	"github.com/coder/websocket"
	"github.com/quic-go/quic-go"
	"golang.org/x/sync/errgroup"

	"github.com/dowse-dev/dowse/internal/controller/link/cloudhub"
	"github.com/dowse-dev/dowse/internal/link"
	"github.com/dowse-dev/dowse/internal/link/pki"
	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
)

var manyWindow int

func main() {
	hub := flag.Bool("hub", false, "internal: run the hub child")
	dir := flag.String("dir", "", "internal: directory with the CA")
	idle := flag.Int("idle", 10000, "idle connections per transport")
	conns := flag.Int("conns", 1000, "connections of the many-connection load")
	dur := flag.Duration("duration", 3*time.Second, "length of each throughput run")
	window := flag.Int("window", 256, "messages in flight per connection (one-connection runs)")
	flag.IntVar(&manyWindow, "many-window", 4, "messages in flight per connection (many-connection runs)")
	spread := flag.Int("spread", 10000, "idle WebSocket connections spread over two hub processes (0: not measured)")
	transports := flag.String("transports", "websocket,quic", "transports measured, comma-separated")
	flag.Parse()
	var err error
	if *hub {
		err = runHub(*dir)
	} else {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		err = run(ctx, *idle, *conns, *spread, *dur, *window, strings.Split(*transports, ","))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

type allowAll struct{}

func (allowAll) AuthorizeDevice(context.Context, string, *linkv1.DeviceRef) error { return nil }

// runHub is the child: a cloudhub that echoes every reported value back as
// a desired one, and a bare WebSocket echo server, on loopback; it prints
// their addresses and runs until stdin closes. SIGUSR1 makes it return
// freed memory to the OS so that the parent reads a settled RSS.
func runHub(dir string) error {
	if os.Getenv("LINK_BENCH_HUB_HEAPPROFILE") != "" {
		runtime.MemProfileRate = 512 // fine-grained: per-connection figures
	}
	certPEM, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		return err
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, "ca.key"))
	if err != nil {
		return err
	}
	ca, err := pki.LoadCA(certPEM, keyPEM)
	if err != nil {
		return err
	}
	srv, err := ca.IssueServer([]string{"127.0.0.1"}, time.Hour)
	if err != nil {
		return err
	}
	serverTLS := pki.ServerTLSConfig(pki.Static[*tls.ClientHelloInfo](srv), ca.Pool())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var hub *cloudhub.Hub
	hub, err = cloudhub.New(cloudhub.Config{WebSocketAddr: "127.0.0.1:0", QUICAddr: "127.0.0.1:0", TLS: serverTLS,
		Heartbeat: 30 * time.Second, QueueSize: 4096, RateLimit: 1e9, RateBurst: 1 << 30},
		allowAll{}, func(_ context.Context, m cloudhub.Inbound) error {
			node, r := m.Node, m.Env.GetTwinReported()
			if r == nil {
				return nil
			}
			// The reported value comes back as a desired value, which rides
			// its Device as the controller sends it.
			_, err := hub.Send(node, &linkv1.Envelope{Kind: &linkv1.Envelope_DeviceUpdate{DeviceUpdate: &linkv1.DeviceUpdate{Device: &linkv1.EdgeDevice{
				Ref: r.Device, Model: "cam", Properties: []*linkv1.EdgeDeviceProperty{{Name: r.Property, Desired: r.Reported}}}}}})
			return err
		}, nil)
	if err != nil {
		return err
	}
	go func() {
		if err := hub.Start(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "hub:", err)
			os.Exit(1)
		}
	}()
	<-hub.Ready()
	echo, err := startEcho(ctx, serverTLS)
	if err != nil {
		return err
	}
	ws, q := hub.Addrs()
	fmt.Printf("READY %s %s %s\n", ws, q, echo)
	usr1 := make(chan os.Signal, 1)
	signal.Notify(usr1, syscall.SIGUSR1)
	go func() {
		n := 0
		for range usr1 {
			// Collections until the stacks stop shrinking: each halves
			// the stack of a goroutine that uses little of it, as the
			// runtime's own collections (at least one every two
			// minutes) do to the stacks of a hub's idle edges.
			settle()
			if f := os.Getenv("LINK_BENCH_HUB_HEAPPROFILE"); f != "" {
				n++
				if out, err := os.Create(fmt.Sprintf("%s.%d", f, n)); err == nil {
					_ = pprof.Lookup("heap").WriteTo(out, 0)
					_ = pprof.Lookup("goroutine").WriteTo(mustCreate(fmt.Sprintf("%s.%d.goroutines", f, n)), 1)
					out.Close()
				}
				if os.Getenv("LINK_BENCH_HUB_HEAPDUMP") != "" {
					if d, err := os.Create(fmt.Sprintf("%s.%d.dump", f, n)); err == nil {
						debug.WriteHeapDump(d.Fd())
						d.Close()
					}
				}
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				fmt.Fprintf(os.Stderr, "hub: heap in use %.1f MiB, stacks %.1f MiB, other runtime %.1f MiB, %d goroutines\n",
					float64(ms.HeapInuse)/(1<<20), float64(ms.StackInuse)/(1<<20), float64(ms.MSpanInuse+ms.MCacheInuse+ms.GCSys+ms.OtherSys+ms.BuckHashSys)/(1<<20), runtime.NumGoroutine())
			}
			fmt.Println("GC")
		}
	}()
	if f := os.Getenv("LINK_BENCH_HUB_CPUPROFILE"); f != "" {
		out, err := os.Create(f)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(out); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n') // parent gone or done
	return nil
}

func run(ctx context.Context, idleN, connsN, spreadN int, dur time.Duration, window int, transports []string) error {
	dir, err := os.MkdirTemp("", "dowse-link-bench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	ca, err := pki.NewCA("dowse-link-bench", time.Hour)
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

	h, err := startChild(dir)
	if err != nil {
		return err
	}
	defer h.stop()
	wsAddr, quicAddr, echoAddr := h.ws, h.quic, h.echo
	rss := h.rss

	b := &bench{ca: ca, certs: map[string]tls.Certificate{}}
	fmt.Printf("issuing %d node certificates...\n", max(idleN, connsN+1, spreadN))
	if err := b.issue(max(idleN, connsN+1, spreadN)); err != nil {
		return err
	}
	qtr := &quic.Transport{Conn: mustUDP()}
	defer qtr.Close()
	type result struct {
		idle             int
		idleMiB          float64
		perConnKiB       float64
		oneRate          float64
		oneP50, oneP99   time.Duration
		manyRate         float64
		manyP50, manyP99 time.Duration
	}
	results := map[string]*result{}
	// The baseline first, on a fresh child.
	bare, bareP50, bareP99, err := bareEcho(ctx, echoAddr, b.clientTLS("bare"), dur, window)
	if err != nil {
		return err
	}
	fmt.Printf("bare websocket echo: %.0f msg/s, rtt p50 %s p99 %s\n", bare, bareP50, bareP99)
	for _, tr := range transports {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		addr := wsAddr
		if tr == link.QUIC {
			addr = quicAddr
		}
		dialer := func(node string) link.Dialer {
			conf := b.clientTLS(node)
			if tr == link.QUIC {
				return &link.QUICDialer{Addr: addr, TLS: conf, Transport: qtr}
			}
			return &link.WebSocketDialer{Addr: addr, TLS: conf}
		}
		r := &result{}
		results[tr] = r

		lctx, lcancel := context.WithCancel(ctx)
		one, err := b.connect(lctx, dialer, "one", connsN, 1, 10*time.Second)
		if err != nil {
			lcancel()
			return err
		}
		r.oneRate, r.oneP50, r.oneP99 = load(one, dur, window)
		fmt.Printf("%s: one connection %.0f msg/s, rtt p50 %s p99 %s\n", tr, r.oneRate, r.oneP50, r.oneP99)
		many, err := b.connect(lctx, dialer, "many", 0, connsN, 10*time.Second)
		if err != nil {
			lcancel()
			return err
		}
		r.manyRate, r.manyP50, r.manyP99 = load(many, dur, manyWindow)
		fmt.Printf("%s: %d connections %.0f msg/s, rtt p50 %s p99 %s\n", tr, connsN, r.manyRate, r.manyP50, r.manyP99)
		lcancel()
		for _, e := range append(one, many...) {
			<-e.done
		}
		time.Sleep(time.Second)

		before := rss()
		fmt.Printf("%s: opening %d idle connections (hub RSS %.0f MiB)...\n", tr, idleN, before)
		ictx, icancel := context.WithCancel(ctx)
		t0 := time.Now()
		edges, err := b.connect(ictx, dialer, "idle", 0, idleN, 30*time.Second)
		if err != nil {
			icancel()
			return err
		}
		time.Sleep(2 * time.Second)
		after := rss()
		r.idle, r.idleMiB = len(edges), after-before
		r.perConnKiB = (after - before) * 1024 / float64(len(edges))
		fmt.Printf("%s: %d idle connections in %s, hub RSS %.0f MiB (+%.0f MiB)\n", tr, len(edges), time.Since(t0).Round(time.Millisecond), after, after-before)
		icancel()
		for _, e := range edges {
			<-e.done
		}
		time.Sleep(2 * time.Second) // let the hub see them go
	}

	var spreadRSS []float64
	if spreadN > 0 {
		if spreadRSS, err = b.spread(ctx, dir, spreadN); err != nil {
			return err
		}
	}

	ws, q := results[link.WebSocket], results[link.QUIC]
	if ws == nil {
		ws = &result{}
	}
	if q == nil {
		q = &result{}
	}
	fmt.Println()
	fmt.Printf("%-46s %16s %16s\n", "cloud/edge link, loopback, one hub process", "websocket", "quic")
	row := func(name string, a, b string) { fmt.Printf("%-46s %16s %16s\n", name, a, b) }
	row("idle connections held", strconv.Itoa(ws.idle), strconv.Itoa(q.idle))
	row("hub memory for them (RSS growth, MiB)", fmt.Sprintf("%.0f", ws.idleMiB), fmt.Sprintf("%.0f", q.idleMiB))
	row("memory per idle connection (KiB)", fmt.Sprintf("%.1f", ws.perConnKiB), fmt.Sprintf("%.1f", q.perConnKiB))
	row("10,000 idle connections, projected (MiB)", fmt.Sprintf("%.0f", ws.perConnKiB*10000/1024), fmt.Sprintf("%.0f", q.perConnKiB*10000/1024))
	row("msgs/s, one connection (echoed)", fmt.Sprintf("%.0f", ws.oneRate), fmt.Sprintf("%.0f", q.oneRate))
	row("  rtt p50 / p99", ws.oneP50.String()+" / "+ws.oneP99.String(), q.oneP50.String()+" / "+q.oneP99.String())
	row(fmt.Sprintf("msgs/s, %d connections (echoed)", connsN), fmt.Sprintf("%.0f", ws.manyRate), fmt.Sprintf("%.0f", q.manyRate))
	row("  rtt p50 / p99", ws.manyP50.String()+" / "+ws.manyP99.String(), q.manyP50.String()+" / "+q.manyP99.String())
	row("bare coder/websocket echo, one conn (msgs/s)", fmt.Sprintf("%.0f", bare), "")
	row("  rtt p50 / p99", bareP50.String()+" / "+bareP99.String(), "")
	row("link / bare websocket throughput", fmt.Sprintf("%.2f", ws.oneRate/bare), fmt.Sprintf("%.2f", q.oneRate/bare))
	if spreadN > 0 {
		row(fmt.Sprintf("%d idle edges over 2 hubs, RSS total (MiB)", spreadN), fmt.Sprintf("%.0f", spreadRSS[0]+spreadRSS[1]), "")
		row("  each hub's RSS (MiB)", fmt.Sprintf("%.0f + %.0f", spreadRSS[0], spreadRSS[1]), "")
	}
	fmt.Printf("goals: an idle edge <= 25 KiB over WebSocket, <= 35 KiB over QUIC; link/bare > 1; window %d per connection (one), %d (many); %d cores\n",
		window, manyWindow, runtime.NumCPU())
	return nil
}

// settle collects until the goroutine stacks stop shrinking (at most ten
// times) and returns freed memory to the OS.
func settle() {
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	for range 9 {
		before := ms.StackInuse
		runtime.GC()
		runtime.ReadMemStats(&ms)
		if ms.StackInuse >= before {
			break
		}
	}
	debug.FreeOSMemory()
}

// hubChild is a hub process (this binary with -hub).
type hubChild struct {
	cmd            *exec.Cmd
	stdin          io.Closer
	ws, quic, echo string
	gcLines        chan struct{}
}

func startChild(dir string) (*hubChild, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	h := &hubChild{cmd: exec.Command(self, "-hub", "-dir", dir), gcLines: make(chan struct{}, 16)}
	h.stdin, _ = h.cmd.StdinPipe()
	stdout, _ := h.cmd.StdoutPipe()
	h.cmd.Stderr = os.Stderr
	if err := h.cmd.Start(); err != nil {
		return nil, err
	}
	fmt.Printf("hub child pid %d\n", h.cmd.Process.Pid)
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() {
		h.stop()
		return nil, fmt.Errorf("hub child did not start")
	}
	f := strings.Fields(lines.Text())
	if len(f) != 4 || f[0] != "READY" {
		h.stop()
		return nil, fmt.Errorf("hub child said %q", lines.Text())
	}
	h.ws, h.quic, h.echo = f[1], f[2], f[3]
	go func() {
		for lines.Scan() {
			h.gcLines <- struct{}{}
		}
	}()
	return h, nil
}

// rss is the child's settled RSS, MiB.
func (h *hubChild) rss() float64 {
	_ = h.cmd.Process.Signal(syscall.SIGUSR1)
	select {
	case <-h.gcLines:
	case <-time.After(10 * time.Second):
	}
	return vmRSS(h.cmd.Process.Pid)
}

// stop ends the child (it returns when its stdin closes) and waits for it.
func (h *hubChild) stop() {
	h.stdin.Close()
	done := make(chan struct{})
	go func() { _ = h.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = h.cmd.Process.Kill()
		<-done
	}
}

// spread holds n idle WebSocket edges on two fresh hub processes, half on
// each (as two replicas share a fleet), and returns each hub's whole RSS.
func (b *bench) spread(ctx context.Context, dir string, n int) ([]float64, error) {
	var hubs []*hubChild
	defer func() {
		for _, h := range hubs {
			h.stop()
		}
	}()
	for range 2 {
		h, err := startChild(dir)
		if err != nil {
			return nil, err
		}
		hubs = append(hubs, h)
	}
	ictx, icancel := context.WithCancel(ctx)
	defer icancel()
	t0 := time.Now()
	var all []*edge
	for i, h := range hubs {
		addr := h.ws
		edges, err := b.connect(ictx, func(node string) link.Dialer {
			return &link.WebSocketDialer{Addr: addr, TLS: b.clientTLS(node)}
		}, "spread", i*(n/2), n/2, 30*time.Second)
		all = append(all, edges...)
		if err != nil {
			return nil, err
		}
	}
	time.Sleep(2 * time.Second)
	out := []float64{hubs[0].rss(), hubs[1].rss()}
	fmt.Printf("spread: %d idle edges over 2 hubs in %s, RSS %.0f + %.0f MiB\n", len(all), time.Since(t0).Round(time.Millisecond), out[0], out[1])
	icancel()
	for _, e := range all {
		<-e.done
	}
	return out, nil
}

func mustCreate(name string) *os.File {
	f, err := os.Create(name)
	if err != nil {
		panic(err)
	}
	return f
}

func mustUDP() *netUDPConn {
	c, err := listenUDP()
	if err != nil {
		panic(err)
	}
	return c
}

func vmRSS(pid int) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(l, "VmRSS:") {
			kb, _ := strconv.ParseFloat(strings.Fields(l)[1], 64)
			return kb / 1024
		}
	}
	return 0
}

type bench struct {
	ca    *pki.CA
	mu    sync.Mutex
	certs map[string]tls.Certificate
	n     int
}

// issue makes node certificates node-0..n-1 up front, so that issuing does
// not count in connection times.
func (b *bench) issue(n int) error {
	var g errgroup.Group
	g.SetLimit(runtime.NumCPU())
	for i := range n {
		g.Go(func() error {
			name := fmt.Sprintf("node-%d", i)
			c, err := b.ca.IssueNode(name, "", time.Hour)
			if err != nil {
				return err
			}
			b.mu.Lock()
			b.certs[name] = c
			b.mu.Unlock()
			return nil
		})
	}
	b.n = n
	return g.Wait()
}

func (b *bench) clientTLS(node string) *tls.Config {
	b.mu.Lock()
	c, ok := b.certs[node]
	b.mu.Unlock()
	if !ok {
		c, _ = b.ca.IssueNode(node, "", time.Hour)
	}
	return pki.ClientTLSConfig(pki.Static[*tls.CertificateRequestInfo](c), b.ca.Pool(), "127.0.0.1")
}

// edge is a minimal edge: a memory session over one connection, counting
// echoes and their round trips.
type edge struct {
	node   string
	sess   *link.Session
	done   chan struct{}
	echoed atomic.Int64
	window chan struct{}
	mu     sync.Mutex
	rtts   []time.Duration
	record atomic.Bool
}

// connect opens n edges named node-<first+i>, each with its own
// certificate, 64 handshakes at a time.
func (b *bench) connect(ctx context.Context, dialer func(string) link.Dialer, phase string, first, n int, hb time.Duration) ([]*edge, error) {
	edges := make([]*edge, n)
	var g errgroup.Group
	g.SetLimit(64)
	for i := range n {
		g.Go(func() error {
			node := fmt.Sprintf("node-%d", first+i)
			e := &edge{node: node, sess: link.NewSession(link.SessionConfig{}), done: make(chan struct{})}
			var c link.Conn
			var err error
			var f *link.Framed
			var w linkv1.Envelope
			// A loaded hub turns handshakes away beyond its limit (QUIC's
			// CONNECTION_REFUSED): try again, as an edge would.
			for attempt := 0; ; attempt++ {
				if attempt > 0 {
					time.Sleep(time.Duration(attempt) * 200 * time.Millisecond)
				}
				dctx, cancel := context.WithTimeout(ctx, 20*time.Second)
				c, err = dialer(node).Dial(dctx)
				cancel()
				if err == nil {
					f = link.NewFramed(c, link.DefaultMaxFrame)
					if err = f.Write(&linkv1.Envelope{Kind: &linkv1.Envelope_Hello{Hello: &linkv1.Hello{Node: node, StreamId: e.sess.StreamID()}}}); err == nil {
						w.Reset()
						if _, err = f.Read(&w); err == nil && w.GetWelcome() == nil {
							err = fmt.Errorf("no welcome: %v", w.GetError())
						}
					}
					if err != nil {
						_ = c.Close()
					}
				}
				if err == nil || attempt == 5 || ctx.Err() != nil {
					break
				}
			}
			if err != nil {
				return fmt.Errorf("%s %s: %w", phase, node, err)
			}
			e.sess.SetPeer(w.GetWelcome().StreamId)
			e.sess.Resume(w.GetWelcome().PeerStreamId, w.GetWelcome().Received)
			go func() {
				defer close(e.done)
				_ = link.RunConn(ctx, f, e.sess, &link.ConnConfig{Heartbeat: hb, Deliver: func(_ context.Context, env *linkv1.Envelope) error {
					if d := env.GetDeviceUpdate(); d != nil {
						if e.record.Load() {
							sent, _ := strconv.ParseInt(d.GetDevice().GetProperties()[0].GetDesired().GetValue(), 10, 64)
							rtt := time.Duration(time.Now().UnixNano() - sent)
							e.mu.Lock()
							e.rtts = append(e.rtts, rtt)
							e.mu.Unlock()
							e.echoed.Add(1)
						}
						select {
						case <-e.window:
						default:
						}
					}
					return nil
				}})
			}()
			edges[i] = e
			return nil
		})
	}
	return edges, g.Wait()
}

// load sends from every edge for dur, at most window messages in flight
// each, and returns echoed messages per second and the round-trip p50/p99.
func load(edges []*edge, dur time.Duration, window int) (float64, time.Duration, time.Duration) {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, e := range edges {
		e.window = make(chan struct{}, window)
		e.rtts = e.rtts[:0]
		e.echoed.Store(0)
		wg.Add(1)
		go func() {
			defer wg.Done()
			dev := &linkv1.DeviceRef{Namespace: "default", Name: e.node + "-cam"}
			for {
				select {
				case <-stop:
					return
				case e.window <- struct{}{}:
				}
				env := &linkv1.Envelope{Kind: &linkv1.Envelope_TwinReported{TwinReported: &linkv1.TwinReportedUpdate{
					Device: dev, Property: "temperature", Reported: &linkv1.TwinValue{Value: strconv.FormatInt(time.Now().UnixNano(), 10)}}}}
				if _, _, err := e.sess.Enqueue(env, ""); err != nil {
					<-e.window
					time.Sleep(time.Millisecond)
				}
			}
		}()
	}
	// Warm up, then count over dur.
	time.Sleep(300 * time.Millisecond)
	for _, e := range edges {
		e.mu.Lock()
		e.rtts = e.rtts[:0]
		e.mu.Unlock()
		e.echoed.Store(0)
		e.record.Store(true)
	}
	time.Sleep(dur)
	var total int64
	var rtts []time.Duration
	for _, e := range edges {
		e.record.Store(false)
		total += e.echoed.Load()
		e.mu.Lock()
		rtts = append(rtts, e.rtts...)
		e.mu.Unlock()
	}
	close(stop)
	wg.Wait()
	p50, p99 := percentiles(rtts)
	return float64(total) / dur.Seconds(), p50, p99
}

func percentiles(d []time.Duration) (time.Duration, time.Duration) {
	if len(d) == 0 {
		return 0, 0
	}
	slices.Sort(d)
	r := func(x time.Duration) time.Duration {
		if x < time.Millisecond {
			return x.Round(time.Microsecond)
		}
		return x.Round(100 * time.Microsecond)
	}
	return r(d[len(d)/2]), r(d[len(d)*99/100])
}

// bareEcho is the baseline: one TLS WebSocket connection to a plain echo
// handler, one binary message per value, the same window as the link.
func bareEcho(ctx context.Context, addr string, conf *tls.Config, dur time.Duration, window int) (float64, time.Duration, time.Duration, error) {
	conf = conf.Clone()
	conf.NextProtos = []string{"http/1.1"}
	client := &httpClient{TLS: conf}
	c, _, err := websocket.Dial(ctx, "wss://"+addr+"/echo", client.options())
	if err != nil {
		return 0, 0, 0, err
	}
	defer c.CloseNow()
	c.SetReadLimit(1 << 20)
	// The same size as the link's envelope for one reported value.
	size := len(mustFrame())
	win := make(chan struct{}, window)
	var recording atomic.Bool
	var echoed atomic.Int64
	var mu sync.Mutex
	var rtts []time.Duration
	stop := make(chan struct{})
	rctx, rcancel := context.WithCancel(ctx)
	defer rcancel()
	go func() {
		for {
			_, p, err := c.Read(rctx)
			if err != nil {
				return
			}
			if recording.Load() {
				sent := int64(0)
				for i := 0; i < 8; i++ {
					sent |= int64(p[i]) << (8 * i)
				}
				mu.Lock()
				rtts = append(rtts, time.Duration(time.Now().UnixNano()-sent))
				mu.Unlock()
				echoed.Add(1)
			}
			<-win
		}
	}()
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, size)
		for {
			select {
			case <-stop:
				return
			case win <- struct{}{}:
			}
			now := time.Now().UnixNano()
			for i := 0; i < 8; i++ {
				buf[i] = byte(now >> (8 * i))
			}
			if err := c.Write(ctx, websocket.MessageBinary, buf); err != nil {
				return
			}
		}
	}()
	time.Sleep(300 * time.Millisecond)
	recording.Store(true)
	time.Sleep(dur)
	recording.Store(false)
	n := echoed.Load()
	close(stop)
	<-done
	mu.Lock()
	p50, p99 := percentiles(rtts)
	mu.Unlock()
	return float64(n) / dur.Seconds(), p50, p99, nil
}

func mustFrame() []byte {
	b, _ := link.AppendFrame(nil, &linkv1.Envelope{Version: 1, Seq: 1000, Ack: 1000, Kind: &linkv1.Envelope_TwinReported{TwinReported: &linkv1.TwinReportedUpdate{
		Device: &linkv1.DeviceRef{Namespace: "default", Name: "node-0-cam"}, Property: "temperature",
		Reported: &linkv1.TwinValue{Value: strconv.FormatInt(time.Now().UnixNano(), 10)}}}})
	return b
}
