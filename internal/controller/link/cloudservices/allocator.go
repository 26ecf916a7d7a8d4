package cloudservices

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"slices"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// managedBy is the EndpointSlice controller name of the cloud sides'
// slices (Kubernetes' own leaves slices it does not manage alone).
const managedBy = "cloudservices.dowse.dev"

// Allocator, run by the leader alone, gives each Service that asks to be
// reached from the cloud side replica ports (AnnotationPorts) and keeps
// its cloud-side Service and EndpointSlice (the replicas that relay, at
// those ports) current; it removes them from a Service that no longer
// asks. It lists those Services by their label every Every, so no cache
// of every Service in the cluster is kept.
type Allocator struct {
	// Client writes; Reader reads (the API server: the manager's cache
	// holds only the Services Dowse makes, and no EndpointSlices).
	Client client.Client
	Reader client.Reader
	Ports  PortRange
	// Hosts are the addresses the replicas relay on (their presence).
	Hosts func() []string
	// Every is how often Services and replicas are looked at again (2s).
	Every time.Duration
	Log   logr.Logger
}

// NeedLeaderElection: ports are given by one replica.
func (a *Allocator) NeedLeaderElection() bool { return true }

// Start runs until ctx ends.
func (a *Allocator) Start(ctx context.Context) error {
	every := a.Every
	if every <= 0 {
		every = 2 * time.Second
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if err := a.Sync(ctx); err != nil && ctx.Err() == nil {
			a.Log.Error(err, "cloud-side Services")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Sync brings every asking Service's ports and cloud side up to date.
func (a *Allocator) Sync(ctx context.Context) error {
	var asking corev1.ServiceList
	if err := a.Reader.List(ctx, &asking, client.HasLabels{LabelReach}); err != nil {
		return fmt.Errorf("listing services labelled %s: %w", LabelReach, err)
	}
	used := map[int32]types.NamespacedName{}
	for i := range asking.Items {
		s := &asking.Items[i]
		for _, p := range ports(s) {
			if _, taken := used[p]; !taken && reachable(s) && a.Ports.contains(p) {
				used[p] = client.ObjectKeyFromObject(s)
			}
		}
	}
	hosts := a.Hosts()
	var errs []error
	labelled := map[types.NamespacedName]bool{}
	for i := range asking.Items {
		s := &asking.Items[i]
		labelled[client.ObjectKeyFromObject(s)] = true
		if err := a.sync(ctx, s, used, hosts); err != nil {
			errs = append(errs, fmt.Errorf("service %s/%s: %w", s.Namespace, s.Name, err))
		}
	}
	// The cloud sides of Services no longer labelled (listed above no
	// more) go too.
	var clouds corev1.ServiceList
	if err := a.Reader.List(ctx, &clouds, client.HasLabels{LabelCloudOf}); err != nil {
		return fmt.Errorf("listing cloud-side Services: %w", err)
	}
	for _, cs := range clouds.Items {
		key := types.NamespacedName{Namespace: cs.Namespace, Name: cs.Labels[LabelCloudOf]}
		if labelled[key] {
			continue
		}
		var s corev1.Service
		if err := a.Reader.Get(ctx, key, &s); err != nil {
			if !apierrors.IsNotFound(err) {
				errs = append(errs, err)
			}
			continue // gone: the garbage collector takes its cloud side
		}
		if err := a.removeCloudSide(ctx, &s); err != nil {
			errs = append(errs, fmt.Errorf("service %s: %w", key, err))
		} else if s.Annotations[AnnotationPorts] != "" {
			if err := a.annotate(ctx, &s, ""); err != nil {
				errs = append(errs, fmt.Errorf("service %s: %w", key, err))
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%v", errs)
	}
	return nil
}

func (a *Allocator) sync(ctx context.Context, s *corev1.Service, used map[int32]types.NamespacedName, hosts []string) error {
	key := client.ObjectKeyFromObject(s)
	if !reachable(s) {
		// A cloud side of its own, or no longer asking (or unable to):
		// its ports are given up, its cloud side removed.
		if s.Labels[LabelCloudOf] != "" || s.Annotations[AnnotationPorts] == "" {
			return nil
		}
		if err := a.removeCloudSide(ctx, s); err != nil {
			return err
		}
		return a.annotate(ctx, s, "")
	}
	name, err := CloudName(s.Name)
	if err != nil {
		return err
	}
	have := ports(s)
	want := map[int32]int32{}
	for _, p := range tcpPorts(s) {
		if rp, ok := have[p.Port]; ok && a.Ports.contains(rp) && used[rp] == key {
			want[p.Port] = rp
			continue
		}
		rp, ok := a.free(used)
		if !ok {
			return fmt.Errorf("no replica port left in %d-%d", a.Ports.Min, a.Ports.Max)
		}
		used[rp] = key
		want[p.Port] = rp
	}
	if !maps.Equal(have, want) {
		if err := a.annotate(ctx, s, formatPorts(want)); err != nil {
			return err
		}
	}
	if err := a.ensureService(ctx, s, name, want); err != nil {
		return err
	}
	return a.ensureSlice(ctx, s, name, want, hosts)
}

// free is the lowest replica port no Service holds.
func (a *Allocator) free(used map[int32]types.NamespacedName) (int32, bool) {
	for p := a.Ports.Min; p <= a.Ports.Max; p++ {
		if _, taken := used[p]; !taken {
			return p, true
		}
	}
	return 0, false
}

func (a *Allocator) annotate(ctx context.Context, s *corev1.Service, value string) error {
	var v any = value
	if value == "" {
		v = nil
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{AnnotationPorts: v}}})
	if err != nil {
		return err
	}
	if err := a.Client.Patch(ctx, s, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return fmt.Errorf("recording its replica ports: %w", err)
	}
	a.Log.Info("cloud-side ports", "service", client.ObjectKeyFromObject(s).String(), "ports", value)
	return nil
}

func owner(s *corev1.Service) []metav1.OwnerReference {
	return []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: s.Name, UID: s.UID, Controller: ptr.To(true)}}
}

func cloudPorts(s *corev1.Service, want map[int32]int32) []corev1.ServicePort {
	var out []corev1.ServicePort
	for _, p := range tcpPorts(s) {
		out = append(out, corev1.ServicePort{Name: p.Name, Protocol: corev1.ProtocolTCP, Port: p.Port, TargetPort: intOrPort(want[p.Port])})
	}
	return out
}

// ensureService makes the cloud-side Service: no selector (its
// EndpointSlice is ours), the Service's ports, each to its replica port.
func (a *Allocator) ensureService(ctx context.Context, s *corev1.Service, name string, want map[int32]int32) error {
	ports := cloudPorts(s, want)
	var cur corev1.Service
	err := a.Reader.Get(ctx, types.NamespacedName{Namespace: s.Namespace, Name: name}, &cur)
	if apierrors.IsNotFound(err) {
		svc := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.Namespace, Labels: map[string]string{LabelCloudOf: s.Name}, OwnerReferences: owner(s)},
			Spec:       corev1.ServiceSpec{Ports: ports},
		}
		if err := a.Client.Create(ctx, svc); err != nil {
			return fmt.Errorf("creating its cloud side %s: %w", name, err)
		}
		a.Log.Info("cloud-side Service made", "service", s.Namespace+"/"+s.Name, "cloudService", name)
		return nil
	}
	if err != nil {
		return err
	}
	if cur.Labels[LabelCloudOf] != s.Name {
		return fmt.Errorf("a Service %s that is not its cloud side exists", name)
	}
	if slices.EqualFunc(cur.Spec.Ports, ports, func(x, y corev1.ServicePort) bool {
		return x.Name == y.Name && x.Port == y.Port && x.TargetPort == y.TargetPort && x.Protocol == y.Protocol
	}) {
		return nil
	}
	cur.Spec.Ports = ports
	return a.Client.Update(ctx, &cur)
}

