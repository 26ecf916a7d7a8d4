package main

// -readings: report → visible in the live readings API, through the path
// a client takes.

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"

	"github.com/dowse-dev/dowse/internal/dowsectl/live"
	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
	readingsv1 "github.com/dowse-dev/dowse/shared/api/readings/v1alpha1"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/framework/kube"
	"github.com/dowse-dev/dowse/test/framework/procs"
)

// readingsService is the Service the readings APIService names.
const readingsService = "dowse-readings"

// readingsWatch is what the watcher saw: per Device the newest counter,
// and each new counter's time from its report to its arrival.
type readingsWatch struct {
	mu sync.Mutex
	// on: arrivals are measured (the load has settled).
	on   bool
	last map[string]int64
	// direct: the replica the API server reaches held the node;
	// forwarded: the other did, and the first followed its watch.
	direct, forwarded []time.Duration
	// skipped counts counters never seen: superseded by a newer one before
	// the replica sent the Device's event (events coalesce).
	events, skipped int
}

func (w *readingsWatch) take() (direct, forwarded []time.Duration, events, skipped int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	direct, forwarded, events, skipped = w.direct, w.forwarded, w.events, w.skipped
	w.direct, w.forwarded, w.events, w.skipped = nil, nil, 0, 0
	return
}

// runReadings runs two replicas serving the live readings API behind the
// API server's aggregator (its APIService's Service reaching replica 0),
// nEdges × perEdge Devices on simulated edges spread over both, and one
// watch of every DeviceReading of the namespace through the API server,
// as `kubectl get devicereadings -w` or the console makes it. At each
// offered report rate it prints how long a counter took from its report
// (the edge's call) to its arrival in the watch, p50 / p99 / max, for the
// Devices of the replica the API server reaches and of the other (whose
// values the first forwards), how many counters the watch saw, and the
// CPU each process used.
func runReadings(ctx context.Context, nEdges, perEdge int, rates []float64, window time.Duration) error {
	n := nEdges * perEdge
	b, stop, err := startBench(ctx, kube.Options{CRDs: true, Aggregator: true}, true)
	if err != nil {
		return err
	}
	defer stop()
	if err := createFleet(ctx, b.c, nEdges, perEdge, v1alpha1.ModelProperty{Name: "count", Type: v1alpha1.PropertyInt}); err != nil {
		return err
	}

	// The replicas, each serving the readings API; the APIService's
	// Service reaches replica 0 on loopback (no kube-proxy here).
	readingsPorts := map[string]int{}
	for i := range 2 {
		r, err := b.newReplica(fmt.Sprintf("replica-%d", i))
		if err != nil {
			return err
		}
		port, err := b.freePort()
		if err != nil {
			return err
		}
		readingsPorts[r.name] = port
		b.replicas = append(b.replicas, r)
		if err := b.start(ctx, r, "--readings-address", fmt.Sprintf("127.0.0.1:%d", port), "--readings-service", readingsService,
			"--readings-apiservice", readingsv1.APIServiceName); err != nil {
			return err
		}
	}
	front := readingsPorts[b.replicas[0].name]
	if err := b.c.Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: readingsService},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "localhost",
			Ports: []corev1.ServicePort{{Name: "https", Port: int32(front)}}}}); err != nil {
		return err
	}
	if err := b.c.Create(ctx, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
		"metadata": map[string]any{"name": readingsv1.APIServiceName},
		"spec": map[string]any{"group": readingsv1.Group, "version": readingsv1.Version,
			"groupPriorityMinimum": int64(1000), "versionPriority": int64(15),
			"service": map[string]any{"namespace": namespace, "name": readingsService, "port": int64(front)}},
	}}); err != nil {
		return err
	}
	dc, err := discovery.NewDiscoveryClientForConfig(&b.config)
	if err != nil {
		return err
	}
	for t1 := time.Now(); !live.ReadingsServed(dc); time.Sleep(500 * time.Millisecond) {
		if time.Since(t1) > 2*time.Minute {
			return errors.New("the API server does not serve the readings API after 2 minutes")
		}
	}
	ca, err := b.linkCA(ctx)
	if err != nil {
		return err
	}

	// The edges, spread over both replicas.
	edges, stopEdges, err := b.startBudgetEdges(ctx, ca, nEdges, perEdge, nil)
	defer stopEdges()
	if err != nil {
		return err
	}
	held, err := b.holders(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("%d edges have a session: %v\n", nEdges, held)

	// The watcher: the dynamic client, as kubectl and the console use it,
	// through the API server's aggregator.
	dyn, err := dynamic.NewForConfig(&b.config)
	if err != nil {
		return err
	}
	rw := &readingsWatch{last: map[string]int64{}}
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	watchErr := make(chan error, 1)
	go func() { watchErr <- watchReadings(wctx, dyn, b.replicas[0].name, rw) }()

	fmt.Println()
	fmt.Printf("report → visible in a watch of the live readings API through the API server, %d Devices on %d edges, 2 replicas (the API server reaches replica-0)\n", n, nEdges)
	fmt.Printf("%-18s %-16s %-22s %-22s %-22s %s\n", "reports/s offered", "counters seen", "p50 / p99 / max", "replica-0's Devices", "replica-1's (forwarded)", "CPU s/s")
	for _, rate := range rates {
		every := time.Duration(float64(n) / rate * float64(time.Second))
		stop := reportCounters(ctx, edges, every)
		time.Sleep(min(window/3, 5*time.Second)) // settle
		_, _, _, _ = rw.take()
		rw.mu.Lock()
		rw.on = true
		rw.mu.Unlock()
		cpu0 := b.cpuTimes(b.replicas[0])
		if d, err := procs.CPUTime(b.replicas[1].proc.Pid()); err == nil {
			cpu0[b.replicas[1].name] = d
		}
		m0 := time.Now()
		select {
		case <-time.After(window):
		case err := <-watchErr:
			stop()
			return fmt.Errorf("the watch ended: %w", err)
		case <-ctx.Done():
			stop()
			return ctx.Err()
		}
		elapsed := time.Since(m0)
		cpu1 := b.cpuTimes(b.replicas[0])
		if d, err := procs.CPUTime(b.replicas[1].proc.Pid()); err == nil {
			cpu1[b.replicas[1].name] = d
		}
		rw.mu.Lock()
		rw.on = false
		rw.mu.Unlock()
		stop()
		direct, forwarded, events, skipped := rw.take()
		all := slices.Concat(direct, forwarded)
		slices.Sort(all)
		slices.Sort(direct)
		slices.Sort(forwarded)
		q := func(d []time.Duration, full bool) string {
			if len(d) == 0 {
				return "-"
			}
			if full {
				return fmt.Sprintf("%s / %s / %s", pct(d, 0.5), pct(d, 0.99), d[len(d)-1].Round(time.Millisecond))
			}
			return fmt.Sprintf("%s / %s", pct(d, 0.5), pct(d, 0.99))
		}
		var use []string
		for _, k := range []string{"bench (edges)", "kube-apiserver", "etcd", "replica-0", "replica-1", "machine"} {
			if a, ok := cpu1[k]; ok {
				use = append(use, fmt.Sprintf("%s %.2f", k, (a-cpu0[k]).Seconds()/elapsed.Seconds()))
			}
		}
		seen := "-"
		if events+skipped > 0 {
			seen = fmt.Sprintf("%d of %d", events, events+skipped)
		}
		fmt.Printf("%-18s %-16s %-22s %-22s %-22s %s\n", fmt.Sprintf("%.0f (%d/s taken)", rate, int(float64(events+skipped)/elapsed.Seconds())),
			seen, q(all, true), q(direct, false), q(forwarded, false), strings.Join(use, ", "))
	}
	fmt.Printf("%d cores, load %s\n", runtime.NumCPU(), loadavg())
	return nil
}

