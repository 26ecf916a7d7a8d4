package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/framework/faultproxy"
	"github.com/dowse-dev/dowse/test/framework/kube"
	"github.com/dowse-dev/dowse/test/framework/procs"
	"github.com/dowse-dev/dowse/test/framework/promtest"
	"github.com/dowse-dev/dowse/test/framework/soakreport"
	"github.com/dowse-dev/dowse/test/framework/testwait"
	"github.com/dowse-dev/dowse/test/peers/modbusplc"
)

// The soak's fault kinds, in the order each round injects them: the kills
// first, so that the processes they restart live long enough afterwards
// for their growth to be judged.
var soakFaults = []string{
	"kill -9 agent", "kill -9 controller replica-0", "kill -9 controller replica-1",
	"kill -9 handler (dowse-modbus-discovery)", "kill -9 mapper (dowse-modbus-mapper)",
	"restart the API server", "restart etcd", "link cut for 15 s", "partition a node for 20 s",
}

// soakMargins: a resource levels off when the median of the last third of
// a process's life stays within factor times its middle third's, plus
// slack (generous: a soak looks for leaks, not for noise).
var soakMargins = map[string]struct{ factor, slack float64 }{
	"RSS (MiB)":  {1.25, 8},
	"goroutines": {1.25, 25},
	"open files": {1.25, 10},
}

// TestSoak runs the e2e fleet (two controller replicas, two edges' real
// agents, the real Modbus discovery handler and mapper with a Modbus PLC
// peer, counters reported every 5 ms on each edge and desired values set
// every few seconds) for SOAK_DURATION (default 5m; `make soak` runs an
// hour) under a fault schedule that kills with -9 each kind of Dowse
// process (an agent, each replica, the handler, the mapper: the mapper is
// the twin's broker here, as no kubelet runs broker Pods; in the first
// third of the run only, so that each process then lives long enough for
// its growth to be judged), restarts the API
// server and etcd, cuts an edge's link and partitions a node (link and API
// server). After each fault everything must converge (every edge holds a
// session, each replica is ready, each counter twin applies a new desired
// value and its Device.status shows every counter's last value, the PLC's
// Instance names its node and its Device applies a new setpoint), and no
// Device.status ever shows a counter going back. Every Dowse process's RSS,
// goroutines (go_goroutines from its /metrics) and open files are sampled
// throughout; a process whose figures keep growing in the last third of its
// life fails the test. The report (HTML, SVG plots) goes to SOAK_REPORT or
// a temporary directory the log names.
func TestSoak(t *testing.T) {
	d := 5 * time.Minute
	if s := os.Getenv("SOAK_DURATION"); s != "" {
		var err error
		if d, err = time.ParseDuration(s); err != nil {
			t.Fatalf("SOAK_DURATION=%q: %v", s, err)
		}
	}
	reportPath := os.Getenv("SOAK_REPORT")
	if reportPath == "" {
		dir, err := os.MkdirTemp("", "dowse-soak-")
		if err != nil {
			t.Fatal(err)
		}
		reportPath = filepath.Join(dir, "soak.html")
	}
	s := newSoak(t, d)
	s.run()
	s.finish(reportPath)
}

type soak struct {
	t      *testing.T
	ctx    context.Context
	f      *fleet
	d      time.Duration
	start  time.Time
	edges  []*soakEdge
	plc    *modbusplc.PLC
	report soakreport.Report

	handlerMetrics, mapperMetrics int

	// mu guards procs, which the sampler reads.
	mu    sync.Mutex
	procs map[string]*soakProc

	// kinds is each injected fault's kind (soakFaults), beside
	// report.Faults.
	kinds   []string
	regress *regressions
	desired map[string]int
	plcWant int
}

type soakEdge struct {
	node  string
	links []*faultproxy.TCP
	api   *faultproxy.TCP
	ct    *counterTwin
}

// soakProc is a Dowse process the sampler follows.
type soakProc struct {
	proc    *procs.Proc
	metrics int
}

