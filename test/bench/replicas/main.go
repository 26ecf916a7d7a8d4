// Command replicas measures the cloud side with several controller
// replicas, on the API server of test/framework/kube with the real dowse-controller
// binary (leader election and the link on every replica) and simulated
// edges in this process (the agent's edgehub, each with its node's
// certificate from the controller's link CA, its store without fsync),
// every edge given every replica's WebSocket address. It prints:
//   - twin reports written into Device.status a second (and status writes
//     a second) with one replica, then with three, each edge reporting a
//     counter of its Device all the while: the ratio says where the limit
//     moves;
//   - a replica killed (SIGKILL) while it holds every edge, one other
//     replica up: the time until every edge has a session again;
//   - at the end, with reporting stopped: every edge's store emptied
//     (everything acknowledged) and every Device's status at its edge's
//     last counter (no report lost).
//
// With -readings it measures report → visible in the live readings API
// (readings.go): two replicas serving it behind the API server's
// aggregator, one watch of every DeviceReading through the API server, at
// several report rates: p50 / p99 / max from a counter's report at its edge
// to its arrival in the watch.
//
// With -budget it measures the status write budget instead (budget.go):
// two replicas at their default budget and interval, -edges ×
// -devices-per-edge Devices (20,000 by default) each reporting a changing
// counter every second: status writes a second at the API server and by
// priority, the statuses' age when written, desired → acknowledged in
// status under that load, the edges' largest backlog, and that nothing is
// lost once the reports stop.
//
// Everything it starts it stops; it writes only under its temporary
// directory.
package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/dowse-dev/dowse/internal/agent/edgehub"
	"github.com/dowse-dev/dowse/internal/controller/link/ownership"
	"github.com/dowse-dev/dowse/internal/link/pki"
	"github.com/dowse-dev/dowse/internal/scheme"
	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/framework/dowse"
	"github.com/dowse-dev/dowse/test/framework/kube"
	"github.com/dowse-dev/dowse/test/framework/procs"
)

const namespace = "dowse-system"

var (
	failoverOnly bool
	profileDir   string
	profileFor   time.Duration
)

