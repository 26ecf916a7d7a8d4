// Command discovery measures the discovery path end to end with the real
// binaries (dowse-agent, dowse-debug-echo-discovery) on the real test control
// plane, and prints:
//   - latency from a handler's change (availability file flipped) to the
//     Instance change seen through a watch, p50 and p99 over 100 flips;
//   - time to apply 5,000 devices from one handler (Instances per second);
//   - API requests the agent makes in 60 idle seconds holding 1,000 Instances;
//   - peak RSS (VmHWM) of the agent and the handler;
//
// each twice, named: without device plugins, and with them (CDI specs
// written, plugins serving sockets with no kubelet to register with). It
// writes only under its own temporary directory.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/dowse-dev/dowse/agent"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/bench/benchkit"
	"github.com/dowse-dev/dowse/test/framework/procs"
	"github.com/dowse-dev/dowse/test/framework/promtest"
)

var agentArgs string

// namespace holds the objects of the case being measured.
var namespace string

func main() {
	flips := flag.Int("flips", 100, "availability flips for the latency figure")
	applyN := flag.Int("apply", 5000, "devices for the apply-rate figure")
	idleN := flag.Int("idle-instances", 1000, "Instances held during the idle measurement")
	idleFor := flag.Duration("idle", 60*time.Second, "idle measurement window")
	flag.StringVar(&agentArgs, "agent-args", "", "extra dowse-agent flags, space-separated")
	flag.Parse()
	// Nothing here logs through controller-runtime; unset, its logger
	// prints a stack trace the first time a client would.
	ctrllog.SetLogger(logr.Discard())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *flips, *applyN, *idleN, *idleFor); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func start(dir, name string, args ...string) (*procs.Proc, error) {
	logf, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		return nil, err
	}
	p, err := procs.Start(name, logf, args...)
	if err != nil {
		return nil, err
	}
	fmt.Printf("started %s pid %d\n", name, p.Pid())
	return p, nil
}

func run(ctx context.Context, flips, applyN, idleN int, idleFor time.Duration) error {
	scheme, err := agent.Scheme()
	if err != nil {
		return err
	}
	cloud, err := benchkit.StartCloud("dowse-bench", scheme)
	if err != nil {
		return err
	}
	defer cloud.Stop()
	c, dir, kubeconfig := cloud.Client, cloud.Dir, cloud.Kubeconfig
	// Both cases write only under dir: the agent's default CDI directory is
	// the machine's /var/run/cdi.
	for _, cs := range []struct{ name, pluginDir string }{
		{"without-device-plugins", ""},
		// No kubelet listens there: the plugins serve their sockets and retry
		// registering, and the agent writes a CDI spec per Instance.
		{"with-device-plugins", filepath.Join(dir, "with-device-plugins", "device-plugins")},
	} {
		namespace = cs.name
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: cs.name}}); err != nil {
			return err
		}
		fmt.Printf("== %s\n", cs.name)
		caseDir := filepath.Join(dir, cs.name)
		if err := os.MkdirAll(caseDir, 0o755); err != nil {
			return err
		}
		if err := measure(ctx, c, caseDir, kubeconfig, flips, applyN, idleN, idleFor,
			"--device-plugin-dir", cs.pluginDir, "--cdi-spec-dir", filepath.Join(caseDir, "cdi")); err != nil {
			return fmt.Errorf("%s: %w", cs.name, err)
		}
	}
	return nil
}

