// Command dra measures what Dynamic Resource Allocation costs the agent,
// beside device plugins, with the real binaries (dowse-agent,
// dowse-debug-echo-discovery) on the real test control plane. For each
// device count (1,000 and 5,000 by default) and each case it starts a fresh
// agent and handler (local devices, one node) and prints Instances applied a
// second, the CPU the agent and the API server used for them and how busy
// the machine's CPUs were meanwhile, how long
// until every device is in the node's ResourceSlices (DRA only), and the
// agent's peak RSS and peak anonymous memory:
//
//   - dra: spec.allocation DRA, agent --dra (no kubelet plugin:
//     --dra-registrar-dir=), device plugins off (--device-plugin-dir=);
//   - device-plugins: spec.allocation DevicePlugin, device plugins on (no
//     kubelet listens: the plugins serve their sockets and retry);
//   - dp-kubelet (--cases device-plugins-kubelet): the same with a
//     kubelet's device manager (this binary in a process of its own:
//     runKubelet) that registers every plugin and holds its ListAndWatch
//     stream, as on a real node, and the time until all stream;
//   - neither: device plugins off and no DRA, the discovery path alone;
//   - shared: the devices shared (debug-echo --shared), DRA on and device
//     plugins off, the controller (dowse-controller --dra) publishing one
//     pool per device: time until all are in slices, and the controller's
//     peak RSS beside the agent's.
//
// It writes only under its own temporary directory.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/dowse-dev/dowse/agent"
	shareddra "github.com/dowse-dev/dowse/internal/dra"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/bench/benchkit"
	"github.com/dowse-dev/dowse/test/framework/dowse"
	"github.com/dowse-dev/dowse/test/framework/procs"
)

const node = "bench-node"

var agentArgs string

type benchCase struct {
	name       string
	allocation v1alpha1.Allocation
	args       func(dir string) []string
	shared     bool
	// kubelet: a kubelet's device manager (runKubelet) holds every
	// plugin's ListAndWatch stream, as on a real node.
	kubelet bool
}

func main() {
	if dir := os.Getenv(kubeletEnv); dir != "" {
		if err := runKubelet(dir); err != nil {
			fmt.Fprintln(os.Stderr, "bench kubelet:", err)
			os.Exit(1)
		}
		return
	}
	counts := flag.String("devices", "1000,5000", "comma-separated device counts")
	only := flag.String("cases", "dra,device-plugins,device-plugins-kubelet,neither,shared", "comma-separated cases to run")
	flag.StringVar(&agentArgs, "agent-args", "", "extra dowse-agent flags, space-separated (e.g. --pprof-bind-address=127.0.0.1:6060)")
	flag.Parse()
	ctrllog.SetLogger(logr.Discard())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var ns []int
	for _, s := range strings.Split(*counts, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench: --devices:", err)
			os.Exit(2)
		}
		ns = append(ns, n)
	}
	if err := run(ctx, ns, strings.Split(*only, ",")); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, counts []int, only []string) error {
	scheme, err := agent.Scheme()
	if err != nil {
		return err
	}
	cloud, err := benchkit.StartCloud("dowse-bench-dra", scheme)
	if err != nil {
		return err
	}
	defer cloud.Stop()
	c, dir, kubeconfig := cloud.Client, cloud.Dir, cloud.Kubeconfig
	// The agent's slices are owned by its Node.
	if err := c.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}); err != nil {
		return err
	}
	cases := map[string]benchCase{
		"dra": {"dra", v1alpha1.AllocationDRA, func(d string) []string {
			return []string{"--dra", "--dra-registrar-dir=", "--device-plugin-dir="}
		}, false, false},
		"device-plugins": {"device-plugins", v1alpha1.AllocationDevicePlugin, func(d string) []string {
			return []string{"--device-plugin-dir", filepath.Join(d, "device-plugins")}
		}, false, false},
		"device-plugins-kubelet": {name: "dp-kubelet", allocation: v1alpha1.AllocationDevicePlugin, args: func(d string) []string {
			return []string{"--device-plugin-dir", filepath.Join(d, "device-plugins")}
		}, kubelet: true},
		"neither": {"neither", v1alpha1.AllocationDevicePlugin, func(string) []string { return []string{"--device-plugin-dir="} }, false, false},
		"shared": {"shared", v1alpha1.AllocationDRA, func(d string) []string {
			return []string{"--dra", "--dra-registrar-dir=", "--device-plugin-dir="}
		}, true, false},
	}
	// The first Instances an API server stores cost it more (its caches and
	// the CRD's handlers warm up): a run of 200 devices, not printed, so
	// that the first case measured pays no more than the others.
	warm := filepath.Join(dir, "warmup")
	if err := os.MkdirAll(warm, 0o755); err != nil {
		return err
	}
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "warmup"}}); err != nil {
		return err
	}
	if err := measure(ctx, c, kubeconfig, warm, "warmup", cases["neither"], 200, io.Discard); err != nil {
		return fmt.Errorf("warming up: %w", err)
	}
	for _, n := range counts {
		for _, name := range only {
			cs, ok := cases[strings.TrimSpace(name)]
			if !ok {
				return fmt.Errorf("unknown case %q", name)
			}
			caseDir := filepath.Join(dir, fmt.Sprintf("%s-%d", cs.name, n))
			if err := os.MkdirAll(caseDir, 0o755); err != nil {
				return err
			}
			ns := fmt.Sprintf("%s-%d", cs.name, n)
			if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
				return err
			}
			if err := measure(ctx, c, kubeconfig, caseDir, ns, cs, n, os.Stdout); err != nil {
				return fmt.Errorf("%s at %d: %w", cs.name, n, err)
			}
		}
	}
	return nil
}