func main() {
	edges := flag.Int("edges", 2000, "simulated edges, one Device each")
	every := flag.Duration("report-every", 500*time.Millisecond, "how often each edge reports its Device's counter")
	window := flag.Duration("window", 10*time.Second, "length of each write-rate measurement")
	flag.BoolVar(&failoverOnly, "failover-only", false, "measure only the failover (and that nothing was lost): no write rates, no third replica")
	flag.StringVar(&profileDir, "profile", "", "write CPU profiles of the surviving replica and of the API server during the failover into this folder")
	flag.DurationVar(&profileFor, "profile-for", 15*time.Second, "length of the failover's CPU profiles")
	budget := flag.Bool("budget", false, "measure the status write budget instead: -edges × -devices-per-edge Devices reporting every -report-every (1s unless given) through two replicas at their defaults; -window (1m unless given) is the measurement")
	perEdge := flag.Int("devices-per-edge", 10, "Devices on each edge, with -budget and -readings")
	readings := flag.Bool("readings", false, "measure report → visible in the live readings API instead: -edges (100 unless given) × -devices-per-edge Devices on two replicas serving the API behind the API server's aggregator, one watch through the API server, at each of -rates; -window (20s unless given) is each measurement")
	rates := flag.String("rates", "100,1000,4000", "reports a second offered, comma-separated, with -readings")
	flag.Parse()
	ctrllog.SetLogger(logr.Discard())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	given := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if *readings {
		if !given["edges"] {
			*edges = 100
		}
		if !given["window"] {
			*window = 20 * time.Second
		}
		var rs []float64
		for _, f := range strings.Split(*rates, ",") {
			r, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
			if err != nil || r <= 0 {
				fmt.Fprintf(os.Stderr, "bench: -rates: %q is not a rate\n", f)
				os.Exit(2)
			}
			rs = append(rs, r)
		}
		if err := runReadings(ctx, *edges, *perEdge, rs, *window); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	if *budget {
		if !given["report-every"] {
			*every = time.Second
		}
		if !given["window"] {
			*window = time.Minute
		}
		if err := runBudget(ctx, *edges, *perEdge, *every, *window); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(ctx, *edges, *every, *window); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

type bench struct {
	edgeLog edgeLog
	cp      *kube.ControlPlane
	c       client.WithWatch
	// config is the API server's, unthrottled: the bench's own reads and
	// writes are not what is measured.
	config     rest.Config
	cs         *kubernetes.Clientset
	dir        string
	kubeconfig string
	replicas   []*replica
	edges      []*edge
	ports      map[int]bool
	// defaultInterval runs the replicas at the default status interval
	// rather than 10 ms.
	defaultInterval bool
}

type replica struct {
	name    string
	proc    *procs.Proc
	ws      int
	health  int
	auth    int
	metrics int
	pprof   int
	logFile *os.File
}

type edge struct {
	node    string
	hub     *edgehub.EdgeHub
	dev     *linkv1.DeviceRef
	counter atomic.Int64 // the last value reported
	done    chan struct{}
}

// startBench starts a control plane (o) and a bench on it: a temporary
// folder (kept when REPLICAS_BENCH_KEEP is set), the kubeconfig the
// replicas use, unthrottled clients and the bench's namespace. stop undoes
// it all, replicas and edges too.
func startBench(ctx context.Context, o kube.Options, defaultInterval bool) (b *bench, stop func(), err error) {
	cp, err := kube.StartWith(o)
	if err != nil {
		return nil, nil, err
	}
	b = &bench{cp: cp, ports: map[int]bool{}, defaultInterval: defaultInterval}
	stop = func() {
		b.stopAll()
		_ = cp.Stop()
		if keep := os.Getenv("REPLICAS_BENCH_KEEP"); keep != "" && b.dir != "" {
			fmt.Printf("replica logs kept in %s\n", b.dir)
			return
		}
		if b.dir != "" {
			os.RemoveAll(b.dir)
		}
	}
	defer func() {
		if err != nil {
			stop()
		}
	}()
	if b.dir, err = os.MkdirTemp("", "dowse-replicas-bench"); err != nil {
		return nil, nil, err
	}
	b.kubeconfig = filepath.Join(b.dir, "kubeconfig")
	if err := cp.Kubeconfig(b.kubeconfig); err != nil {
		return nil, nil, err
	}
	b.config = *cp.Config
	b.config.QPS, b.config.Burst = -1, 0
	sch, err := scheme.New()
	if err != nil {
		return nil, nil, err
	}
	if b.c, err = client.NewWithWatch(&b.config, client.Options{Scheme: sch}); err != nil {
		return nil, nil, err
	}
	if b.cs, err = kubernetes.NewForConfig(&b.config); err != nil {
		return nil, nil, err
	}
	if err := b.c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}); err != nil {
		return nil, nil, err
	}
	return b, stop, nil
}

func run(ctx context.Context, n int, every, window time.Duration) error {
	b, stop, err := startBench(ctx, kube.Options{CRDs: true}, false)
	if err != nil {
		return err
	}
	defer stop()
	fmt.Printf("creating %d Nodes and Devices...\n", n)
	if err := b.objects(ctx, n); err != nil {
		return err
	}
	for i := range 3 {
		r, err := b.newReplica(fmt.Sprintf("replica-%d", i))
		if err != nil {
			return err
		}
		b.replicas = append(b.replicas, r)
	}
	// One replica first; the edges know all three addresses and find the
	// one that answers.
	r0, r1, r2 := b.replicas[0], b.replicas[1], b.replicas[2]
	// The first replica does not spread its edges while it runs first:
	// killed, it holds them all.
	if err := b.start(ctx, r0, "--link-spread-interval", "1h"); err != nil {
		return err
	}
	ca, err := b.linkCA(ctx)
	if err != nil {
		return err
	}
	idleRSS := anonMiB(r0)
	ectx, ecancel := context.WithCancel(ctx)
	defer func() {
		ecancel()
		for _, e := range b.edges {
			<-e.done
			_ = e.hub.Close()
		}
	}()
	t0 := time.Now()
	if err := b.startEdges(ectx, ca, n); err != nil {
		return err
	}
	if err := waitAll(ctx, b.edges, 5*time.Minute); err != nil {
		return err
	}
	fmt.Printf("%d edges have a session on %s in %s\n", n, r0.name, time.Since(t0).Round(time.Millisecond))
	time.Sleep(5 * time.Second)
	withEdges := anonMiB(r0)
	fmt.Printf("%s anonymous RSS: %.0f MiB before the edges, %.0f MiB with them (%.1f KiB each)\n", r0.name, idleRSS, withEdges, (withEdges-idleRSS)*1024/float64(n))
	stopReports := b.report(ectx, every)
	time.Sleep(window) // let the first writes settle
	var one rate
	if !failoverOnly {
		if one, err = b.writeRate(ctx, window); err != nil {
			return err
		}
		fmt.Printf("1 replica: %.0f reports/s written, %.0f status writes/s, status %.1f reports behind its edge (load %s)\n", one.reports, one.writes, one.behind, loadavg())
	}

	// A second replica, then the first killed: every edge goes to the
	// second at once.
	if err := b.start(ctx, r1); err != nil {
		return err
	}
	held, err := b.holders(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("%s ready; %s holds %d sessions; killing %s\n", r1.name, r0.name, held[r0.name], r0.name)
	killedWith := held[r0.name]
	// The steady state's CPU (one replica serving every edge's reports,
	// the second idle), to tell the failover's own cost from it.
	steady0 := b.cpuTimes(r0)
	ts0 := time.Now()
	time.Sleep(5 * time.Second)
	fmt.Printf("  CPU seconds a second before the kill (steady reporting): %s\n", cpuRate(steady0, b.cpuTimes(r0), time.Since(ts0)))
	cpu0 := b.cpuTimes(r1)
	api0, rest0 := b.apiMetrics(ctx), scrape(fmt.Sprintf("http://127.0.0.1:%d/metrics", r1.metrics))
	profiles := b.profile(ctx, r1)
	b.edgeLog.on.Store(true)
	tk := time.Now()
	r0.proc.Kill()
	if err := waitGone(ctx, b.edges, 10*time.Second); err != nil {
		fmt.Println("note:", err)
	}
	progress := time.NewTicker(time.Second)
	defer progress.Stop()
	var bySecond []string
	var bsMu sync.Mutex
	go func() {
		for range progress.C {
			connected := 0
			for _, e := range b.edges {
				if e.hub.Connected() {
					connected++
				}
			}
			bsMu.Lock()
			bySecond = append(bySecond, strconv.Itoa(connected))
			n := len(bySecond)
			bsMu.Unlock()
			if n%5 == 0 {
				fmt.Printf("  %s after the kill: %d edges with a session; %s: %s\n", time.Since(tk).Round(time.Second), connected, r1.name, hubFigures(r1))
			}
		}
	}()
	err = waitAll(ctx, b.edges, 2*time.Minute)
	progress.Stop()
	bsMu.Lock()
	fmt.Printf("  edges with a session, second by second after the kill: %s\n", strings.Join(bySecond, " "))
	bsMu.Unlock()
	failover := time.Since(tk).Round(time.Millisecond).String()
	b.edgeLog.on.Store(false)
	if err != nil {
		if ctx.Err() != nil {
			return err
		}
		failover = "> 2m (" + err.Error() + ")"
	}
	fmt.Printf("killed %s with %d sessions: every edge had a session again %s after the kill (load %s)\n",
		r0.name, killedWith, failover, loadavg())
	fmt.Printf("  %s meanwhile: %s\n", r1.name, hubFigures(r1))
	fmt.Printf("  CPU seconds used from the kill until then: %s\n", cpuSpent(cpu0, b.cpuTimes(r1)))
	fmt.Printf("  requests meanwhile: %s\n", requestFigures(api0, b.apiMetrics(ctx), rest0, scrape(fmt.Sprintf("http://127.0.0.1:%d/metrics", r1.metrics))))
	for msg, n := range b.edgeLog.take() {
		fmt.Printf("  edges logged %d× %s\n", n, msg)
	}
	if err := profiles(); err != nil {
		fmt.Println("note: profiles:", err)
	}

	if failoverOnly {
		stopReports()
		lost, err := b.checkNothingLost(ctx, 2*time.Minute)
		if err != nil {
			return err
		}
		fmt.Printf("failover only: %d edges, replica killed with %d sessions: all have one again after %s; %d Devices lost their last report; %d cores, load %s\n",
			n, killedWith, failover, lost, runtime.NumCPU(), loadavg())
		if lost > 0 {
			return fmt.Errorf("%d Devices lost their last report", lost)
		}
		return nil
	}

	// Three replicas: the first back, the third added; the spread moves
	// edges to them.
	if err := b.start(ctx, r0); err != nil {
		return err
	}
	if err := b.start(ctx, r2); err != nil {
		return err
	}
	ts := time.Now()
	var counts map[string]int
	for time.Since(ts) < 3*time.Minute {
		if counts, err = b.holders(ctx); err != nil {
			return err
		}
		if spreadEnough(counts, n, 3) {
			break
		}
		time.Sleep(time.Second)
	}
	fmt.Printf("spread over 3 replicas after %s: %v\n", time.Since(ts).Round(time.Second), counts)
	if err := waitAll(ctx, b.edges, 3*time.Minute); err != nil {
		return err
	}
	time.Sleep(window) // and the moved edges catch up
	three, err := b.writeRate(ctx, window)
	if err != nil {
		return err
	}
	var rss []string
	for _, r := range b.replicas {
		rss = append(rss, fmt.Sprintf("%s %.0f MiB", r.name, anonMiB(r)))
	}
	fmt.Printf("3 replicas, anonymous RSS while reporting: %s\n", strings.Join(rss, ", "))
	fmt.Printf("3 replicas: %.0f reports/s written, %.0f status writes/s, status %.1f reports behind its edge (load %s)\n", three.reports, three.writes, three.behind, loadavg())

	// Nothing lost: stop reporting, wait for every store to empty and
	// every Device to show its edge's last counter.
	stopReports()
	lost, err := b.checkNothingLost(ctx, 2*time.Minute)
	if err != nil {
		return err
	}

	fmt.Println()
	fmt.Printf("%-62s %12s\n", fmt.Sprintf("cloud side, %d simulated edges, API server on loopback", n), "")
	row := func(name, v string) { fmt.Printf("%-62s %12s\n", name, v) }
	row(fmt.Sprintf("reports/s into Device.status, 1 replica (offered %.0f/s)", float64(n)/every.Seconds()), fmt.Sprintf("%.0f", one.reports))
	row("  status writes/s", fmt.Sprintf("%.0f", one.writes))
	row("  status behind the edge (reports)", fmt.Sprintf("%.1f", one.behind))
	row("reports/s into Device.status, 3 replicas", fmt.Sprintf("%.0f", three.reports))
	row("  status writes/s", fmt.Sprintf("%.0f", three.writes))
	row("  status behind the edge (reports)", fmt.Sprintf("%.1f", three.behind))
	row("  3 replicas / 1, status writes", fmt.Sprintf("%.2f", three.writes/one.writes))
	row(fmt.Sprintf("controller memory per edge (anonymous RSS, %d edges on 1)", n), fmt.Sprintf("%.1f KiB", (withEdges-idleRSS)*1024/float64(n)))
	row(fmt.Sprintf("replica killed with %d sessions: all have one again after", killedWith), failover)
	row("Devices whose last report is missing from status", strconv.Itoa(lost))
	fmt.Printf("%d cores, load %s\n", runtime.NumCPU(), loadavg())
	if lost > 0 {
		return fmt.Errorf("%d Devices lost their last report", lost)
	}
	return nil
}

// objects creates n Nodes and one Device each on a model with one
// property.
func (b *bench) objects(ctx context.Context, n int) error {
	model := &v1alpha1.DeviceModel{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "bench"},
		Spec: v1alpha1.DeviceModelSpec{Protocol: "scripted", Properties: []v1alpha1.ModelProperty{{Name: "count", Type: v1alpha1.PropertyInt}}}}
	if err := b.c.Create(ctx, model); err != nil {
		return err
	}
	var g errgroup.Group
	g.SetLimit(32)
	for i := range n {
		g.Go(func() error {
			node := fmt.Sprintf("node-%d", i)
			if err := b.c.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}); err != nil {
				return err
			}
			return b.c.Create(ctx, &v1alpha1.Device{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: node + "-dev"},
				Spec: v1alpha1.DeviceSpec{DeviceModelRef: &corev1.LocalObjectReference{Name: "bench"}, NodeName: node}})
		})
	}
	return g.Wait()
}

