package deviceplugin

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	dp "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// TestMain lets the test binary act as the kubelet of the memory bench in
// a process of its own, so that the kubelet's side of every connection is
// not counted as the agent's.
func TestMain(m *testing.M) {
	if dir := os.Getenv("DOWSE_FAKE_KUBELET_DIR"); dir != "" {
		os.Exit(runStreamingKubelet(dir))
	}
	os.Exit(m.Run())
}

// runStreamingKubelet is a kubelet's device manager, as far as a plugin
// sees it: it takes registrations and, for each, dials the plugin's
// endpoint and keeps its ListAndWatch stream open.
func runStreamingKubelet(dir string) int {
	l, err := net.Listen("unix", filepath.Join(dir, "kubelet.sock"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	var streams atomic.Int64
	srv := grpc.NewServer()
	dp.RegisterRegistrationServer(srv, &streamingKubelet{dir: dir, streams: &streams})
	go func() {
		for range time.Tick(200 * time.Millisecond) {
			fmt.Println("streams", streams.Load())
		}
	}()
	_ = srv.Serve(l)
	return 0
}

type streamingKubelet struct {
	dp.UnimplementedRegistrationServer
	dir     string
	streams *atomic.Int64
}

func (k *streamingKubelet) Register(_ context.Context, r *dp.RegisterRequest) (*dp.Empty, error) {
	go func() {
		conn, err := grpc.NewClient("unix://"+filepath.Join(k.dir, r.Endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return
		}
		defer conn.Close()
		s, err := dp.NewDevicePluginClient(conn).ListAndWatch(context.Background(), &dp.Empty{})
		if err != nil {
			return
		}
		if _, err := s.Recv(); err != nil {
			return
		}
		k.streams.Add(1)
		for {
			if _, err := s.Recv(); err != nil {
				k.streams.Add(-1)
				return
			}
		}
	}()
	return &dp.Empty{}, nil
}

// heapAndStacks is the Go heap and goroutine stacks in use, after a GC.
func heapAndStacks() (heap, stacks uint64) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse, ms.StackInuse
}

// BenchmarkPluginMemory runs the device plugins of -plugins Instances and
// reports what each costs the agent (Go heap and stacks in use, and
// goroutines): with a kubelet (in its own process) that holds a
// ListAndWatch stream of every plugin, and with none listening, where the
// plugins retry their registrations. Run it with
// go test -run '^$' -bench PluginMemory -benchtime 1x ./internal/agent/deviceplugin.
func BenchmarkPluginMemory(b *testing.B) {
	n := 1000
	if s := os.Getenv("DOWSE_BENCH_PLUGINS"); s != "" {
		n, _ = strconv.Atoi(s)
	}
	for _, kubelet := range []bool{true, false} {
		b.Run(map[bool]string{true: "kubelet", false: "no-kubelet"}[kubelet], func(b *testing.B) {
			for b.Loop() {
				benchPlugins(b, n, kubelet)
			}
		})
	}
}

func benchPlugins(b *testing.B, n int, kubelet bool) {
	dir, err := os.MkdirTemp("", "dpbench")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(dir)
	var streams atomic.Int64
	if kubelet {
		self, err := os.Executable()
		if err != nil {
			b.Fatal(err)
		}
		cmd := exec.Command(self)
		cmd.Env = append(os.Environ(), "DOWSE_FAKE_KUBELET_DIR="+dir)
		out, err := cmd.StdoutPipe()
		if err != nil {
			b.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
		go func() {
			buf := make([]byte, 4096)
			for {
				k, err := out.Read(buf)
				if err != nil {
					return
				}
				lines := strings.Split(strings.TrimSpace(string(buf[:k])), "\n")
				if v, err := strconv.ParseInt(strings.TrimPrefix(lines[len(lines)-1], "streams "), 10, 64); err == nil {
					streams.Store(v)
				}
			}
		}()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if _, err := os.Stat(filepath.Join(dir, "kubelet.sock")); err == nil {
				break
			}
			if time.Now().After(deadline) {
				b.Fatal("the kubelet process never listened")
			}
		}
	}
	metrics := NewMetrics(prometheus.NewRegistry())
	m, err := NewManager(nil, Options{NodeName: "n1", PluginDir: dir, Classic: true, Metrics: metrics}, logr.Discard())
	if err != nil {
		b.Fatal(err)
	}
	m.claimer = &fakeClaimer{taken: map[string]bool{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Start(ctx) }()
	<-m.started
	heap0, stacks0 := heapAndStacks()
	goroutines := runtime.NumGoroutine()
	for i := range n {
		inst := testInstance(v1alpha1.InstanceName("bench", v1alpha1.DeviceHash(strconv.Itoa(i), false, "n1")))
		inst.Spec.DeviceSpecs = nil
		m.upsert(inst, logr.Discard())
	}
	want := int64(n + 1) // and the Configuration's
	wait := func(what string, got func() int64) {
		for deadline := time.Now().Add(5 * time.Minute); got() < want; time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				b.Fatalf("%s: %d of %d", what, got(), want)
			}
		}
	}
	if kubelet {
		wait("registrations", func() int64 { return int64(testutil.ToFloat64(metrics.registrations)) })
		wait("ListAndWatch streams", streams.Load)
	} else {
		time.Sleep(3 * time.Second) // a few rounds of retries
	}
	heap1, stacks1 := heapAndStacks()
	goroutinesAfter := runtime.NumGoroutine()
	if f := os.Getenv("DOWSE_BENCH_HEAP_PROFILE"); f != "" && kubelet {
		if out, err := os.Create(f); err == nil {
			_ = pprof.Lookup("heap").WriteTo(out, 0)
			_ = out.Close()
		}
	}
	b.ReportMetric(float64(heap1+stacks1-heap0-stacks0)/float64(want), "B/plugin")
	b.ReportMetric(float64(stacks1-stacks0)/float64(want), "stack-B/plugin")
	b.ReportMetric(float64(goroutinesAfter-goroutines)/float64(want), "goroutines/plugin")
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}
