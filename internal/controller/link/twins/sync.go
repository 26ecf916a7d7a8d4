package twins

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/protobuf/proto"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/dowse-dev/dowse/internal/link"
	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// Indexes on Devices in the controller's cache.
const (
	// NodeIndex: spec.nodeName.
	NodeIndex = "spec.nodeName"
	// ModelIndex: spec.deviceModelRef.name.
	ModelIndex = "spec.deviceModelRef.name"
)

// IndexByNode is NodeIndex's function.
func IndexByNode(o client.Object) []string {
	if d, ok := o.(*v1alpha1.Device); ok && d.Spec.NodeName != "" {
		return []string{d.Spec.NodeName}
	}
	return nil
}

// IndexByModel is ModelIndex's function.
func IndexByModel(o client.Object) []string {
	if d, ok := o.(*v1alpha1.Device); ok && d.Spec.DeviceModelRef != nil && d.Spec.DeviceModelRef.Name != "" {
		return []string{d.Spec.DeviceModelRef.Name}
	}
	return nil
}

// Sender is what Sync needs of the cloudhub.
type Sender interface {
	Send(node string, env *linkv1.Envelope) (uint64, error)
	IsConnected(node string) bool
}

// Sync sends each connected node its Devices and the DeviceModels they
// name: all of them, then an inventory, when it connects, and each change
// as it happens (a Device that moves to another node is removed from the
// old one). A Device that does not fit its model is not sent (and is taken
// from its node); its Valid condition says why. Only the newest state of a
// Device matters, so an unchanged one is not sent again.
type Sync struct {
	reader  client.Reader // the cache, with NodeIndex and ModelIndex
	secrets client.Reader
	hub     Sender
	status  *Status
	metrics *Metrics
	log     logr.Logger

	mu    sync.Mutex
	nodes map[string]*sentTo              // what each connected node holds
	where map[types.NamespacedName]string // node each Device was sent to
}

type sentTo struct {
	devices map[types.NamespacedName]sentDevice
	models  map[types.NamespacedName][32]byte
}

type sentDevice struct {
	digest [32]byte
	model  types.NamespacedName
}

// NewSync makes a Sync. secrets (uncached: the controller keeps no
// Secrets) checks that the Secrets pushMethods name exist; nil: not checked.
func NewSync(reader, secrets client.Reader, hub Sender, status *Status, m *Metrics, log logr.Logger) *Sync {
	return &Sync{reader: reader, secrets: secrets, hub: hub, status: status, metrics: m, log: log,
		nodes: map[string]*sentTo{}, where: map[types.NamespacedName]string{}}
}

func (s *Sync) secretExists(ctx context.Context, namespace, name string) (bool, error) {
	return secretExists(s.secrets)(ctx, namespace, name)
}

// secretExists asks r (metadata only) whether a Secret exists; r nil: it
// is taken to.
func secretExists(r client.Reader) func(ctx context.Context, namespace, name string) (bool, error) {
	return func(ctx context.Context, namespace, name string) (bool, error) {
		if r == nil {
			return true, nil
		}
		sec := &metav1.PartialObjectMetadata{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"}}
		err := r.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, sec)
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil, err
	}
}

// SetupWithManager reconciles Devices, and the Devices of a DeviceModel
// when it changes. The indexes must be registered.
func (s *Sync) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("twin-sync").
		For(&v1alpha1.Device{}).
		Watches(&v1alpha1.DeviceModel{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			var list v1alpha1.DeviceList
			if err := s.reader.List(ctx, &list, client.InNamespace(o.GetNamespace()), client.MatchingFields{ModelIndex: o.GetName()}); err != nil {
				s.log.Error(err, "listing the devices of a model", "model", o.GetNamespace()+"/"+o.GetName())
				return nil
			}
			out := make([]reconcile.Request, len(list.Items))
			for i := range list.Items {
				out[i].NamespacedName = client.ObjectKeyFromObject(&list.Items[i])
			}
			return out
		})).
		// One at a time: a node must get a model before the devices of it.
		// On every replica: each sends the nodes whose sessions it holds.
		WithOptions(controller.Options{MaxConcurrentReconciles: 1, NeedLeaderElection: ptr.To(false)}).
		Complete(s)
}