// ensureSlice makes the cloud side's EndpointSlice: the relaying
// replicas' addresses (IPv4, neither loopback nor link-local, which an
// EndpointSlice may not hold; the rest are left out), each Service port at
// its replica port.
func (a *Allocator) ensureSlice(ctx context.Context, s *corev1.Service, name string, want map[int32]int32, hosts []string) error {
	var eps []discoveryv1.Endpoint
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil && ip.To4() != nil && !ip.IsLoopback() && !ip.IsLinkLocalUnicast() {
			eps = append(eps, discoveryv1.Endpoint{Addresses: []string{h}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
		}
	}
	var ports []discoveryv1.EndpointPort
	for _, p := range tcpPorts(s) {
		ports = append(ports, discoveryv1.EndpointPort{Name: ptr.To(p.Name), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(want[p.Port])})
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.Namespace, OwnerReferences: owner(s),
			Labels: map[string]string{discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: managedBy, LabelCloudOf: s.Name}},
		AddressType: discoveryv1.AddressTypeIPv4, Endpoints: eps, Ports: ports,
	}
	var cur discoveryv1.EndpointSlice
	err := a.Reader.Get(ctx, types.NamespacedName{Namespace: s.Namespace, Name: name}, &cur)
	if apierrors.IsNotFound(err) {
		return a.Client.Create(ctx, slice)
	}
	if err != nil {
		return err
	}
	if sameEndpoints(cur.Endpoints, eps) && slices.EqualFunc(cur.Ports, ports, func(x, y discoveryv1.EndpointPort) bool {
		return ptr.Deref(x.Name, "") == ptr.Deref(y.Name, "") && ptr.Deref(x.Port, 0) == ptr.Deref(y.Port, 0)
	}) {
		return nil
	}
	cur.Endpoints, cur.Ports = eps, ports
	return a.Client.Update(ctx, &cur)
}

func sameEndpoints(a, b []discoveryv1.Endpoint) bool {
	return slices.EqualFunc(a, b, func(x, y discoveryv1.Endpoint) bool { return slices.Equal(x.Addresses, y.Addresses) })
}

// removeCloudSide deletes the cloud-side Service and EndpointSlice of s
// (only ones labelled as its).
func (a *Allocator) removeCloudSide(ctx context.Context, s *corev1.Service) error {
	name, err := CloudName(s.Name)
	if err != nil {
		return nil //nolint:nilerr // no cloud side was ever made
	}
	key := types.NamespacedName{Namespace: s.Namespace, Name: name}
	for _, o := range []client.Object{&corev1.Service{}, &discoveryv1.EndpointSlice{}} {
		if err := a.Reader.Get(ctx, key, o); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return err
		}
		if o.GetLabels()[LabelCloudOf] != s.Name {
			continue
		}
		if err := a.Client.Delete(ctx, o); client.IgnoreNotFound(err) != nil {
			return err
		}
	}
	a.Log.Info("cloud-side Service removed", "service", s.Namespace+"/"+s.Name)
	return nil
}

func intOrPort(p int32) intstr.IntOrString { return intstr.FromInt32(p) }
