package e2e

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/internal/agent/edgecert"
	"github.com/dowse-dev/dowse/internal/link/pki"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/framework/dmitest"
	"github.com/dowse-dev/dowse/test/framework/faultproxy"
	"github.com/dowse-dev/dowse/test/framework/testwait"
)

// counters is the scripted device's state: each property counts up.
type counters struct {
	mu   sync.Mutex
	last map[string]int
}

func (c *counters) next(props []string) map[string]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]string{}
	for _, p := range props {
		c.last[p]++
		out[p] = strconv.Itoa(c.last[p])
	}
	return out
}

func (c *counters) snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]int{}
	for k, v := range c.last {
		out[k] = v
	}
	return out
}

// statusWatch records every Device.status the API server shows and fails
// the test when a reported counter ever goes back (a value applied twice,
// or an old one after a newer).
type statusWatch struct {
	mu      sync.Mutex
	last    map[string]int
	errs    []string
	updates int
}

func watchStatus(t *testing.T, c client.WithWatch, ns, name string) *statusWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w, err := c.Watch(ctx, &v1alpha1.DeviceList{}, client.InNamespace(ns))
	if err != nil {
		t.Fatal(err)
	}
	sw := &statusWatch{last: map[string]int{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			d, ok := ev.Object.(*v1alpha1.Device)
			if !ok || d.Name != name || ev.Type == watch.Deleted {
				continue
			}
			sw.mu.Lock()
			sw.updates++
			for _, tw := range d.Status.Twins {
				if tw.Reported == nil || tw.PropertyName == "setpoint" {
					continue
				}
				v, err := strconv.Atoi(tw.Reported.Value)
				if err != nil {
					sw.errs = append(sw.errs, fmt.Sprintf("%s reported %q", tw.PropertyName, tw.Reported.Value))
					continue
				}
				if v < sw.last[tw.PropertyName] {
					sw.errs = append(sw.errs, fmt.Sprintf("%s went back from %d to %d", tw.PropertyName, sw.last[tw.PropertyName], v))
				}
				sw.last[tw.PropertyName] = v
			}
			sw.mu.Unlock()
		}
	}()
	t.Cleanup(func() { cancel(); w.Stop(); <-done })
	return sw
}

func (sw *statusWatch) seen() int {
	sw.mu.Lock()
	defer sw.mu.Unlock()
	return sw.updates
}

func (sw *statusWatch) check(t *testing.T) {
	t.Helper()
	sw.mu.Lock()
	defer sw.mu.Unlock()
	if len(sw.errs) > 0 {
		t.Fatalf("Device.status broke order %d times, first: %v", len(sw.errs), sw.errs[:min(5, len(sw.errs))])
	}
}

