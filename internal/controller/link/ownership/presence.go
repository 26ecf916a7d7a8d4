package ownership

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
)

// PresenceConfig configures Presence. Zero values take the defaults noted.
type PresenceConfig struct {
	// Leases is the controller's namespace's Lease client.
	Leases coordinationv1client.LeaseInterface
	// Replica is this replica's identity (ClaimsConfig.Replica).
	Replica string
	// Sessions lists the nodes connected to this replica now.
	Sessions func() []string
	// Draining reports whether this replica is moving its edges away.
	Draining func() bool
	// Move asks node's edge to reconnect after delay (cloudhub.Hub.Move);
	// false when it is not connected.
	Move func(node string, delay time.Duration) bool
	// Every is how often the presence is renewed and the spread checked
	// (2s); a presence not renewed for three times that is a replica gone.
	Every time.Duration
	// Tolerance: a replica moves edges away only while it holds more than
	// Tolerance times its share (1.1), and then down to its share.
	Tolerance float64
	// MoveRate bounds the edges one replica moves away per second (100),
	// so that the others take them gradually.
	MoveRate float64
	// Egress is where the other replicas reach this one's egress peer
	// listener (host:port; empty: none), published on its presence Lease.
	Egress string
	// CloudServices is the address (a host) this replica relays cloud-side
	// Services on, published on its presence Lease; empty: none.
	CloudServices string
	// Readings is where the other replicas reach this one's live readings
	// API (host:port; empty: none), published on its presence Lease.
	Readings string
	Log      logr.Logger
	// Registerer receives the metrics (nil: not registered).
	Registerer prometheus.Registerer
}

// Presence publishes this replica's presence Lease (how many sessions it
// holds, whether it drains), watches the others', and moves edges away
// while this replica holds more than its share of them: a few at a time,
// each at a random moment, and again only once the counts have settled.
// Edges moved away reconnect through the Service (or to the next address
// they were given) and land on another replica.
type Presence struct {
	cfg   PresenceConfig
	inf   cache.SharedIndexInformer
	moved prometheus.Counter
	share prometheus.Gauge
	live  prometheus.Gauge

	mu   sync.Mutex
	mine *coordinationv1.Lease
}

// NewPresence checks cfg and makes a Presence; Start runs it.
func NewPresence(cfg PresenceConfig) (*Presence, error) {
	if cfg.Leases == nil || cfg.Replica == "" || cfg.Sessions == nil || cfg.Move == nil {
		return nil, errors.New("ownership: presence needs a Lease client, the replica's identity, its sessions and a way to move them")
	}
	if cfg.Draining == nil {
		cfg.Draining = func() bool { return false }
	}
	if cfg.Every <= 0 {
		cfg.Every = 2 * time.Second
	}
	if cfg.Tolerance < 1 {
		cfg.Tolerance = 1.1
	}
	if cfg.MoveRate <= 0 {
		cfg.MoveRate = 100
	}
	if cfg.Log.GetSink() == nil {
		cfg.Log = logr.Discard()
	}
	p := &Presence{cfg: cfg,
		moved: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "dowse", Subsystem: "cloudhub", Name: "rebalanced_sessions_total",
			Help: "Edges this replica asked to reconnect elsewhere because it held more than its share."}),
		share: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "dowse", Subsystem: "cloudhub", Name: "session_share",
			Help: "The sessions each serving replica would hold if the edges were spread evenly, as this replica last counted."}),
		live: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "dowse", Subsystem: "cloudhub", Name: "serving_replicas",
			Help: "Replicas serving edges (present, not draining), as this replica last counted."}),
	}
	if r := cfg.Registerer; r != nil {
		r.MustRegister(p.moved, p.share, p.live)
	}
	selector := labels.Set{LabelKind: kindReplica}.String()
	p.inf = cache.NewSharedIndexInformerWithOptions(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = selector
			return cfg.Leases.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = selector
			return cfg.Leases.Watch(ctx, o)
		},
	}, &coordinationv1.Lease{}, cache.SharedIndexInformerOptions{})
	return p, nil
}