func start(dir, name string, args ...string) (*procs.Proc, error) {
	logf, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		return nil, err
	}
	return procs.Start(name, logf, args...)
}

// startController runs the controller logging to dir/dowse-controller.log.
func startController(dir string, c dowse.Controller) (*procs.Proc, error) {
	logf, err := os.Create(filepath.Join(dir, "dowse-controller.log"))
	if err != nil {
		return nil, err
	}
	return c.Start(logf)
}

func measure(ctx context.Context, c client.WithWatch, kubeconfig, dir, ns string, cs benchCase, n int, out io.Writer) error {
	args := append([]string{"--kubeconfig", kubeconfig, "--node-name", node, "--state-dir", dir, "--namespace", ns,
		"--metrics-bind-address", "0", "--health-probe-bind-address", "0", "--cdi-spec-dir", filepath.Join(dir, "cdi")}, cs.args(dir)...)
	args = append(args, strings.Fields(agentArgs)...)
	if cs.kubelet {
		stop, err := startKubelet(filepath.Join(dir, "device-plugins"))
		if err != nil {
			return err
		}
		defer stop()
	}
	ag, err := start(dir, "dowse-agent", args...)
	if err != nil {
		return err
	}
	defer ag.Stop()
	hargs := []string{"--state-dir", dir}
	var ctl *procs.Proc
	if cs.shared {
		hargs = append(hargs, "--shared")
		if ctl, err = startController(dir, dowse.Controller{Kubeconfig: kubeconfig, Args: []string{"--dra"}}); err != nil {
			return err
		}
		defer ctl.Stop()
	}
	h, err := start(dir, "dowse-debug-echo-discovery", hargs...)
	if err != nil {
		return err
	}
	defer h.Stop()

	descs := make([]string, n)
	for i := range descs {
		descs[i] = fmt.Sprintf("d-%05d", i)
	}
	raw, err := json.Marshal(map[string]any{"descriptions": descs})
	if err != nil {
		return err
	}
	// CPU used while the Instances are applied, per 1,000: the agent's and
	// the API server's (which, on a small machine, bounds the rate).
	apiserver, err := procs.Child("kube-apiserver")
	if err != nil {
		return err
	}
	before, err := readUsage(ag.Pid(), apiserver)
	if err != nil {
		return err
	}
	stopSampling := sampleAnon(ag)
	defer stopSampling()
	t0 := time.Now()
	cfg := &v1alpha1.Configuration{ObjectMeta: metav1.ObjectMeta{Name: "many", Namespace: ns},
		Spec: v1alpha1.ConfigurationSpec{Allocation: cs.allocation, DiscoveryHandler: v1alpha1.DiscoveryHandlerSpec{
			Name: "debug-echo", DiscoveryDetails: &apiextensionsv1.JSON{Raw: raw}}}}
	if err := c.Create(ctx, cfg); err != nil {
		return err
	}
	if err := waitInstances(ctx, c, ns, n, ag, h); err != nil {
		return err
	}
	applied := time.Since(t0)
	after, err := readUsage(ag.Pid(), apiserver)
	var streamsIn time.Duration
	if cs.kubelet {
		// Every plugin (and the Configuration's) registered and streaming.
		for kubeletStreams(filepath.Join(dir, "device-plugins")) < n+1 {
			if time.Since(t0) > 10*time.Minute {
				return fmt.Errorf("the kubelet holds %d of %d ListAndWatch streams", kubeletStreams(filepath.Join(dir, "device-plugins")), n+1)
			}
			time.Sleep(100 * time.Millisecond)
		}
		streamsIn = time.Since(t0)
	}
	if err != nil {
		return err
	}
	perK := func(d time.Duration) float64 { return d.Seconds() * 1000 / float64(n) }
	line := fmt.Sprintf("%-15s %5d devices: applied in %6.2fs, %5.0f Instances/s (CPU per 1,000: agent %.2fs, API server %.2fs; machine %.0f%% busy)",
		cs.name, n, applied.Seconds(), float64(n)/applied.Seconds(), perK(after.agent-before.agent), perK(after.apiserver-before.apiserver),
		100*float64(after.busy-before.busy)/float64(after.all-before.all))
	if cs.allocation == v1alpha1.AllocationDRA {
		if err := waitSliceDevices(ctx, c, ns, n, cs.shared, ag); err != nil {
			return err
		}
		line += fmt.Sprintf(", all in ResourceSlices after %6.2fs", time.Since(t0).Seconds())
	}
	if cs.kubelet {
		line += fmt.Sprintf(", all %d plugins streaming to the kubelet after %6.2fs", n+1, streamsIn.Seconds())
	}
	kib, err := ag.PeakRSS()
	if err != nil {
		return err
	}
	line += fmt.Sprintf("; agent peak RSS %.1f MiB (%.1f MiB anonymous)", float64(kib)/1024, float64(stopSampling())/1024)
	if ctl != nil {
		if kib, err = ctl.PeakRSS(); err != nil {
			return err
		}
		line += fmt.Sprintf(", controller %.1f MiB", float64(kib)/1024)
	}
	fmt.Fprintln(out, line)
	if err := c.Delete(ctx, cfg); err != nil {
		return err
	}
	if err := waitInstances(ctx, c, ns, 0, ag, h); err != nil {
		return err
	}
	if cs.allocation == v1alpha1.AllocationDRA {
		return waitSliceDevices(ctx, c, ns, 0, cs.shared, ag)
	}
	return nil
}