func newSoak(t *testing.T, d time.Duration) *soak {
	ctx := t.Context()
	s := &soak{t: t, ctx: ctx, d: d, procs: map[string]*soakProc{}, desired: map[string]int{}, plcWant: 30,
		report: soakreport.Report{Title: "Dowse soak (e2e fleet)", Resources: map[string][]soakreport.Series{}}}
	s.f = startFleet(t, 2)
	f := s.f
	f.agentKubeconfig = map[string]string{}
	for _, r := range f.replicas {
		s.track("controller "+r.name, r.proc, r.metrics)
	}
	apiURL, err := url.Parse(f.cp.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := os.ReadFile(f.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, node := range []string{"edge-a", "edge-b"} {
		e := &soakEdge{node: node}
		for _, r := range f.replicas {
			p, err := faultproxy.NewTCP(fmt.Sprintf("127.0.0.1:%d", r.ws))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(p.Close)
			e.links = append(e.links, p)
		}
		// The agent reaches the API server through a proxy of its own too:
		// a partition cuts both.
		if e.api, err = faultproxy.NewTCP(apiURL.Host); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(e.api.Close)
		path := filepath.Join(f.dir, "kubeconfig-"+node)
		if err := os.WriteFile(path, []byte(strings.ReplaceAll(string(kc), apiURL.Host, e.api.Addr())), 0o600); err != nil {
			t.Fatal(err)
		}
		f.agentKubeconfig[node] = path
		s.join(e)
		s.edges = append(s.edges, e)
	}
	if err := poll(time.Now().Add(time.Minute), 200*time.Millisecond, func() error {
		for _, e := range s.edges {
			if err := metricIs(f.agents[e.node].metrics, "dowse_edgehub_connected", 1); err != nil {
				return fmt.Errorf("agent %s: %w", e.node, err)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, e := range s.edges {
		e.ct = f.counterTwin(t, ctx, e.node)
		s.desired[e.node] = 1
	}
	// edge-b runs the Modbus handler and mapper for a PLC peer.
	if s.plc, err = modbusplc.Start(nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.plc.Stop)
	for _, p := range []*int{&s.handlerMetrics, &s.mapperMetrics} {
		if *p, err = procs.FreePort(); err != nil {
			t.Fatal(err)
		}
	}
	s.startHandler()
	s.startMapper()
	s.applyPLC()
	s.regress = watchRegressions(t, f)
	if err := s.converge(3 * time.Minute); err != nil {
		t.Fatalf("the fleet never converged before the first fault: %v", err)
	}
	return s
}

func (s *soak) track(name string, p *procs.Proc, metrics int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.procs[name] = &soakProc{proc: p, metrics: metrics}
}

// join starts (or starts again) e's agent, its link through e's proxies.
func (s *soak) join(e *soakEdge) {
	var servers []string
	for _, p := range e.links {
		servers = append(servers, p.Addr())
	}
	p, state, metrics := s.f.joinAgent(e.node, strings.Join(servers, ","))
	s.f.agents[e.node] = &fleetAgent{proc: p, state: state, metrics: metrics}
	s.track("agent "+e.node, p, metrics)
	s.nodeReady(e.node)
}

// nodeReady marks the Node Ready, as its kubelet would: no kubelet runs
// beside the fleet, and the controller counts a Node that never said it
// was Ready as NotReady since its creation, dead after the grace period
// (5 minutes), and takes it out of its Instances.
func (s *soak) nodeReady(name string) {
	testwait.For(s.t, 30*time.Second, func() error {
		var n corev1.Node
		if err := s.f.client.Get(s.ctx, client.ObjectKey{Name: name}, &n); err != nil {
			return err
		}
		now := metav1.Now()
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue,
			Reason: "KubeletReady", LastHeartbeatTime: now, LastTransitionTime: now}}
		return s.f.client.Status().Update(s.ctx, &n)
	})
}

func (s *soak) edgeB() string { return s.f.agents["edge-b"].state }

func (s *soak) startHandler() {
	p := s.f.cloud.start("dowse-modbus-discovery", "modbus-discovery", "--state-dir", s.edgeB(),
		"--metrics-address", fmt.Sprintf("127.0.0.1:%d", s.handlerMetrics))
	s.track("handler modbus-discovery", p, s.handlerMetrics)
}

func (s *soak) startMapper() {
	p := s.f.cloud.start("dowse-modbus-mapper", "modbus-mapper", "--state-dir", s.edgeB(), "--name", "modbus-plc",
		"--metrics-address", fmt.Sprintf("127.0.0.1:%d", s.mapperMetrics))
	s.track("mapper modbus", p, s.mapperMetrics)
}

// applyPLC applies samples/modbus-plc-model.yaml and samples/modbus-plc.yaml
// scanning the PLC peer's address.
func (s *soak) applyPLC() {
	t := s.t
	var model v1alpha1.DeviceModel
	var cfg v1alpha1.Configuration
	for name, o := range map[string]any{"modbus-plc-model.yaml": &model, "modbus-plc.yaml": &cfg} {
		b, err := os.ReadFile(filepath.Join(kube.RepoRoot(), "samples", name))
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.UnmarshalStrict(b, o); err != nil {
			t.Fatalf("samples/%s: %v", name, err)
		}
	}
	var details map[string]any
	if err := yaml.Unmarshal(cfg.Spec.DiscoveryHandler.DiscoveryDetails.Raw, &details); err != nil {
		t.Fatal(err)
	}
	details["targets"] = []string{s.plc.Addr}
	raw, err := json.Marshal(details)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Spec.DiscoveryHandler.DiscoveryDetails = &apiextensionsv1.JSON{Raw: raw}
	model.Namespace, cfg.Namespace = "default", "default"
	for _, o := range []client.Object{&model, &cfg} {
		if err := s.f.client.Create(s.ctx, o); err != nil {
			t.Fatal(err)
		}
	}
}

// regressions follows every Device's status through API server and etcd
// restarts (kube.Watch resumes) and records each counter that went back.
type regressions struct {
	mu      sync.Mutex
	last    map[string]int
	errs    []string
	updates int
}

func watchRegressions(t *testing.T, f *fleet) *regressions {
	wc, err := client.NewWithWatch(f.cp.Config, client.Options{Scheme: f.client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	r := &regressions{last: map[string]int{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = kube.Watch(ctx, wc, &v1alpha1.DeviceList{}, "default", func(ev watch.EventType, o client.Object) {
			d, ok := o.(*v1alpha1.Device)
			if !ok || ev == watch.Deleted || !strings.HasPrefix(d.Name, "counter-") {
				return
			}
			r.mu.Lock()
			defer r.mu.Unlock()
			r.updates++
			for _, tw := range d.Status.Twins {
				if tw.Reported == nil || tw.PropertyName == "setpoint" {
					continue
				}
				v, err := strconv.Atoi(tw.Reported.Value)
				key := d.Name + "/" + tw.PropertyName
				switch {
				case err != nil:
					r.errs = append(r.errs, fmt.Sprintf("%s reported %q", key, tw.Reported.Value))
				case v < r.last[key]:
					r.errs = append(r.errs, fmt.Sprintf("%s went back from %d to %d", key, r.last[key], v))
				}
				r.last[key] = max(r.last[key], v)
			}
		})
	}()
	t.Cleanup(func() { cancel(); <-done })
	return r
}

func (r *regressions) snapshot() (updates int, errs []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.updates, slices.Clone(r.errs)
}

// poll calls check until it returns nil or the deadline passes.
func poll(deadline time.Time, every time.Duration, check func() error) error {
	for {
		err := check()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(every)
	}
}

// setDesired sets a counter twin's setpoint to the next value.
func (s *soak) setDesired(e *soakEdge, deadline time.Time) (string, error) {
	s.desired[e.node]++
	v := strconv.Itoa(s.desired[e.node])
	return v, poll(deadline, 200*time.Millisecond, func() error {
		var d v1alpha1.Device
		if err := s.f.client.Get(s.ctx, client.ObjectKeyFromObject(e.ct.dev), &d); err != nil {
			return err
		}
		d.Spec.Properties[0].Desired.Value = v
		return s.f.client.Update(s.ctx, &d)
	})
}

// converge waits until everything is as it should be: every replica
// ready, every edge holding a session, each counter twin applying a new
// desired value with every counter's last value in its status, the PLC's
// Instance on edge-b and its Device applying a new setpoint.
func (s *soak) converge(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	f := s.f
	for _, r := range f.replicas {
		if err := poll(deadline, 200*time.Millisecond, func() error {
			code, err := httpGet(fmt.Sprintf("http://127.0.0.1:%d/readyz", r.health))
			if err == nil && code != 200 {
				err = fmt.Errorf("readiness answers %d", code)
			}
			if err != nil {
				return fmt.Errorf("%s: %w", r.name, err)
			}
			return nil
		}); err != nil {
			return err
		}
	}
	if err := poll(deadline, 200*time.Millisecond, func() error {
		sum := 0
		for _, n := range f.connected() {
			sum += n
		}
		if sum != len(s.edges) {
			return fmt.Errorf("the replicas hold %d sessions (%v), want %d", sum, f.connected(), len(s.edges))
		}
		for _, e := range s.edges {
			if err := metricIs(f.agents[e.node].metrics, "dowse_edgehub_connected", 1); err != nil {
				return fmt.Errorf("agent %s: %w", e.node, err)
			}
		}
		return nil
	}); err != nil {
		return err
	}
	for _, e := range s.edges {
		if err := s.counterConverged(e, deadline); err != nil {
			return err
		}
	}
	return s.plcConverged(deadline)
}

// counterConverged sets a new desired value, waits for the mapper to hold
// it and report it, then pauses the reports until Device.status holds every
// counter's last value and the new setpoint as observedDesired.
func (s *soak) counterConverged(e *soakEdge, deadline time.Time) error {
	ct := e.ct
	want, err := s.setDesired(e, deadline)
	if err != nil {
		return fmt.Errorf("%s: setting desired: %w", ct.dev.Name, err)
	}
	if err := poll(deadline, 50*time.Millisecond, func() error {
		if got := ct.m.Desired("default", ct.dev.Name, "setpoint"); got != want {
			return fmt.Errorf("%s: the mapper holds desired %q, want %s", ct.dev.Name, got, want)
		}
		if got, _ := ct.sent.Load().(string); got != want {
			return fmt.Errorf("%s: the newest report the agent took carries setpoint %q, want %s", ct.dev.Name, got, want)
		}
		return nil
	}); err != nil {
		return err
	}
	ct.on <- false
	defer func() { ct.on <- true }()
	final := ct.cnt.snapshot()
	return poll(deadline, 100*time.Millisecond, func() error {
		var d v1alpha1.Device
		if err := s.f.client.Get(s.ctx, client.ObjectKeyFromObject(ct.dev), &d); err != nil {
			return err
		}
		for _, p := range ct.props {
			if rep, _ := d.Twin(p).Values(); rep != strconv.Itoa(final[p]) {
				return fmt.Errorf("%s: %s reported %q, want the last value %d", ct.dev.Name, p, rep, final[p])
			}
		}
		if _, obs := d.Twin("setpoint").Values(); obs != want {
			return fmt.Errorf("%s: setpoint observedDesired %q, want %s", ct.dev.Name, obs, want)
		}
		return nil
	})
}

// plcConverged waits for the PLC's Instance to name edge-b and sets a new
// setpoint with dowsectl (again, should the Device have been made anew)
// until its status reports it applied.
func (s *soak) plcConverged(deadline time.Time) error {
	ctx := s.ctx
	if err := poll(deadline, 200*time.Millisecond, func() error {
		var list v1alpha1.InstanceList
		if err := s.f.client.List(ctx, &list, client.InNamespace("default")); err != nil {
			return err
		}
		for _, in := range list.Items {
			if in.Spec.ConfigurationName == "modbus-plc" && slices.ContainsFunc(in.Status.Nodes, func(n v1alpha1.InstanceNode) bool { return n.Name == "edge-b" }) {
				return nil
			}
		}
		return fmt.Errorf("no Instance of modbus-plc names edge-b (%d Instances)", len(list.Items))
	}); err != nil {
		return err
	}
	s.plcWant = 5 + (s.plcWant-4)%80 // within the model's 5..90
	want := strconv.Itoa(s.plcWant)
	var set time.Time
	return poll(deadline, 200*time.Millisecond, func() error {
		var list v1alpha1.DeviceList
		if err := s.f.client.List(ctx, &list, client.InNamespace("default")); err != nil {
			return err
		}
		var dev *v1alpha1.Device
		for i := range list.Items {
			if d := &list.Items[i]; d.Spec.DeviceModelRef != nil && d.Spec.DeviceModelRef.Name == "modbus-plc" {
				dev = d
			}
		}
		if dev == nil {
			return errors.New("no Device of the PLC")
		}
		rep, obs := dev.Twin("setpoint").Values()
		if rep == want && obs == want {
			return nil
		}
		if time.Since(set) > 5*time.Second {
			set = time.Now()
			if out, err := exec.Command(filepath.Join(procs.BinDir(), "dowsectl"), "twin", "set", dev.Name, "setpoint", want,
				"--kubeconfig", s.f.kubeconfig, "-n", "default").CombinedOutput(); err != nil {
				return fmt.Errorf("dowsectl twin set: %w: %s", err, out)
			}
		}
		return fmt.Errorf("the PLC's setpoint reported %q, observedDesired %q, want %s", rep, obs, want)
	})
}

// sample records every tracked process's RSS, goroutines and open files
// every interval until stop closes.
func (s *soak) sample(every time.Duration, stop <-chan struct{}) {
	series := map[string]*soakreport.Series{}
	var order []string
	defer func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, k := range order {
			res, _, _ := strings.Cut(k, "\x00")
			s.report.Resources[res] = append(s.report.Resources[res], *series[k])
		}
	}()
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		at := time.Since(s.start)
		s.mu.Lock()
		ps := map[string]soakProc{}
		for name, p := range s.procs {
			ps[name] = *p
		}
		s.mu.Unlock()
		for name, p := range ps {
			if !p.proc.Alive() {
				continue
			}
			pid := p.proc.Pid()
			vals := map[string]float64{}
			if m, err := p.proc.MemoryNow(); err == nil {
				vals["RSS (MiB)"] = float64(m.RSS) / 1024
			}
			if m, err := promtest.Scrape(fmt.Sprintf("http://127.0.0.1:%d/metrics", p.metrics), "go_goroutines"); err == nil {
				if g, ok := m["go_goroutines"]; ok {
					vals["goroutines"] = g
				}
			}
			if fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid)); err == nil {
				vals["open files"] = float64(len(fds))
			}
			for res, v := range vals {
				k := fmt.Sprintf("%s\x00%s\x00%d", res, name, pid)
				if series[k] == nil {
					series[k] = &soakreport.Series{Process: name, Pid: pid}
					order = append(order, k)
				}
				series[k].Points = append(series[k].Points, soakreport.Point{At: at, Value: v})
			}
		}
	}
}

// inject runs one fault; it returns when the fault has ended (the process
// started again, the link restored), from which recovery is timed.
func (s *soak) inject(kind string, round int) (string, error) {
	f := s.f
	e := s.edges[round%len(s.edges)]
	switch kind {
	case "kill -9 agent":
		f.agents[e.node].proc.Kill()
		time.Sleep(time.Second)
		s.join(e)
		return "kill -9 agent " + e.node, nil
	case "kill -9 controller replica-0", "kill -9 controller replica-1":
		r := f.byName(strings.TrimPrefix(kind, "kill -9 controller "))
		r.proc.Kill()
		time.Sleep(time.Second)
		f.start(r)
		s.track("controller "+r.name, r.proc, r.metrics)
	case "kill -9 handler (dowse-modbus-discovery)":
		s.procs["handler modbus-discovery"].proc.Kill()
		time.Sleep(time.Second)
		s.startHandler()
	case "kill -9 mapper (dowse-modbus-mapper)":
		s.procs["mapper modbus"].proc.Kill()
		time.Sleep(time.Second)
		s.startMapper()
	case "restart the API server":
		return kind, f.cp.RestartAPIServer()
	case "restart etcd":
		return kind, f.cp.RestartEtcd()
	case "link cut for 15 s":
		for _, p := range e.links {
			p.Blackhole(true)
			p.Cut(64)
		}
		time.Sleep(15 * time.Second)
		for _, p := range e.links {
			p.Blackhole(false)
		}
		return "link of " + e.node + " cut for 15 s", nil
	case "partition a node for 20 s":
		e = s.edges[(round+1)%len(s.edges)]
		for _, p := range append([]*faultproxy.TCP{e.api}, e.links...) {
			p.Blackhole(true)
			p.Cut(0)
		}
		time.Sleep(20 * time.Second)
		for _, p := range append([]*faultproxy.TCP{e.api}, e.links...) {
			p.Blackhole(false)
		}
		return "partition of " + e.node + " (link and API server) for 20 s", nil
	}
	return kind, nil
}

// run injects the fault schedule, round after round, until the duration
// is over (at least one whole round; kills only in the first third), with
// desired values set every 3 s between faults.
func (s *soak) run() {
	t := s.t
	s.start = time.Now()
	every := max(2*time.Second, s.d/150)
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() { defer close(sampled); s.sample(every, stop) }()
	defer func() { close(stop); <-sampled }()
	gap := max(10*time.Second, s.d/60)
	steady := func(until time.Time) {
		for time.Now().Before(until) {
			time.Sleep(min(3*time.Second, time.Until(until)))
			for _, e := range s.edges {
				if _, err := s.setDesired(e, time.Now().Add(10*time.Second)); err != nil {
					t.Errorf("setting a desired value between faults: %v", err)
				}
			}
		}
	}
	end := s.start.Add(s.d)
	// Processes are killed in the first third of the run only (in the
	// first round at least), so that each lives through the last two
	// thirds, where its growth is judged.
	kills := s.start.Add(s.d / 3)
	for round := 0; round == 0 || time.Now().Before(end); round++ {
		for _, kind := range soakFaults {
			if round > 0 && !time.Now().Before(end) {
				break
			}
			if round > 0 && strings.HasPrefix(kind, "kill -9") && !time.Now().Before(kills) {
				continue
			}
			at := time.Since(s.start)
			name, err := s.inject(kind, round)
			fault := soakreport.Fault{Kind: name, At: at}
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			ended := time.Now()
			if err := s.converge(3 * time.Minute); err != nil {
				fault.Err = err.Error()
				t.Errorf("after %s: not converged within 3 minutes: %v", name, err)
			} else {
				fault.Recovered = time.Since(ended)
			}
			t.Logf("%s at %s: converged %s after", name, at.Round(time.Second), fault.Recovered.Round(100*time.Millisecond))
			s.mu.Lock()
			s.kinds = append(s.kinds, kind)
			s.report.Faults = append(s.report.Faults, fault)
			s.mu.Unlock()
			steady(time.Now().Add(gap))
		}
	}
	steady(end)
}

// finish judges the samples, writes the report and fails on a counter
// that went back or a resource that kept growing.
func (s *soak) finish(path string) {
	t := s.t
	r := &s.report
	r.Duration = time.Since(s.start)
	updates, errs := s.regress.snapshot()
	reports := 0
	for _, e := range s.edges {
		for _, v := range e.ct.cnt.snapshot() {
			reports += v
		}
	}
	r.Summary = append(r.Summary,
		fmt.Sprintf("the e2e fleet: 2 controller replicas, agents edge-a and edge-b, dowse-modbus-discovery and dowse-modbus-mapper on edge-b with a Modbus PLC peer; %d faults injected", len(r.Faults)),
		fmt.Sprintf("%d counter values reported (5 counters per edge, every 5 ms); %d Device.status updates of the counter twins watched", reports, updates),
		fmt.Sprintf("counters that went back in Device.status: %d", len(errs)))
	worst := map[string]time.Duration{}
	for i, f := range r.Faults {
		worst[s.kinds[i]] = max(worst[s.kinds[i]], f.Recovered)
	}
	var kinds []string
	for k, v := range worst {
		kinds = append(kinds, fmt.Sprintf("%s %.1f s", k, v.Seconds()))
	}
	slices.Sort(kinds)
	r.Summary = append(r.Summary, "longest time to converge per fault kind: "+strings.Join(kinds, "; "))
	// A process killed (in the first third) and started again lives
	// through the last two thirds at least, less the first round's length
	// in a short run.
	minLife := r.Duration / 3
	for res, series := range r.Resources {
		m := soakMargins[res]
		for _, se := range series {
			if len(se.Points) == 0 || se.Points[len(se.Points)-1].At-se.Points[0].At < minLife {
				continue
			}
			if g := soakreport.Judge(res, se, 15, m.factor, m.slack); g != nil {
				r.Growth = append(r.Growth, *g)
			}
		}
	}
	slices.SortFunc(r.Growth, func(a, b soakreport.Growth) int {
		return strings.Compare(a.Resource+a.Process, b.Resource+b.Process)
	})
	if err := r.WriteFile(path); err != nil {
		t.Errorf("writing the report: %v", err)
	}
	t.Logf("soak of %s: report at %s", r.Duration.Round(time.Second), path)
	for _, l := range r.Summary {
		t.Log(l)
	}
	for _, g := range r.Growth {
		t.Log(g.String())
		if !g.OK {
			t.Errorf("growth that does not level off: %s", g)
		}
	}
	if len(errs) > 0 {
		t.Errorf("Device.status showed counters going back %d times, first: %v", len(errs), errs[:min(5, len(errs))])
	}
	if len(r.Growth) == 0 {
		t.Error("no process lived long enough for its growth to be judged")
	}
}
