package main

// -budget: the status write budget under a fleet's load.

import (
	"context"
	"fmt"
	"maps"
	"math"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/internal/agent/edgehub"
	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/framework/kube"
	"github.com/dowse-dev/dowse/test/framework/procs"
)

// budgetEdge is a simulated edge with several Devices, which applies a
// desired value at once and reports it back as observed.
type budgetEdge struct {
	node    string
	hub     *edgehub.EdgeHub
	devs    []*linkv1.DeviceRef
	counter []atomic.Int64
	done    chan struct{}
}

// runBudget runs two replicas at their default status budget (and
// interval) under nEdges × perEdge Devices each reporting a changing
// counter every period, and prints the status writes a second the API
// server takes, each replica's by priority, how old the statuses were
// when written, desired → acknowledged in status under that load, and the
// edges' largest unacknowledged backlog; then, with the reports stopped,
// how long until every Device shows its last counter.
func runBudget(ctx context.Context, nEdges, perEdge int, every, window time.Duration) error {
	n := nEdges * perEdge
	b, stop, err := startBench(ctx, kube.Options{CRDs: true}, true)
	if err != nil {
		return err
	}
	defer stop()
	if err := createFleet(ctx, b.c, nEdges, perEdge, v1alpha1.ModelProperty{Name: "count", Type: v1alpha1.PropertyInt},
		v1alpha1.ModelProperty{Name: "setpoint", Type: v1alpha1.PropertyInt, AccessMode: v1alpha1.ReadWrite}); err != nil {
		return err
	}
	// Each replica keeps the live readings (the store every report goes
	// into, as with the chart's link.readings.enabled), without the
	// APIService: -readings measures serving them.
	for i := range 2 {
		r, err := b.newReplica(fmt.Sprintf("replica-%d", i))
		if err != nil {
			return err
		}
		port, err := b.freePort()
		if err != nil {
			return err
		}
		b.replicas = append(b.replicas, r)
		if err := b.start(ctx, r, "--readings-address", fmt.Sprintf("127.0.0.1:%d", port)); err != nil {
			return err
		}
	}
	ca, err := b.linkCA(ctx)
	if err != nil {
		return err
	}
	// Each replica's memory with every Device in its cache and no edge:
	// what the edges' sessions, twins and readings add is measured
	// against it.
	time.Sleep(5 * time.Second)
	idleRSS := make([]float64, len(b.replicas))
	for i, r := range b.replicas {
		idleRSS[i] = anonMiB(r)
	}

	// The edges: each gets every replica's address, starting at one of
	// them in turn.
	var atEdge sync.Map // "device=value" → when its edge got the desired value
	t1 := time.Now()
	edges, stopEdges, err := b.startBudgetEdges(ctx, ca, nEdges, perEdge, func(e *budgetEdge) edgehub.OnMessage {
		return func(_ context.Context, env *linkv1.Envelope) {
			ed := env.GetDeviceUpdate().GetDevice()
			for _, p := range ed.GetProperties() {
				if p.GetName() == "setpoint" && p.GetDesired() != nil {
					v := &linkv1.TwinValue{Value: p.GetDesired().GetValue()}
					atEdge.Store(ed.GetRef().GetName()+"="+v.Value, time.Now())
					go func() { _, _ = e.hub.Report(ed.GetRef(), "setpoint", v, time.Now(), edgehub.WithObservedDesired(v)) }()
				}
			}
		}
	})
	defer stopEdges()
	if err != nil {
		return err
	}
	held, err := b.holders(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("%d edges have a session in %s: %v\n", nEdges, time.Since(t1).Round(time.Second), held)
	// The leader's Valid condition of each new Device (its spec's write,
	// not its reports') first, so that it does not count.
	t2 := time.Now()
	for {
		var list v1alpha1.DeviceList
		if err := b.c.List(ctx, &list, client.InNamespace("default")); err != nil {
			return err
		}
		valid := 0
		for _, d := range list.Items {
			if meta.IsStatusConditionTrue(d.Status.Conditions, v1alpha1.ConditionDeviceValid) {
				valid++
			}
		}
		if valid == n {
			break
		}
		if time.Since(t2) > 10*time.Minute {
			return fmt.Errorf("%d of %d Devices Valid after 10 minutes", valid, n)
		}
		time.Sleep(2 * time.Second)
	}
	fmt.Printf("every Device Valid %s later\n", time.Since(t2).Round(time.Second))

	// Desired values acknowledged, each seen through a watch of its own
	// Device (a field selector on its name, from the resourceVersion it
	// was read at): a watch of all 20,000 Devices fell behind on this
	// machine, was closed by the API server and relisted 20,000 Devices
	// again and again, stalling the bench's other requests behind it on
	// the same connection.
	type probe struct {
		want string
		set  time.Time
		// written: the desired value's Update returned; specSeen: its
		// event in the bench's watch. specSeen - written is the API
		// server's watch delivery of one Device write under this load,
		// the same path as the acknowledging status write's.
		written, specSeen time.Time
	}
	var pmu sync.Mutex
	probes := map[string]probe{}
	var acks, down []time.Duration // set → in status; set → at the edge
	// The API server's part: its status write (the managedFields time of
	// the status subresource's newest entry, whole seconds: the figure is
	// up to 1 s above the truth) → the event in the bench's watch.
	var delivered []time.Duration
	// The API server's watch delivery of each probe's own spec write, and
	// desired → acknowledged less it (the status write's delivery to the
	// bench's watch, estimated by the spec write's) and less it twice
	// (the desired value's delivery to the replica's informer too).
	var specDelivery, lessOne, lessTwo, up []time.Duration
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	handle := func(t watch.EventType, o client.Object) {
		d, ok := o.(*v1alpha1.Device)
		if !ok || t == watch.Deleted {
			return
		}
		now := time.Now()
		pmu.Lock()
		defer pmu.Unlock()
		p, ok := probes[d.Name]
		if !ok {
			return
		}
		if p.specSeen.IsZero() {
			for _, dp := range d.Spec.Properties {
				if dp.Name == "setpoint" && dp.Desired != nil && dp.Desired.Value == p.want {
					p.specSeen = now
					probes[d.Name] = p
				}
			}
		}
		for _, tw := range d.Status.Twins {
			if tw.PropertyName == "setpoint" && tw.ObservedDesired != nil && tw.ObservedDesired.Value == p.want {
				acks = append(acks, now.Sub(p.set))
				if at := statusWrittenAt(d); !at.IsZero() {
					delivered = append(delivered, now.Sub(at))
				}
				if at, ok := atEdge.Load(d.Name + "=" + p.want); ok {
					down = append(down, at.(time.Time).Sub(p.set))
					up = append(up, now.Sub(at.(time.Time)))
				}
				if !p.specSeen.IsZero() && !p.written.IsZero() {
					w := max(0, p.specSeen.Sub(p.written))
					specDelivery = append(specDelivery, w)
					lessOne = append(lessOne, now.Sub(p.set)-w)
					lessTwo = append(lessTwo, max(0, now.Sub(p.set)-2*w))
				}
				delete(probes, d.Name)
			}
		}
	}

	// The load: each edge reports the next counter of each of its
	// Devices every period, in one call, at a phase of its own.
	rctx, rcancel := context.WithCancel(ctx)
	var reporters sync.WaitGroup
	var maxPending atomic.Int64
	for k, e := range edges {
		reporters.Go(func() {
			select {
			case <-time.After(every * time.Duration(k) / time.Duration(nEdges)):
			case <-rctx.Done():
				return
			}
			tick := time.NewTicker(every)
			defer tick.Stop()
			reports := make([]*linkv1.TwinReportedUpdate, perEdge)
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
				if p := int64(e.hub.Pending()); p > maxPending.Load() {
					maxPending.Store(p)
				}
				select {
				case <-tick.C:
				case <-rctx.Done():
					return
				}
			}
		})
	}
	stopReports := func() { rcancel(); reporters.Wait() }
	defer stopReports()
	fmt.Printf("reporting: %d Devices every %s (%.0f reports/s offered); settling for %s\n", n, every, float64(n)/every.Seconds(), window/2)
	time.Sleep(window / 2)
	maxPending.Store(0)

	// A loaded replica may take seconds to answer.
	patient := &http.Client{Timeout: 30 * time.Second}
	// Each scrape's time is its request's midpoint: under this load one
	// takes seconds, and a rate over the window divides by the time
	// between a counter's two scrapes, not by the window's length.
	mid := func(f func()) time.Time {
		t := time.Now()
		f()
		return t.Add(time.Since(t) / 2)
	}
	var scraped []time.Time // of the last scrapeAll, a replica each
	scrapeAll := func() []series {
		var out []series
		scraped = make([]time.Time, len(b.replicas))
		for i, r := range b.replicas {
			t := time.Now()
			s := series{}
			if resp, err := patient.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", r.metrics)); err == nil {
				s = parseSeries(resp.Body)
				resp.Body.Close()
			} else {
				fmt.Println("note: scraping", r.name, err)
			}
			out = append(out, s)
			scraped[i] = t.Add(time.Since(t) / 2)
		}
		return out
	}
	// CPU seconds a second of the edges (this process), the API server,
	// etcd and each replica over the window.
	cpu := func() map[string]time.Duration {
		out := b.cpuTimes(b.replicas[0])
		if d, err := procs.CPUTime(b.replicas[1].proc.Pid()); err == nil {
			out[b.replicas[1].name] = d
		}
		return out
	}
	var api0, api1 float64
	tAPI0 := mid(func() { api0, err = b.statusWrites(ctx) })
	if err != nil {
		return err
	}
	rep0 := scrapeAll()
	tRep0 := scraped
	apiM0 := b.apiMetrics(ctx)
	var cpu0, cpu1 map[string]time.Duration
	tCPU0 := mid(func() { cpu0 = cpu() })
	m0 := time.Now()
	// A desired value on another Device every 250 ms through the window.
	var setters sync.WaitGroup
	tick := time.NewTicker(250 * time.Millisecond)
	for k := 0; time.Since(m0) < window; k++ {
		<-tick.C
		e, i := (k*7919)%nEdges, k%perEdge
		name := devName(e, i)
		setters.Go(func() {
			var d v1alpha1.Device
			gctx, gcancel := context.WithTimeout(ctx, 30*time.Second)
			err := b.c.Get(gctx, client.ObjectKey{Namespace: "default", Name: name}, &d)
			gcancel()
			if err != nil {
				return
			}
			w, err := b.c.Watch(wctx, &v1alpha1.DeviceList{}, &client.ListOptions{Namespace: "default",
				Raw: &metav1.ListOptions{FieldSelector: "metadata.name=" + name, ResourceVersion: d.ResourceVersion}})
			if err != nil {
				return
			}
			defer w.Stop()
			want := strconv.Itoa(1000 + k)
			d.Spec.Properties = []v1alpha1.DeviceProperty{{Name: "setpoint", Desired: &v1alpha1.TwinProperty{Value: want}}}
			pmu.Lock()
			probes[name] = probe{want: want, set: time.Now()}
			pmu.Unlock()
			err = b.c.Update(ctx, &d)
			done := time.Now()
			pmu.Lock()
			if err != nil {
				delete(probes, name)
				pmu.Unlock()
				return
			}
			if p, ok := probes[name]; ok && p.want == want {
				p.written = done
				probes[name] = p
			}
			pmu.Unlock()
			for ev := range w.ResultChan() {
				o, ok := ev.Object.(client.Object)
				if ev.Type == watch.Error || !ok {
					break
				}
				handle(ev.Type, o)
				pmu.Lock()
				_, open := probes[name]
				pmu.Unlock()
				if !open {
					break
				}
			}
		})
	}
	tick.Stop()
	tCPU1 := mid(func() { cpu1 = cpu() })
	tAPI1 := mid(func() { api1, err = b.statusWrites(ctx) })
	if err != nil {
		return err
	}
	rep1 := scrapeAll()
	tRep1 := scraped
	apiM1 := b.apiMetrics(ctx)
	elapsed := time.Since(m0).Seconds()
	apiElapsed, cpuElapsed := tAPI1.Sub(tAPI0).Seconds(), tCPU1.Sub(tCPU0).Seconds()
	backlog := maxPending.Load()
	time.Sleep(5 * time.Second) // the last acknowledgements
	wcancel()
	setters.Wait()
	pmu.Lock()
	lat, downLat, deliveredLat := slices.Clone(acks), slices.Clone(down), slices.Clone(delivered)
	specLat, lessOneLat, lessTwoLat, upLat := slices.Clone(specDelivery), slices.Clone(lessOne), slices.Clone(lessTwo), slices.Clone(up)
	unacked := len(probes)
	left := maps.Clone(probes)
	pmu.Unlock()
	// Why not: what the unacknowledged Devices' statuses and specs show.
	why := map[string]int{}
	for name, p := range left {
		var d v1alpha1.Device
		gctx, gcancel := context.WithTimeout(ctx, 30*time.Second)
		err := b.c.Get(gctx, client.ObjectKey{Namespace: "default", Name: name}, &d)
		gcancel()
		if err != nil {
			why["unreadable"]++
			continue
		}
		obs := ""
		for _, tw := range d.Status.Twins {
			if tw.PropertyName == "setpoint" && tw.ObservedDesired != nil {
				obs = tw.ObservedDesired.Value
			}
		}
		c := meta.FindStatusCondition(d.Status.Conditions, v1alpha1.ConditionDesiredApplied)
		if _, ok := atEdge.Load(name + "=" + p.want); !ok {
			why["not at its edge"]++
		}
		switch {
		case obs == p.want:
			why["in status now"]++
		case c != nil && c.ObservedGeneration == d.Generation:
			why["DesiredApplied Pending written, no acknowledgement"]++
		default:
			why["nothing of it in status"]++
		}
	}
	if len(why) > 0 {
		fmt.Printf("the desired values not acknowledged in time: %v\n", why)
	}
	slices.Sort(lat)
	slices.Sort(downLat)
	slices.Sort(deliveredLat)
	for _, l := range [][]time.Duration{specLat, lessOneLat, lessTwoLat, upLat} {
		slices.Sort(l)
	}
	var rss []string
	var heldEdges int
	var grew float64
	holders, _ := b.holders(ctx)
	for i, r := range b.replicas {
		now := anonMiB(r)
		rss = append(rss, fmt.Sprintf("%s %.0f → %.0f MiB (%d edges)", r.name, idleRSS[i], now, holders[r.name]))
		heldEdges += holders[r.name]
		grew += now - idleRSS[i]
	}

	var taken float64
	var perReplica []string
	for i, r := range b.replicas {
		elapsed := tRep1[i].Sub(tRep0[i]).Seconds()
		var parts []string
		for _, p := range []string{"urgent", "change", "repeat"} {
			d := rep1[i].sum("dowse_twins_status_priority_writes_total", `priority="`+p+`"`) - rep0[i].sum("dowse_twins_status_priority_writes_total", `priority="`+p+`"`)
			parts = append(parts, fmt.Sprintf("%s %.1f", p, d/elapsed))
		}
		// A write that found the Device changed since it was read (by the
		// leader's validity check, or a cache behind) is read from the API
		// server and made again.
		conflicts := rep1[i].sum("dowse_twins_status_writes_total", `result="conflict"`) - rep0[i].sum("dowse_twins_status_writes_total", `result="conflict"`)
		parts = append(parts, fmt.Sprintf("conflicts %.1f", conflicts/elapsed))
		taken += (rep1[i].sum("dowse_twins_reports_total") - rep0[i].sum("dowse_twins_reports_total")) / elapsed
		perReplica = append(perReplica, fmt.Sprintf("%s %s", r.name, strings.Join(parts, ", ")))
	}
	q := func(name, label string) string {
		return fmt.Sprintf("%.2f / %.2f s", histQuantile(rep0, rep1, name, label, 0.5), histQuantile(rep0, rep1, name, label, 0.99))
	}

	fmt.Println()
	fmt.Printf("%-66s %14s\n", fmt.Sprintf("status budget, %d Devices on %d simulated edges, 2 replicas", n, nEdges), "")
	row := func(name, v string) { fmt.Printf("%-66s %14s\n", name, v) }
	row(fmt.Sprintf("reports/s offered (every %s) / taken by the replicas", every), fmt.Sprintf("%.0f / %.0f", float64(n)/every.Seconds(), taken))
	row(fmt.Sprintf("Device status writes/s at the API server (budget %d a replica)", 100), fmt.Sprintf("%.1f", (api1-api0)/apiElapsed))
	for _, p := range perReplica {
		row("  by priority, "+p, "")
	}
	row("status age when written, changes, p50 / p99", q("dowse_twins_status_age_seconds", `priority="change"`))
	if len(lat) > 0 {
		row(fmt.Sprintf("desired → acknowledged in status, p50 / p99 / max (%d)", len(lat)),
			fmt.Sprintf("%s / %s / %s", pct(lat, 0.5), pct(lat, 0.99), lat[len(lat)-1].Round(time.Millisecond)))
	}
	if len(downLat) > 0 {
		row("  of which set → at its edge, p50 / p99", fmt.Sprintf("%s / %s", pct(downLat, 0.5), pct(downLat, 0.99)))
	}
	if len(upLat) > 0 {
		row("  of which at its edge → acknowledged in the bench's watch, p50 / p99", fmt.Sprintf("%s / %s", pct(upLat, 0.5), pct(upLat, 0.99)))
	}
	if len(deliveredLat) > 0 {
		row("  of which status written → in the bench's watch (+0-1 s), p50 / p99", fmt.Sprintf("%s / %s", pct(deliveredLat, 0.5), pct(deliveredLat, 0.99)))
	}
	if len(specLat) > 0 {
		// The API server's watch delivery, timed exactly on the probe's
		// own spec write: Update returned → its event in the bench's watch.
		row(fmt.Sprintf("  API server's watch delivery: desired written → in the bench's watch, p50 / p99 / max (%d)", len(specLat)),
			fmt.Sprintf("%s / %s / %s", pct(specLat, 0.5), pct(specLat, 0.99), specLat[len(specLat)-1].Round(time.Millisecond)))
		row("  desired → acknowledged less that delivery once (the status event's), p50 / p99",
			fmt.Sprintf("%s / %s", pct(lessOneLat, 0.5), pct(lessOneLat, 0.99)))
		row("  less it twice (the desired value's to the replica too): Dowse's part, p50 / p99",
			fmt.Sprintf("%s / %s", pct(lessTwoLat, 0.5), pct(lessTwoLat, 0.99)))
	}
	// Where an acknowledgement's time goes: the twin sync's queue (it
	// sends the desired value to the node), the urgent write's wait
	// (arrival to write) and the status patch itself.
	row("  twin sync: queue wait, p50 / p99", q("workqueue_queue_duration_seconds", `name="twin-sync"`))
	// The way up: an acknowledgement is a report like the counters, in
	// the same ordered stream of its edge's link.
	row("  report transit, read on the edge → at the status writer, p50 / p99", q("dowse_twins_report_transit_seconds", ""))
	row("  urgent writes' age when written, p50 / p99", q("dowse_twins_status_age_seconds", `priority="urgent"`))
	row("  urgent report at the writer → its write done, p50 / p99", q("dowse_twins_status_urgent_wait_seconds", ""))
	row("  status patch, p50 / p99", q("dowse_twins_status_write_duration_seconds", ""))
	row("desired values not acknowledged within 5 s of the window's end", strconv.Itoa(unacked))
	row(fmt.Sprintf("largest unacknowledged backlog of an edge (%d Devices)", perEdge), strconv.FormatInt(backlog, 10))
	var use []string
	for _, k := range []string{"bench (edges)", "kube-apiserver", "etcd", "replica-0", "replica-1", "machine"} {
		if a, ok := cpu1[k]; ok {
			use = append(use, fmt.Sprintf("%s %.2f", k, (a-cpu0[k]).Seconds()/cpuElapsed))
		}
	}
	fmt.Printf("CPU seconds a second in the window: %s\n", strings.Join(use, ", "))
	// What the API server answered in the window (every write competes
	// with the acknowledgements' and the desired values' own).
	fmt.Printf("API server in the window (%.0f s): %s\n", elapsed, requestFigures(apiM0, apiM1, rep0[0], rep1[0]))
	fmt.Printf("replicas' anonymous RSS, every Device cached and no edge → end of the window: %s; %.2f KiB a Device held (sessions, twins, status writer and live readings, history %d)\n",
		strings.Join(rss, ", "), grew*1024/float64(max(1, heldEdges*perEdge)), 8)
	fmt.Printf("%d cores, load %s\n", runtime.NumCPU(), loadavg())

	// Nothing lost: the reports stop; every Device shows its last counter.
	stopReports()
	t3 := time.Now()
	for {
		var list v1alpha1.DeviceList
		if err := b.c.List(ctx, &list, client.InNamespace("default")); err != nil {
			return err
		}
		got := map[string]string{}
		for _, d := range list.Items {
			for _, tw := range d.Status.Twins {
				if tw.PropertyName == "count" && tw.Reported != nil {
					got[d.Name] = tw.Reported.Value
				}
			}
		}
		behind, pending := 0, 0
		for k, e := range edges {
			pending += e.hub.Pending()
			for i := range perEdge {
				if got[devName(k, i)] != strconv.FormatInt(e.counter[i].Load(), 10) {
					behind++
				}
			}
		}
		if behind == 0 && pending == 0 {
			fmt.Printf("reports stopped: every Device at its last counter and every edge's store empty after %s\n", time.Since(t3).Round(time.Second))
			return nil
		}
		if time.Since(t3) > 5*time.Minute {
			return fmt.Errorf("5 minutes after the reports stopped %d Devices are not at their last counter, %d messages unacknowledged", behind, pending)
		}
		time.Sleep(2 * time.Second)
	}
}