func (b *bench) newReplica(name string) (*replica, error) {
	r := &replica{name: name}
	for _, p := range []*int{&r.ws, &r.health, &r.auth, &r.metrics, &r.pprof} {
		// Free now, and not one another replica, not started yet, took.
		for {
			port, err := procs.FreePort()
			if err != nil {
				return nil, err
			}
			if !b.ports[port] {
				b.ports[port], *p = true, port
				break
			}
		}
	}
	return r, nil
}

// start runs the replica and waits until it is ready (serves edges).
func (b *bench) start(ctx context.Context, r *replica, extra ...string) error {
	if r.logFile == nil {
		f, err := os.Create(filepath.Join(b.dir, r.name+".log"))
		if err != nil {
			return err
		}
		r.logFile = f
	}
	// The twin write path, not the client's limiter, is measured.
	args := []string{"--kube-api-qps", "5000", "--kube-api-burst", "10000", "--pprof-bind-address", b.pprofAddr(r)}
	// REPLICAS_BENCH_CONTROLLER_ARGS adds flags (e.g. --zap-log-level=debug).
	args = append(append(args, extra...), strings.Fields(os.Getenv("REPLICAS_BENCH_CONTROLLER_ARGS"))...)
	interval := 10 * time.Millisecond
	if b.defaultInterval {
		interval = 0
	} else {
		// The write path's own limits are measured, not the budget's.
		args = append(args, "--twin-status-budget=-1")
	}
	p, err := dowse.Controller{Kubeconfig: b.kubeconfig, PodName: r.name, Metrics: r.metrics, Health: r.health,
		Link:               &dowse.Link{WebSocket: r.ws, Auth: r.auth, Heartbeat: 5 * time.Second},
		TwinStatusInterval: interval, Args: args}.Start(r.logFile)
	if err != nil {
		return err
	}
	r.proc = p
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if p.Exited() {
			return fmt.Errorf("%s exited; see its log:\n%s", r.name, tail(r.logFile.Name()))
		}
		if code, err := httpGet(fmt.Sprintf("http://127.0.0.1:%d/readyz", r.health)); err == nil && code == 200 {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s not ready after 2 minutes; its log:\n%s", r.name, tail(r.logFile.Name()))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (b *bench) stopAll() {
	for _, r := range b.replicas {
		if r.proc != nil && !r.proc.Exited() {
			r.proc.Stop()
		}
		if r.logFile != nil {
			r.logFile.Close()
		}
	}
}

// linkCA reads the CA the controller made, to issue node certificates as
// its bootstrap endpoint would.
func (b *bench) linkCA(ctx context.Context) (*pki.CA, error) {
	var s corev1.Secret
	if err := b.c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "dowse-link-ca"}, &s); err != nil {
		return nil, err
	}
	return pki.LoadCA(s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey])
}