// usage is the CPU used so far by the agent, the API server and the
// machine (busy, and in all).
type usage struct{ agent, apiserver, busy, all time.Duration }

func readUsage(agent, apiserver int) (u usage, err error) {
	if u.agent, err = procs.CPUTime(agent); err != nil {
		return u, err
	}
	if u.apiserver, err = procs.CPUTime(apiserver); err != nil {
		return u, err
	}
	u.busy, u.all, err = procs.MachineCPU()
	return u, err
}

// sampleAnon samples p's anonymous memory every 20 ms (the kernel keeps
// the peak of the total only) until the returned function is called,
// which returns the peak in KiB.
func sampleAnon(p *procs.Proc) func() int {
	done := make(chan struct{})
	peak := make(chan int)
	go func() {
		most := 0
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				peak <- most
				return
			case <-t.C:
				if m, err := p.MemoryNow(); err == nil {
					most = max(most, m.Anon)
				}
			}
		}
	}()
	var once sync.Once
	var got int
	return func() int {
		once.Do(func() { close(done); got = <-peak })
		return got
	}
}

// waitInstances waits until want Instances in ns list a node, following a
// watch (polling lists of thousands would load the machine more than the
// agent does).
func waitInstances(ctx context.Context, c client.WithWatch, ns string, want int, watched ...*procs.Proc) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	var l v1alpha1.InstanceList
	if err := c.List(ctx, &l, client.InNamespace(ns)); err != nil {
		return err
	}
	live := map[string]bool{}
	for _, i := range l.Items {
		if len(i.Status.Nodes) > 0 {
			live[i.Name] = true
		}
	}
	w, err := c.Watch(ctx, &v1alpha1.InstanceList{}, client.InNamespace(ns), &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: l.ResourceVersion}})
	if err != nil {
		return err
	}
	defer w.Stop()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for len(live) != want {
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d Instances, want %d", len(live), want)
		case <-tick.C:
			for _, p := range watched {
				if p.Exited() {
					return fmt.Errorf("%s exited; see its log", p.Name)
				}
			}
		case ev, ok := <-w.ResultChan():
			if !ok {
				return waitInstances(ctx, c, ns, want, watched...)
			}
			i, isInst := ev.Object.(*v1alpha1.Instance)
			if !isInst {
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

// waitSliceDevices waits until the slices of namespace ns (the node's, or
// the controller's shared pools) hold want devices.
func waitSliceDevices(ctx context.Context, c client.Client, ns string, want int, shared bool, ag *procs.Proc) error {
	deadline := time.Now().Add(10 * time.Minute)
	prefix := shareddra.LocalPool(node, ns, "")
	sel := fields.OneTermEqualSelector(resourceapi.ResourceSliceSelectorNodeName, node)
	if shared {
		prefix = shareddra.SharedPool(ns, "", "")
		prefix = prefix[:len(prefix)-1] // "shared/<ns>/"
		sel = fields.OneTermEqualSelector(resourceapi.ResourceSliceSelectorDriver, shareddra.DriverName)
	}
	for {
		var list resourceapi.ResourceSliceList
		if err := c.List(ctx, &list, client.MatchingFieldsSelector{Selector: sel}); err != nil {
			return err
		}
		got := 0
		for _, s := range list.Items {
			if s.Spec.Driver == shareddra.DriverName && strings.HasPrefix(s.Spec.Pool.Name, prefix) {
				got += len(s.Spec.Devices)
			}
		}
		if got == want {
			return nil
		}
		if ag.Exited() {
			return fmt.Errorf("agent exited; see its log")
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d devices in slices, want %d", got, want)
		}
		time.Sleep(250 * time.Millisecond)
	}
}
