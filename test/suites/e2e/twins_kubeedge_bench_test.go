package e2e

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/framework/testwait"
	"github.com/dowse-dev/dowse/test/peers/kubeedgepeer"
)

const kubeEdgeBenchManifest = `apiVersion: dowse.dev/v1alpha1
kind: DeviceModel
metadata: {name: thermo, namespace: default}
spec:
  protocol: virtual
  properties:
    - {name: temp, type: INT, accessMode: ReadWrite, minimum: "0", maximum: "1000"}
---
apiVersion: dowse.dev/v1alpha1
kind: Device
metadata: {name: thermo-1, namespace: default}
spec:
  deviceModelRef: {name: thermo}
  nodeName: edge-1
  protocol: {protocolName: virtual, configData: {address: "sim://thermo-1"}}
  properties:
    - name: temp
      desired: {value: "100"}
      visitors: {protocolName: virtual, configData: {initial: 20}}
      collectCycle: 1000
      reportCycle: 1000
`

// BenchmarkKubeEdgeMapperTwin prints, with the real binaries on loopback,
// the controller's default 1 s status interval and the mapper built on
// KubeEdge's mapper-framework v1.21.0 (test/peers/kubeedge-mapper) at a 1 s
// collect and report cycle, the round trip of a desired value patched into
// Device.spec until it is reported (and observedDesired) in Device.status,
// seen through a watch, and that round trip less the mapper's own wait:
// from the mapper's UpdateDevice (its device restarted with the value) to
// the read time of the report carrying it (the report's timestamp
// metadata). What is left is Dowse's share: the way down and the way up.
// 40 changes 1.3 s to 2.3 s apart, so that each lands anywhere in the
// mapper's cycle. Run it with -benchtime 1x (make bench does).
func BenchmarkKubeEdgeMapperTwin(b *testing.B) {
	for range b.N {
		benchKubeEdgeMapperTwin(b)
	}
}

func benchKubeEdgeMapperTwin(b *testing.B) {
	bin := kubeedgepeer.Build(b, b.TempDir(), kubeedgepeer.V121)
	c := startCloud(b)
	ctx := context.Background()
	m := c.joinKubeEdgeMapper(b, bin)

	// Watch before the Device exists, so that no event of it is missed.
	w := c.watchDevices(b)
	type sighting struct {
		at   time.Time // the watch event's arrival
		read time.Time // the report's read time, from its metadata
	}
	var mu sync.Mutex
	seen := map[string]sighting{}
	go func() {
		for ev := range w.ResultChan() {
			d, ok := ev.Object.(*v1alpha1.Device)
			if !ok || d.Name != "thermo-1" {
				continue
			}
			now := time.Now()
			for _, tw := range d.Status.Twins {
				if tw.PropertyName != "temp" || tw.Reported == nil || tw.ObservedDesired == nil || tw.Reported.Value != tw.ObservedDesired.Value {
					continue
				}
				ms, err := strconv.ParseInt(tw.Reported.Metadata["timestamp"], 10, 64)
				if err != nil {
					continue
				}
				mu.Lock()
				if _, ok := seen[tw.Reported.Value]; !ok {
					seen[tw.Reported.Value] = sighting{at: now, read: time.UnixMilli(ms)}
				}
				mu.Unlock()
			}
		}
	}()
	sightingOf := func(v string) (sighting, bool) {
		mu.Lock()
		defer mu.Unlock()
		s, ok := seen[v]
		return s, ok
	}
	c.apply(b, kubeEdgeBenchManifest)
	testwait.For(b, 60*time.Second, func() error {
		if _, ok := sightingOf("100"); !ok {
			return fmt.Errorf("the Device's own desired value 100 is not reported yet:\n%s", m.Out)
		}
		return nil
	})
	key := client.ObjectKey{Namespace: "default", Name: "thermo-1"}
	var dev v1alpha1.Device
	if err := c.client.Get(ctx, key, &dev); err != nil {
		b.Fatal(err)
	}

	stages := []string{"dowse_twins_report_transit_seconds", "dowse_twins_status_wait_seconds", "dowse_twins_status_write_duration_seconds"}
	before := map[string]map[string]float64{}
	for _, h := range stages {
		before[h] = histBuckets(b, c.metrics, h)
	}
	const changes = 40
	var total, down, mapperWait, dowse []time.Duration
	_, line, _ := m.Out.First("desired=temp:100", 0)
	for n := 1; n <= changes; n++ {
		// Spread the changes over the mapper's 1 s cycle.
		time.Sleep(1300*time.Millisecond + time.Duration(n*37%40)*25*time.Millisecond)
		v := strconv.Itoa(100 + n)
		patch := fmt.Appendf(nil, `[{"op":"replace","path":"/spec/properties/0/desired","value":{"value":%q}}]`, v)
		start := time.Now()
		if err := c.client.Patch(ctx, &dev, client.RawPatch(types.JSONPatchType, patch)); err != nil {
			b.Fatal(err)
		}
		var applied time.Time
		var s sighting
		testwait.For(b, 30*time.Second, func() error {
			if applied.IsZero() {
				var ok bool
				if applied, line, ok = m.Out.First("desired=temp:"+v, line); !ok {
					return fmt.Errorf("desired %s has not reached the mapper:\n%s", v, m.Out)
				}
			}
			var ok bool
			if s, ok = sightingOf(v); !ok {
				return fmt.Errorf("desired %s is not reported in Device.status yet", v)
			}
			return nil
		})
		wait := max(s.read.Sub(applied), 0) // the metadata has millisecond resolution
		total = append(total, s.at.Sub(start))
		down = append(down, applied.Sub(start))
		mapperWait = append(mapperWait, wait)
		dowse = append(dowse, s.at.Sub(start)-wait)
	}
	// Every report of the run, the mapper's each-cycle repeats included.
	for _, h := range stages {
		fmt.Printf("  %s: %s\n", strings.TrimPrefix(h, "dowse_twins_"), histDelta(before[h], histBuckets(b, c.metrics, h)))
	}
	r := func(d time.Duration) time.Duration { return d.Round(100 * time.Microsecond) }
	order := make([]int, len(dowse))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return int(dowse[b] - dowse[a]) })
	for _, i := range order[:5] {
		fmt.Printf("  slowest: change %d, Dowse's share %v: down %v, the mapper's wait %v, up %v\n",
			i+1, r(dowse[i]), r(down[i]), r(mapperWait[i]), r(dowse[i]-down[i]))
	}
	for _, ds := range [][]time.Duration{total, down, mapperWait, dowse} {
		slices.Sort(ds)
	}
	fmt.Printf("KubeEdge mapper-framework v1.21.0 mapper, 1 s cycle, status interval 1 s, %d changes: desired in Device.spec -> reported and observedDesired in Device.status p50 %v, p99 %v; less the mapper's own wait (UpdateDevice -> the report's read time, p50 %v, p99 %v): p50 %v, p99 %v, max %v (goal < 50 ms); of it desired in Device.spec -> the mapper's UpdateDevice p50 %v, p99 %v\n",
		changes, r(pct(total, 50)), r(pct(total, 99)), r(pct(mapperWait, 50)), r(pct(mapperWait, 99)),
		r(pct(dowse, 50)), r(pct(dowse, 99)), r(dowse[len(dowse)-1]), r(pct(down, 50)), r(pct(down, 99)))
}