func (b *bench) startEdges(ctx context.Context, ca *pki.CA, n int) error {
	var servers []string
	for _, r := range b.replicas {
		servers = append(servers, fmt.Sprintf("127.0.0.1:%d", r.ws))
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	b.edges = make([]*edge, n)
	var g errgroup.Group
	g.SetLimit(runtime.NumCPU())
	for i := range n {
		g.Go(func() error {
			node := fmt.Sprintf("node-%d", i)
			cert, err := ca.IssueNode(node, "", 24*time.Hour)
			if err != nil {
				return err
			}
			dir := filepath.Join(b.dir, "edges", node)
			if err := os.MkdirAll(dir, 0o700); err != nil {
				return err
			}
			h, err := edgehub.New(edgehub.Config{Node: node, Transport: "websocket", Server: servers[0], Servers: servers[1:],
				TLS:      pki.ClientTLSConfig(pki.Static[*tls.CertificateRequestInfo](cert), pool, "127.0.0.1"),
				StateDir: dir, NoSync: true, Heartbeat: 5 * time.Second, BackoffMax: 2 * time.Second}, nil, nil)
			if err != nil {
				return err
			}
			e := &edge{node: node, hub: h, dev: &linkv1.DeviceRef{Namespace: "default", Name: node + "-dev"}, done: make(chan struct{})}
			b.edges[i] = e
			go func() {
				defer close(e.done)
				_ = h.Start(logr.NewContext(ctx, logr.New(b.edgeLog.sink())))
			}()
			return nil
		})
	}
	return g.Wait()
}

// report makes every edge report the next value of its counter each
// period, at a random phase, until the returned function is called.
func (b *bench) report(ctx context.Context, every time.Duration) func() {
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for i, e := range b.edges {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case <-time.After(every * time.Duration(i) / time.Duration(len(b.edges))):
			case <-rctx.Done():
				return
			}
			t := time.NewTicker(every)
			defer t.Stop()
			for {
				v := e.counter.Load() + 1
				if _, err := e.hub.Report(e.dev, "count", &linkv1.TwinValue{Value: strconv.FormatInt(v, 10)}, time.Now()); err == nil {
					e.counter.Store(v)
				}
				select {
				case <-t.C:
				case <-rctx.Done():
					return
				}
			}
		}()
	}
	return func() { cancel(); wg.Wait() }
}

