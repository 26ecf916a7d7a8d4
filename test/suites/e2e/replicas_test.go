package e2e

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/internal/controller/link/ownership"
	readingsv1 "github.com/dowse-dev/dowse/shared/api/readings/v1alpha1"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/framework/dmitest"
	"github.com/dowse-dev/dowse/test/framework/dowse"
	"github.com/dowse-dev/dowse/test/framework/faultproxy"
	"github.com/dowse-dev/dowse/test/framework/kube"
	"github.com/dowse-dev/dowse/test/framework/procs"
	"github.com/dowse-dev/dowse/test/framework/promtest"
	"github.com/dowse-dev/dowse/test/framework/testwait"
)

// replica is one dowse-controller process of a fleet.
type replica struct {
	name                          string
	proc                          *procs.Proc
	metrics, health, ws, quic, au int
	// readings is where it serves the live readings API (0: not).
	readings int
}

// fleet is a cloud with several controller replicas (leader election on,
// the link on every one) and agents given every replica's address.
type fleet struct {
	*cloud
	replicas []*replica
	args     []string
	agents   map[string]*fleetAgent
	// readings: each replica serves the live readings API.
	readings bool
}

type fleetAgent struct {
	proc    *procs.Proc
	state   string
	metrics int
}

func startFleet(t *testing.T, n int, args ...string) *fleet {
	t.Helper()
	return startFleetWith(t, fleetOptions{replicas: n, args: args})
}

// fleetOptions configure startFleetWith.
type fleetOptions struct {
	replicas int
	args     []string
	// aggregator: the API server has a front proxy for aggregated APIs,
	// and every replica serves the live readings API.
	aggregator bool
}

func startFleetWith(t *testing.T, o fleetOptions) *fleet {
	t.Helper()
	f := &fleet{cloud: newCloudWith(t, kube.Options{CRDs: true, Aggregator: o.aggregator}), args: o.args, agents: map[string]*fleetAgent{},
		readings: o.aggregator}
	for i := range o.replicas {
		r := &replica{name: fmt.Sprintf("replica-%d", i)}
		ports := []*int{&r.metrics, &r.health, &r.ws, &r.quic, &r.au}
		if f.readings {
			ports = append(ports, &r.readings)
		}
		for _, p := range ports {
			port, err := procs.FreePort()
			if err != nil {
				t.Fatal(err)
			}
			*p = port
		}
		f.replicas = append(f.replicas, r)
		f.start(r)
	}
	// Agents bootstrap at replica 0's endpoint (any replica serves it).
	f.cloud.ws, f.cloud.auth, f.cloud.metrics = f.replicas[0].ws, f.replicas[0].au, f.replicas[0].metrics
	for _, r := range f.replicas {
		f.waitReady(r)
	}
	return f
}

func (f *fleet) start(r *replica) {
	f.t.Helper()
	args := f.args
	if r.readings != 0 {
		args = append(slices.Clip(args), "--readings-address", fmt.Sprintf("127.0.0.1:%d", r.readings),
			"--readings-service", readingsService, "--readings-apiservice", readingsv1.APIServiceName)
	}
	r.proc = dowse.Controller{Kubeconfig: f.kubeconfig, PodName: r.name, Metrics: r.metrics, Health: r.health,
		Link: &dowse.Link{WebSocket: r.ws, QUIC: r.quic, Auth: r.au, Heartbeat: time.Second},
		Args: args}.StartLogged(f.t, f.cloud.dir, r.name)
}

// waitReady waits for the replica's readiness (its link serves edges).
func (f *fleet) waitReady(r *replica) {
	f.t.Helper()
	testwait.For(f.t, 60*time.Second, func() error {
		resp, err := httpGet(fmt.Sprintf("http://127.0.0.1:%d/readyz", r.health))
		if err != nil {
			return fmt.Errorf("%s: %w", r.name, err)
		}
		if resp != 200 {
			return fmt.Errorf("%s readiness answers %d", r.name, resp)
		}
		return nil
	})
}

var httpClient = &http.Client{Timeout: 2 * time.Second}

