package ownership

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
)

// ClaimsConfig configures Claims.
type ClaimsConfig struct {
	// Leases is the controller's namespace's Lease client.
	Leases coordinationv1client.LeaseInterface
	// Replica is this replica's identity (its Pod's name), unique among the
	// replicas running at once.
	Replica string
	// NodeUID, when set, gives the UID of a node's Node object, which then
	// owns the node's record (the garbage collector removes it with the
	// Node). An error or an empty UID leaves the record unowned.
	NodeUID func(ctx context.Context, node string) (types.UID, error)
	// Lost is told, when a record this replica held is taken by another
	// holder, that no session of node with an epoch at or below through is
	// the node's owner any more: close it and drop its unwritten state.
	// Called on the watch's goroutine; it must not block long.
	Lost func(node string, through uint64)
	// MaxInFlight bounds the claims being written at once
	// (DefaultMaxClaimsInFlight); more wait
	// their turn. A replica taking over a dead one's nodes claims them all
	// at once: unbounded, the writes queue in the API server instead, and
	// every other request of the replica (its leader election's renewals)
	// waits behind them.
	MaxInFlight int
	// Metrics may be nil.
	Metrics *Metrics
	Log     logr.Logger
}

// DefaultMaxClaimsInFlight is ClaimsConfig.MaxInFlight's default.
const DefaultMaxClaimsInFlight = 128

// Claims makes this replica the owner of node sessions (Claim) and tells
// it when another replica took one (ClaimsConfig.Lost). See the package
// comment for why that is safe.
type Claims struct {
	cfg   ClaimsConfig
	label string

	inFlight chan struct{}

	mu      sync.Mutex
	held    map[string]uint64 // node -> the newest epoch this replica knows it holds
	claimed map[string]uint64 // node -> the epoch this process last wrote into its record
	watched map[string]uint64 // node -> the epoch the watch last showed its record held here at
	synced  func() bool
}

// NewClaims checks cfg and makes Claims; Start runs its watch.
func NewClaims(cfg ClaimsConfig) (*Claims, error) {
	if cfg.Leases == nil || cfg.Replica == "" {
		return nil, errors.New("ownership: a Lease client and the replica's identity are required")
	}
	if cfg.Lost == nil {
		cfg.Lost = func(string, uint64) {}
	}
	if cfg.Log.GetSink() == nil {
		cfg.Log = logr.Discard()
	}
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = DefaultMaxClaimsInFlight
	}
	return &Claims{cfg: cfg, label: HolderLabel(cfg.Replica), inFlight: make(chan struct{}, cfg.MaxInFlight),
		held: map[string]uint64{}, claimed: map[string]uint64{}, watched: map[string]uint64{}, synced: func() bool { return false }}, nil
}

// maxClaimRounds bounds the read-and-write rounds of one Claim: each lost
// round means another replica claimed the node meanwhile, which a healthy
// edge does not make happen more than once or twice.
const maxClaimRounds = 8

// ErrContended is returned when the record kept changing under Claim; the
// edge retries with its backoff.
var ErrContended = errors.New("ownership: the node's record kept changing while it was claimed")

// Claim makes this replica the holder of node's record and returns the new
// session's epoch: one more than any session of the node began before,
// on any replica. The write is conditional on what was read (a JSON patch
// whose test the API server applies atomically, else the read
// resourceVersion), so two replicas claiming at once get different epochs
// and the later one is the owner. hint is the epoch the edge last had (its
// Hello's): when it is still the record's, the claim is one request.
//
// An edge that comes back to this process with the epoch this process
// last wrote into its record, while the watch still shows the record held
// here at that epoch, resumes that session without a write (path "kept"):
// no other session can have begun as far as this replica can know, and if
// one did (the watch trails the API server), the watch closes this one
// when it catches up and the fence on Device.status refuses its writes
// after the newer session's first. A reconnect of an edge dropped by a
// loaded replica then costs the API server nothing.
//
// Errors are the API server's, or ErrContended; the caller refuses the
// session and the edge retries.
func (c *Claims) Claim(ctx context.Context, node string, hint uint64) (uint64, error) {
	start := time.Now()
	if c.kept(node, hint) {
		c.cfg.Metrics.claimed("kept", nil, time.Since(start))
		return hint, nil
	}
	select {
	case c.inFlight <- struct{}{}:
	case <-ctx.Done():
		return 0, context.Cause(ctx)
	}
	epoch, path, err := c.claim(ctx, node, hint)
	<-c.inFlight
	c.cfg.Metrics.claimed(path, err, time.Since(start))
	if err != nil {
		return 0, err
	}
	c.mu.Lock()
	c.held[node] = max(c.held[node], epoch)
	c.claimed[node] = epoch
	c.mu.Unlock()
	return epoch, nil
}

