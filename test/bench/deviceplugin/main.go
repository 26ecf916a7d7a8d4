// Command deviceplugin measures the agent's device plugins on the real test
// node (root, runc and `make k8s` needed): the time from an Instance
// appearing to its plugin registered with the kubelet and to its resource
// in the node's allocatable, and Allocate latency as the kubelet sees it
// (a new slot, claimed on the API server, and a slot already held).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	dp "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/dowse-dev/dowse/agent"
	debugecho "github.com/dowse-dev/dowse/discovery-handlers/debug-echo"
	"github.com/dowse-dev/dowse/internal/agent/deviceplugin"
	"github.com/dowse-dev/dowse/internal/kubeflags"
	"github.com/dowse-dev/dowse/internal/scheme"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/framework/cluster"
	"github.com/dowse-dev/dowse/test/framework/kube"
)

func main() {
	rounds := flag.Int("rounds", 20, "times a device goes OFFLINE and comes back")
	allocs := flag.Int("allocations", 200, "Allocate calls (each a new slot: the Configuration's capacity)")
	statusEvery := flag.Duration("node-status-every", 2*time.Second, "the kubelet's nodeStatusUpdateFrequency (its default is 10s)")
	flag.Parse()
	// Nothing here logs through controller-runtime; unset, its logger
	// prints a stack trace the first time a client would.
	ctrllog.SetLogger(logr.Discard())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *rounds, *allocs, *statusEvery); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, rounds, allocs int, statusEvery time.Duration) error {
	c, err := cluster.Start(ctx, cluster.Options{NodeStatusEvery: statusEvery})
	if err != nil {
		return err
	}
	defer func() {
		if err := c.Stop(); err == nil {
			_ = os.RemoveAll(c.StateDir)
		}
	}()
	sch, err := scheme.New()
	if err != nil {
		return err
	}
	if err := apiextensionsv1.AddToScheme(sch); err != nil {
		return err
	}
	cl, err := client.New(c.Config, client.Options{Scheme: sch})
	if err != nil {
		return err
	}
	if err := kube.InstallCRDs(c.Config); err != nil {
		return err
	}
	state := filepath.Join(c.StateDir, "dowse")
	if err := os.MkdirAll(state, 0o755); err != nil {
		return err
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	reg := prometheus.NewRegistry()
	errc := make(chan error, 2)
	go func() {
		errc <- agent.Run(runCtx, agent.Config{
			RESTConfig: c.Config, NodeName: c.NodeName, StateDir: state,
			GracePeriod: time.Minute, WriteConcurrency: 4, Serving: kubeflags.Off(), Registerer: reg,
			DevicePluginDir: deviceplugin.DefaultDir, CDISpecDir: c.CDIDir,
			// No reclaimer: the slots Allocate claims below have no pods.
			SlotReclaimGrace: -1,
		}, logr.Discard())
	}()
	go func() {
		errc <- debugecho.Run(runCtx, debugecho.Config{StateDir: state, Logger: logr.Discard()})
	}()
	avail := filepath.Join(state, debugecho.DefaultAvailabilityFileName)

	cfg := &v1alpha1.Configuration{ObjectMeta: metav1.ObjectMeta{Name: "bench", Namespace: "default"}}
	cfg.Spec.DiscoveryHandler.Name = debugecho.DefaultName
	cfg.Spec.DiscoveryHandler.DiscoveryDetails = &apiextensionsv1.JSON{Raw: []byte(`{"descriptions":["dev0"]}`)}
	cfg.Spec.Capacity = int32(allocs)
	if err := cl.Create(ctx, cfg); err != nil {
		return err
	}

	// Each round: the device goes OFFLINE (Instance, plugin and resource
	// gone), comes back ONLINE, and the clock runs from the Instance's
	// creation as the API server stamped it (second precision, so the
	// bench's own observation of the Instance is the start instead).
	var toRegistered, toAllocatable []time.Duration
	var inst v1alpha1.Instance
	for r := range rounds + 1 {
		if r > 0 {
			if err := os.WriteFile(avail, []byte("OFFLINE"), 0o644); err != nil {
				return err
			}
			if err := poll(ctx, 30*time.Second, "Instance gone and resource unallocatable", func() (bool, error) {
				err := cl.Get(ctx, client.ObjectKeyFromObject(&inst), &v1alpha1.Instance{})
				if !apierrors.IsNotFound(err) {
					return false, client.IgnoreNotFound(err)
				}
				q, err := allocatable(ctx, c, &inst)
				return q == 0, err
			}); err != nil {
				return err
			}
			if err := os.WriteFile(avail, []byte("ONLINE"), 0o644); err != nil {
				return err
			}
		}
		regs := counter(reg, "dowse_agent_device_plugin_registrations_total")
		var seen time.Time
		if err := poll(ctx, 30*time.Second, "Instance", func() (bool, error) {
			var l v1alpha1.InstanceList
			if err := cl.List(ctx, &l, client.InNamespace("default")); err != nil {
				return false, err
			}
			if len(l.Items) == 0 {
				return false, nil
			}
			seen, inst = time.Now(), l.Items[0]
			return true, nil
		}); err != nil {
			return err
		}
		// The Instance's plugin (and, the first time, the Configuration's).
		want := regs + 1
		if r == 0 {
			want++
		}
		if err := poll(ctx, 30*time.Second, "registration", func() (bool, error) {
			return counter(reg, "dowse_agent_device_plugin_registrations_total") >= want, nil
		}); err != nil {
			return err
		}
		registered := time.Since(seen)
		if err := poll(ctx, 30*time.Second, "allocatable", func() (bool, error) {
			q, err := allocatable(ctx, c, &inst)
			return q == int64(allocs), err
		}); err != nil {
			return err
		}
		if r > 0 { // the first round includes the kubelet's first contact
			toRegistered = append(toRegistered, registered)
			toAllocatable = append(toAllocatable, time.Since(seen))
		}
	}

	// Allocate as the kubelet calls it, on the Instance plugin's socket.
	conn, err := grpc.NewClient("unix://"+filepath.Join(deviceplugin.DefaultDir,
		deviceplugin.SocketName(c.NodeName, inst.ResourceName())),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	pl := dp.NewDevicePluginClient(conn)
	allocate := func(id string) (time.Duration, error) {
		begin := time.Now()
		resp, err := pl.Allocate(ctx, &dp.AllocateRequest{ContainerRequests: []*dp.ContainerAllocateRequest{{DevicesIds: []string{id}}}})
		if err != nil {
			return 0, fmt.Errorf("allocate %s: %w", id, err)
		}
		if len(resp.ContainerResponses) != 1 || len(resp.ContainerResponses[0].CdiDevices) != 1 {
			return 0, fmt.Errorf("allocate %s answered %v", id, resp)
		}
		return time.Since(begin), nil
	}
	var fresh, held []time.Duration
	ids := inst.SlotIDs()
	for _, id := range ids {
		d, err := allocate(id)
		if err != nil {
			return err
		}
		fresh = append(fresh, d)
	}
	for _, id := range ids {
		d, err := allocate(id)
		if err != nil {
			return err
		}
		held = append(held, d)
	}
	var cur v1alpha1.Instance
	if err := cl.Get(ctx, client.ObjectKeyFromObject(&inst), &cur); err != nil {
		return err
	}
	if len(cur.Status.Slots) != len(ids) {
		return fmt.Errorf("%d slots claimed in status, want %d", len(cur.Status.Slots), len(ids))
	}
	cancel()
	for range 2 {
		if err := <-errc; err != nil && !errors.Is(err, context.Canceled) {
			fmt.Fprintln(os.Stderr, "bench: stopping:", err)
		}
	}

	fmt.Printf("device plugins on the real kubelet (nodeStatusUpdateFrequency %s), %d rounds:\n", statusEvery, rounds)
	fmt.Printf("  Instance seen -> plugin registered with the kubelet  p50 %-8s p99 %s\n", pct(toRegistered, 50), pct(toRegistered, 99))
	fmt.Printf("  Instance seen -> resource in node allocatable        p50 %-8s p99 %s\n", pct(toAllocatable, 50), pct(toAllocatable, 99))
	fmt.Printf("Allocate over the plugin socket, %d calls each:\n", len(ids))
	fmt.Printf("  new slot (server-side apply of status.slots)          p50 %-8s p99 %s\n", pct(fresh, 50), pct(fresh, 99))
	fmt.Printf("  slot already held (no write)                          p50 %-8s p99 %s\n", pct(held, 50), pct(held, 99))
	return nil
}

func allocatable(ctx context.Context, c *cluster.Cluster, inst *v1alpha1.Instance) (int64, error) {
	n, err := c.Client.CoreV1().Nodes().Get(ctx, c.NodeName, metav1.GetOptions{})
	if err != nil {
		return 0, err
	}
	q := n.Status.Allocatable[corev1.ResourceName(inst.ResourceName())]
	return q.Value(), nil
}

func counter(reg *prometheus.Registry, name string) float64 {
	mfs, _ := reg.Gather()
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// poll checks every 2ms (fine enough for millisecond figures) until ok.
func poll(ctx context.Context, limit time.Duration, what string, ok func() (bool, error)) error {
	deadline := time.Now().Add(limit)
	for {
		done, err := ok()
		if err != nil {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
		if done {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("waiting for %s: timed out", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func pct(ds []time.Duration, p int) string {
	if len(ds) == 0 {
		return "-"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	i = min(max(i-1, 0), len(s)-1)
	return s[i].Round(10 * time.Microsecond).String()
}
