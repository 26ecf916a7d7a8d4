// Package ownership tests the node-session ownership records and the
// replicas' presence (internal/controller/link/ownership) against a real kube-apiserver.
package ownership

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/utils/ptr"

	"github.com/dowse-dev/dowse/internal/controller/link/ownership"
	"github.com/dowse-dev/dowse/test/framework/kube"
	"github.com/dowse-dev/dowse/test/framework/testwait"
)

var suite = &kube.Suite{NamespacePrefix: "own-"}

func TestMain(m *testing.M) { os.Exit(suite.Run(m)) }

// ownLeases is the Leases of a namespace of the test's own.
func ownLeases(t *testing.T) coordinationv1client.LeaseInterface {
	t.Helper()
	return suite.Clientset.CoordinationV1().Leases(suite.Namespace(t))
}

// lostLog records what a replica was told it lost.
type lostLog struct {
	mu   sync.Mutex
	lost map[string][]uint64
}

func (l *lostLog) record(node string, through uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lost[node] = append(l.lost[node], through)
}

func (l *lostLog) of(node string) []uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.lost[node])
}

func replica(t *testing.T, leases coordinationv1client.LeaseInterface, name string) (*ownership.Claims, *lostLog) {
	t.Helper()
	lost := &lostLog{lost: map[string][]uint64{}}
	c, err := ownership.NewClaims(ownership.ClaimsConfig{Leases: leases, Replica: name, Lost: lost.record,
		Metrics: ownership.NewMetrics(nil), Log: testr.New(t).WithName(name)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = c.Start(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	testwait.For(t, 10*time.Second, func() error {
		if !c.Synced() {
			return fmt.Errorf("%s's watch has not listed its records", name)
		}
		return nil
	})
	return c, lost
}

// TestClaimTakesOverAndTellsTheOldHolder: each claim of a node begins a
// session with a greater epoch, on whichever replica; the replica that held
// the record is told it lost the node through its epoch, and a replica is
// never told it lost a session newer than the one taken from it.
func TestClaimTakesOverAndTellsTheOldHolder(t *testing.T) {
	ctx := context.Background()
	leases := ownLeases(t)
	a, lostA := replica(t, leases, "replica-a")
	b, lostB := replica(t, leases, "replica-b")

	e1, err := a.Claim(ctx, "edge-1", 0)
	if err != nil || e1 != 1 {
		t.Fatalf("first claim: epoch %d, %v; want 1", e1, err)
	}
	e2, err := b.Claim(ctx, "edge-1", e1) // the edge's hint: its last epoch
	if err != nil || e2 != 2 {
		t.Fatalf("claim on another replica: epoch %d, %v; want 2", e2, err)
	}
	testwait.For(t, 10*time.Second, func() error {
		if got := lostA.of("edge-1"); !slices.Equal(got, []uint64{1}) {
			return fmt.Errorf("replica-a was told it lost %v, want [1]", got)
		}
		return nil
	})
	// A wrong hint (an edge that remembers an older session) costs a read.
	e3, err := a.Claim(ctx, "edge-1", 1)
	if err != nil || e3 != 3 {
		t.Fatalf("claim with a stale hint: epoch %d, %v; want 3", e3, err)
	}
	testwait.For(t, 10*time.Second, func() error {
		if got := lostB.of("edge-1"); !slices.Equal(got, []uint64{2}) {
			return fmt.Errorf("replica-b was told it lost %v, want [2]", got)
		}
		return nil
	})
	// Reconnecting to the replica that holds it: a claim with the epoch
	// this process wrote is one request, or none once its watch shows the
	// record at that epoch: the session goes on (kept), nothing is
	// written, no loss told.
	rv := func() string {
		l, err := leases.Get(ctx, ownership.NodeLeaseName("edge-1"), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return l.ResourceVersion
	}
	cur := e3
	testwait.For(t, 10*time.Second, func() error {
		before := rv()
		e, err := a.Claim(ctx, "edge-1", cur)
		switch {
		case err != nil:
			return err
		case e != cur:
			if e != cur+1 {
				t.Fatalf("reclaim with hint %d: epoch %d, want %d or %d", cur, e, cur, cur+1)
			}
			cur = e
			return fmt.Errorf("claimed anew as epoch %d: the watch trails", e)
		case rv() != before:
			t.Fatalf("the session of epoch %d was kept, yet its record was written", e)
		}
		return nil
	})
	l, err := leases.Get(ctx, ownership.NodeLeaseName("edge-1"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h := ptr.Deref(l.Spec.HolderIdentity, ""); h != "replica-a" || uint64(ptr.Deref(l.Spec.LeaseTransitions, 0)) != cur ||
		l.Labels[ownership.LabelHolder] != "replica-a" || l.Annotations[ownership.AnnotationNode] != "edge-1" || l.Spec.LeaseDurationSeconds != nil {
		t.Errorf("record %+v %+v: want holder replica-a, %d transitions, its label and node, no duration", l.ObjectMeta, l.Spec, cur)
	}
	time.Sleep(500 * time.Millisecond)
	if got := lostA.of("edge-1"); !slices.Equal(got, []uint64{1}) {
		t.Errorf("replica-a was told it lost %v after reclaiming, want only the first [1]", got)
	}
	// Taken by b: once a's watch told it, a keeps nothing and claims anew.
	eb, err := b.Claim(ctx, "edge-1", cur)
	if err != nil || eb != cur+1 {
		t.Fatalf("claim on replica-b: epoch %d, %v; want %d", eb, err, cur+1)
	}
	testwait.For(t, 10*time.Second, func() error {
		if got := lostA.of("edge-1"); !slices.Equal(got, []uint64{1, cur}) {
			return fmt.Errorf("replica-a was told it lost %v, want [1 %d]", got, cur)
		}
		return nil
	})
	if e, err := a.Claim(ctx, "edge-1", cur); err != nil || e != cur+2 {
		t.Fatalf("claim on replica-a after it lost epoch %d: epoch %d, %v; want %d", cur, e, err, cur+2)
	}
	// A fence (a Device found written by a newer session) is a loss as
	// the watch's is: told to Lost, and the next return is claimed anew.
	a.Fenced("edge-1", cur+2)
	if got := lostA.of("edge-1"); !slices.Equal(got, []uint64{1, cur, cur + 2}) {
		t.Errorf("replica-a was told it lost %v after the fence, want [1 %d %d]", got, cur, cur+2)
	}
	if e, err := a.Claim(ctx, "edge-1", cur+2); err != nil || e != cur+3 {
		t.Errorf("claim on replica-a after it was fenced at epoch %d: epoch %d, %v; want %d (not kept)", cur+2, e, err, cur+3)
	}
}

// TestConcurrentClaimsGetDistinctEpochs: replicas claiming one node at the
// same moment (a node reaching two replicas at once) never get the same
// epoch, and the record ends with the greatest, held by whoever got it.
func TestConcurrentClaimsGetDistinctEpochs(t *testing.T) {
	ctx := context.Background()
	leases := ownLeases(t)
	var replicas []*ownership.Claims
	for _, n := range []string{"r-0", "r-1", "r-2"} {
		c, _ := replica(t, leases, n)
		replicas = append(replicas, c)
	}
	type claim struct {
		replica string
		epoch   uint64
	}
	var mu sync.Mutex
	var got []claim
	var wg sync.WaitGroup
	for i := range 24 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := i % len(replicas)
			// Some with a hint (possibly stale), some without.
			e, err := replicas[r].Claim(ctx, "contended", uint64(i%3))
			if errors.Is(err, ownership.ErrContended) {
				return // refused: that edge retries later
			}
			if err != nil {
				t.Errorf("claim %d: %v", i, err)
				return
			}
			mu.Lock()
			got = append(got, claim{fmt.Sprintf("r-%d", r), e})
			mu.Unlock()
		}()
	}
	wg.Wait()
	if len(got) < 8 {
		t.Errorf("%d of 24 claims at once succeeded, want at least 8 (one a round)", len(got))
	}
	seen := map[uint64]string{}
	var best claim
	for _, c := range got {
		if o, dup := seen[c.epoch]; dup {
			t.Errorf("epoch %d given to both %s and %s", c.epoch, o, c.replica)
		}
		seen[c.epoch] = c.replica
		if c.epoch > best.epoch {
			best = c
		}
	}
	l, err := leases.Get(ctx, ownership.NodeLeaseName("contended"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if uint64(ptr.Deref(l.Spec.LeaseTransitions, 0)) != best.epoch || ptr.Deref(l.Spec.HolderIdentity, "") != best.replica {
		t.Errorf("record says epoch %d held by %s; the greatest claim was %d by %s",
			ptr.Deref(l.Spec.LeaseTransitions, 0), ptr.Deref(l.Spec.HolderIdentity, ""), best.epoch, best.replica)
	}
}

// TestNamesFitObjectsAndLabels: a node name too long for a Lease name with
// the prefix, and a replica name that is no label value, still make valid,
// distinct names.
func TestNamesFitObjectsAndLabels(t *testing.T) {
	long := strings.Repeat("n", 250)
	a, b := ownership.NodeLeaseName(long), ownership.NodeLeaseName(long+"x")
	for _, n := range []string{a, b, ownership.NodeLeaseName("edge-1"), ownership.ReplicaLeaseName(strings.Repeat("p", 253))} {
		if errs := validation.IsDNS1123Subdomain(n); len(errs) > 0 {
			t.Errorf("%q: %v", n, errs)
		}
	}
	if a == b {
		t.Errorf("two node names share the record %s", a)
	}
	for _, r := range []string{"dowse-controller-7c9d-abcde", strings.Repeat("r", 70), "Host_name.1", ""} {
		if errs := validation.IsValidLabelValue(ownership.HolderLabel(r)); len(errs) > 0 {
			t.Errorf("holder label of %q: %v", r, errs)
		}
	}
	if ownership.NodeLeaseName("edge-1") != "dowse-link-edge-1" {
		t.Errorf("short names are kept readable: %s", ownership.NodeLeaseName("edge-1"))
	}
	// The long one is accepted by the API server as it is.
	leases := ownLeases(t)
	c, _ := replica(t, leases, strings.Repeat("r", 70))
	if e, err := c.Claim(context.Background(), long, 0); err != nil || e != 1 {
		t.Fatalf("claim of a 250-character node name: %d, %v", e, err)
	}
}

// fleet is a set of edges spread over replicas; a moved edge reconnects to
// the next replica of the ring after its delay, as an agent given every
// replica's address does.
type fleet struct {
	mu    sync.Mutex
	held  map[string]map[string]bool
	order []string
	moves int
}

func (f *fleet) sessions(replica string) func() []string {
	return func() []string {
		f.mu.Lock()
		defer f.mu.Unlock()
		var out []string
		for n := range f.held[replica] {
			out = append(out, n)
		}
		slices.Sort(out)
		return out
	}
}

func (f *fleet) move(replica string) func(string, time.Duration) bool {
	return func(node string, delay time.Duration) bool {
		f.mu.Lock()
		ok := f.held[replica][node]
		f.mu.Unlock()
		if !ok {
			return false
		}
		time.AfterFunc(delay, func() {
			f.mu.Lock()
			defer f.mu.Unlock()
			delete(f.held[replica], node)
			i := slices.Index(f.order, replica)
			f.held[f.order[(i+1)%len(f.order)]][node] = true
			f.moves++
		})
		return true
	}
}

func (f *fleet) counts() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []int
	for _, r := range f.order {
		out = append(out, len(f.held[r]))
	}
	return out
}

func startPresence(t *testing.T, leases coordinationv1client.LeaseInterface, f *fleet, name string) context.CancelFunc {
	t.Helper()
	p, err := ownership.NewPresence(ownership.PresenceConfig{Leases: leases, Replica: name,
		Sessions: f.sessions(name), Move: f.move(name), Every: 200 * time.Millisecond, Log: testr.New(t).WithName(name)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = p.Start(ctx); close(done) }()
	stop := func() { cancel(); <-done }
	t.Cleanup(stop)
	return stop
}

// TestPresenceSpreadsEdges: nine edges all on one of three replicas end
// three on each (no replica above 1.2 times its share), moved a few at a
// time; a replica that leaves is no longer counted, and one that joins
// takes its share without the others dropping all their edges.
func TestPresenceSpreadsEdges(t *testing.T) {
	leases := ownLeases(t)
	f := &fleet{held: map[string]map[string]bool{"a": {}, "b": {}, "c": {}}, order: []string{"a", "b", "c"}}
	for i := range 9 {
		f.held["a"][fmt.Sprintf("edge-%d", i)] = true
	}
	stops := map[string]context.CancelFunc{}
	for _, r := range f.order {
		stops[r] = startPresence(t, leases, f, r)
	}
	settled := func(want []int) {
		t.Helper()
		testwait.For(t, 20*time.Second, func() error {
			if got := f.counts(); !slices.Equal(got, want) {
				return fmt.Errorf("edges per replica %v, want %v", got, want)
			}
			return nil
		})
		// And they stay put.
		time.Sleep(time.Second)
		if got := f.counts(); !slices.Equal(got, want) {
			t.Fatalf("edges per replica moved on to %v after settling at %v", got, want)
		}
	}
	settled([]int{3, 3, 3})
	f.mu.Lock()
	moves := f.moves
	f.mu.Unlock()
	// A moves 6 to b, b moves 3 on to c: no edge moved for nothing.
	if moves != 9 {
		t.Errorf("%d moves to spread nine edges from one replica over three, want 9", moves)
	}

	// c stops (its edges go to a, as a drain would send them).
	stops["c"]()
	f.mu.Lock()
	for n := range f.held["c"] {
		delete(f.held["c"], n)
		f.held["a"][n] = true
	}
	f.order = []string{"a", "b"}
	f.mu.Unlock()
	settled([]int{5, 4})
}

// TestPresenceSendsNothingToAStaleReplica: a replica killed leaves its
// presence as it was (here one that promised to renew hourly, as a replica
// run with --link-spread-interval 1h does, last renewed 10 s ago, holding
// nothing): it is counted in the share, but a replica holding every edge
// moves none to it, since the edges would only come back.
func TestPresenceSendsNothingToAStaleReplica(t *testing.T) {
	ctx := context.Background()
	leases := ownLeases(t)
	renewed := metav1.NewMicroTime(time.Now().Add(-10 * time.Second))
	if _, err := leases.Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: ownership.ReplicaLeaseName("dead"), Labels: map[string]string{ownership.LabelKind: "replica"},
			Annotations: map[string]string{ownership.AnnotationSessions: "0", ownership.AnnotationDraining: "false"}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("dead"), LeaseDurationSeconds: ptr.To(int32(3 * 3600)), RenewTime: &renewed},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f := &fleet{held: map[string]map[string]bool{"a": {}, "dead": {}}, order: []string{"a", "dead"}}
	for i := range 9 {
		f.held["a"][fmt.Sprintf("edge-%d", i)] = true
	}
	startPresence(t, leases, f, "a")
	// Ten of its intervals: it renewed and looked at the spread each time.
	testwait.For(t, 10*time.Second, func() error {
		l, err := leases.Get(ctx, ownership.ReplicaLeaseName("a"), metav1.GetOptions{})
		if err != nil {
			return err
		}
		if l.Spec.RenewTime == nil || time.Since(l.Spec.RenewTime.Time) > time.Second {
			return errors.New("a's presence is not renewed")
		}
		return nil
	})
	time.Sleep(2 * time.Second)
	if got := f.counts(); !slices.Equal(got, []int{9, 0}) {
		t.Errorf("edges per replica %v, want [9 0]: a moved edges to a replica whose presence is stale", got)
	}
}
