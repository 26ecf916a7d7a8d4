package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/internal/agent/edgehub"
	"github.com/dowse-dev/dowse/internal/link/pki"
	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/framework/kube"
	"github.com/dowse-dev/dowse/test/framework/testwait"
)

// simEdge is a node's edge simulated in the test's process: the agent's
// edgehub with its node's certificate, reporting for its Devices, and
// applying desired values at once (it reports them back as observed).
type simEdge struct {
	node  string
	hub   *edgehub.EdgeHub
	count []atomic.Int64 // per Device, the last counter reported
	done  chan struct{}
}

// connectSimEdges starts a simulated edge for each node name, with perNode
// counters, a certificate from ca and a session with one of f's replicas
// (spread over them); onMessage, when set, makes what an edge does with a
// message from the cloud. The edges stop when the test ends. It returns
// once every edge has its session.
func connectSimEdges(t *testing.T, ctx context.Context, f *fleet, ca *pki.CA, names []string, perNode int, heartbeat time.Duration, onMessage func(e *simEdge) edgehub.OnMessage) []*simEdge {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	servers := strings.Split(f.servers(), ",")
	ectx, stopEdges := context.WithCancel(ctx)
	edges := make([]*simEdge, len(names))
	for n, name := range names {
		e := &simEdge{node: name, count: make([]atomic.Int64, perNode), done: make(chan struct{})}
		cert, err := ca.IssueNode(e.node, "", time.Hour)
		if err != nil {
			stopEdges()
			t.Fatal(err)
		}
		apply := func(context.Context, *linkv1.Envelope) {}
		if onMessage != nil {
			apply = onMessage(e)
		}
		if e.hub, err = edgehub.New(edgehub.Config{Node: e.node, Transport: "websocket", Server: servers[n%len(servers)], Servers: servers,
			TLS:      pki.ClientTLSConfig(pki.Static[*tls.CertificateRequestInfo](cert), pool, "127.0.0.1"),
			StateDir: filepath.Join(t.TempDir(), e.node), NoSync: true, Heartbeat: heartbeat, BackoffMax: heartbeat}, apply, nil); err != nil {
			stopEdges()
			t.Fatal(err)
		}
		go func() {
			defer close(e.done)
			_ = e.hub.Start(logr.NewContext(ectx, logr.Discard()))
		}()
		edges[n] = e
	}
	t.Cleanup(func() {
		stopEdges()
		for _, e := range edges {
			if e != nil {
				<-e.done
				_ = e.hub.Close()
			}
		}
	})
	testwait.For(t, time.Minute, func() error {
		for _, e := range edges {
			if !e.hub.Connected() {
				return fmt.Errorf("%s has no session", e.node)
			}
		}
		return nil
	})
	return edges
}

