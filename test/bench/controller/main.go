// Command controller measures dowse-controller (the real binary) on the real
// test control plane: how fast it creates broker Pods for N Instances, how
// much of that time is its own rather than waiting on API round-trips, and
// its peak memory while holding them.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"net/http"
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
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/dowse-dev/dowse/internal/scheme"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/framework/dowse"
	"github.com/dowse-dev/dowse/test/framework/kube"
	"github.com/dowse-dev/dowse/test/framework/procs"
)

func main() {
	n := flag.Int("instances", 2000, "Instances to create brokers for")
	qps := flag.Int("kube-api-qps", 200, "the controller's --kube-api-qps (its default is 200; burst is twice it)")
	flag.Parse()
	// Nothing here logs through controller-runtime; unset, its logger
	// prints a stack trace the first time a client would.
	ctrllog.SetLogger(logr.Discard())
	ctlQPS = *qps
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *n); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// ctlQPS is the controller's client rate limit: at its default, the limit
// and not the API server sets the pace.
var ctlQPS int

func run(ctx context.Context, n int) error {
	cp, err := kube.Start()
	if err != nil {
		return err
	}
	defer cp.Stop()
	dir, err := os.MkdirTemp("", "dowse-ctl-bench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := cp.Kubeconfig(kubeconfig); err != nil {
		return err
	}
	sch, err := scheme.New()
	if err != nil {
		return err
	}
	c, err := client.New(cp.Config, client.Options{Scheme: sch})
	if err != nil {
		return err
	}
	if err := c.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "bench-node"}}); err != nil {
		return err
	}
	if err := c.Create(ctx, &v1alpha1.Configuration{
		ObjectMeta: metav1.ObjectMeta{Name: "bench", Namespace: "default"},
		Spec: v1alpha1.ConfigurationSpec{DiscoveryHandler: v1alpha1.DiscoveryHandlerSpec{Name: "debug-echo"},
			BrokerSpec: &v1alpha1.BrokerSpec{BrokerPodSpec: &corev1.PodSpec{Containers: []corev1.Container{{
				Name: "broker", Image: "broker:bench",
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"{{PLACEHOLDER}}": resource.MustParse("1")}},
			}}}}},
	}); err != nil {
		return err
	}
	t0 := time.Now()
	if err := createInstances(ctx, c, n); err != nil {
		return err
	}
	fmt.Printf("created %d Instances in %s (before the controller starts)\n", n, time.Since(t0).Round(time.Millisecond))

	port, err := procs.FreePort()
	if err != nil {
		return err
	}
	logf, err := os.Create(filepath.Join(dir, "controller.log"))
	if err != nil {
		return err
	}
	t1 := time.Now()
	ctl, err := dowse.Controller{Kubeconfig: kubeconfig, Metrics: port, Args: []string{
		"--pprof-bind-address", os.Getenv("BENCH_PPROF"),
		"--kube-api-qps", strconv.Itoa(ctlQPS), "--kube-api-burst", strconv.Itoa(2 * ctlQPS)}}.Start(logf)
	if err != nil {
		return err
	}
	defer ctl.Stop()
	for {
		var pods corev1.PodList
		if err := c.List(ctx, &pods, client.InNamespace("default"), client.Limit(1)); err != nil {
			return err
		}
		got := n - int(ptrOr(pods.RemainingItemCount)) - len(pods.Items)
		if got <= 0 && len(pods.Items) > 0 {
			break
		}
		if ctl.Exited() {
			return fmt.Errorf("controller exited; log %s", logf.Name())
		}
		if time.Since(t1) > 10*time.Minute {
			return fmt.Errorf("no %d pods within 10 minutes", n)
		}
		time.Sleep(200 * time.Millisecond)
	}
	el := time.Since(t1)
	m, err := scrape(fmt.Sprintf("http://127.0.0.1:%d/metrics", port))
	if err != nil {
		return err
	}
	cpuTime, err := procs.CPUTime(ctl.Pid())
	cpu := cpuTime.Seconds()
	if err != nil {
		return err
	}
	fmt.Printf("controller created %d broker Pods in %s from its start: %.0f pods/s\n", n, el.Round(time.Millisecond), float64(n)/el.Seconds())
	fmt.Printf("API requests %.0f, summed round-trip time %.1fs (mean %.1f ms); controller CPU %.1fs: CPU/round-trip ratio %.2f\n",
		m.count, m.seconds, 1000*m.seconds/max(m.count, 1), cpu, cpu/max(m.seconds, 1e-9))
	if os.Getenv("BENCH_PPROF") != "" {
		fmt.Println("profiles at http://" + os.Getenv("BENCH_PPROF") + "/debug/pprof/; waiting 60 s")
		time.Sleep(60 * time.Second)
	}
	kib, err := ctl.PeakRSS()
	if err != nil {
		return err
	}
	fmt.Printf("controller peak RSS with %d Instances and %d Pods: %.1f MiB (goal at 10,000 Instances: < 96 MiB)\n", n, n, float64(kib)/1024)
	return nil
}

func ptrOr(p *int64) int64 {
	if p == nil {
		return 0
	}
	return *p
}

func createInstances(ctx context.Context, c client.Client, n int) error {
	var wg sync.WaitGroup
	errc := make(chan error, 1)
	work := make(chan int)
	for w := 0; w < 16; w++ {
		wg.Go(func() {
			for i := range work {
				inst := &v1alpha1.Instance{
					ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("bench-%05d", i), Namespace: "default"},
					Spec:       v1alpha1.InstanceSpec{ConfigurationName: "bench", DeviceID: fmt.Sprint(i), Shared: true, Capacity: 1},
					Status:     v1alpha1.InstanceStatus{Nodes: []v1alpha1.InstanceNode{{Name: "bench-node"}}},
				}
				if err := c.Create(ctx, inst); err != nil {
					select {
					case errc <- err:
					default:
					}
				}
			}
		})
	}
	for i := 0; i < n; i++ {
		work <- i
	}
	close(work)
	wg.Wait()
	select {
	case err := <-errc:
		return err
	default:
		return nil
	}
}

type requestMetrics struct{ count, seconds float64 }

// scrape sums client-go's request latency histogram from the controller.
func scrape(url string) (requestMetrics, error) {
	resp, err := http.Get(url)
	if err != nil {
		return requestMetrics{}, err
	}
	defer resp.Body.Close()
	var m requestMetrics
	s := bufio.NewScanner(resp.Body)
	s.Buffer(make([]byte, 1<<20), 1<<20)
	for s.Scan() {
		line := s.Text()
		i := strings.LastIndex(line, " ")
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		switch {
		case strings.HasPrefix(line, "rest_client_request_duration_seconds_sum"):
			m.seconds += v
		case strings.HasPrefix(line, "rest_client_request_duration_seconds_count"):
			m.count += v
		}
	}
	return m, s.Err()
}