type rate struct{ reports, writes, behind float64 }

// writeRate measures over window how far the Devices' reported counters
// advanced (each step one report whose effect is written) and how many
// status writes the API server answered.
func (b *bench) writeRate(ctx context.Context, window time.Duration) (rate, error) {
	v0, err := b.reported(ctx)
	if err != nil {
		return rate{}, err
	}
	w0, err := b.statusWrites(ctx)
	if err != nil {
		return rate{}, err
	}
	t0 := time.Now()
	time.Sleep(window)
	v1, err := b.reported(ctx)
	if err != nil {
		return rate{}, err
	}
	w1, err := b.statusWrites(ctx)
	if err != nil {
		return rate{}, err
	}
	d := time.Since(t0).Seconds()
	var steps, behind int64
	for name, v := range v1 {
		steps += v - v0[name]
	}
	for _, e := range b.edges {
		behind += e.counter.Load() - v1[e.dev.Name]
	}
	return rate{reports: float64(steps) / d, writes: (w1 - w0) / d, behind: float64(behind) / float64(len(b.edges))}, nil
}

// reported reads every Device's reported counter.
func (b *bench) reported(ctx context.Context) (map[string]int64, error) {
	var list v1alpha1.DeviceList
	if err := b.c.List(ctx, &list, client.InNamespace("default")); err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for _, d := range list.Items {
		for _, tw := range d.Status.Twins {
			if tw.PropertyName == "count" && tw.Reported != nil {
				v, _ := strconv.ParseInt(tw.Reported.Value, 10, 64)
				out[d.Name] = v
			}
		}
	}
	return out, nil
}

