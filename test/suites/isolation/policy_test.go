package isolation

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/internal/apply"
	"github.com/dowse-dev/dowse/internal/instancestore"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	acv1alpha1 "github.com/dowse-dev/dowse/shared/api/v1alpha1/applyconfiguration/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/framework/kube"
	"github.com/dowse-dev/dowse/test/framework/testwait"
)

const nodeA, nodeB = "iso-node-a", "iso-node-b"

func clientFor(t *testing.T, cfg *rest.Config) client.Client {
	t.Helper()
	c, err := client.New(cfg, client.Options{Scheme: suite.Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// agentClient is node's agent, with the token its DaemonSet pod gets.
func agentClient(t *testing.T, node string) client.Client {
	t.Helper()
	cfg, err := kube.AgentConfig(context.Background(), suite.Config, node)
	if err != nil {
		t.Fatal(err)
	}
	return clientFor(t, cfg)
}

// expectRefused checks that err is the policy's refusal naming rule.
func expectRefused(t *testing.T, what string, err error, rule string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: allowed, want refused by rule %s", what, rule)
	}
	if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) {
		t.Fatalf("%s: %v, want a refusal by rule %s", what, err, rule)
	}
	if !strings.Contains(err.Error(), rule+":") || !strings.Contains(err.Error(), "dowse-agent-node-restriction") {
		t.Fatalf("%s: refused, but the message does not name rule %s of the policy: %v", what, rule, err)
	}
}

func mustOK(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// seed makes, as suite.Client, what two agents would have made: a Configuration
// both hold with their finalizers and status entries, a shared Instance both
// see with a slot of B's, and a local Instance of B's.
func seed(t *testing.T, ns string, a client.Client) (*v1alpha1.Configuration, *v1alpha1.Instance, *v1alpha1.Instance) {
	t.Helper()
	ctx := context.Background()
	cfg := &v1alpha1.Configuration{
		ObjectMeta: metav1.ObjectMeta{Name: "cams", Namespace: ns,
			Finalizers: []string{v1alpha1.AgentFinalizer(nodeA), v1alpha1.AgentFinalizer(nodeB)}},
		Spec: v1alpha1.ConfigurationSpec{DiscoveryHandler: v1alpha1.DiscoveryHandlerSpec{Name: "debug-echo"}},
	}
	mustOK(t, "creating configuration", suite.Client.Create(ctx, cfg))
	cfg.Status.Nodes = []v1alpha1.ConfigurationNodeStatus{{NodeName: nodeA, Devices: 1}, {NodeName: nodeB, Devices: 2}}
	cfg.Status.Instances = 2
	mustOK(t, "writing configuration status", suite.Client.Status().Update(ctx, cfg))
	t.Cleanup(func() {
		var c v1alpha1.Configuration
		if suite.Client.Get(ctx, client.ObjectKeyFromObject(cfg), &c) == nil {
			c.Finalizers = nil
			_ = suite.Client.Update(ctx, &c)
		}
	})

	shared := &v1alpha1.Instance{
		ObjectMeta: metav1.ObjectMeta{Name: "cams-shared", Namespace: ns,
			Labels: map[string]string{v1alpha1.NodeLabel(nodeB): ""}},
		Spec: v1alpha1.InstanceSpec{ConfigurationName: "cams", DeviceID: "cam-1", Shared: true, Capacity: 2},
		Status: v1alpha1.InstanceStatus{
			Nodes: []v1alpha1.InstanceNode{{Name: nodeB}},
			Slots: []v1alpha1.InstanceSlot{{ID: v1alpha1.SlotID("cams-shared", 0), Node: nodeB}},
		},
	}
	mustOK(t, "creating shared instance", suite.Client.Create(ctx, shared))
	// Node A sees it too, and says so itself.
	_, err := instancestore.Apply(ctx, a, nodeA, &v1alpha1.Instance{ObjectMeta: metav1.ObjectMeta{Name: shared.Name, Namespace: ns}, Spec: shared.Spec})
	mustOK(t, "node A joining the shared instance", err)
	local := &v1alpha1.Instance{
		ObjectMeta: metav1.ObjectMeta{Name: "cams-local-b", Namespace: ns, Labels: map[string]string{v1alpha1.NodeLabel(nodeB): ""}},
		Spec:       v1alpha1.InstanceSpec{ConfigurationName: "cams", DeviceID: "usb-1", Capacity: 1},
		Status:     v1alpha1.InstanceStatus{Nodes: []v1alpha1.InstanceNode{{Name: nodeB}}},
	}
	mustOK(t, "creating local instance", suite.Client.Create(ctx, local))
	return cfg, shared, local
}

// patch changes obj (read afresh) with change and sends it as c's merge
// patch, as an agent (allowed patch, not update) would.
func patch[T client.Object](t *testing.T, c client.Client, obj T, change func(T)) error {
	t.Helper()
	cur := fresh(t, obj.DeepCopyObject().(T))
	orig := cur.DeepCopyObject().(T)
	change(cur)
	return c.Patch(context.Background(), cur, client.MergeFrom(orig))
}

// patchStatus is patch on the status subresource.
func patchStatus[T client.Object](t *testing.T, c client.Client, obj T, change func(T)) error {
	t.Helper()
	cur := fresh(t, obj.DeepCopyObject().(T))
	orig := cur.DeepCopyObject().(T)
	change(cur)
	return c.Status().Patch(context.Background(), cur, client.MergeFrom(orig))
}

// fresh reads obj again as suite.Client.
func fresh[T client.Object](t *testing.T, obj T) T {
	t.Helper()
	mustOK(t, "reading "+obj.GetName(), suite.Client.Get(context.Background(), client.ObjectKeyFromObject(obj), obj))
	return obj
}

// Everything an agent could do to another node's part, tried with node A's
// credentials: each refused by the rule that forbids it.
func TestAgentCannotTouchAnotherNodesPart(t *testing.T) {
	ns := suite.Namespace(t)
	ctx := context.Background()
	a := agentClient(t, nodeA)
	cfg, shared, local := seed(t, ns, a)

	bOnly := &v1alpha1.Instance{
		ObjectMeta: metav1.ObjectMeta{Name: "cams-forged", Namespace: ns},
		Spec:       v1alpha1.InstanceSpec{ConfigurationName: "cams", DeviceID: "forged", Shared: true},
		Status:     v1alpha1.InstanceStatus{Nodes: []v1alpha1.InstanceNode{{Name: nodeB}}},
	}
	expectRefused(t, "create an Instance naming node B", a.Create(ctx, bOnly), "instance-create")
	both := bOnly.DeepCopy()
	both.Status.Nodes = []v1alpha1.InstanceNode{{Name: nodeA}, {Name: nodeB}}
	expectRefused(t, "create an Instance naming A and B", a.Create(ctx, both), "instance-create")
	withSlot := bOnly.DeepCopy()
	withSlot.Status.Nodes = []v1alpha1.InstanceNode{{Name: nodeA}}
	withSlot.Status.Slots = []v1alpha1.InstanceSlot{{ID: "x-0", Node: nodeB}}
	expectRefused(t, "create an Instance with a slot of B's", a.Create(ctx, withSlot), "instance-slots")

	type inst = *v1alpha1.Instance
	type conf = *v1alpha1.Configuration
	expectRefused(t, "remove node B from a shared Instance", patch(t, a, shared, func(s inst) {
		s.Status.Nodes = []v1alpha1.InstanceNode{{Name: nodeA}}
	}), "instance-nodes")
	expectRefused(t, "take node B's slot", patch(t, a, shared, func(s inst) { s.Status.Slots[0].Node = nodeA }), "instance-slots")
	expectRefused(t, "release node B's slot", patch(t, a, shared, func(s inst) { s.Status.Slots = nil }), "instance-slots")
	expectRefused(t, "claim a slot in node B's name", patch(t, a, shared, func(s inst) {
		s.Status.Slots = append(s.Status.Slots, v1alpha1.InstanceSlot{ID: v1alpha1.SlotID(s.Name, 1), Node: nodeB})
	}), "instance-slots")
	expectRefused(t, "delete an Instance node B still sees", a.Delete(ctx, fresh(t, shared.DeepCopy())), "instance-delete")

	expectRefused(t, "join node B's local Instance", patch(t, a, local, func(l inst) {
		l.Status.Nodes = append(l.Status.Nodes, v1alpha1.InstanceNode{Name: nodeA})
		l.Labels[v1alpha1.NodeLabel(nodeA)] = ""
	}), "instance-local")
	expectRefused(t, "rewrite the spec of a device node A does not see", patch(t, a, local, func(l inst) {
		l.Spec.BrokerProperties = map[string]string{"URL": "rtsp://attacker"}
	}), "instance-spec")
	expectRefused(t, "delete node B's local Instance", a.Delete(ctx, fresh(t, local.DeepCopy())), "instance-delete")
	// Node A sees the shared device too, so it may touch the spec, but not
	// the host paths node B's containers would get.
	expectRefused(t, "mount the host's root into a shared Instance", patch(t, a, shared, func(s inst) {
		s.Spec.Mounts = append(s.Spec.Mounts, v1alpha1.Mount{ContainerPath: "/host", HostPath: "/"})
	}), "instance-shared-host-paths")
	expectRefused(t, "add a device node to a shared Instance", patch(t, a, shared, func(s inst) {
		s.Spec.DeviceSpecs = append(s.Spec.DeviceSpecs, v1alpha1.DeviceNode{ContainerPath: "/dev/mem", HostPath: "/dev/mem"})
	}), "instance-shared-host-paths")

	expectRefused(t, "remove node B's label", patch(t, a, shared, func(s inst) { delete(s.Labels, v1alpha1.NodeLabel(nodeB)) }), "labels")
	expectRefused(t, "label an Instance node A is not in", patch(t, a, local, func(l inst) { l.Labels[v1alpha1.NodeLabel(nodeA)] = "" }), "labels")
	expectRefused(t, "annotate an Instance", patch(t, a, shared, func(s inst) { s.Annotations = map[string]string{"x": "y"} }), "metadata")

	expectRefused(t, "remove node B's finalizer", patch(t, a, cfg, func(c conf) {
		c.Finalizers = []string{v1alpha1.AgentFinalizer(nodeA)}
	}), "finalizers")
	expectRefused(t, "change a Configuration's spec", patch(t, a, cfg, func(c conf) { c.Spec.Capacity = 7 }), "configuration-spec")
	expectRefused(t, "change node B's entry in a Configuration's status", patchStatus(t, a, cfg, func(c conf) { c.Status.Nodes[1].Devices = 0 }), "configuration-status")
	expectRefused(t, "remove node B's entry", patchStatus(t, a, cfg, func(c conf) { c.Status.Nodes = c.Status.Nodes[:1] }), "configuration-status")
	expectRefused(t, "change the controller's part of a Configuration's status", patchStatus(t, a, cfg, func(c conf) { c.Status.Instances = 0 }), "configuration-status")

	// Nothing of B's changed.
	s := fresh(t, shared.DeepCopy())
	if len(s.Status.Nodes) != 2 || len(s.Status.Slots) != 1 || s.Status.Slots[0].Node != nodeB {
		t.Fatalf("shared instance changed: %+v", s.Status)
	}
	if c := fresh(t, cfg.DeepCopy()); len(c.Finalizers) != 2 || c.Status.Nodes[1].Devices != 2 {
		t.Fatalf("configuration changed: %v %+v", c.Finalizers, c.Status)
	}
	// RBAC, not the policy, keeps agents from Configurations' lifecycle.
	if err := a.Delete(ctx, fresh(t, cfg.DeepCopy())); !apierrors.IsForbidden(err) {
		t.Fatalf("agent deleted a Configuration: %v", err)
	}
}

// The same kinds of write on node A's own part succeed, made as the agent
// makes them (internal/instancestore and server-side apply).
func TestAgentWritesItsOwnPart(t *testing.T) {
	ns := suite.Namespace(t)
	ctx := context.Background()
	a := agentClient(t, nodeA)
	cfg, shared, _ := seed(t, ns, a)

	own := &v1alpha1.Instance{
		ObjectMeta: metav1.ObjectMeta{Name: "cams-own", Namespace: ns},
		Spec:       v1alpha1.InstanceSpec{ConfigurationName: "cams", DeviceID: "usb-a", Capacity: 1},
	}
	_, err := instancestore.Apply(ctx, a, nodeA, own)
	mustOK(t, "create its own local Instance", err)
	own = fresh(t, own)
	if _, ok := own.Labels[v1alpha1.NodeLabel(nodeA)]; !ok || !own.HasNode(nodeA) {
		t.Fatalf("own instance %v %+v", own.Labels, own.Status)
	}
	mustOK(t, "claim its own slot", instancestore.ApplySlots(ctx, a, nodeA, own, []v1alpha1.InstanceSlot{{ID: own.SlotIDs()[0], Node: nodeA}}))
	mustOK(t, "release its own slot", instancestore.ApplySlots(ctx, a, nodeA, fresh(t, own), nil))
	deleted, err := instancestore.Release(ctx, a, nodeA, fresh(t, own))
	mustOK(t, "release and delete its own Instance", err)
	if !deleted {
		t.Fatal("the last node's release did not delete the Instance")
	}

	// A shared Instance: A's slot, then A leaves; B's entry, label and slot stay.
	s := fresh(t, shared.DeepCopy())
	mustOK(t, "claim a slot of a shared Instance", instancestore.ApplySlots(ctx, a, nodeA, s, []v1alpha1.InstanceSlot{{ID: s.SlotIDs()[1], Node: nodeA}}))
	mustOK(t, "release its slot", instancestore.ApplySlots(ctx, a, nodeA, fresh(t, s), nil))
	deleted, err = instancestore.Release(ctx, a, nodeA, fresh(t, s))
	mustOK(t, "leave a shared Instance", err)
	s = fresh(t, s)
	if deleted || s.HasNode(nodeA) || !s.HasNode(nodeB) || len(s.Status.Slots) != 1 {
		t.Fatalf("after A left: deleted %v, %+v", deleted, s.Status)
	}
	if _, ok := s.Labels[v1alpha1.NodeLabel(nodeA)]; ok {
		t.Fatalf("A's label stayed after it left: %v", s.Labels)
	}
	// ... and joins again.
	_, err = instancestore.Apply(ctx, a, nodeA, &v1alpha1.Instance{ObjectMeta: metav1.ObjectMeta{Name: s.Name, Namespace: ns}, Spec: s.Spec})
	mustOK(t, "join a shared Instance", err)

	// Its own finalizer and status entry on the Configuration.
	fm := client.FieldOwner(instancestore.FieldManager(nodeA))
	mustOK(t, "drop its own finalizer", a.Apply(ctx, acv1alpha1.Configuration(cfg.Name, ns).WithUID(cfg.UID), fm, client.ForceOwnership))
	mustOK(t, "state its own finalizer", a.Apply(ctx, acv1alpha1.Configuration(cfg.Name, ns).WithUID(cfg.UID).WithFinalizers(v1alpha1.AgentFinalizer(nodeA)), fm, client.ForceOwnership))
	st := acv1alpha1.ConfigurationStatus().WithNodes(acv1alpha1.ConfigurationNodeStatus().WithNodeName(nodeA).WithDevices(5).
		WithConditions(apply.Condition(metav1.Condition{Type: v1alpha1.ConditionDiscovering, Status: metav1.ConditionTrue, Reason: "Streaming", LastTransitionTime: metav1.Now()})))
	mustOK(t, "write its own status entry", a.Status().Apply(ctx, acv1alpha1.Configuration(cfg.Name, ns).WithStatus(st), fm, client.ForceOwnership))
	c := fresh(t, cfg.DeepCopy())
	var mine *v1alpha1.ConfigurationNodeStatus
	for i := range c.Status.Nodes {
		if c.Status.Nodes[i].NodeName == nodeA {
			mine = &c.Status.Nodes[i]
		}
	}
	if mine == nil || mine.Devices != 5 || meta.FindStatusCondition(mine.Conditions, v1alpha1.ConditionDiscovering) == nil || len(c.Finalizers) != 2 {
		t.Fatalf("configuration after A's writes: %v %+v", c.Finalizers, c.Status)
	}
}

// Credentials that are not a live agent pod's get nothing, and say why.
func TestCredentialsThatAreNotAnAgentPod(t *testing.T) {
	ns := suite.Namespace(t)
	ctx := context.Background()
	probe := func() *v1alpha1.Instance {
		return &v1alpha1.Instance{
			ObjectMeta: metav1.ObjectMeta{Name: "cams-probe", Namespace: ns},
			Spec:       v1alpha1.InstanceSpec{ConfigurationName: "cams", DeviceID: "probe", Shared: true},
			Status:     v1alpha1.InstanceStatus{Nodes: []v1alpha1.InstanceNode{{Name: nodeA}}},
		}
	}

	// The token of a pod that was deleted: the API server no longer
	// authenticates it.
	pod, err := kube.AgentPod(ctx, suite.Clientset, kube.AgentServiceAccount, nodeA)
	mustOK(t, "agent pod", err)
	token, err := kube.PodToken(ctx, suite.Clientset, pod)
	mustOK(t, "token", err)
	gone := clientFor(t, kube.WithToken(suite.Config, token))
	mustOK(t, "the live pod's token works", gone.Create(ctx, probe(), client.DryRunAll))
	mustOK(t, "deleting the pod", suite.Clientset.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))}))
	testwait.For(t, 30*time.Second, func() error {
		err := gone.Create(ctx, probe(), client.DryRunAll)
		if !apierrors.IsUnauthorized(err) {
			return fmt.Errorf("a deleted pod's token answered %w, want 401 Unauthorized", err)
		}
		return nil
	})

	// Another service account on the same node: RBAC gives it nothing.
	other := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "not-the-agent", Namespace: kube.AgentNamespace}}
	if err := suite.Client.Create(ctx, other); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	opod, err := kube.AgentPod(ctx, suite.Clientset, other.Name, nodeA)
	mustOK(t, "other pod", err)
	otoken, err := kube.PodToken(ctx, suite.Clientset, opod)
	mustOK(t, "other token", err)
	err = clientFor(t, kube.WithToken(suite.Config, otoken)).Create(ctx, probe())
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "system:serviceaccount:dowse-system:not-the-agent") {
		t.Fatalf("another service account: %v, want RBAC's Forbidden naming it", err)
	}

	// The agent's service account without a pod (a token that names no
	// node): it may read, but not write.
	tr, err := suite.Clientset.CoreV1().ServiceAccounts(kube.AgentNamespace).CreateToken(ctx, kube.AgentServiceAccount, &authnv1.TokenRequest{}, metav1.CreateOptions{})
	mustOK(t, "unbound token", err)
	unbound := clientFor(t, kube.WithToken(suite.Config, tr.Status.Token))
	mustOK(t, "an unbound agent token reads Configurations", unbound.List(ctx, &v1alpha1.ConfigurationList{}, client.InNamespace(ns)))
	expectRefused(t, "an agent token without a node writes", unbound.Create(ctx, probe()), "node-identity")
}