// freePort is a free loopback port no replica of b was given.
func (b *bench) freePort() (int, error) {
	for {
		port, err := procs.FreePort()
		if err != nil {
			return 0, err
		}
		if !b.ports[port] {
			b.ports[port] = true
			return port, nil
		}
	}
}

// reportCounters makes each edge report the next counter of each of its
// Devices every period, in one call, at a phase of its own, until the
// returned func is called.
func reportCounters(ctx context.Context, edges []*budgetEdge, every time.Duration) func() {
	rctx, rcancel := context.WithCancel(ctx)
	var reporters sync.WaitGroup
	for k, e := range edges {
		reporters.Go(func() {
			select {
			case <-time.After(every * time.Duration(k) / time.Duration(len(edges))):
			case <-rctx.Done():
				return
			}
			tick := time.NewTicker(every)
			defer tick.Stop()
			reports := make([]*linkv1.TwinReportedUpdate, len(e.devs))
			for {
				now := time.Now()
				for i, d := range e.devs {
					reports[i] = &linkv1.TwinReportedUpdate{Device: d, Property: "count",
						Reported: &linkv1.TwinValue{Value: strconv.FormatInt(e.counter[i].Load()+1, 10)}, Time: timestamppb.New(now)}
				}
				if err := e.hub.ReportMany(reports); err == nil {
					for i := range e.devs {
						e.counter[i].Add(1)
					}
				}
				select {
				case <-tick.C:
				case <-rctx.Done():
					return
				}
			}
		})
	}
	return func() { rcancel(); reporters.Wait() }
}

// watchReadings watches every DeviceReading of the namespace through the
// API server until ctx ends (a watch the server ends is made again) and
// records in w each new counter's time from its report (the reading's
// time: the edge's timestamp) to its arrival; front is the replica the API
// server reaches.
func watchReadings(ctx context.Context, dyn dynamic.Interface, front string, w *readingsWatch) error {
	ri := dyn.Resource(readingsv1.GVR()).Namespace("default")
	for ctx.Err() == nil {
		wi, err := ri.Watch(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for ev := range wi.ResultChan() {
			now := time.Now()
			if ev.Type != watch.Added && ev.Type != watch.Modified {
				continue
			}
			u, ok := ev.Object.(*unstructured.Unstructured)
			if !ok {
				continue
			}
			var r readingsv1.DeviceReading
			if err := kruntime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &r); err != nil {
				continue
			}
			p := r.Property("count")
			if p == nil || p.Source != readingsv1.SourceLive {
				continue
			}
			v, err := strconv.ParseInt(p.Value, 10, 64)
			if err != nil {
				continue
			}
			w.mu.Lock()
			last, known := w.last[r.Name]
			if v > last {
				w.last[r.Name] = v
				if w.on && known {
					w.events++
					w.skipped += int(v - last - 1)
					d := now.Sub(p.Time.Time)
					if r.Replica == front {
						w.direct = append(w.direct, d)
					} else {
						w.forwarded = append(w.forwarded, d)
					}
				}
			}
			w.mu.Unlock()
		}
		wi.Stop()
	}
	return nil
}