// TestTwinsSurviveOfflineAndFaults runs the real controller and agent with
// the link through a fault proxy and a scripted mapper reporting counters
// on five properties every 5 ms: the link cut for seconds (a desired value
// set meanwhile reaches the mapper when it returns), 100 random link
// faults, a controller restart mid-stream, and an agent restart while the
// cloud is down (its mapper gets its devices from the edge store). After
// each, Device.status holds every property's newest value, and no status
// ever showed a counter going back.
func TestTwinsSurviveOfflineAndFaults(t *testing.T) {
	c := startCloud(t, "--twin-status-interval", "200ms")
	ctx := context.Background()
	proxy, err := faultproxy.NewTCP(fmt.Sprintf("127.0.0.1:%d", c.ws))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	agentProc, state, agentMetrics := c.joinAgent("edge-1", proxy.Addr())
	dump := func() {
		for _, port := range []int{c.metrics, agentMetrics} {
			resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", port))
			if err != nil {
				continue
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			for _, l := range strings.Split(string(b), "\n") {
				if strings.HasPrefix(l, "dowse_twins") || strings.HasPrefix(l, "dowse_dmi") || strings.HasPrefix(l, "dowse_edgehub") || strings.HasPrefix(l, "dowse_cloudhub_dup") || strings.HasPrefix(l, "dowse_cloudhub_messages") {
					t.Log(port, l)
				}
			}
		}
	}

	props := []string{"p0", "p1", "p2", "p3", "p4"}
	model := &v1alpha1.DeviceModel{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "counter"},
		Spec: v1alpha1.DeviceModelSpec{Protocol: "scripted"}}
	for _, p := range props {
		model.Spec.Properties = append(model.Spec.Properties, v1alpha1.ModelProperty{Name: p, Type: v1alpha1.PropertyInt})
	}
	model.Spec.Properties = append(model.Spec.Properties, v1alpha1.ModelProperty{Name: "setpoint", Type: v1alpha1.PropertyInt, AccessMode: v1alpha1.ReadWrite})
	dev := &v1alpha1.Device{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "counter-1"},
		Spec: v1alpha1.DeviceSpec{DeviceModelRef: &corev1.LocalObjectReference{Name: "counter"}, NodeName: "edge-1",
			Properties: []v1alpha1.DeviceProperty{{Name: "setpoint", Desired: &v1alpha1.TwinProperty{Value: "1"}}}}}
	for _, o := range []client.Object{model, dev} {
		if err := c.client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	wc, err := client.NewWithWatch(c.cp.Config, client.Options{Scheme: c.client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	sw := watchStatus(t, wc, "default", dev.Name)

	mctx, stopMapper := context.WithCancel(ctx)
	defer stopMapper()
	// The mapper's socket goes in the agent's state directory, which the
	// agent makes.
	testwait.For(t, 60*time.Second, func() error { _, err := os.Stat(filepath.Join(state, "dmi", "dmi.sock")); return err })
	m, err := dmitest.Start(mctx, state, "counters", "scripted")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Stop)
	testwait.For(t, 30*time.Second, func() error {
		if !m.Has("default", dev.Name) {
			return fmt.Errorf("the agent has not handed the mapper its device")
		}
		return nil
	})

	cnt := &counters{last: map[string]int{}}
	reporting := make(chan bool)
	var reportErrs sync.Map
	var sent atomic.Value // the setpoint of the newest report the agent took
	go func() {
		on := true
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-mctx.Done():
				return
			case on = <-reporting:
			case <-tick.C:
				if !on {
					continue
				}
				vals := cnt.next(props)
				vals["setpoint"] = m.Desired("default", dev.Name, "setpoint")
				if err := m.Report(mctx, "default", dev.Name, vals); err != nil {
					reportErrs.Store(err.Error(), true)
				} else {
					sent.Store(vals["setpoint"])
				}
			}
		}
	}()
	setReporting := func(on bool) { reporting <- on }

	// settled stops the mapper's reports and waits for Device.status to
	// show each property's last value and setpoint observed at want.
	settled := func(phase, want string) {
		t.Helper()
		// The mapper reports what it applied: wait for the desired value
		// to reach it, and for a report carrying it to be taken (one call
		// can outlast any fixed pause on a loaded machine), before its
		// reports stop.
		testwait.For(t, 30*time.Second, func() error {
			if got := m.Desired("default", dev.Name, "setpoint"); got != want {
				return fmt.Errorf("%s: the mapper holds desired %q, want %s", phase, got, want)
			}
			if got, _ := sent.Load().(string); got != want {
				return fmt.Errorf("%s: the newest report the agent took carries setpoint %q, want %s", phase, got, want)
			}
			return nil
		})
		setReporting(false)
		final := cnt.snapshot()
		defer func() {
			if t.Failed() {
				dump()
			}
		}()
		testwait.For(t, 30*time.Second, func() error {
			var d v1alpha1.Device
			if err := c.client.Get(ctx, client.ObjectKeyFromObject(dev), &d); err != nil {
				return err
			}
			for _, p := range props {
				if rep, _ := d.Twin(p).Values(); rep != strconv.Itoa(final[p]) {
					return fmt.Errorf("%s: %s reported %q, want the last value %d", phase, p, rep, final[p])
				}
			}
			if rep, obs := d.Twin("setpoint").Values(); obs != want {
				return fmt.Errorf("%s: setpoint observedDesired %q (reported %q, the mapper holds %q), want %s; status %+v", phase, obs, rep,
					m.Desired("default", dev.Name, "setpoint"), want, d.Status)
			}
			return nil
		})
		sw.check(t)
		setReporting(true)
	}
	time.Sleep(time.Second) // a second of steady reports
	settled("steady", "1")

	t.Run("LinkCut", func(t *testing.T) {
		proxy.Blackhole(true)
		proxy.Cut(0)
		time.Sleep(3 * time.Second)
		// Meanwhile in the cloud: a new desired value.
		var d v1alpha1.Device
		if err := c.client.Get(ctx, client.ObjectKeyFromObject(dev), &d); err != nil {
			t.Fatal(err)
		}
		d.Spec.Properties[0].Desired.Value = "2"
		if err := c.client.Update(ctx, &d); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second)
		if got := m.Desired("default", dev.Name, "setpoint"); got != "1" {
			t.Fatalf("the mapper got desired %q while the link was cut", got)
		}
		proxy.Blackhole(false)
		testwait.For(t, 30*time.Second, func() error {
			if got := m.Desired("default", dev.Name, "setpoint"); got != "2" {
				return fmt.Errorf("desired %q at the mapper, want 2 once the link is back", got)
			}
			return nil
		})
		settled("after the cut", "2")
	})

	t.Run("RandomFaults", func(t *testing.T) {
		rng := rand.New(rand.NewPCG(1, 2))
		for i := range 100 {
			switch rng.IntN(3) {
			case 0:
				proxy.Cut(rng.IntN(4096))
			case 1:
				proxy.Blackhole(true)
				time.Sleep(time.Duration(rng.IntN(300)) * time.Millisecond)
				proxy.Blackhole(false)
			case 2:
				proxy.Delay(time.Duration(rng.IntN(50)) * time.Millisecond)
			}
			if i == 50 {
				var d v1alpha1.Device
				if err := c.client.Get(ctx, client.ObjectKeyFromObject(dev), &d); err != nil {
					t.Fatal(err)
				}
				d.Spec.Properties[0].Desired.Value = "3"
				if err := c.client.Update(ctx, &d); err != nil {
					t.Fatal(err)
				}
			}
			time.Sleep(time.Duration(20+rng.IntN(80)) * time.Millisecond)
		}
		proxy.Delay(0)
		proxy.Blackhole(false)
		settled("after 100 faults", "3")
	})

	t.Run("ControllerRestart", func(t *testing.T) {
		time.Sleep(500 * time.Millisecond)
		c.controller.Stop()
		time.Sleep(2 * time.Second)
		c.startController()
		settled("after a controller restart", "3")
	})

	t.Run("AgentRestartWhileOffline", func(t *testing.T) {
		c.controller.Stop()
		agentProc.Stop()
		told := func() int { return m.Registers() + len(m.Updates()) }
		before := told()
		agentProc, _, _ = c.joinAgent("edge-1", proxy.Addr())
		// The cloud is down: the device comes from the edge store (as an
		// UpdateDevice: the mapper may hold it already).
		testwait.For(t, 30*time.Second, func() error {
			if told() <= before {
				return fmt.Errorf("the restarted agent has not handed the mapper its device (RegisterDevice or UpdateDevice %d times)", told())
			}
			return nil
		})
		if got := m.Desired("default", dev.Name, "setpoint"); got != "3" {
			t.Errorf("desired %q from the edge store, want 3", got)
		}
		time.Sleep(time.Second) // reports pile up in the edge store
		c.startController()
		settled("after an agent restart while offline", "3")
	})

	// The node's certificate expired while the agent was down, and the
	// cloud is down too: the agent cannot bootstrap, yet its mapper API
	// serves from the edge store and keeps the mapper's reports until the
	// cloud is back.
	t.Run("AgentWithExpiredCertificateWhileOffline", func(t *testing.T) {
		c.controller.Stop()
		agentProc.Stop()
		var sec corev1.Secret
		if err := c.client.Get(ctx, client.ObjectKey{Namespace: "dowse-system", Name: "dowse-link-ca"}, &sec); err != nil {
			t.Fatal(err)
		}
		ca, err := pki.LoadCA(sec.Data[corev1.TLSCertKey], sec.Data[corev1.TLSPrivateKeyKey])
		if err != nil {
			t.Fatal(err)
		}
		expired, err := ca.IssueNode("edge-1", "", -time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		key, err := x509.MarshalPKCS8PrivateKey(expired.PrivateKey)
		if err != nil {
			t.Fatal(err)
		}
		certFile := filepath.Join(state, "link", edgecert.CertFileName)
		pemData := append(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: expired.Certificate[0]}),
			pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: key})...)
		if err := os.WriteFile(certFile, pemData, 0o600); err != nil {
			t.Fatal(err)
		}
		told := func() int { return m.Registers() + len(m.Updates()) }
		before := told()
		agentProc, _, _ = c.joinAgent("edge-1", proxy.Addr())
		testwait.For(t, 30*time.Second, func() error {
			if told() <= before {
				return fmt.Errorf("the agent with an expired certificate has not handed the mapper its device: dmi.sock waits for the cloud")
			}
			return nil
		})
		time.Sleep(time.Second) // reports pile up in the edge store
		// The last reports are taken while offline: each must reach
		// Device.status once the cloud is back.
		setReporting(false)
		offline := cnt.snapshot()
		if b, _ := os.ReadFile(certFile); !bytes.Equal(b, pemData) {
			t.Fatal("the agent replaced its expired certificate with the cloud down")
		}
		c.startController()
		testwait.For(t, 60*time.Second, func() error {
			var d v1alpha1.Device
			if err := c.client.Get(ctx, client.ObjectKeyFromObject(dev), &d); err != nil {
				return err
			}
			for _, p := range props {
				if rep, _ := d.Twin(p).Values(); rep != strconv.Itoa(offline[p]) {
					return fmt.Errorf("%s reported %q, want %d, the last value reported while offline", p, rep, offline[p])
				}
			}
			return nil
		})
		sw.check(t)
		setReporting(true)
		var d v1alpha1.Device
		if err := c.client.Get(ctx, client.ObjectKeyFromObject(dev), &d); err != nil {
			t.Fatal(err)
		}
		settled("after an agent with an expired certificate restarted while offline", d.Spec.Properties[0].Desired.Value)
	})
	if sw.seen() == 0 {
		t.Fatal("the status watch saw no update")
	}
	reportErrs.Range(func(k, _ any) bool {
		t.Logf("mapper report refused: %v", k)
		return true
	})
}
