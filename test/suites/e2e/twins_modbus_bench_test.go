package e2e

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/framework/testwait"
	"github.com/dowse-dev/dowse/test/peers/npmpeer"
)

// BenchmarkModbusTwin prints, with the real binaries on loopback and the
// controller's default 1 s status interval, the time from a desired
// setpoint patched into Device.spec to the same value reported (and
// observedDesired) in Device.status, seen through a watch, p50 and p99
// over 100 changes: dowse-modbus-mapper writes it to a real Modbus server
// (jsmodbus), reads it back and reports it. Changes are 1.1 s apart (a
// quiet Device: each written at once, not at the interval's end). Run it
// with -benchtime 1x (make bench does).
func BenchmarkModbusTwin(b *testing.B) {
	for range b.N {
		benchModbusTwin(b)
	}
}

func benchModbusTwin(b *testing.B) {
	port := npmpeer.FreePort(b, "127.0.0.1")
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	srv := npmpeer.StartModbus(b, "jsmodbus", map[string]any{"impl": "jsmodbus", "host": "127.0.0.1", "port": port, "holding": map[string]int{"0": 5, "1": 215}, "logWrites": true})

	c := startCloud(b)
	ctx := context.Background()
	_, state, _ := c.joinAgent("edge-1", "")
	c.start("dowse-modbus-discovery", "modbus-discovery", "--state-dir", state)
	c.start("dowse-modbus-mapper", "modbus-mapper", "--state-dir", state, "--name", "plc")
	c.apply(b, fmt.Sprintf(modbusTwinManifest, addr))

	var dev v1alpha1.Device
	testwait.For(b, 90*time.Second, func() error {
		var list v1alpha1.DeviceList
		if err := c.client.List(ctx, &list, client.InNamespace("default")); err != nil {
			return err
		}
		if len(list.Items) != 1 {
			return fmt.Errorf("%d Devices, want the discovered server's one", len(list.Items))
		}
		dev = list.Items[0]
		if rep, _ := dev.Twin("setpoint").Values(); rep != "5" {
			return fmt.Errorf("setpoint reported %q, want 5", rep)
		}
		return nil
	})
	i := slices.IndexFunc(dev.Spec.Properties, func(p v1alpha1.DeviceProperty) bool { return p.Name == "setpoint" })

	w := c.watchDevices(b)
	seen := make(chan string, 1024)
	go func() {
		for ev := range w.ResultChan() {
			if d, ok := ev.Object.(*v1alpha1.Device); ok && d.Name == dev.Name {
				if rep, obs := d.Twin("setpoint").Values(); rep != "" && rep == obs {
					seen <- rep
				}
			}
		}
	}()
	var took, written []time.Duration
	line := 0
	for n := 1; n <= 100; n++ {
		time.Sleep(1100 * time.Millisecond)
		v := strconv.Itoa(100 + n)
		op := "add"
		if n > 1 {
			op = "replace"
		}
		patch := fmt.Appendf(nil, `[{"op":%q,"path":"/spec/properties/%d/desired","value":{"value":%q}}]`, op, i, v)
		start := time.Now()
		if err := c.client.Patch(ctx, &dev, client.RawPatch(types.JSONPatchType, patch)); err != nil {
			b.Fatal(err)
		}
		// The server prints each register write as it takes it: the time
		// splits into the way down (spec to register) and the way up.
		_, line = srv.WaitLine(b, "WRITE 0 "+v, line, 30*time.Second)
		written = append(written, time.Since(start))
	wait:
		for {
			select {
			case got := <-seen:
				if got == v {
					break wait
				}
			case <-time.After(30 * time.Second):
				b.Fatalf("desired %s never came back reported in Device.status", v)
			}
		}
		took = append(took, time.Since(start))
	}
	up := make([]time.Duration, len(took))
	order := make([]int, len(took))
	for i := range took {
		up[i], order[i] = took[i]-written[i], i
	}
	slices.SortFunc(order, func(a, b int) int { return int(took[b] - took[a]) })
	for _, i := range order[:5] {
		fmt.Printf("  slowest: change %d took %v: register written after %v\n", i+1, took[i].Round(time.Millisecond), written[i].Round(time.Millisecond))
	}
	slices.Sort(took)
	fmt.Printf("Modbus twin (dowse-modbus-mapper on jsmodbus, status interval 1 s): desired in Device.spec -> reported and observedDesired in Device.status, 100 changes 1.1 s apart: p50 %v, p99 %v, max %v (goal p99 < 150 ms)\n",
		pct(took, 50).Round(time.Millisecond), pct(took, 99).Round(time.Millisecond), took[len(took)-1].Round(time.Millisecond))
	fmt.Printf("  of which desired in Device.spec -> register written: p50 %v, p99 %v; register written -> Device.status: p50 %v, p99 %v\n",
		pct(written, 50).Round(time.Millisecond), pct(written, 99).Round(time.Millisecond), pct(up, 50).Round(time.Millisecond), pct(up, 99).Round(time.Millisecond))
}
