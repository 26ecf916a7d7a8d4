package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/framework/kube"
	"github.com/dowse-dev/dowse/test/peers/modbusplc"
)

// nodeSoakFault is a kill -9 of one kind of Dowse process on the real
// node (the first container of the Pod that sel picks in ns), or, with
// control set, an outage of the control plane's etcd or kube-apiserver
// for away.
type nodeSoakFault struct {
	name, ns string
	sel      client.MatchingLabels
	// broker marks the debug-echo broker, whose restart its Pod's
	// restart count shows.
	broker  bool
	control string
	away    time.Duration
}

// nodeSoakConverge is the most a fault may take to converge.
const nodeSoakConverge = 3 * time.Minute

// nodeSoakRoundEvery is how far apart rounds start: the kubelet restarts
// a crashed container at once only when its last crash is more than its
// longest crash-loop back-off (5 minutes) ago; sooner, it waits 10 s,
// doubling up to 5 minutes, which would then be most of each time to
// converge.
const nodeSoakRoundEvery = 5*time.Minute + 10*time.Second

// TestSoakOnNode is the soak's part that needs the real node (kubelet,
// containerd, the chart): the parts TestSoak's process fleet cannot have.
// The chart runs the agent, one controller replica and the debug-echo and
// Modbus handlers; debug-echo's broker Pods hold device slots (the device
// plugin and CDI); a Modbus PLC's counter twin (the counter goes up five
// times a second, read every 200 ms by the controller's mapper Pod) also
// pushes each reading to an HTTP sink the test serves. Each round kills
// with -9 the agent's process, the controller's, each handler's, the
// mapper's and a broker's (the kubelet restarts each), keeps the API
// server away 20 s and restarts etcd, and sets a desired setpoint right
// after each fault. After each fault it waits, at most
// nodeSoakConverge, until everything converges: the killed container
// restarted in the same Pod, every Pod of the chart ready, the edge's
// session back, the same Instances, Devices, broker and mapper Pods
// (UIDs), the node's allocatable dowse.dev resources and CDI devices as
// before, each broker Pod serving its device's environment with restarts
// only where the broker itself was killed, the setpoint applied, and (the
// PLC's counter held) both Device.status and the sink showing the PLC's
// counter. Throughout, neither Device.status nor the sink may show the
// counter going back. One round by default; SOAK_DURATION (as TestSoak's)
// repeats rounds, one every nodeSoakRoundEvery, while it lasts. Time to converge per fault is
// logged (docs/user-guide/reliability.md), never asserted.
func TestSoakOnNode(t *testing.T) {
	kube.RequireHelm(t)
	var d time.Duration
	if s := os.Getenv("SOAK_DURATION"); s != "" {
		var err error
		if d, err = time.ParseDuration(s); err != nil {
			t.Fatalf("SOAK_DURATION=%q: %v", s, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute+d)
	defer cancel()
	c := startCluster(t, ctx,
		[2]string{"./agent/cmd/dowse-agent", "ghcr.io/dowse-dev/dowse-agent:latest"},
		[2]string{"./controller/cmd/dowse-controller", "ghcr.io/dowse-dev/dowse-controller:latest"},
		[2]string{"./discovery-handlers/debug-echo/cmd/dowse-debug-echo-discovery", "ghcr.io/dowse-dev/dowse-debug-echo-discovery:latest"},
		[2]string{"./discovery-handlers/modbus/cmd/dowse-modbus-discovery", "ghcr.io/dowse-dev/dowse-modbus-discovery:latest"},
		[2]string{"./mappers/modbus/cmd/dowse-modbus-mapper", "ghcr.io/dowse-dev/dowse-modbus-mapper:latest"},
		[2]string{"./brokers/debug-echo/cmd/dowse-debug-echo-broker", "ghcr.io/dowse-dev/dowse-debug-echo-broker:latest"})
	cl := newClient(t, c)
	sink := serveSink(t)

	valuesFile, ports := nodeValues(t, c, map[string]any{
		"debugEcho": map[string]any{"discovery": map[string]any{"enabled": true}},
		"modbus":    map[string]any{"discovery": map[string]any{"enabled": true}},
	})
	out, err := kube.HelmCommand(ctx, t, "install", "dowse", filepath.Join(kube.RepoRoot(), "deploy", "helm", "dowse"),
		"--namespace", "dowse-system", "--create-namespace", "--values", valuesFile, "--kubeconfig", c.Kubeconfig).CombinedOutput()
	if err != nil {
		t.Fatalf("helm install: %v\n%s", err, out)
	}
	parts := []string{"dowse-agent", "dowse-controller", "dowse-debug-echo-discovery", "dowse-modbus-discovery"}
	waitReady(t, ctx, cl, "dowse-system", parts)
	connected := fmt.Sprintf("127.0.0.1:%d", ports.controllerMetrics)
	waitMetricAt(t, ctx, connected, "dowse_cloudhub_connected_nodes 1")

	plc, err := modbusplc.Start(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer plc.Stop()
	echo, _ := applyWorkloads(t, ctx, cl, plc.Addr, workloadOptions{counter: true,
		counterSink: &v1alpha1.PushMethod{HTTP: &v1alpha1.PushMethodHTTP{HostName: "http://127.0.0.1", Port: int64(sink.port), RequestPath: "/readings"}}})
	brokerPort := echo.Spec.BrokerSpec.BrokerPodSpec.Containers[0].Ports[0].ContainerPort
	dev := waitTwin(t, ctx, cl, "setpoint", "21")
	counter := watchCounter(t, c.Config, client.Options{Scheme: cl.Scheme()})
	eventuallyNode(t, ctx, time.Minute, func() error {
		if counter.last() < 1 || sink.last() < 1 {
			return fmt.Errorf("no counter yet: Device.status %d, the sink %d", counter.last(), sink.last())
		}
		return nil
	})
	before := uids(t, ctx, cl)
	brokers := brokerPods(t, ctx, cl, echo.Name, brokerPort)
	// The node's resources once the broker's slot is recorded: a slot held
	// through the Instance's resource is then unavailable through the
	// Configuration's.
	eventuallyNode(t, ctx, time.Minute, func() error { return slotsSettled(ctx, cl, c.NodeName, c.CDIDir, echo.Name) })
	devices, err := readNodeDevices(ctx, cl, c.CDIDir)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("before the faults: %d Instances, %d Devices, %d broker Pods, %d mapper Pods, dowse.dev resources %v, %d CDI devices; the counter at %d",
		len(before.instances), len(before.devices), len(before.pods), len(before.mappers), devices.allocatable, len(devices.cdi), counter.last())

	faults := []nodeSoakFault{
		{name: "kill -9 agent", ns: "dowse-system", sel: client.MatchingLabels{"app.kubernetes.io/name": "dowse-agent"}},
		{name: "kill -9 controller replica", ns: "dowse-system", sel: client.MatchingLabels{"app.kubernetes.io/name": "dowse-controller"}},
		{name: "kill -9 handler (debug-echo)", ns: "dowse-system", sel: client.MatchingLabels{"app.kubernetes.io/name": "dowse-debug-echo-discovery"}},
		{name: "kill -9 handler (modbus)", ns: "dowse-system", sel: client.MatchingLabels{"app.kubernetes.io/name": "dowse-modbus-discovery"}},
		{name: "kill -9 mapper (modbus)", ns: "default", sel: client.MatchingLabels{v1alpha1.LabelMapper: "true"}},
		{name: "kill -9 broker (debug-echo)", ns: "default", sel: client.MatchingLabels{v1alpha1.LabelConfiguration: echo.Name}, broker: true},
		{name: "API server away 20 s", control: "kube-apiserver", away: 20 * time.Second},
		{name: "restart etcd", control: "etcd"},
	}
	setpoint := 21
	took := map[string][]time.Duration{}
	begin := time.Now()
	for round := 1; round == 1 || time.Since(begin) < d; round++ {
		if round > 1 {
			// Steady traffic until the round is due (the watches of
			// Device.status and the sink go on checking it).
			next := begin.Add(time.Duration(round-1) * nodeSoakRoundEvery)
			if next.After(begin.Add(d)) {
				break
			}
			select {
			case <-time.After(time.Until(next)):
			case <-ctx.Done():
				t.Fatal(ctx.Err())
			}
		}
		for _, f := range faults {
			what := fmt.Sprintf("round %d, %s", round, f.name)
			var (
				pod       *corev1.Pod
				restarts  int32
				container string
				pid       int
				killed    time.Time
				apiReady  time.Duration
			)
			if f.control != "" {
				// Timed from the process started again, as TestSoak's.
				if err := c.RestartControlPlane(ctx, f.control, f.away); err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				killed = time.Now()
				// How much of the convergence is the API server's own start.
				for {
					body, err := c.Client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
					if err == nil && string(body) == "ok" {
						break
					}
					if time.Since(killed) > nodeSoakConverge {
						t.Fatalf("%s: the API server not ready %v after %s started again: %v", what, nodeSoakConverge, f.control, err)
					}
					time.Sleep(100 * time.Millisecond)
				}
				apiReady = time.Since(killed)
			} else {
				pod, restarts = soakTarget(t, ctx, cl, f)
				if f.broker {
					b := brokers[pod.Namespace+"/"+pod.Name]
					b.restarts++
					brokers[pod.Namespace+"/"+pod.Name] = b
				}
				container = pod.Spec.Containers[0].Name
				killed = time.Now()
				var err error
				if pid, err = c.KillContainer(ctx, pod.Namespace, pod.Name, container); err != nil {
					t.Fatalf("%s: %v", what, err)
				}
			}
			setpoint++
			setDesired(t, ctx, cl, dev, "setpoint", strconv.Itoa(setpoint))
			patched := time.Since(killed)

			settled := func() error {
				if pod != nil {
					var p corev1.Pod
					if err := cl.Get(ctx, client.ObjectKeyFromObject(pod), &p); err != nil {
						return err
					}
					if p.UID != pod.UID {
						return fmt.Errorf("%s: Pod %s is another Pod (%s, was %s)", what, pod.Name, p.UID, pod.UID)
					}
					if n := containerRestarts(&p, container); n != restarts+1 {
						return fmt.Errorf("%s: container %s of %s has %d restarts, want %d", what, container, pod.Name, n, restarts+1)
					}
				}
				for _, ns := range []string{"dowse-system", "default"} {
					if err := podsReady(ctx, cl, ns); err != nil {
						return fmt.Errorf("%s: %w", what, err)
					}
				}
				if err := hasMetric(ctx, connected, "dowse_cloudhub_connected_nodes 1"); err != nil {
					return fmt.Errorf("%s: %w", what, err)
				}
				if errs := diffSnapshots(before, uids(t, ctx, cl), what); len(errs) > 0 {
					return errors.Join(errs...)
				}
				if err := nodeDevicesAsBefore(ctx, cl, c.CDIDir, devices, what); err != nil {
					return err
				}
				now, err := readBrokerPods(ctx, cl, echo.Name, brokerPort)
				if err != nil {
					return fmt.Errorf("%s: %w", what, err)
				}
				if errs := diffBrokers(brokers, now, what); len(errs) > 0 {
					return errors.Join(errs...)
				}
				var cur v1alpha1.Device
				if err := cl.Get(ctx, client.ObjectKeyFromObject(dev), &cur); err != nil {
					return err
				}
				if got := reported(&cur, "setpoint"); got != strconv.Itoa(setpoint) {
					return fmt.Errorf("%s: the setpoint set after the kill (%d) is not reported yet (%q)", what, setpoint, got)
				}
				return nil
			}
			var last error
			for last = settled(); last != nil; last = settled() {
				if time.Since(killed) > nodeSoakConverge {
					t.Fatalf("not converged %v after the kill: %v", nodeSoakConverge, last)
				}
				time.Sleep(200 * time.Millisecond)
			}
			structural := time.Since(killed)
			restarted := killed
			if pod != nil {
				var p corev1.Pod
				if err := cl.Get(ctx, client.ObjectKeyFromObject(pod), &p); err != nil {
					t.Fatal(err)
				}
				for _, cs := range p.Status.ContainerStatuses {
					if cs.Name == container && cs.State.Running != nil {
						restarted = cs.State.Running.StartedAt.Time
					}
				}
			}
			// Nothing missing: with the PLC's counter held, Device.status
			// and the sink reach its value.
			want := plc.HoldCounter(true)
			for counter.last() != want || sink.last() != want {
				if time.Since(killed) > nodeSoakConverge {
					t.Fatalf("%s: the PLC's counter is %d, Device.status shows %d, the sink %d", what, want, counter.last(), sink.last())
				}
				time.Sleep(100 * time.Millisecond)
			}
			converged := time.Since(killed)
			plc.HoldCounter(false)
			_, _, gap, _ := counter.window(killed, time.Now())
			took[f.name] = append(took[f.name], converged)
			// The kubelet's StartedAt has whole seconds: the time from the
			// restart is to within a second.
			started := fmt.Sprintf("pid %d; the container started again +%v", pid, restarted.Sub(killed).Round(time.Second))
			if pod == nil {
				started = fmt.Sprintf("%s timed from its start, the API server ready +%v", f.control, apiReady.Round(100*time.Millisecond))
			}
			t.Logf("%s: converged in %v (Pods, Instances, slots, brokers, setpoint %d set +%v and applied: %v; %s); counter %d in Device.status and the sink; Device.status showed no new counter value for %v at most",
				what, converged.Round(100*time.Millisecond), setpoint, patched.Round(100*time.Millisecond), structural.Round(100*time.Millisecond), started, want, gap.Round(100*time.Millisecond))
			if errs := counter.errors(); len(errs) > 0 {
				t.Fatalf("%s: Device.status showed the counter going back %d times, first: %v", what, len(errs), errs[:min(5, len(errs))])
			}
			if errs := sink.errors(); len(errs) > 0 {
				t.Fatalf("%s: the sink received the counter going back %d times, first: %v", what, len(errs), errs[:min(5, len(errs))])
			}
		}
	}
	var summary []string
	for _, f := range faults {
		ds := took[f.name]
		summary = append(summary, fmt.Sprintf("%s: %d times, %v to %v", f.name, len(ds), slices.Min(ds).Round(100*time.Millisecond), slices.Max(ds).Round(100*time.Millisecond)))
	}
	posts, values, gaps := sink.figures()
	t.Logf("over %v: %s; the sink got %d counter readings, %d values (the counter skipped %d values between readings it got, missing while the mapper was down or between two 200 ms reads); gone back in Device.status 0, in the sink 0",
		time.Since(begin).Round(time.Second), strings.Join(summary, "; "), posts, values, gaps)
}

// slotsSettled says whether the Configuration cfg's Instances record a
// slot held on node and the node's allocatable dowse.dev resources are
// what their slots make them: each slot counts for a resource unless
// another node holds it, or this node through another resource.
func slotsSettled(ctx context.Context, cl client.Client, node, cdiDir, cfg string) error {
	var insts v1alpha1.InstanceList
	if err := cl.List(ctx, &insts); err != nil {
		return err
	}
	want := map[string]int{}
	held := 0
	for _, in := range insts.Items {
		for _, r := range []string{v1alpha1.ResourceName(in.Namespace, in.Name), v1alpha1.ResourceName(in.Namespace, in.Spec.ConfigurationName)} {
			elsewhere := map[string]bool{}
			for _, sl := range in.Status.Slots {
				if sl.Node != node || (sl.Resource != "" && sl.Resource != r) {
					elsewhere[sl.ID] = true
				}
			}
			for _, id := range in.SlotIDs() {
				if !elsewhere[id] {
					want[node+" "+r]++
				}
			}
		}
		for _, sl := range in.Status.Slots {
			if in.Spec.ConfigurationName == cfg && sl.Node == node {
				held++
			}
		}
	}
	if held == 0 {
		return fmt.Errorf("no Instance of %s records a slot held on %s", cfg, node)
	}
	now, err := readNodeDevices(ctx, cl, cdiDir)
	if err != nil {
		return err
	}
	for r, n := range want {
		if now.allocatable[r] != strconv.Itoa(n) {
			return fmt.Errorf("node allocatable %s is %q, its Instances' slots make it %d", r, now.allocatable[r], n)
		}
	}
	return nil
}

// soakTarget picks the Pod f kills (the first by name) and reads its
// first container's restart count.
func soakTarget(t *testing.T, ctx context.Context, cl client.Client, f nodeSoakFault) (*corev1.Pod, int32) {
	t.Helper()
	var pods corev1.PodList
	if err := cl.List(ctx, &pods, client.InNamespace(f.ns), f.sel); err != nil {
		t.Fatal(err)
	}
	var live []corev1.Pod
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil && (!f.broker || p.Labels[v1alpha1.LabelMapper] != "true") {
			live = append(live, p)
		}
	}
	if len(live) == 0 {
		t.Fatalf("%s: no Pod to kill in %s with %v", f.name, f.ns, f.sel)
	}
	slices.SortFunc(live, func(a, b corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
	p := live[0]
	return &p, containerRestarts(&p, p.Spec.Containers[0].Name)
}

func containerRestarts(p *corev1.Pod, container string) int32 {
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == container {
			return cs.RestartCount
		}
	}
	return -1
}

// podsReady says which Pod in ns is not running with every container
// ready (nil: none).
func podsReady(ctx context.Context, cl client.Client, ns string) error {
	var pods corev1.PodList
	if err := cl.List(ctx, &pods, client.InNamespace(ns)); err != nil {
		return err
	}
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil {
			continue
		}
		if p.Status.Phase != corev1.PodRunning {
			return fmt.Errorf("Pod %s/%s is %s", ns, p.Name, p.Status.Phase)
		}
		for _, cs := range p.Status.ContainerStatuses {
			if !cs.Ready {
				return fmt.Errorf("Pod %s/%s: %s not ready", ns, p.Name, cs.Name)
			}
		}
	}
	return nil
}

// sinkWatch is an HTTP sink (a property's pushMethod.http) served on
// loopback: it keeps the counter readings the mapper posts and says when
// one goes back.
type sinkWatch struct {
	port int

	mu     sync.Mutex
	posts  int
	values []int // each new value, in arrival order
	errs   []string
}

func serveSink(t *testing.T) *sinkWatch {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &sinkWatch{port: ln.Addr().(*net.TCPAddr).Port}
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var rd struct {
			Property string `json:"property"`
			Value    string `json:"value"`
		}
		if r.Method != http.MethodPost || r.URL.Path != "/readings" || json.NewDecoder(r.Body).Decode(&rd) != nil {
			http.Error(w, "a reading is a JSON object posted to /readings", http.StatusBadRequest)
			return
		}
		w.WriteHeader(http.StatusNoContent)
		if rd.Property != "counter" {
			return
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		s.posts++
		v, err := strconv.Atoi(rd.Value)
		switch {
		case err != nil:
			s.errs = append(s.errs, fmt.Sprintf("counter %q", rd.Value))
		case len(s.values) > 0 && v < s.values[len(s.values)-1]:
			s.errs = append(s.errs, fmt.Sprintf("counter went back from %d to %d at %s", s.values[len(s.values)-1], v, time.Now().Format(time.StampMilli)))
			s.values = append(s.values, v)
		case len(s.values) == 0 || v != s.values[len(s.values)-1]:
			s.values = append(s.values, v)
		}
	})}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close(); <-done })
	return s
}

// last is the newest counter value the sink got (-1: none).
func (s *sinkWatch) last() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.values) == 0 {
		return -1
	}
	return s.values[len(s.values)-1]
}

func (s *sinkWatch) errors() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.errs)
}

// figures are the readings posted, the distinct values among them, and
// how many values the counter skipped between two the sink got.
func (s *sinkWatch) figures() (posts, values, skipped int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := 1; i < len(s.values); i++ {
		if d := s.values[i] - s.values[i-1]; d > 1 {
			skipped += d - 1
		}
	}
	return s.posts, len(s.values), skipped
}