func pct(d []time.Duration, q float64) string {
	i := int(math.Ceil(q*float64(len(d)))) - 1
	return d[max(0, min(i, len(d)-1))].Round(time.Millisecond).String()
}

// histQuantile estimates quantile q of histogram name (its series whose
// labels contain label) over what it observed between two scrapes of each
// replica, interpolating within buckets.
func histQuantile(before, after []series, name, label string, q float64) float64 {
	counts := map[float64]float64{}
	for i := range after {
		for k, v := range after[i] {
			if !strings.HasPrefix(k, name+"_bucket{") || !strings.Contains(k, label) {
				continue
			}
			_, le, _ := strings.Cut(k, `le="`)
			le, _, _ = strings.Cut(le, `"`)
			bound, err := strconv.ParseFloat(le, 64)
			if le == "+Inf" {
				bound, err = math.Inf(1), nil
			}
			if err != nil {
				continue
			}
			counts[bound] += v - before[i][k]
		}
	}
	bounds := make([]float64, 0, len(counts))
	for b := range counts {
		bounds = append(bounds, b)
	}
	slices.Sort(bounds)
	if len(bounds) == 0 || counts[bounds[len(bounds)-1]] == 0 {
		return math.NaN()
	}
	total := counts[bounds[len(bounds)-1]]
	rank := q * total
	prevBound, prevCount := 0.0, 0.0
	for _, b := range bounds {
		if counts[b] >= rank {
			if math.IsInf(b, 1) {
				return prevBound
			}
			return prevBound + (b-prevBound)*(rank-prevCount)/math.Max(counts[b]-prevCount, 1e-9)
		}
		prevBound, prevCount = b, counts[b]
	}
	return prevBound
}

// statusWrittenAt is when the API server took d's newest status write:
// the time of its newest managedFields entry for the status subresource
// (whole seconds; zero when it has none).
func statusWrittenAt(d *v1alpha1.Device) time.Time {
	var at time.Time
	for _, mf := range d.ManagedFields {
		if mf.Subresource == "status" && mf.Time != nil && mf.Time.After(at) {
			at = mf.Time.Time
		}
	}
	return at
}