// measure runs one agent and one handler in dir, prints the figures, and
// removes its Configurations (and so the Instances) before it stops them.
func measure(ctx context.Context, c client.WithWatch, dir, kubeconfig string, flips, applyN, idleN int, idleFor time.Duration, args ...string) error {
	port, err := procs.FreePort()
	if err != nil {
		return err
	}
	metricsURL := fmt.Sprintf("http://127.0.0.1:%d/metrics", port)
	avail := filepath.Join(dir, "availability")
	args = append([]string{"--kubeconfig", kubeconfig, "--node-name", "bench-node", "--state-dir", dir,
		"--metrics-bind-address", fmt.Sprintf("127.0.0.1:%d", port), "--health-probe-bind-address", "0"}, args...)
	ag, err := start(dir, "dowse-agent", append(args, strings.Fields(agentArgs)...)...)
	if err != nil {
		return err
	}
	defer ag.Stop()
	h, err := start(dir, "dowse-debug-echo-discovery", "--state-dir", dir, "--availability-file", avail, "--shared")
	if err != nil {
		return err
	}
	defer h.Stop()

	anon := benchkit.SampleAnon(ag, h)

	// 1. Latency over flips.
	if err := createConfig(ctx, c, "flip", 1); err != nil {
		return err
	}
	if err := waitCount(ctx, c, "flip", 1, 60*time.Second, ag, h); err != nil {
		return err
	}
	lat, err := measureFlips(ctx, c, avail, flips)
	if err != nil {
		return err
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	fmt.Printf("discovery latency over %d flips: p50 %s, p99 %s, max %s (goal: p99 < 200ms)\n",
		len(lat), pct(lat, 50), pct(lat, 99), lat[len(lat)-1].Round(time.Microsecond))

	// 2. Apply rate.
	t0 := time.Now()
	if err := createConfig(ctx, c, "many", applyN); err != nil {
		return err
	}
	if err := waitCount(ctx, c, "many", applyN, 10*time.Minute, ag, h); err != nil {
		return err
	}
	el := time.Since(t0)
	fmt.Printf("applied %d instances in %s: %.0f instances/s (goal: > 500/s)\n", applyN, el.Round(time.Millisecond), float64(applyN)/el.Seconds())
	if err := c.Delete(ctx, &v1alpha1.Configuration{ObjectMeta: metav1.ObjectMeta{Name: "many", Namespace: namespace}}); err != nil {
		return err
	}
	if err := waitCount(ctx, c, "many", 0, 10*time.Minute, ag, h); err != nil {
		return err
	}
	fmt.Printf("released and deleted them in %s after the Configuration was deleted\n", (time.Since(t0) - el).Round(time.Millisecond))

	// 3. Idle requests with idleN Instances.
	if err := createConfig(ctx, c, "idle", idleN); err != nil {
		return err
	}
	if err := waitCount(ctx, c, "idle", idleN, 10*time.Minute, ag, h); err != nil {
		return err
	}
	time.Sleep(3 * time.Second) // let status writes and watch events settle
	before, err := promtest.Scrape(metricsURL, "rest_client_requests_total")
	if err != nil {
		return err
	}
	select {
	case <-time.After(idleFor):
	case <-ctx.Done():
		return ctx.Err()
	}
	after, err := promtest.Scrape(metricsURL, "rest_client_requests_total")
	if err != nil {
		return err
	}
	var writes, reads float64
	for k, v := range after {
		d := v - before[k]
		if strings.Contains(k, `method="GET"`) {
			reads += d
		} else {
			writes += d
		}
	}
	fmt.Printf("agent API requests in %s idle with %d instances: %.0f writes, %.0f reads (watches stay open) (goal: 0 writes)\n", idleFor, idleN+1, writes, reads)

	anon.Stop()
	for _, p := range []*procs.Proc{ag, h} {
		kib, err := p.PeakRSS()
		if err != nil {
			return err
		}
		now, err := p.MemoryNow()
		if err != nil {
			return err
		}
		fmt.Printf("peak RSS %s: %.1f MiB (peak anonymous %.1f MiB; now %.1f MiB of which %.1f MiB file-backed binary pages)\n",
			p.Name, mib(kib), mib(anon.Peak(p.Name)), mib(now.RSS), mib(now.File))
	}
	fmt.Println("goals: agent < 64 MiB, handler < 16 MiB")
	for _, name := range []string{"flip", "idle"} {
		if err := c.Delete(ctx, &v1alpha1.Configuration{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}}); err != nil {
			return err
		}
		if err := waitCount(ctx, c, name, 0, 10*time.Minute, ag, h); err != nil {
			return err
		}
	}
	return nil
}

