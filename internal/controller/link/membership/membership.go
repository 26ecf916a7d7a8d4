package membership

import (
	"context"
	"crypto/sha256"
	"slices"
	"strings"
	"sync"

	"github.com/go-logr/logr"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// NodeIndex indexes Instances by the nodes in their status.
const NodeIndex = "status.nodes.name"

// IndexByNode is NodeIndex's function.
func IndexByNode(o client.Object) []string {
	inst, ok := o.(*v1alpha1.Instance)
	if !ok {
		return nil
	}
	out := make([]string, len(inst.Status.Nodes))
	for i, n := range inst.Status.Nodes {
		out[i] = n.Name
	}
	return out
}

// Sender is what Memberships needs of the cloudhub.
type Sender interface {
	Send(node string, env *linkv1.Envelope) (uint64, error)
	IsConnected(node string) bool
}

// Memberships keeps each connected node told which Instances it sees: in
// full when it connects, and again whenever that set changes. Only the
// newest set matters, so an unchanged one is not sent again, and a node
// that never connected is sent nothing (its queue would only grow).
type Memberships struct {
	reader client.Reader // the cache, with NodeIndex
	hub    Sender
	log    logr.Logger

	mu   sync.Mutex
	sent map[string][32]byte // digest of the last set sent, per node
}

// NewMemberships makes a Memberships; reader must have NodeIndex.
func NewMemberships(reader client.Reader, hub Sender, log logr.Logger) *Memberships {
	return &Memberships{reader: reader, hub: hub, log: log, sent: map[string][32]byte{}}
}

// SetupWithManager runs Reconcile for every node an Instance change
// concerns (before and after it).
func (m *Memberships) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("edge-membership").
		// On every replica: each tells the nodes whose sessions it holds.
		WithOptions(controller.Options{NeedLeaderElection: ptr.To(false)}).
		Watches(&v1alpha1.Instance{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			nodes := IndexByNode(o)
			reqs := make([]reconcile.Request, len(nodes))
			for i, n := range nodes {
				reqs[i].Name = n
			}
			return reqs
		})).
		Complete(m)
}

// TakenOver (cloudhub.SessionObserver) drops what was last sent to node:
// its new owner sends it again.
func (m *Memberships) TakenOver(node string) { m.forget(node) }

// Departed (cloudhub.SessionObserver) drops what was last sent to node.
func (m *Memberships) Departed(node string) { m.forget(node) }

func (m *Memberships) forget(node string) {
	m.mu.Lock()
	delete(m.sent, node)
	m.mu.Unlock()
}

// Connected (cloudhub.SessionObserver) sends node its whole membership: a (re)connected node may have
// missed any earlier one (a restarted hub keeps no queue).
func (m *Memberships) Connected(ctx context.Context, node string) {
	m.mu.Lock()
	delete(m.sent, node)
	m.mu.Unlock()
	if err := m.send(ctx, node); err != nil {
		m.log.Error(err, "sending device membership", "node", node)
	}
}

// Reconcile sends node its membership if it is connected and the set
// changed. Idempotent.
func (m *Memberships) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	if !m.hub.IsConnected(req.Name) {
		return reconcile.Result{}, nil
	}
	return reconcile.Result{}, m.send(ctx, req.Name)
}

func (m *Memberships) send(ctx context.Context, node string) error {
	set, err := Of(ctx, m.reader, node)
	if err != nil {
		return err
	}
	h := sha256.New()
	for _, d := range set.Devices {
		h.Write([]byte(d.Namespace + "/" + d.Name + "\x00"))
	}
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	m.mu.Lock()
	defer m.mu.Unlock()
	if last, ok := m.sent[node]; ok && last == sum {
		return nil
	}
	if _, err := m.hub.Send(node, &linkv1.Envelope{Kind: &linkv1.Envelope_DeviceMembership{DeviceMembership: set}}); err != nil {
		return err
	}
	m.sent[node] = sum
	return nil
}

// Of lists the Instances node sees, sorted.
func Of(ctx context.Context, r client.Reader, node string) (*linkv1.DeviceMembership, error) {
	var list v1alpha1.InstanceList
	// Read only: the cache's objects are not copied.
	if err := r.List(ctx, &list, client.MatchingFields{NodeIndex: node}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, err
	}
	m := &linkv1.DeviceMembership{Node: node}
	for i := range list.Items {
		m.Devices = append(m.Devices, &linkv1.DeviceRef{Namespace: list.Items[i].Namespace, Name: list.Items[i].Name})
	}
	slices.SortFunc(m.Devices, func(a, b *linkv1.DeviceRef) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	return m, nil
}