// statusWrites is the API server's count of successful Device status
// writes.
func (b *bench) statusWrites(ctx context.Context) (float64, error) {
	raw, err := b.cs.RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return 0, err
	}
	var sum float64
	sc := bufio.NewScanner(strings.NewReader(string(raw)))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, "apiserver_request_total{") || !strings.Contains(l, `resource="devices"`) ||
			!strings.Contains(l, `subresource="status"`) || !strings.Contains(l, `code="200"`) {
			continue
		}
		if !strings.Contains(l, `verb="PATCH"`) && !strings.Contains(l, `verb="PUT"`) {
			continue
		}
		f := strings.Fields(l)
		v, _ := strconv.ParseFloat(f[len(f)-1], 64)
		sum += v
	}
	return sum, sc.Err()
}

// holders counts the node records each replica holds.
func (b *bench) holders(ctx context.Context) (map[string]int, error) {
	list, err := b.cs.CoordinationV1().Leases(namespace).List(ctx, metav1.ListOptions{LabelSelector: ownership.LabelKind + "=node"})
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	for _, l := range list.Items {
		if l.Spec.HolderIdentity != nil {
			out[*l.Spec.HolderIdentity]++
		}
	}
	return out, nil
}

func (b *bench) checkNothingLost(ctx context.Context, within time.Duration) (int, error) {
	deadline := time.Now().Add(within)
	for {
		pending := 0
		for _, e := range b.edges {
			pending += e.hub.Pending()
		}
		got, err := b.reported(ctx)
		if err != nil {
			return 0, err
		}
		lost := 0
		for _, e := range b.edges {
			if got[e.dev.Name] != e.counter.Load() {
				lost++
			}
		}
		if (pending == 0 && lost == 0) || time.Now().After(deadline) {
			fmt.Printf("after reporting stopped: %d reports unacknowledged, %d Devices not at their last value\n", pending, lost)
			return lost, nil
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func spreadEnough(counts map[string]int, n, replicas int) bool {
	share := float64(n) / float64(replicas)
	if len(counts) < replicas {
		return false
	}
	for _, c := range counts {
		if float64(c) > 1.2*share {
			return false
		}
	}
	return true
}

// waitAll waits until every edge has a session.
func waitAll(ctx context.Context, edges []*edge, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		missing := 0
		for _, e := range edges {
			if !e.hub.Connected() {
				missing++
			}
		}
		if missing == 0 {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%d edges without a session after %s", missing, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitGone waits until some edge has seen its connection end.
func waitGone(ctx context.Context, edges []*edge, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		for _, e := range edges {
			if !e.hub.Connected() {
				return nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return errors.New("no edge saw the kill")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}

func tail(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	b, _ := io.ReadAll(f)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

var httpClient = &http.Client{Timeout: 2 * time.Second}

func httpGet(url string) (int, error) {
	resp, err := httpClient.Get(url)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// edgeLog counts what the simulated edges log (why a connection failed),
// while on.
type edgeLog struct {
	on     atomic.Bool
	mu     sync.Mutex
	counts map[string]int
}

func (l *edgeLog) sink() logr.LogSink { return &countingSink{l: l} }

func (l *edgeLog) take() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.counts
	l.counts = map[string]int{}
	return out
}

type countingSink struct{ l *edgeLog }

func (s *countingSink) Init(logr.RuntimeInfo)  {}
func (s *countingSink) Enabled(level int) bool { return level <= 1 && s.l.on.Load() }
func (s *countingSink) Info(_ int, msg string, kv ...any) {
	if msg == "link up" {
		return
	}
	key := msg
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i] == "reason" || kv[i] == "code" {
			r := fmt.Sprint(kv[i+1])
			// Addresses and ports differ from edge to edge.
			if j := strings.Index(r, "127.0.0.1:"); j >= 0 {
				r = r[:j] + "127.0.0.1:*" + strings.TrimLeft(r[j+len("127.0.0.1:"):], "0123456789")
			}
			key += ": " + r
		}
	}
	s.l.mu.Lock()
	if s.l.counts == nil {
		s.l.counts = map[string]int{}
	}
	s.l.counts[key]++
	s.l.mu.Unlock()
}
func (s *countingSink) Error(err error, msg string, kv ...any) {
	s.Info(0, msg+": "+err.Error(), kv...)
}
func (s *countingSink) WithValues(kv ...any) logr.LogSink { return s }
func (s *countingSink) WithName(string) logr.LogSink      { return s }

// series is a scrape of Prometheus metrics: each sample line's name and
// labels, as written, to its value.
type series map[string]float64

func parseSeries(r io.Reader) series {
	out := series{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if l == "" || l[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(l, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(l[i+1:], 64)
		if err == nil {
			out[l[:i]] = v
		}
	}
	return out
}

func scrape(url string) series {
	resp, err := httpClient.Get(url)
	if err != nil {
		return series{}
	}
	defer resp.Body.Close()
	return parseSeries(resp.Body)
}

func (b *bench) apiMetrics(ctx context.Context) series {
	raw, err := b.cs.RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return series{}
	}
	return parseSeries(strings.NewReader(string(raw)))
}

// sum adds the samples of metric name whose labels contain every one of
// labels (each written as in the exposition, `verb="PATCH"`).
func (s series) sum(name string, labels ...string) float64 {
	var t float64
	for k, v := range s {
		if !strings.HasPrefix(k, name+"{") && k != name {
			continue
		}
		ok := true
		for _, l := range labels {
			if !strings.Contains(k, l) {
				ok = false
				break
			}
		}
		if ok {
			t += v
		}
	}
	return t
}

// requestFigures says how many Lease and Device status writes the API
// server answered between two scrapes and their mean time there, the time
// of its etcd updates, and the replica's client's mean PATCH time.
func requestFigures(api0, api1, rest0, rest1 series) string {
	mean := func(s0, s1 series, name string, labels ...string) (n, ms float64) {
		n = s1.sum(name+"_count", labels...) - s0.sum(name+"_count", labels...)
		sec := s1.sum(name+"_sum", labels...) - s0.sum(name+"_sum", labels...)
		if n > 0 {
			ms = sec / n * 1000
		}
		return n, ms
	}
	var parts []string
	for _, q := range []struct {
		what, name string
		labels     []string
	}{
		{"Lease PATCH", "apiserver_request_duration_seconds", []string{`resource="leases"`, `verb="PATCH"`}},
		{"Device status PATCH", "apiserver_request_duration_seconds", []string{`resource="devices"`, `subresource="status"`, `verb="PATCH"`}},
		{"Device status PUT", "apiserver_request_duration_seconds", []string{`resource="devices"`, `subresource="status"`, `verb="PUT"`}},
		{"Device GET", "apiserver_request_duration_seconds", []string{`resource="devices"`, `verb="GET"`}},
		{"etcd Lease update", "etcd_request_duration_seconds", []string{`operation="update"`, `type="leases.coordination.k8s.io"`}},
		{"etcd Device update", "etcd_request_duration_seconds", []string{`operation="update"`, `type="devices.dowse.dev"`}},
		// Time in API Priority and Fairness's queues, which the request
		// durations above leave out.
		{"APF wait", "apiserver_flowcontrol_request_wait_duration_seconds", []string{`execute="true"`}},
	} {
		if n, ms := mean(api0, api1, q.name, q.labels...); n > 0 {
			parts = append(parts, fmt.Sprintf("%s %.0f × %.1f ms", q.what, n, ms))
		}
	}
	if n, ms := mean(rest0, rest1, "rest_client_request_duration_seconds", `verb="PATCH"`); n > 0 {
		parts = append(parts, fmt.Sprintf("replica's PATCHes %.0f × %.1f ms", n, ms))
	}
	if n, ms := mean(rest0, rest1, "rest_client_request_duration_seconds", `verb="PUT"`); n > 0 {
		parts = append(parts, fmt.Sprintf("replica's PUTs %.0f × %.1f ms", n, ms))
	}
	return strings.Join(parts, "; ")
}

// hubFigures sums what the replica's metrics say about taking sessions:
// claims and their mean time, connections refused by reason.
func hubFigures(r *replica) string {
	resp, err := httpClient.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", r.metrics))
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	var claims, claimSec float64
	refused := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.ParseFloat(f[len(f)-1], 64)
		switch {
		case strings.HasPrefix(l, "dowse_cloudhub_node_claim_seconds_sum"):
			claimSec = v
		case strings.HasPrefix(l, "dowse_cloudhub_node_claim_seconds_count"):
			claims = v
		case strings.HasPrefix(l, "dowse_cloudhub_refused_connections_total{"):
			_, reason, _ := strings.Cut(l, `reason="`)
			reason, _, _ = strings.Cut(reason, `"`)
			refused[reason] = v
		}
	}
	mean := 0.0
	if claims > 0 {
		mean = claimSec / claims * 1000
	}
	return fmt.Sprintf("%.0f claims, %.0f ms each on average; connections refused: %v", claims, mean, refused)
}

func (b *bench) pprofAddr(r *replica) string {
	if v := os.Getenv("BENCH_PPROF_" + strings.ReplaceAll(r.name, "-", "_")); v != "" {
		return v
	}
	if profileDir != "" {
		return fmt.Sprintf("127.0.0.1:%d", r.pprof)
	}
	return ""
}

// cpuTimes is the CPU time used so far by this process (the simulated
// edges), the API server, etcd and replica r.
func (b *bench) cpuTimes(r *replica) map[string]time.Duration {
	out := map[string]time.Duration{}
	if d, err := procs.CPUTime(os.Getpid()); err == nil {
		out["bench (edges)"] = d
	}
	for _, comm := range []string{"kube-apiserver", "etcd"} {
		if pid, err := procs.Child(comm); err == nil {
			if d, err := procs.CPUTime(pid); err == nil {
				out[comm] = d
			}
		}
	}
	if d, err := procs.CPUTime(r.proc.Pid()); err == nil {
		out[r.name] = d
	}
	if busy, _, err := procs.MachineCPU(); err == nil {
		out["machine"] = busy
	}
	return out
}

func cpuRate(before, after map[string]time.Duration, d time.Duration) string {
	var parts []string
	for _, k := range []string{"bench (edges)", "kube-apiserver", "etcd", "replica-0", "machine"} {
		if a, ok := after[k]; ok {
			parts = append(parts, fmt.Sprintf("%s %.2f", k, (a-before[k]).Seconds()/d.Seconds()))
		}
	}
	return strings.Join(parts, ", ")
}

func cpuSpent(before, after map[string]time.Duration) string {
	var parts []string
	for _, k := range []string{"bench (edges)", "kube-apiserver", "etcd", "replica-1", "machine"} {
		if a, ok := after[k]; ok {
			parts = append(parts, fmt.Sprintf("%s %.1f", k, (a-before[k]).Seconds()))
		}
	}
	return strings.Join(parts, ", ")
}

// profile starts CPU profiles of r and the API server, when -profile is
// set; the returned function waits for them and writes them.
func (b *bench) profile(ctx context.Context, r *replica) func() error {
	if profileDir == "" {
		return func() error { return nil }
	}
	if err := os.MkdirAll(profileDir, 0o755); err != nil {
		return func() error { return err }
	}
	secs := int(profileFor.Seconds())
	var g errgroup.Group
	g.Go(func() error {
		f, err := os.Create(filepath.Join(profileDir, "bench.pprof"))
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		time.Sleep(profileFor)
		pprof.StopCPUProfile()
		return nil
	})
	g.Go(func() error {
		c := &http.Client{Timeout: profileFor + 30*time.Second}
		resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/profile?seconds=%d", r.pprof, secs))
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		raw, err := io.ReadAll(resp.Body)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(profileDir, r.name+".pprof"), raw, 0o644)
	})
	g.Go(func() error {
		raw, err := b.cs.RESTClient().Get().AbsPath("/debug/pprof/profile").Param("seconds", strconv.Itoa(secs)).Timeout(profileFor + 30*time.Second).DoRaw(ctx)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(profileDir, "kube-apiserver.pprof"), raw, 0o644)
	})
	return g.Wait
}

// anonMiB is the replica's anonymous resident memory (its heap and
// stacks, not the binary's pages), MiB.
func anonMiB(r *replica) float64 {
	m, err := r.proc.MemoryNow()
	if err != nil {
		return 0
	}
	return float64(m.Anon) / 1024
}