// TestTwinStatusBudget: 1,000 Devices on 50 simulated edges each report a
// changing counter every second through two controller replicas whose
// status budget is 20 writes a second each, so that the fleet runs in
// overload (1,000 changes a second against 40 writes). The API server
// takes no more Device status writes than the two budgets allow (counted
// on its side) and both replicas spend theirs; every Device's status is
// written at least once every (its replica's Devices ÷ budget) seconds,
// with slack; a desired value set during the load is acknowledged in
// Device.status within 2 s; no counter ever goes back in status; an
// edge's unacknowledged backlog stays about one message a Device (not
// one a report); and once the reports stop, every Device shows its last
// counter and every edge has had everything acknowledged.
func TestTwinStatusBudget(t *testing.T) {
	const (
		nodes, perNode = 50, 20
		devices        = nodes * perNode
		budget         = 20.0
		window         = 40 * time.Second
	)
	ctx := context.Background()
	f := startFleet(t, 2, "--twin-status-budget", strconv.FormatFloat(budget, 'g', -1, 64))
	// The test's own requests are not what is measured.
	cfg := rest.CopyConfig(f.cp.Config)
	cfg.QPS, cfg.Burst = -1, 0
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: f.client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}

	model := &v1alpha1.DeviceModel{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "budget"},
		Spec: v1alpha1.DeviceModelSpec{Protocol: "scripted", Properties: []v1alpha1.ModelProperty{
			{Name: "count", Type: v1alpha1.PropertyInt},
			{Name: "setpoint", Type: v1alpha1.PropertyInt, AccessMode: v1alpha1.ReadWrite}}}}
	if err := c.Create(ctx, model); err != nil {
		t.Fatal(err)
	}
	devName := func(n, i int) string { return fmt.Sprintf("budget-%d-%d", n, i) }
	var g errgroup.Group
	g.SetLimit(16)
	for n := range nodes {
		g.Go(func() error {
			if err := c.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("budget-%d", n)}}); err != nil {
				return err
			}
			for i := range perNode {
				if err := c.Create(ctx, &v1alpha1.Device{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: devName(n, i)},
					Spec: v1alpha1.DeviceSpec{DeviceModelRef: &corev1.LocalObjectReference{Name: "budget"}, NodeName: fmt.Sprintf("budget-%d", n)}}); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}

	// The edges, with certificates of the controllers' link CA.
	var sec corev1.Secret
	testwait.For(t, 30*time.Second, func() error {
		return c.Get(ctx, client.ObjectKey{Namespace: "dowse-system", Name: "dowse-link-ca"}, &sec)
	})
	ca, err := pki.LoadCA(sec.Data[corev1.TLSCertKey], sec.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		t.Fatal(err)
	}
	names := make([]string, nodes)
	for n := range names {
		names[n] = fmt.Sprintf("budget-%d", n)
	}
	edges := connectSimEdges(t, ctx, f, ca, names, perNode, 2*time.Second, func(e *simEdge) edgehub.OnMessage {
		return func(_ context.Context, env *linkv1.Envelope) {
			ed := env.GetDeviceUpdate().GetDevice()
			for _, p := range ed.GetProperties() {
				if p.GetName() != "setpoint" || p.GetDesired() == nil {
					continue
				}
				v := &linkv1.TwinValue{Value: p.GetDesired().GetValue()}
				// Off the link's reader: applied and reported back at once.
				go func() {
					_, _ = e.hub.Report(ed.GetRef(), "setpoint", v, time.Now(), edgehub.WithObservedDesired(v))
				}()
			}
		}
	})
	testwait.For(t, time.Minute, func() error {
		for _, e := range edges {
			if !e.hub.Connected() {
				return fmt.Errorf("%s has no session", e.node)
			}
		}
		// Spread over both replicas, each serving the nodes it holds.
		holders, err := f.holders(ctx)
		if err != nil {
			return err
		}
		per := map[string]int{}
		for _, e := range edges {
			per[holders[e.node]]++
		}
		if got := f.connected(); !maps.Equal(got, per) {
			return fmt.Errorf("replicas say they serve %v, the records say %v", got, per)
		}
		for r, k := range per {
			if k > nodes*6/10 {
				return fmt.Errorf("replica %s holds %d of %d nodes", r, k, nodes)
			}
		}
		return nil
	})
	// The leader's Valid condition, a write of each new Device outside the
	// budget (its spec's, not its reports'), is in before the count starts.
	testwait.For(t, time.Minute, func() error {
		var list v1alpha1.DeviceList
		if err := c.List(ctx, &list, client.InNamespace("default")); err != nil {
			return err
		}
		valid := 0
		for _, d := range list.Items {
			if meta.IsStatusConditionTrue(d.Status.Conditions, v1alpha1.ConditionDeviceValid) {
				valid++
			}
		}
		if valid < devices {
			return fmt.Errorf("%d of %d Devices have their Valid condition", valid, devices)
		}
		return nil
	})
	// Which replica holds each node, and so how many Devices share each
	// budget.
	holders, err := f.holders(ctx)
	if err != nil {
		t.Fatal(err)
	}
	share := map[string]int{}
	for _, e := range edges {
		share[holders[e.node]] += perNode
	}
	t.Logf("Devices per replica: %v", share)

	// Every status the API server shows: when each Device's counter moved,
	// and whether it ever went back.
	type seen struct {
		mu       sync.Mutex
		moved    map[string][]time.Time
		last     map[string]int64
		back     []string
		observed map[string]string // a Device's setpoint observedDesired
		obsAt    map[string]time.Time
	}
	sn := &seen{moved: map[string][]time.Time{}, last: map[string]int64{}, observed: map[string]string{}, obsAt: map[string]time.Time{}}
	wctx, stopWatch := context.WithCancel(ctx)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		_ = kube.Watch(wctx, c, &v1alpha1.DeviceList{}, "default", func(et watch.EventType, o client.Object) {
			d, ok := o.(*v1alpha1.Device)
			if !ok || et == watch.Deleted {
				return
			}
			now := time.Now()
			sn.mu.Lock()
			defer sn.mu.Unlock()
			for _, tw := range d.Status.Twins {
				switch {
				case tw.PropertyName == "count" && tw.Reported != nil:
					v, _ := strconv.ParseInt(tw.Reported.Value, 10, 64)
					if last, ok := sn.last[d.Name]; ok && v < last {
						sn.back = append(sn.back, fmt.Sprintf("%s from %d to %d", d.Name, last, v))
					}
					if v != sn.last[d.Name] {
						sn.moved[d.Name] = append(sn.moved[d.Name], now)
					}
					sn.last[d.Name] = v
				case tw.PropertyName == "setpoint" && tw.ObservedDesired != nil:
					if sn.observed[d.Name] != tw.ObservedDesired.Value {
						sn.observed[d.Name], sn.obsAt[d.Name] = tw.ObservedDesired.Value, now
					}
				}
			}
		})
	}()
	t.Cleanup(func() { stopWatch(); <-watched })

	// The load: every Device reports the next value of its counter every
	// second, their phases spread over the second.
	rctx, stopReports := context.WithCancel(ctx)
	var reporters sync.WaitGroup
	for n, e := range edges {
		for i := range perNode {
			ref := &linkv1.DeviceRef{Namespace: "default", Name: devName(n, i)}
			phase := time.Duration(n*perNode+i) * time.Second / devices
			reporters.Go(func() {
				select {
				case <-time.After(phase):
				case <-rctx.Done():
					return
				}
				tick := time.NewTicker(time.Second)
				defer tick.Stop()
				for {
					v := e.count[i].Load() + 1
					if _, err := e.hub.Report(ref, "count", &linkv1.TwinValue{Value: strconv.FormatInt(v, 10)}, time.Now()); err == nil {
						e.count[i].Store(v)
					}
					select {
					case <-tick.C:
					case <-rctx.Done():
						return
					}
				}
			})
		}
	}
	defer func() { stopReports(); reporters.Wait() }()

	// The edges' backlog, sampled through the window.
	var maxPending atomic.Int64
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-rctx.Done():
				return
			case <-tick.C:
			}
			for _, e := range edges {
				if p := int64(e.hub.Pending()); p > maxPending.Load() {
					maxPending.Store(p)
				}
			}
		}
	}()

	start := time.Now()
	api0, err := statusPatches(ctx, cs)
	if err != nil {
		t.Fatal(err)
	}
	own0 := map[string]float64{}
	for _, r := range f.replicas {
		own0[r.name] = f.metric(r, "dowse_twins_status_priority_writes_total")
	}

	// Desired values set during the load, one every few seconds on a
	// Device of another node each time: acknowledged in status within 2 s.
	var acks []time.Duration
	time.Sleep(10 * time.Second)
	for k := range 5 {
		name := devName(k*7%nodes, k%perNode)
		want := strconv.Itoa(100 + k)
		var d v1alpha1.Device
		if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &d); err != nil {
			t.Fatal(err)
		}
		d.Spec.Properties = []v1alpha1.DeviceProperty{{Name: "setpoint", Desired: &v1alpha1.TwinProperty{Value: want}}}
		set := time.Now()
		if err := c.Update(ctx, &d); err != nil {
			t.Fatal(err)
		}
		testwait.For(t, 10*time.Second, func() error {
			sn.mu.Lock()
			defer sn.mu.Unlock()
			if sn.observed[name] != want {
				return fmt.Errorf("%s: setpoint observedDesired %q, want %s", name, sn.observed[name], want)
			}
			acks = append(acks, sn.obsAt[name].Sub(set))
			return nil
		})
		time.Sleep(4 * time.Second)
	}
	if rest := window - time.Since(start); rest > 0 {
		time.Sleep(rest)
	}
	api1, err := statusPatches(ctx, cs)
	if err != nil {
		t.Fatal(err)
	}
	end := time.Now()
	elapsed := end.Sub(start).Seconds()

	// Writes: within both budgets from the API server's side, and each
	// replica spends its own (it is in overload).
	apiRate := (api1 - api0) / elapsed
	var own []string
	for _, r := range f.replicas {
		rate := (f.metric(r, "dowse_twins_status_priority_writes_total") - own0[r.name]) / elapsed
		own = append(own, fmt.Sprintf("%s %.1f", r.name, rate))
		// The budget's burst (a tenth of a second's worth) is all it may
		// exceed by.
		if rate > budget*1.05 || rate < budget*0.75 {
			t.Errorf("%s made %.1f status writes a second, want its budget, %v", r.name, rate, budget)
		}
	}
	t.Logf("status writes a second: %.1f at the API server (budget %v a replica); the replicas' own: %s", apiRate, budget, strings.Join(own, ", "))
	// A desired value's Valid check (the leader's, not budgeted) adds a
	// write each.
	if apiRate > 2*budget*1.05+5/elapsed {
		t.Errorf("the API server took %.1f Device status writes a second, above the two replicas' budgets, %v", apiRate, 2*budget)
	}

	// Every Device written at least once every (its replica's Devices ÷
	// budget) seconds: the longest gap between two changes of its status
	// in the window, the window's ends included.
	sn.mu.Lock()
	var worst time.Duration
	var worstName string
	late := 0
	for n, e := range edges {
		bound := time.Duration(1.5*float64(share[holders[e.node]])/budget*float64(time.Second)) + 3*time.Second
		for i := range perNode {
			name := devName(n, i)
			prev := start
			var gap time.Duration
			for _, at := range append(slices.Clone(sn.moved[name]), end) {
				if at.Before(start) {
					continue
				}
				if at.After(end) {
					at = end
				}
				gap = max(gap, at.Sub(prev))
				prev = at
			}
			if gap > worst {
				worst, worstName = gap, name
			}
			if gap > bound {
				late++
				if late <= 5 {
					t.Errorf("%s (node %s, on %s with %d Devices) went %s without a status write, want at most %s", name, e.node, holders[e.node], share[holders[e.node]], gap.Round(100*time.Millisecond), bound)
				}
			}
		}
	}
	back := slices.Clone(sn.back)
	sn.mu.Unlock()
	t.Logf("the longest time a Device's status went unwritten: %s (%s); %d Devices over the bound", worst.Round(100*time.Millisecond), worstName, late)
	if len(back) > 0 {
		t.Errorf("a counter went back in status %d times, first: %v", len(back), back[:min(5, len(back))])
	}
	slices.Sort(acks)
	t.Logf("desired → acknowledged in status: %v", acks)
	for _, a := range acks {
		if a > 2*time.Second {
			t.Errorf("a desired value set during the load was acknowledged in status after %s, want within 2 s", a.Round(10*time.Millisecond))
		}
	}
	t.Logf("the largest unacknowledged backlog of an edge (%d Devices each, reporting every second): %d messages", perNode, maxPending.Load())
	if p := maxPending.Load(); p > 3*perNode {
		t.Errorf("an edge held %d unacknowledged messages, want about one a Device (%d)", p, perNode)
	}

	// Nothing lost: the reports stop, and every Device shows its last
	// counter, every edge's store empty.
	stopReports()
	reporters.Wait()
	<-sampled
	drained := time.Now()
	testwait.For(t, 90*time.Second, func() error {
		var list v1alpha1.DeviceList
		if err := c.List(ctx, &list, client.InNamespace("default")); err != nil {
			return err
		}
		got := map[string]string{}
		for _, d := range list.Items {
			for _, tw := range d.Status.Twins {
				if tw.PropertyName == "count" && tw.Reported != nil {
					got[d.Name] = tw.Reported.Value
				}
			}
		}
		behind := 0
		for n, e := range edges {
			for i := range perNode {
				if got[devName(n, i)] != strconv.FormatInt(e.count[i].Load(), 10) {
					behind++
				}
			}
		}
		if behind > 0 {
			return fmt.Errorf("%d Devices do not show their last counter yet", behind)
		}
		for _, e := range edges {
			if p := e.hub.Pending(); p > 0 {
				return fmt.Errorf("%s holds %d unacknowledged messages", e.node, p)
			}
		}
		return nil
	})
	t.Logf("after the reports stopped, every Device showed its last counter and every edge's store was empty in %s", time.Since(drained).Round(100*time.Millisecond))
}

// statusPatches is the API server's count of Device status PATCHes it
// answered 200.
func statusPatches(ctx context.Context, cs kubernetes.Interface) (float64, error) {
	raw, err := cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return 0, err
	}
	var sum float64
	sc := bufio.NewScanner(strings.NewReader(string(raw)))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, "apiserver_request_total{") || !strings.Contains(l, `resource="devices"`) ||
			!strings.Contains(l, `subresource="status"`) || !strings.Contains(l, `code="200"`) ||
			(!strings.Contains(l, `verb="PATCH"`) && !strings.Contains(l, `verb="PUT"`)) {
			continue
		}
		f := strings.Fields(l)
		v, _ := strconv.ParseFloat(f[len(f)-1], 64)
		sum += v
	}
	return sum, sc.Err()
}