// An agent publishes DRA ResourceSlices for its own node only.
func TestAgentPublishesOnlyItsOwnNodesSlices(t *testing.T) {
	ctx := context.Background()
	a := agentClient(t, nodeA)
	slice := func(name, node string) *resourcev1.ResourceSlice {
		return &resourcev1.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: resourcev1.ResourceSliceSpec{Driver: "dowse.dev", NodeName: ptr.To(node),
				Pool:    resourcev1.ResourcePool{Name: node, ResourceSliceCount: 1},
				Devices: []resourcev1.Device{{Name: "d0"}}},
		}
	}
	own := slice("iso-slice-a", nodeA)
	mustOK(t, "publish its own node's slice", a.Create(ctx, own))
	t.Cleanup(func() { _ = suite.Client.Delete(ctx, own) })
	expectRefused(t, "publish a slice for node B", a.Create(ctx, slice("iso-slice-forged", nodeB)), "resourceslice-node")
	b := slice("iso-slice-b", nodeB)
	mustOK(t, "admin publishes node B's slice", suite.Client.Create(ctx, b))
	t.Cleanup(func() { _ = suite.Client.Delete(ctx, b) })
	expectRefused(t, "change node B's slice", patch(t, a, b, func(s *resourcev1.ResourceSlice) {
		s.Spec.Devices = append(s.Spec.Devices, resourcev1.Device{Name: "d1"})
	}), "resourceslice-node")
	expectRefused(t, "delete node B's slice", a.Delete(ctx, fresh(t, b.DeepCopy())), "resourceslice-node")
	mustOK(t, "delete its own slice", a.Delete(ctx, fresh(t, own.DeepCopy())))
}