func httpGet(url string) (int, error) {
	resp, err := httpClient.Get(url)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

func (f *fleet) servers() string {
	var s []string
	for _, r := range f.replicas {
		s = append(s, fmt.Sprintf("127.0.0.1:%d", r.ws))
	}
	return strings.Join(s, ",")
}

func (f *fleet) join(node string, extra ...string) *fleetAgent {
	f.t.Helper()
	p, state, metrics := f.joinAgent(node, f.servers(), extra...)
	a := &fleetAgent{proc: p, state: state, metrics: metrics}
	f.agents[node] = a
	return a
}

// holders reads the nodes' ownership records: node -> holding replica.
func (f *fleet) holders(ctx context.Context) (map[string]string, error) {
	var list coordinationv1.LeaseList
	if err := f.client.List(ctx, &list, client.InNamespace("dowse-system"), client.MatchingLabels{ownership.LabelKind: "node"}); err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, l := range list.Items {
		out[l.Annotations[ownership.AnnotationNode]] = ptr.Deref(l.Spec.HolderIdentity, "")
	}
	return out, nil
}

// connected is each live replica's dowse_cloudhub_connected_nodes.
func (f *fleet) connected() map[string]int {
	out := map[string]int{}
	for _, r := range f.replicas {
		if r.proc.Exited() {
			continue
		}
		m, err := promtest.Scrape(fmt.Sprintf("http://127.0.0.1:%d/metrics", r.metrics), "dowse_cloudhub_connected_nodes")
		if err != nil {
			continue
		}
		out[r.name] = int(m["dowse_cloudhub_connected_nodes"])
	}
	return out
}

func (f *fleet) metric(r *replica, name string) float64 {
	m, err := promtest.Scrape(fmt.Sprintf("http://127.0.0.1:%d/metrics", r.metrics), name)
	if err != nil {
		return -1
	}
	sum := 0.0
	for _, v := range m {
		sum += v
	}
	return sum
}

func (f *fleet) leader() *replica {
	for _, r := range f.replicas {
		if !r.proc.Exited() && f.metric(r, "leader_election_master_status") == 1 {
			return r
		}
	}
	return nil
}

func (f *fleet) byName(name string) *replica {
	for _, r := range f.replicas {
		if r.name == name {
			return r
		}
	}
	return nil
}

// spread checks that every agent is connected, every node's record is held
// by a live replica that says it serves the node, and no replica holds
// more than 1.2 times its share.
func (f *fleet) spread(ctx context.Context) (map[string]int, error) {
	holders, err := f.holders(ctx)
	if err != nil {
		return nil, err
	}
	per := map[string]int{}
	live := 0
	for _, r := range f.replicas {
		if !r.proc.Exited() {
			per[r.name] = 0
			live++
		}
	}
	for node := range f.agents {
		h := holders[node]
		if _, ok := per[h]; !ok {
			return nil, fmt.Errorf("node %s held by %q, not a live replica", node, h)
		}
		per[h]++
	}
	if got := f.connected(); !maps.Equal(got, per) {
		return nil, fmt.Errorf("replicas say they serve %v, the records say %v", got, per)
	}
	share := float64(len(f.agents)) / float64(live)
	for r, n := range per {
		if float64(n) > 1.2*share {
			return nil, fmt.Errorf("replica %s holds %d sessions, above 1.2 times its share %.1f (%v)", r, n, share, per)
		}
	}
	return per, nil
}

// gaps polls every agent's link and records, per agent, the longest time
// it was without a session.
type gaps struct {
	mu      sync.Mutex
	longest map[string]time.Duration
	stop    chan struct{}
	done    chan struct{}
}

func (f *fleet) watchGaps() *gaps {
	g := &gaps{longest: map[string]time.Duration{}, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(g.done)
		down := map[string]time.Time{}
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-g.stop:
				return
			case <-tick.C:
			}
			now := time.Now()
			for node, a := range f.agents {
				m, err := promtest.Scrape(fmt.Sprintf("http://127.0.0.1:%d/metrics", a.metrics), "dowse_edgehub_connected")
				up := err == nil && m["dowse_edgehub_connected"] == 1
				since, was := down[node]
				switch {
				case !up && !was:
					down[node] = now
				case was:
					// Down since the first poll that saw it: at least
					// now-since (less than a poll longer at most).
					g.mu.Lock()
					g.longest[node] = max(g.longest[node], now.Sub(since))
					g.mu.Unlock()
					if up {
						delete(down, node)
					}
				}
			}
		}
	}()
	return g
}

func (g *gaps) end() map[string]time.Duration {
	close(g.stop)
	<-g.done
	g.mu.Lock()
	defer g.mu.Unlock()
	return maps.Clone(g.longest)
}

// counterTwin is a Device on one node whose scripted mapper reports five
// counters every few milliseconds, with the setpoint it applied.
type counterTwin struct {
	t        *testing.T
	f        *fleet
	dev      *v1alpha1.Device
	m        *dmitest.Mapper
	cnt      *counters
	sw       *statusWatch
	props    []string
	on       chan bool
	reported sync.Map
	// sent is the setpoint of the newest report the agent took.
	sent atomic.Value
}

