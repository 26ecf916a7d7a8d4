// Package membership is what the controller makes of its nodes' link: which
// devices a node may speak about, which devices each node is told it has,
// and that a node removed from the cluster is off the link.
package membership

import (
	"context"
	"fmt"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/internal/controller/link/cloudhub"
	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// Authorizer lets a node speak about the Devices whose spec.nodeName is
// the node (their twins are its), and the Instances that list it in
// status.nodes, and no others. It reads the controller's cache.
type Authorizer struct {
	Reader client.Reader
}

// AuthorizeDevice is cloudhub.Authorizer's: nil when the Device of that
// name is the node's or, with no such Device, the Instance lists node.
func (a Authorizer) AuthorizeDevice(ctx context.Context, node string, device *linkv1.DeviceRef) error {
	if device == nil || device.Name == "" {
		return fmt.Errorf("node %s named no device", node)
	}
	var dev v1alpha1.Device
	// Read only, once per message: no copy of the cached object.
	err := a.Reader.Get(ctx, types.NamespacedName{Namespace: device.Namespace, Name: device.Name}, &dev, client.UnsafeDisableDeepCopy)
	if err == nil {
		if dev.Spec.NodeName != node {
			return fmt.Errorf("node %s named Device %s/%s, whose twin is node %q's", node, device.Namespace, device.Name, dev.Spec.NodeName)
		}
		return nil
	}
	if !apierrors.IsNotFound(err) {
		return err
	}
	var inst v1alpha1.Instance
	if err := a.Reader.Get(ctx, types.NamespacedName{Namespace: device.Namespace, Name: device.Name}, &inst); err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("node %s named Instance %s/%s, which does not exist", node, device.Namespace, device.Name)
		}
		return err
	}
	if !inst.HasNode(node) {
		return fmt.Errorf("node %s named Instance %s/%s, which it does not see", node, device.Namespace, device.Name)
	}
	return nil
}

// Handler takes what nodes send. Reported twin values have no consumer
// until device twins exist; they are logged, and counted by the hub. (The
// twin store, once it exists, keeps each value's cloudhub.Position with it
// and serves cloudhub.Positions, for exactly-once across hub restarts.)
func Handler(log logr.Logger) cloudhub.Handler {
	return func(_ context.Context, m cloudhub.Inbound) error {
		if r := m.Env.GetTwinReported(); r != nil {
			log.V(1).Info("reported value", "node", m.Node, "device", r.GetDevice().GetNamespace()+"/"+r.GetDevice().GetName(), "property", r.GetProperty(), "seq", m.At.Seq)
		}
		return nil
	}
}
