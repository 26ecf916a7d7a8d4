package e2e

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/framework/dmitest"
	"github.com/dowse-dev/dowse/test/framework/procs"
	"github.com/dowse-dev/dowse/test/framework/testwait"
)

// BenchmarkTwins prints the twin figures with the real binaries on
// loopback (run it with -benchtime 1x; make bench does):
//   - desired set in Device.spec → the mapper's UpdateDevice, p50/p99 over
//     100 changes;
//   - a mapper's report → the value visible in Device.status, p50/p99
//     over 100 reports 0-300 ms apart (busy: coalesced, at most one write
//     per second) and 30 reports 1.1 s apart (quiet: written at once);
//   - reports one agent takes from its mappers, sustained (32 concurrent
//     DMI clients, each call one property of one device), and the agent's
//     CPU meanwhile;
//   - API status writes a second for 1,000 Devices reporting every 100 ms.
func BenchmarkTwins(b *testing.B) {
	for range b.N {
		benchTwins(b)
	}
}

func benchTwins(b *testing.B) {
	concurrency := os.Getenv("TWIN_STATUS_CONCURRENCY")
	if concurrency == "" {
		concurrency = "16"
	}
	c := startCloud(b, "--twin-status-interval", "1s", "--twin-status-concurrency", concurrency, "--kube-api-qps", "5000", "--kube-api-burst", "10000", "--link-rate-limit", "50000", "--link-rate-burst", "100000")
	ctx := context.Background()
	agent, state, _ := c.joinAgent("edge-1", "")
	model := &v1alpha1.DeviceModel{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "bench"},
		Spec: v1alpha1.DeviceModelSpec{Protocol: "scripted", Properties: []v1alpha1.ModelProperty{
			{Name: "setpoint", Type: v1alpha1.PropertyInt, AccessMode: v1alpha1.ReadWrite}}}}
	for i := range 10 {
		model.Spec.Properties = append(model.Spec.Properties, v1alpha1.ModelProperty{Name: fmt.Sprintf("p%d", i), Type: v1alpha1.PropertyInt})
	}
	if err := c.client.Create(ctx, model); err != nil {
		b.Fatal(err)
	}
	newDevice := func(name string) *v1alpha1.Device {
		d := &v1alpha1.Device{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
			Spec: v1alpha1.DeviceSpec{DeviceModelRef: &corev1.LocalObjectReference{Name: "bench"}, NodeName: "edge-1",
				Properties: []v1alpha1.DeviceProperty{{Name: "setpoint", Desired: &v1alpha1.TwinProperty{Value: "0"}}}}}
		if err := c.client.Create(ctx, d); err != nil {
			b.Fatal(err)
		}
		return d
	}
	dev := newDevice("bench-0")
	m, err := dmitest.Start(ctx, state, "bench", "scripted")
	if err != nil {
		b.Fatal(err)
	}
	defer m.Stop()
	testwait.For(b, 30*time.Second, func() error {
		if !m.Has("default", dev.Name) {
			return fmt.Errorf("no device at the mapper yet")
		}
		return nil
	})

	// Desired → UpdateDevice.
	var desired []time.Duration
	for i := 1; i <= 100; i++ {
		patch := fmt.Appendf(nil, `[{"op":"replace","path":"/spec/properties/0/desired/value","value":"%d"}]`, i)
		start := time.Now()
		if err := c.client.Patch(ctx, dev, client.RawPatch(types.JSONPatchType, patch)); err != nil {
			b.Fatal(err)
		}
		for m.Desired("default", dev.Name, "setpoint") != strconv.Itoa(i) {
			if time.Since(start) > 30*time.Second {
				b.Fatalf("desired %d never reached the mapper", i)
			}
			time.Sleep(200 * time.Microsecond)
		}
		desired = append(desired, time.Since(start))
	}

	// Report → Device.status, seen through a watch.
	wc, err := client.NewWithWatch(c.cp.Config, client.Options{Scheme: c.client.Scheme()})
	if err != nil {
		b.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	w, err := wc.Watch(wctx, &v1alpha1.DeviceList{}, client.InNamespace("default"))
	if err != nil {
		b.Fatal(err)
	}
	// Each value with the time its watch event came: a report's latency
	// is not held up by the mapper's call returning later.
	type event struct {
		v  string
		at time.Time
	}
	seen := make(chan event, 1024)
	go func() {
		for ev := range w.ResultChan() {
			if d, ok := ev.Object.(*v1alpha1.Device); ok && d.Name == dev.Name {
				if v, _ := d.Twin("p0").Values(); v != "" {
					seen <- event{v, time.Now()}
				}
			}
		}
	}()
	var calls []time.Duration // the mapper's ReportDeviceStatus: taken and stored by the agent
	report := func(i int) time.Duration {
		start := time.Now()
		if err := m.Report(ctx, "default", dev.Name, map[string]string{"p0": strconv.Itoa(i)}); err != nil {
			b.Fatal(err)
		}
		calls = append(calls, time.Since(start))
		for {
			select {
			case e := <-seen:
				if e.v == strconv.Itoa(i) {
					return e.at.Sub(start)
				}
			case <-time.After(30 * time.Second):
				b.Fatalf("report %d never reached Device.status", i)
			}
		}
	}
	var toStatus, quiet []time.Duration
	for i := 1; i <= 100; i++ {
		toStatus = append(toStatus, report(i))
		// Reports arrive at random points of the coalescing interval.
		time.Sleep(time.Duration(i*37%300) * time.Millisecond)
	}
	// A quiet Device: each report comes more than an interval after the
	// last write, so it is written at once (the leading edge).
	stages := []string{"dowse_twins_report_transit_seconds", "dowse_twins_status_wait_seconds", "dowse_twins_status_write_duration_seconds"}
	before := map[string]map[string]float64{}
	for _, h := range stages {
		before[h] = histBuckets(b, c.metrics, h)
	}
	conflicts0, _ := metricValue(c.metrics, `dowse_twins_status_writes_total{result="conflict"}`)
	calls = calls[:0]
	for i := 101; i <= 130; i++ {
		time.Sleep(1100 * time.Millisecond)
		quiet = append(quiet, report(i))
	}
	quietCalls := slices.Clone(calls)
	conflicts1, _ := metricValue(c.metrics, `dowse_twins_status_writes_total{result="conflict"}`)
	var quietStages []string
	for _, h := range stages {
		quietStages = append(quietStages, strings.TrimPrefix(h, "dowse_twins_")+": "+histDelta(before[h], histBuckets(b, c.metrics, h)))
	}
	cancel()
	w.Stop()

	// Sustained intake: 32 clients, each call one value, then ten.
	intake := func(values int) (callsPerSec, cores float64, refusedN int64) {
		var accepted, refused atomic.Int64
		cpu0 := cpuSeconds(b, agent.Pid())
		start := time.Now()
		var wg sync.WaitGroup
		stop := make(chan struct{})
		for g := range 32 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					vals := map[string]string{}
					for p := range values {
						vals[fmt.Sprintf("p%d", p)] = strconv.Itoa(g*1_000_000 + i)
					}
					if err := m.Report(ctx, "default", dev.Name, vals); err != nil {
						refused.Add(1)
						continue
					}
					accepted.Add(1)
				}
			}()
		}
		time.Sleep(5 * time.Second)
		close(stop)
		wg.Wait()
		d := time.Since(start)
		return float64(accepted.Load()) / d.Seconds(), (cpuSeconds(b, agent.Pid()) - cpu0) / d.Seconds(), refused.Load()
	}
	calls1, cores1, refused1 := intake(1)
	calls10, cores10, refused10 := intake(10)

	// 1,000 Devices reporting every 100 ms.
	const n = 1000
	names := make([]string, n)
	for i := range n {
		names[i] = fmt.Sprintf("bench-%d", i+1)
		newDevice(names[i])
	}
	testwait.For(b, 60*time.Second, func() error {
		for _, nm := range names {
			if !m.Has("default", nm) {
				return fmt.Errorf("device %s not at the mapper yet", nm)
			}
		}
		return nil
	})
	writes0, _ := metricValue(c.metrics, `dowse_twins_status_writes_total{result="ok"}`)
	fleetStart := time.Now()
	stopFleet := make(chan struct{})
	var fleet sync.WaitGroup
	for g := range 10 {
		fleet.Add(1)
		go func() {
			defer fleet.Done()
			tick := time.NewTicker(100 * time.Millisecond)
			defer tick.Stop()
			for k := 0; ; k++ {
				select {
				case <-stopFleet:
					return
				case <-tick.C:
				}
				for i := g; i < n; i += 10 {
					_ = m.Report(ctx, "default", names[i], map[string]string{"p0": strconv.Itoa(k)})
				}
			}
		}()
	}
	time.Sleep(10 * time.Second)
	close(stopFleet)
	fleet.Wait()
	fleetTime := time.Since(fleetStart)
	writes1, _ := metricValue(c.metrics, `dowse_twins_status_writes_total{result="ok"}`)
	wsum, _ := metricValue(c.metrics, "dowse_twins_status_write_duration_seconds_sum")
	wcount, _ := metricValue(c.metrics, "dowse_twins_status_write_duration_seconds_count")

	fmt.Fprintf(os.Stdout, "\nTwins on loopback, real controller and agent (WebSocket link), scripted DMI mapper, 1 s status coalescing:\n")
	fmt.Fprintf(os.Stdout, "  desired in Device.spec -> mapper UpdateDevice, 100 changes:  p50 %v  p99 %v\n", pct(desired, 50), pct(desired, 99))
	fmt.Fprintf(os.Stdout, "  mapper report -> value in Device.status, 100 reports 0-300 ms apart (busy): p50 %v  p99 %v\n", pct(toStatus, 50), pct(toStatus, 99))
	fmt.Fprintf(os.Stdout, "  mapper report -> value in Device.status, 30 reports 1.1 s apart (quiet):   p50 %v  p99 %v\n", pct(quiet, 50), pct(quiet, 99))
	fmt.Fprintf(os.Stdout, "    where the quiet reports' time went: the mapper's ReportDeviceStatus (agent stored it) p50 %v p99 %v max %v; %v conflicts;\n",
		pct(quietCalls, 50), pct(quietCalls, 99), pct(quietCalls, 100), conflicts1-conflicts0)
	for _, l := range quietStages {
		fmt.Fprintf(os.Stdout, "      %s\n", l)
	}
	fmt.Fprintf(os.Stdout, "  agent intake, 32 DMI clients, one value a call:             %.0f calls/s = values/s (%d refused), agent CPU %.2f cores\n",
		calls1, refused1, cores1)
	fmt.Fprintf(os.Stdout, "  agent intake, 32 DMI clients, ten values a call:            %.0f calls/s = %.0f values/s (%d refused), agent CPU %.2f cores\n",
		calls10, 10*calls10, refused10, cores10)
	fmt.Fprintf(os.Stdout, "  1,000 Devices reporting every 100 ms for %v:               %.0f status writes/s (at most %d: one per Device per second)\n",
		fleetTime.Round(time.Second), (writes1-writes0)/fleetTime.Seconds(), n)
	fmt.Fprintf(os.Stdout, "    (one status write takes %v on average here; %s parallel writes)\n",
		(time.Duration(wsum / max(wcount, 1) * float64(time.Second))).Round(time.Millisecond), concurrency)
}