func (f *fleet) counterTwin(t *testing.T, ctx context.Context, node string) *counterTwin {
	ct := &counterTwin{t: t, f: f, cnt: &counters{last: map[string]int{}}, props: []string{"p0", "p1", "p2", "p3", "p4"}, on: make(chan bool)}
	model := &v1alpha1.DeviceModel{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "counter"},
		Spec: v1alpha1.DeviceModelSpec{Protocol: "scripted"}}
	for _, p := range ct.props {
		model.Spec.Properties = append(model.Spec.Properties, v1alpha1.ModelProperty{Name: p, Type: v1alpha1.PropertyInt})
	}
	model.Spec.Properties = append(model.Spec.Properties, v1alpha1.ModelProperty{Name: "setpoint", Type: v1alpha1.PropertyInt, AccessMode: v1alpha1.ReadWrite})
	ct.dev = &v1alpha1.Device{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "counter-" + node},
		Spec: v1alpha1.DeviceSpec{DeviceModelRef: &corev1.LocalObjectReference{Name: "counter"}, NodeName: node,
			Properties: []v1alpha1.DeviceProperty{{Name: "setpoint", Desired: &v1alpha1.TwinProperty{Value: "1"}}}}}
	for _, o := range []client.Object{model, ct.dev} {
		if err := f.client.Create(ctx, o); client.IgnoreAlreadyExists(err) != nil {
			t.Fatal(err)
		}
	}
	wc, err := client.NewWithWatch(f.cp.Config, client.Options{Scheme: f.client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ct.sw = watchStatus(t, wc, "default", ct.dev.Name)
	mctx, stop := context.WithCancel(ctx)
	t.Cleanup(stop)
	if ct.m, err = dmitest.Start(mctx, f.agents[node].state, "counters", "scripted"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ct.m.Stop)
	testwait.For(t, 30*time.Second, func() error {
		if !ct.m.Has("default", ct.dev.Name) {
			return fmt.Errorf("the agent has not handed the mapper its device")
		}
		return nil
	})
	go func() {
		on := true
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-mctx.Done():
				return
			case on = <-ct.on:
			case <-tick.C:
				if !on {
					continue
				}
				vals := ct.cnt.next(ct.props)
				vals["setpoint"] = ct.m.Desired("default", ct.dev.Name, "setpoint")
				if err := ct.m.Report(mctx, "default", ct.dev.Name, vals); err != nil {
					ct.reported.Store(err.Error(), true)
				} else {
					ct.sent.Store(vals["setpoint"])
				}
			}
		}
	}()
	return ct
}

func (ct *counterTwin) setDesired(ctx context.Context, v string) {
	ct.t.Helper()
	testwait.For(ct.t, 10*time.Second, func() error {
		var d v1alpha1.Device
		if err := ct.f.client.Get(ctx, client.ObjectKeyFromObject(ct.dev), &d); err != nil {
			return err
		}
		d.Spec.Properties[0].Desired.Value = v
		return ct.f.client.Update(ctx, &d)
	})
}

// settled stops the reports and waits for Device.status to show each
// counter's last value and the setpoint observed at want; no status ever
// showed a counter going back.
func (ct *counterTwin) settled(ctx context.Context, phase, want string) {
	t := ct.t
	t.Helper()
	testwait.For(t, 30*time.Second, func() error {
		if got := ct.m.Desired("default", ct.dev.Name, "setpoint"); got != want {
			return fmt.Errorf("%s: the mapper holds desired %q, want %s", phase, got, want)
		}
		// A report that carries it must have been taken before the
		// reports stop: one call can outlast any fixed pause on a loaded
		// machine.
		if got, _ := ct.sent.Load().(string); got != want {
			return fmt.Errorf("%s: the newest report the agent took carries setpoint %q, want %s", phase, got, want)
		}
		return nil
	})
	ct.on <- false
	final := ct.cnt.snapshot()
	testwait.For(t, 30*time.Second, func() error {
		var d v1alpha1.Device
		if err := ct.f.client.Get(ctx, client.ObjectKeyFromObject(ct.dev), &d); err != nil {
			return err
		}
		for _, p := range ct.props {
			if rep, _ := d.Twin(p).Values(); rep != strconv.Itoa(final[p]) {
				return fmt.Errorf("%s: %s reported %q, want the last value %d", phase, p, rep, final[p])
			}
		}
		if _, obs := d.Twin("setpoint").Values(); obs != want {
			return fmt.Errorf("%s: setpoint observedDesired %q, want %s", phase, obs, want)
		}
		return nil
	})
	ct.sw.check(t)
	ct.on <- true
}