// Start runs until ctx ends, then deletes this replica's presence (a
// stopping replica is no longer counted).
func (p *Presence) Start(ctx context.Context) error {
	go p.inf.RunWithContext(ctx)
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		err := p.cfg.Leases.Delete(cctx, ReplicaLeaseName(p.cfg.Replica), metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			p.cfg.Log.Error(err, "deleting this replica's presence")
		}
	}()
	t := time.NewTicker(p.cfg.Every)
	defer t.Stop()
	var quietUntil time.Time
	for {
		sessions := p.cfg.Sessions()
		draining := p.cfg.Draining()
		if err := p.renew(ctx, len(sessions), draining); err != nil && ctx.Err() == nil {
			p.cfg.Log.Error(err, "renewing this replica's presence")
		}
		if !draining && p.inf.HasSynced() && time.Now().After(quietUntil) {
			if window := p.spread(sessions); window > 0 {
				// Let the moved edges land and the counts catch up first.
				quietUntil = time.Now().Add(window + 2*p.cfg.Every)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (p *Presence) renew(ctx context.Context, sessions int, draining bool) error {
	name := ReplicaLeaseName(p.cfg.Replica)
	p.mu.Lock()
	l := p.mine
	p.mu.Unlock()
	for range 3 {
		if l == nil {
			got, err := p.cfg.Leases.Get(ctx, name, metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err):
				l = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name}}
			case err != nil:
				return err
			default:
				l = got
			}
		}
		now := metav1.NewMicroTime(time.Now())
		if l.Labels == nil {
			l.Labels = map[string]string{}
		}
		l.Labels[LabelKind] = kindReplica
		if l.Annotations == nil {
			l.Annotations = map[string]string{}
		}
		l.Annotations[AnnotationSessions] = strconv.Itoa(sessions)
		l.Annotations[AnnotationDraining] = strconv.FormatBool(draining)
		for k, v := range map[string]string{AnnotationEgress: p.cfg.Egress, AnnotationCloudServices: p.cfg.CloudServices, AnnotationReadings: p.cfg.Readings} {
			if v != "" {
				l.Annotations[k] = v
			} else {
				delete(l.Annotations, k)
			}
		}
		l.Spec.HolderIdentity = ptr.To(p.cfg.Replica)
		l.Spec.LeaseDurationSeconds = ptr.To(int32(math.Ceil((3 * p.cfg.Every).Seconds())))
		l.Spec.RenewTime = &now
		var err error
		var out *coordinationv1.Lease
		if l.ResourceVersion == "" {
			out, err = p.cfg.Leases.Create(ctx, l, metav1.CreateOptions{FieldManager: fieldManager})
		} else {
			out, err = p.cfg.Leases.Update(ctx, l, metav1.UpdateOptions{FieldManager: fieldManager})
		}
		if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) || apierrors.IsNotFound(err) {
			l = nil
			continue
		}
		if err != nil {
			return err
		}
		p.mu.Lock()
		p.mine = out
		p.mu.Unlock()
		return nil
	}
	p.mu.Lock()
	p.mine = nil
	p.mu.Unlock()
	return errors.New("ownership: this replica's presence kept changing while it was renewed")
}

// Others is how many other replicas serve edges (present, not draining),
// as the watch last saw them.
func (p *Presence) Others() int {
	n := 0
	now := time.Now()
	for _, o := range p.inf.GetStore().List() {
		if l, ok := o.(*coordinationv1.Lease); ok && ptr.Deref(l.Spec.HolderIdentity, "") != p.cfg.Replica && Serving(l, now) {
			n++
		}
	}
	return n
}

// EgressOf is where replica's egress peer listener is, as its presence
// Lease last said ("" when it is not present or serves none).
func (p *Presence) EgressOf(replica string) string {
	name := ReplicaLeaseName(replica)
	for _, o := range p.inf.GetStore().List() {
		if l, ok := o.(*coordinationv1.Lease); ok && l.Name == name && Serving(l, time.Now()) {
			return l.Annotations[AnnotationEgress]
		}
	}
	return ""
}

// ReadingsPeers are the other present replicas (renewed in time, serving
// or draining: a draining one still holds sessions) and where each serves
// the live readings API, as their presence Leases last said.
func (p *Presence) ReadingsPeers() map[string]string {
	out := map[string]string{}
	now := time.Now()
	for _, o := range p.inf.GetStore().List() {
		l, ok := o.(*coordinationv1.Lease)
		if !ok || !p.fresh(l, now) {
			continue
		}
		holder := ptr.Deref(l.Spec.HolderIdentity, "")
		if addr := l.Annotations[AnnotationReadings]; addr != "" && holder != "" && holder != p.cfg.Replica {
			out[holder] = addr
		}
	}
	return out
}