func pct(ds []time.Duration, p int) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	return s[max(0, min(len(s)-1, i-1))].Round(100 * time.Microsecond)
}

func metricValue(port int, sample string) (float64, error) {
	var v float64
	err := metricCheck(port, sample, 0, func(x float64) bool { v = x; return true })
	return v, err
}

// cpuSeconds is the user and system CPU time of process pid.
func cpuSeconds(t testing.TB, pid int) float64 {
	d, err := procs.CPUTime(pid)
	if err != nil {
		t.Fatal(err)
	}
	return d.Seconds()
}

// histBuckets reads a histogram's cumulative bucket counts by upper bound.
func histBuckets(t testing.TB, port int, name string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", port))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(body), "\n") {
		rest, ok := strings.CutPrefix(line, name+`_bucket{le="`)
		if !ok {
			continue
		}
		le, value, ok := strings.Cut(rest, `"} `)
		if v, err := strconv.ParseFloat(value, 64); ok && err == nil {
			out[le] = v
		}
	}
	return out
}

// histDelta says how many observations fell in each bucket between two
// readings, e.g. "<=0.004s 25, <=0.008s 4, <=1.024s 1".
func histDelta(before, after map[string]float64) string {
	les := slices.Collect(maps.Keys(after))
	slices.SortFunc(les, func(a, b string) int {
		x, _ := strconv.ParseFloat(a, 64)
		y, _ := strconv.ParseFloat(b, 64)
		return cmp.Compare(x, y)
	})
	var parts []string
	prev := 0.0
	for _, le := range les {
		n := after[le] - before[le]
		if n > prev {
			parts = append(parts, fmt.Sprintf("<=%ss %.0f", le, n-prev))
		}
		prev = n
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}