// Reconcile brings the Device's node up to date with it. Idempotent.
func (s *Sync) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var d v1alpha1.Device
	if err := s.reader.Get(ctx, req.NamespacedName, &d); err != nil {
		if !apierrors.IsNotFound(err) {
			return reconcile.Result{}, err
		}
		s.status.Forget(req.NamespacedName)
		s.mu.Lock()
		defer s.mu.Unlock()
		return reconcile.Result{}, s.takeFrom(s.where[req.NamespacedName], req.NamespacedName)
	}
	ed, model, err := s.edgeDevice(ctx, &d)
	if err != nil {
		return reconcile.Result{}, err
	}
	return s.reconcileNode(&d, ed, model)
}

func (s *Sync) reconcileNode(d *v1alpha1.Device, ed *linkv1.EdgeDevice, model *v1alpha1.DeviceModel) (reconcile.Result, error) {
	req := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(d)}
	s.mu.Lock()
	defer s.mu.Unlock()
	if old := s.where[req.NamespacedName]; old != "" && (old != d.Spec.NodeName || ed == nil) {
		if err := s.takeFrom(old, req.NamespacedName); err != nil {
			return reconcile.Result{}, err
		}
	}
	if ed == nil || d.Spec.NodeName == "" {
		return reconcile.Result{}, nil
	}
	if s.nodes[d.Spec.NodeName] != nil && !s.hub.IsConnected(d.Spec.NodeName) {
		// Gone since it connected: it is sent everything when it is back.
		delete(s.nodes, d.Spec.NodeName)
	}
	err := s.give(d.Spec.NodeName, ed, model)
	if errors.Is(err, link.ErrQueueFull) {
		// The node is slow to acknowledge; only the newest state matters.
		return reconcile.Result{RequeueAfter: time.Second}, nil
	}
	return reconcile.Result{}, err
}

// edgeDevice converts d if it is to be sent (Check); nil when it is not.
// Whether it is valid is recorded by Validity, on the leader.
func (s *Sync) edgeDevice(ctx context.Context, d *v1alpha1.Device) (*linkv1.EdgeDevice, *v1alpha1.DeviceModel, error) {
	ed, model, _, err := Check(ctx, s.reader, s.secretExists, d)
	return ed, model, err
}

// give sends node the device (and its model first) if it is connected and
// holds another version. Under mu.
func (s *Sync) give(node string, ed *linkv1.EdgeDevice, model *v1alpha1.DeviceModel) error {
	key := types.NamespacedName{Namespace: ed.Ref.Namespace, Name: ed.Ref.Name}
	st := s.nodes[node]
	if st == nil {
		// Not connected: it gets everything when it connects.
		s.where[key] = node
		return nil
	}
	mkey := client.ObjectKeyFromObject(model)
	em := EdgeModel(model)
	if md := digest(em); st.models[mkey] != md {
		if err := s.send(node, "model", &linkv1.Envelope{Kind: &linkv1.Envelope_ModelUpdate{ModelUpdate: &linkv1.DeviceModelUpdate{Model: em}}}); err != nil {
			return err
		}
		st.models[mkey] = md
	}
	dd := digest(ed)
	if cur, ok := st.devices[key]; ok && cur.digest == dd {
		s.where[key] = node
		return nil
	}
	if err := s.send(node, "device", &linkv1.Envelope{Kind: &linkv1.Envelope_DeviceUpdate{DeviceUpdate: &linkv1.DeviceUpdate{Device: ed}}}); err != nil {
		return err
	}
	st.devices[key] = sentDevice{digest: dd, model: mkey}
	s.where[key] = node
	return nil
}