func createConfig(ctx context.Context, c client.Client, name string, n int) error {
	descs := make([]string, n)
	for i := range descs {
		descs[i] = fmt.Sprintf("%s-%05d", name, i)
	}
	raw, err := json.Marshal(map[string]any{"descriptions": descs})
	if err != nil {
		return err
	}
	return c.Create(ctx, &v1alpha1.Configuration{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: v1alpha1.ConfigurationSpec{DiscoveryHandler: v1alpha1.DiscoveryHandlerSpec{
			Name: "debug-echo", DiscoveryDetails: &apiextensionsv1.JSON{Raw: raw}}},
	})
}

// waitCount waits until want Instances of cfg list a node. It lists once
// and then follows a watch: polling lists of thousands of Instances would
// load the shared 2-core machine more than the agent under test does.
func waitCount(ctx context.Context, c client.WithWatch, cfg string, want int, timeout time.Duration, watched ...*procs.Proc) error {
	deadline := time.Now().Add(timeout)
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	var l v1alpha1.InstanceList
	if err := c.List(ctx, &l, client.InNamespace(namespace)); err != nil {
		return err
	}
	live := map[string]bool{}
	for _, i := range l.Items {
		if i.Spec.ConfigurationName == cfg && len(i.Status.Nodes) > 0 {
			live[i.Name] = true
		}
	}
	w, err := c.Watch(ctx, &v1alpha1.InstanceList{}, client.InNamespace(namespace), &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: l.ResourceVersion}})
	if err != nil {
		return err
	}
	defer w.Stop()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for len(live) != want {
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %d instances after %s, want %d", cfg, len(live), timeout, want)
		case <-tick.C:
			for _, p := range watched {
				if p.Exited() {
					return fmt.Errorf("%s exited; see its log", p.Name)
				}
			}
		case ev, ok := <-w.ResultChan():
			if !ok {
				// The API server may end a watch under load: start over.
				return waitCount(ctx, c, cfg, want, time.Until(deadline), watched...)
			}
			i, isInst := ev.Object.(*v1alpha1.Instance)
			if !isInst || i.Spec.ConfigurationName != cfg {
				continue
			}
			if ev.Type == watch.Deleted || len(i.Status.Nodes) == 0 {
				delete(live, i.Name)
			} else {
				live[i.Name] = true
			}
		}
	}
	return nil
}

// measureFlips flips the availability file and times each change until the
// matching watch event: OFFLINE until the Instance's deletion, ONLINE until
// it exists again with the node in its status.
func measureFlips(ctx context.Context, c client.WithWatch, avail string, flips int) ([]time.Duration, error) {
	var lat []time.Duration
	for i := 0; i < flips; i++ {
		var l v1alpha1.InstanceList
		if err := c.List(ctx, &l, client.InNamespace(namespace)); err != nil {
			return nil, err
		}
		w, err := c.Watch(ctx, &v1alpha1.InstanceList{}, client.InNamespace(namespace), &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: l.ResourceVersion}})
		if err != nil {
			return nil, err
		}
		offline := i%2 == 0
		content := "ONLINE"
		if offline {
			content = "OFFLINE"
		}
		t0 := time.Now()
		if err := os.WriteFile(avail+".tmp", []byte(content), 0o644); err != nil {
			return nil, err
		}
		if err := os.Rename(avail+".tmp", avail); err != nil {
			return nil, err
		}
		timeout := time.After(30 * time.Second)
	wait:
		for {
			select {
			case ev, ok := <-w.ResultChan():
				if !ok {
					return nil, fmt.Errorf("watch closed")
				}
				inst, isInst := ev.Object.(*v1alpha1.Instance)
				if !isInst || inst.Spec.ConfigurationName != "flip" {
					continue
				}
				if offline && ev.Type == watch.Deleted {
					break wait
				}
				if !offline && ev.Type != watch.Deleted && len(inst.Status.Nodes) > 0 {
					break wait
				}
			case <-timeout:
				return nil, fmt.Errorf("flip %d (%s): no instance change within 30s", i, content)
			}
		}
		lat = append(lat, time.Since(t0))
		w.Stop()
	}
	return lat, nil
}

func mib(kib int) float64 { return float64(kib) / 1024 }

func pct(sorted []time.Duration, p int) time.Duration {
	i := (len(sorted)*p + 99) / 100
	if i > 0 {
		i--
	}
	return sorted[i].Round(time.Microsecond)
}