// kept reports whether node's session at epoch hint is still this
// process's (see Claim).
func (c *Claims) kept(node string, hint uint64) bool {
	if hint == 0 {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.claimed[node] == hint && c.watched[node] == hint && c.held[node] == hint
}

func (c *Claims) claim(ctx context.Context, node string, hint uint64) (uint64, string, error) {
	name := NodeLeaseName(node)
	c.mu.Lock()
	known, ok := c.held[node]
	c.mu.Unlock()
	if !ok {
		known = hint
	}
	if known > 0 {
		epoch, err := c.patch(ctx, name, known)
		if err == nil {
			return epoch, "patch", nil
		}
		if ctx.Err() != nil {
			return 0, "patch", err
		}
		// The test failed (another session began since), or the record is
		// gone: read it.
	}
	for round := range maxClaimRounds {
		if round > 0 {
			// Lost a race: let the winner's write settle rather than
			// meet the other losers again at once.
			time.Sleep(rand.N(time.Duration(round) * 5 * time.Millisecond))
		}
		l, err := c.cfg.Leases.Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			epoch, err := c.create(ctx, node, name)
			if apierrors.IsAlreadyExists(err) {
				continue
			}
			return epoch, "create", err
		case err != nil:
			return 0, "read", err
		}
		epoch := uint64(ptr.Deref(l.Spec.LeaseTransitions, 0)) + 1
		if epoch > uint64(^uint32(0)>>1) {
			return 0, "update", fmt.Errorf("ownership: node %s has had %d sessions, the most a Lease counts", node, epoch-1)
		}
		c.hold(l, node, epoch)
		_, err = c.cfg.Leases.Update(ctx, l, metav1.UpdateOptions{FieldManager: fieldManager})
		if apierrors.IsConflict(err) {
			continue
		}
		if err != nil {
			return 0, "update", err
		}
		return epoch, "update", nil
	}
	return 0, "update", ErrContended
}

const fieldManager = "dowse-controller-ownership"

// patch claims the record if its epoch is still known, in one request.
func (c *Claims) patch(ctx context.Context, name string, known uint64) (uint64, error) {
	now := metav1.NewMicroTime(time.Now())
	ops := []map[string]any{
		{"op": "test", "path": "/spec/leaseTransitions", "value": known},
		{"op": "replace", "path": "/spec/leaseTransitions", "value": known + 1},
		{"op": "replace", "path": "/spec/holderIdentity", "value": c.cfg.Replica},
		{"op": "replace", "path": "/spec/acquireTime", "value": now},
		{"op": "add", "path": "/metadata/labels/" + jsonPointerEscape(LabelHolder), "value": c.label},
	}
	body, err := json.Marshal(ops)
	if err != nil {
		return 0, err
	}
	l, err := c.cfg.Leases.Patch(ctx, name, types.JSONPatchType, body, metav1.PatchOptions{FieldManager: fieldManager})
	if err != nil {
		return 0, err
	}
	return uint64(ptr.Deref(l.Spec.LeaseTransitions, 0)), nil
}

func jsonPointerEscape(s string) string {
	out := make([]byte, 0, len(s)+2)
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '~':
			out = append(out, '~', '0')
		case '/':
			out = append(out, '~', '1')
		default:
			out = append(out, s[i])
		}
	}
	return string(out)
}

func (c *Claims) create(ctx context.Context, node, name string) (uint64, error) {
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{AnnotationNode: node}}}
	if c.cfg.NodeUID != nil {
		if uid, err := c.cfg.NodeUID(ctx, node); err == nil && uid != "" {
			l.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node, UID: uid}}
		}
	}
	c.hold(l, node, 1)
	_, err := c.cfg.Leases.Create(ctx, l, metav1.CreateOptions{FieldManager: fieldManager})
	if err != nil {
		return 0, err
	}
	return 1, nil
}

// hold makes l say that this replica holds node's session epoch.
func (c *Claims) hold(l *coordinationv1.Lease, node string, epoch uint64) {
	now := metav1.NewMicroTime(time.Now())
	if l.Labels == nil {
		l.Labels = map[string]string{}
	}
	l.Labels[LabelKind] = kindNode
	l.Labels[LabelHolder] = c.label
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	l.Annotations[AnnotationNode] = node
	l.Spec.HolderIdentity = ptr.To(c.cfg.Replica)
	l.Spec.LeaseTransitions = ptr.To(int32(epoch))
	l.Spec.AcquireTime = &now
	// A record, not a timer: nobody renews it, nothing expires.
	l.Spec.LeaseDurationSeconds, l.Spec.RenewTime = nil, nil
}