// takeFrom removes the device from node, and its model when no other
// device of the node names it. Under mu.
func (s *Sync) takeFrom(node string, key types.NamespacedName) error {
	delete(s.where, key)
	st := s.nodes[node]
	if st == nil {
		return nil
	}
	cur, ok := st.devices[key]
	if !ok {
		return nil
	}
	if err := s.send(node, "device-removal", &linkv1.Envelope{Kind: &linkv1.Envelope_DeviceRemoval{DeviceRemoval: &linkv1.DeviceRemoval{
		Device: &linkv1.DeviceRef{Namespace: key.Namespace, Name: key.Name}}}}); err != nil {
		return err
	}
	delete(st.devices, key)
	for _, other := range st.devices {
		if other.model == cur.model {
			return nil
		}
	}
	if _, held := st.models[cur.model]; held {
		if err := s.send(node, "model-removal", &linkv1.Envelope{Kind: &linkv1.Envelope_ModelRemoval{ModelRemoval: &linkv1.DeviceModelRemoval{
			Model: &linkv1.DeviceRef{Namespace: cur.model.Namespace, Name: cur.model.Name}}}}); err != nil {
			return err
		}
		delete(st.models, cur.model)
	}
	return nil
}

func (s *Sync) send(node, kind string, env *linkv1.Envelope) error {
	if _, err := s.hub.Send(node, env); err != nil {
		return fmt.Errorf("sending %s to node %s: %w", kind, node, err)
	}
	s.metrics.Sent.WithLabelValues(kind).Inc()
	return nil
}

// Connected (cloudhub.SessionObserver) sends node every Device it owns and their models, then the
// inventory: a (re)connected node may have missed anything (a restarted
// hub keeps no queue), and the inventory lets it forget what it holds of
// Devices that are no longer its.
func (s *Sync) Connected(ctx context.Context, node string) {
	var list v1alpha1.DeviceList
	if err := s.reader.List(ctx, &list, client.MatchingFields{NodeIndex: node}); err != nil {
		s.log.Error(err, "listing the devices of a node", "node", node)
		return
	}
	type item struct {
		ed    *linkv1.EdgeDevice
		model *v1alpha1.DeviceModel
	}
	var items []item
	for i := range list.Items {
		ed, model, err := s.edgeDevice(ctx, &list.Items[i])
		if err != nil {
			s.log.Error(err, "reading a device's model", "device", client.ObjectKeyFromObject(&list.Items[i]).String())
			continue
		}
		if ed != nil {
			items = append(items, item{ed, model})
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nodes[node] = &sentTo{devices: map[types.NamespacedName]sentDevice{}, models: map[types.NamespacedName][32]byte{}}
	inv := &linkv1.DeviceInventory{Node: node}
	for _, it := range items {
		if err := s.give(node, it.ed, it.model); err != nil {
			s.log.Error(err, "sending a node its devices", "node", node)
			// The inventory would make the node forget what it was not sent.
			delete(s.nodes, node)
			return
		}
	}
	st := s.nodes[node]
	for k := range st.devices {
		inv.Devices = append(inv.Devices, &linkv1.DeviceRef{Namespace: k.Namespace, Name: k.Name})
	}
	for k := range st.models {
		inv.Models = append(inv.Models, &linkv1.DeviceRef{Namespace: k.Namespace, Name: k.Name})
	}
	sortRefs(inv.Devices)
	sortRefs(inv.Models)
	if err := s.send(node, "inventory", &linkv1.Envelope{Kind: &linkv1.Envelope_DeviceInventory{DeviceInventory: inv}}); err != nil {
		s.log.Error(err, "sending a node its inventory", "node", node)
		delete(s.nodes, node)
	}
}

// TakenOver (cloudhub.SessionObserver) drops what was sent to node: its
// new owner sends it all again.
func (s *Sync) TakenOver(node string) { s.forget(node) }

// Departed (cloudhub.SessionObserver) drops what was sent to node.
func (s *Sync) Departed(node string) { s.forget(node) }

func (s *Sync) forget(node string) {
	s.mu.Lock()
	delete(s.nodes, node)
	s.mu.Unlock()
}

func sortRefs(r []*linkv1.DeviceRef) {
	slices.SortFunc(r, func(a, b *linkv1.DeviceRef) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
}

func digest(m proto.Message) [32]byte {
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	return sha256.Sum256(b)
}