// CloudServiceHosts are the addresses the serving replicas relay
// cloud-side Services on, sorted.
func (p *Presence) CloudServiceHosts() []string {
	var out []string
	now := time.Now()
	for _, o := range p.inf.GetStore().List() {
		if l, ok := o.(*coordinationv1.Lease); ok && Serving(l, now) && l.Annotations[AnnotationCloudServices] != "" {
			out = append(out, l.Annotations[AnnotationCloudServices])
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Serving reports whether l is the presence of a replica that serves
// edges: renewed in time and not draining.
func Serving(l *coordinationv1.Lease, now time.Time) bool {
	return l.Annotations[AnnotationDraining] != "true" && l.Spec.RenewTime != nil &&
		now.Sub(l.Spec.RenewTime.Time) <= time.Duration(ptr.Deref(l.Spec.LeaseDurationSeconds, 0))*time.Second
}

// fresh reports whether l was renewed within two of this replica's
// intervals: a replica that recent is taken to have room as it says.
func (p *Presence) fresh(l *coordinationv1.Lease, now time.Time) bool {
	return l.Spec.RenewTime != nil && now.Sub(l.Spec.RenewTime.Time) <= 2*p.cfg.Every
}

// RoomElsewhere says whether a replica holding sessions should send a new
// edge on: it holds at least its share (rounded up) and another replica,
// present and renewed within two intervals, holds less.
func (p *Presence) RoomElsewhere(sessions int) bool {
	if !p.inf.HasSynced() {
		return false
	}
	total, replicas := sessions, 1
	var counts []int
	now := time.Now()
	for _, o := range p.inf.GetStore().List() {
		l, ok := o.(*coordinationv1.Lease)
		if !ok || ptr.Deref(l.Spec.HolderIdentity, "") == p.cfg.Replica || !Serving(l, now) {
			continue
		}
		n, err := strconv.Atoi(l.Annotations[AnnotationSessions])
		if err != nil {
			continue
		}
		total += n
		replicas++
		if p.fresh(l, now) {
			counts = append(counts, n)
		}
	}
	target := int(math.Ceil(float64(total) / float64(replicas)))
	if replicas < 2 || sessions < target {
		return false
	}
	for _, n := range counts {
		if n < target {
			return true
		}
	}
	return false
}

// spread moves edges away when this replica holds more than its share,
// and returns the time over which it spread the moves (0: none).
func (p *Presence) spread(sessions []string) time.Duration {
	own := len(sessions)
	total, replicas := own, 1
	var below int // room on the others up to their share
	counts := []int{}
	now := time.Now()
	for _, o := range p.inf.GetStore().List() {
		l, ok := o.(*coordinationv1.Lease)
		if !ok || ptr.Deref(l.Spec.HolderIdentity, "") == p.cfg.Replica {
			continue
		}
		if !Serving(l, now) {
			continue // stopping, or gone
		}
		n, err := strconv.Atoi(l.Annotations[AnnotationSessions])
		if err != nil {
			continue
		}
		total += n
		replicas++
		// Room only on a replica renewed within two of this one's
		// intervals (as RoomElsewhere): a replica killed leaves its
		// presence serving until it expires, and the edges moved to it
		// would only come back here, each with one more claim.
		if p.fresh(l, now) {
			counts = append(counts, n)
		}
	}
	share := float64(total) / float64(replicas)
	p.share.Set(share)
	p.live.Set(float64(replicas))
	target := int(math.Ceil(share))
	if replicas < 2 || own <= target || float64(own) <= share*p.cfg.Tolerance {
		return 0
	}
	for _, n := range counts {
		below += max(0, target-n)
	}
	n := min(own-target, below)
	if n <= 0 {
		return 0
	}
	window := max(p.cfg.Every, time.Duration(float64(n)/p.cfg.MoveRate*float64(time.Second)))
	p.cfg.Log.Info("moving edges to the other replicas: this one holds more than its share", "sessions", own, "share", share, "replicas", replicas, "moving", n, "over", window)
	moved := 0
	for _, i := range rand.Perm(own) {
		if moved == n {
			break
		}
		if p.cfg.Move(sessions[i], rand.N(window)) {
			moved++
		}
	}
	p.moved.Add(float64(moved))
	return window
}