// Held is how many nodes' records this replica holds as far as it knows.
func (c *Claims) Held() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.held)
}

// Synced reports whether the watch has listed the records this replica
// holds (a readiness check: before it, a takeover could go unnoticed).
func (c *Claims) Synced() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.synced()
}

// Start watches the records labelled with this replica until ctx ends. A
// record that leaves that set (another replica claimed the node, or it was
// deleted with its Node) is reported to Lost with the last epoch this
// replica held it at.
func (c *Claims) Start(ctx context.Context) error {
	selector := labels.Set{LabelKind: kindNode, LabelHolder: c.label}.String()
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = selector
			return c.cfg.Leases.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = selector
			return c.cfg.Leases.Watch(ctx, o)
		},
	}
	inf := cache.NewSharedIndexInformerWithOptions(lw, &coordinationv1.Lease{}, cache.SharedIndexInformerOptions{})
	// Only what deciding ownership needs is kept.
	if err := inf.SetTransform(slimLease); err != nil {
		return err
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { c.seen(o) },
		UpdateFunc: func(_, o any) { c.seen(o) },
		DeleteFunc: c.gone,
	}); err != nil {
		return err
	}
	c.mu.Lock()
	c.synced = inf.HasSynced
	c.mu.Unlock()
	inf.RunWithContext(ctx)
	return nil
}

func slimLease(o any) (any, error) {
	if l, ok := o.(*coordinationv1.Lease); ok {
		l.ManagedFields, l.OwnerReferences = nil, nil
		l.Spec.AcquireTime, l.Spec.RenewTime = nil, nil
	}
	return o, nil
}

// recordOf is the node and epoch of a record and whether this replica
// holds it.
func (c *Claims) recordOf(o any) (node string, epoch uint64, ours bool) {
	l, ok := o.(*coordinationv1.Lease)
	if !ok {
		return "", 0, false
	}
	node = l.Annotations[AnnotationNode]
	epoch = uint64(ptr.Deref(l.Spec.LeaseTransitions, 0))
	return node, epoch, ptr.Deref(l.Spec.HolderIdentity, "") == c.cfg.Replica
}

func (c *Claims) seen(o any) {
	node, epoch, ours := c.recordOf(o)
	if node == "" {
		return
	}
	if !ours {
		// Labelled ours but held by another name (the labels of two
		// identities collide): the record's holder wins.
		c.lost(node, epoch)
		return
	}
	c.mu.Lock()
	c.held[node] = max(c.held[node], epoch)
	c.watched[node] = epoch
	c.mu.Unlock()
}

func (c *Claims) gone(o any) {
	if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = d.Obj
	}
	node, epoch, _ := c.recordOf(o)
	if node == "" {
		return
	}
	c.lost(node, epoch)
}

// lost tells Lost that sessions of node through epoch are not the owner,
// unless this replica has claimed a newer one since (its watch can trail
// its own writes).
func (c *Claims) lost(node string, through uint64) {
	c.mu.Lock()
	if c.held[node] <= through {
		delete(c.held, node)
	}
	delete(c.watched, node)
	if c.claimed[node] <= through {
		delete(c.claimed, node)
	}
	c.mu.Unlock()
	c.cfg.Log.V(1).Info("another replica took the node's session", "node", node, "through", through)
	c.cfg.Lost(node, through)
}

// Fenced tells Claims that a Device of node was found written by a newer
// session than any through epoch through (the status writer's fence): the
// record has moved on whether or not the watch saw it yet, so sessions of
// node through that epoch are lost as if the watch had said so (Lost).
func (c *Claims) Fenced(node string, through uint64) { c.lost(node, through) }

// Connected is cloudhub.SessionObserver's: the claim came before it.
func (c *Claims) Connected(context.Context, string) {}

// TakenOver is cloudhub.SessionObserver's: the record told it (Lost).
func (c *Claims) TakenOver(string) {}

// Departed is cloudhub.SessionObserver's: Forget.
func (c *Claims) Departed(node string) { c.Forget(node) }

// Forget drops what this replica knows of node's record (a node that left
// the cluster).
func (c *Claims) Forget(node string) {
	c.mu.Lock()
	delete(c.held, node)
	delete(c.claimed, node)
	delete(c.watched, node)
	c.mu.Unlock()
}