// TestReplicas runs three controller replicas (leader election on, the
// link on each) and nine agents given the three addresses: the sessions
// spread three to each; a Device on a node a non-leader serves works both
// ways; kill -9 of that replica moves its edges within seconds and the
// counters its mapper reports arrive, none lost, none going back, with a
// desired value set during the move applied; a replacement replica takes
// its share without the others dropping their edges; and a rolling restart
// of all three (each drains its edges before it stops) leaves no edge
// without a session for more than 10 s and loses nothing; a node split
// from its replica reaches another, and once the split heals one replica
// serves it and its Device's status never went back.
func TestReplicas(t *testing.T) {
	ctx := context.Background()
	f := startFleet(t, 3, "--link-spread-interval", "500ms", "--link-drain-period", "2s", "--twin-status-interval", "200ms")
	for i := range 9 {
		f.join(fmt.Sprintf("edge-%d", i))
	}
	begin := time.Now()
	var per map[string]int
	testwait.For(t, 60*time.Second, func() error {
		var err error
		per, err = f.spread(ctx)
		return err
	})
	t.Logf("nine edges spread %v, %s after the last agent started", per, time.Since(begin).Round(100*time.Millisecond))

	// A node a replica other than the leader serves.
	leader := f.leader()
	if leader == nil {
		t.Fatal("no replica leads")
	}
	holders, err := f.holders(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var node string
	for _, n := range slices.Sorted(maps.Keys(holders)) {
		if holders[n] != leader.name {
			node = n
			break
		}
	}
	holder := f.byName(holders[node])
	t.Logf("leader %s; the twin's node %s is served by %s", leader.name, node, holder.name)
	ct := f.counterTwin(t, ctx, node)
	time.Sleep(time.Second)
	ct.setDesired(ctx, "2")
	ct.settled(ctx, "on a non-leader replica", "2")

	t.Run("KillHolder", func(t *testing.T) {
		ct.t = t
		time.Sleep(500 * time.Millisecond) // reports in flight
		killed := time.Now()
		holder.proc.Kill() // SIGKILL
		ct.setDesired(ctx, "3")
		testwait.For(t, 30*time.Second, func() error {
			var err error
			per, err = f.spread(ctx)
			return err
		})
		t.Logf("kill -9 of %s: all nine edges have a session again after %s, spread %v", holder.name, time.Since(killed).Round(100*time.Millisecond), per)
		ct.settled(ctx, "after kill -9 of the holder", "3")
	})

	t.Run("ReplacementTakesItsShare", func(t *testing.T) {
		ct.t = t
		before := 0.0
		for _, r := range f.replicas {
			if !r.proc.Exited() {
				before += f.metric(r, "dowse_cloudhub_rebalanced_sessions_total")
			}
		}
		g := f.watchGaps()
		f.start(holder)
		f.waitReady(holder)
		testwait.For(t, 60*time.Second, func() error {
			var err error
			if per, err = f.spread(ctx); err != nil {
				return err
			}
			if per[holder.name] == 0 {
				return fmt.Errorf("the new replica serves no edge yet: %v", per)
			}
			return nil
		})
		longest := g.end()
		moved := -before
		for _, r := range f.replicas {
			moved += f.metric(r, "dowse_cloudhub_rebalanced_sessions_total")
		}
		t.Logf("the replacement took %d edges (%v); %v edges moved; the longest gap of a moved edge %v", per[holder.name], per, moved, longest)
		// The two full replicas decide what to shed each on counts up to
		// an interval old, so a round may overshoot: up to twice the share
		// moves, never every edge.
		if moved > 6 {
			t.Errorf("%v edges moved to give the new replica its 3, want 6 at most", moved)
		}
		if down := len(longest); float64(down) > moved {
			t.Errorf("%d edges were without a session at some point, more than the %v moved: %v", down, moved, longest)
		}
		ct.settled(ctx, "after the replacement", "3")
	})

	t.Run("RollingRestart", func(t *testing.T) {
		ct.t = t
		g := f.watchGaps()
		movesBefore := f.agentMoves("drain")
		for i, r := range f.replicas {
			r.proc.Stop() // SIGTERM: it drains first
			if i == 1 {
				ct.setDesired(ctx, "4") // set while a replica is down
			}
			f.start(r)
			f.waitReady(r)
		}
		testwait.For(t, 60*time.Second, func() error {
			var err error
			per, err = f.spread(ctx)
			return err
		})
		longest := g.end()
		t.Logf("rolling restart of the three: spread %v after it; longest time without a session per edge %v", per, longest)
		for node, d := range longest {
			if d > 10*time.Second {
				t.Errorf("edge %s was without a session for %s", node, d)
			}
		}
		if n := f.agentMoves("drain") - movesBefore; n < 6 {
			t.Errorf("the agents were told to move by a draining replica %v times, want at least 6 (the edges of the first two replicas stopped)", n)
		}
		ct.settled(ctx, "after a rolling restart", "4")
	})

	t.Run("SplitHealed", func(t *testing.T) {
		// A node whose link to its replica goes silent (a network split:
		// neither end sees the connection close) reaches another replica
		// meanwhile; once the split heals, one replica holds the node's
		// session, the other has closed its own, and the Device's status
		// never went back.
		const node = "split-0"
		var proxies []*faultproxy.TCP
		var addrs []string
		for _, r := range f.replicas[:2] {
			p, err := faultproxy.NewTCP(fmt.Sprintf("127.0.0.1:%d", r.ws))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(p.Close)
			proxies, addrs = append(proxies, p), append(addrs, p.Addr())
		}
		p, state, metrics := f.joinAgent(node, strings.Join(addrs, ","))
		f.agents[node] = &fleetAgent{proc: p, state: state, metrics: metrics}
		lease := func() (string, int32) {
			var l coordinationv1.Lease
			if err := f.client.Get(ctx, client.ObjectKey{Namespace: "dowse-system", Name: ownership.NodeLeaseName(node)}, &l); err != nil {
				return "", 0
			}
			return ptr.Deref(l.Spec.HolderIdentity, ""), ptr.Deref(l.Spec.LeaseTransitions, 0)
		}
		testwait.For(t, 60*time.Second, func() error {
			if h, _ := lease(); h == "" {
				return fmt.Errorf("node %s has no session yet", node)
			}
			if _, err := os.Stat(state); err != nil {
				return err
			}
			return nil
		})
		sct := f.counterTwin(t, ctx, node)
		sct.settled(ctx, "before the split", "1")
		held, epoch := lease()
		side := slices.IndexFunc(f.replicas[:2], func(r *replica) bool { return r.name == held })
		if side < 0 {
			t.Fatalf("node %s held by %q, not one of the two replicas it was given", node, held)
		}
		old, other := f.replicas[side], f.replicas[1-side]
		taken := f.metric(old, "dowse_cloudhub_sessions_taken_over_total")
		split := time.Now()
		proxies[side].Blackhole(true)
		testwait.For(t, 30*time.Second, func() error {
			if h, e := lease(); h != other.name || e <= epoch {
				return fmt.Errorf("node %s held by %q at epoch %d, want %s after %d", node, h, e, other.name, epoch)
			}
			return nil
		})
		t.Logf("split from %s: %s took the node after %s", old.name, other.name, time.Since(split).Round(100*time.Millisecond))
		time.Sleep(time.Second) // reports go on to the new owner
		proxies[side].Blackhole(false)
		// Every live replica serves exactly the nodes whose records it
		// holds: the old one has closed its session of the node.
		testwait.For(t, 30*time.Second, func() error {
			holders, err := f.holders(ctx)
			if err != nil {
				return err
			}
			per := map[string]int{}
			for _, r := range f.replicas {
				if !r.proc.Exited() {
					per[r.name] = 0
				}
			}
			for n := range f.agents {
				per[holders[n]]++
			}
			if got := f.connected(); !maps.Equal(got, per) {
				return fmt.Errorf("replicas say they serve %v, the records say %v", got, per)
			}
			return nil
		})
		if h, _ := lease(); h != other.name {
			t.Errorf("after the split healed node %s is held by %q, want %s", node, h, other.name)
		}
		how := "its heartbeat timed out first"
		if f.metric(old, "dowse_cloudhub_sessions_taken_over_total") > taken {
			how = "taken over"
		}
		t.Logf("the old replica's session of %s ended: %s", node, how)
		sct.setDesired(ctx, "2")
		sct.settled(ctx, "after the split healed", "2")
	})
	ct.reported.Range(func(k, _ any) bool {
		t.Logf("mapper report refused: %v", k)
		return true
	})
}

// agentMoves sums the agents' dowse_edgehub_moves_total{reason}.
func (f *fleet) agentMoves(reason string) float64 {
	sum := 0.0
	for _, a := range f.agents {
		m, err := promtest.Scrape(fmt.Sprintf("http://127.0.0.1:%d/metrics", a.metrics), "dowse_edgehub_moves_total")
		if err != nil {
			continue
		}
		sum += m[fmt.Sprintf("dowse_edgehub_moves_total{reason=%q}", reason)]
	}
	return sum
}
