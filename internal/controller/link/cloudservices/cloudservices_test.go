package cloudservices

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

func svc(name string, reach bool, ports ...int32) *corev1.Service {
	s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("uid-" + name), Labels: map[string]string{}},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": name}}}
	if reach {
		s.Labels[LabelReach] = "true"
	}
	for _, p := range ports {
		s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: fmt.Sprintf("p%d", p), Port: p, TargetPort: intstr.FromInt32(p + 8000)})
	}
	return s
}

func newAllocator(t *testing.T, hosts []string, objs ...client.Object) (*Allocator, client.Client) {
	t.Helper()
	sch := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(sch); err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(sch).WithObjects(objs...).Build()
	return &Allocator{Client: c, Reader: c, Ports: PortRange{Min: 31000, Max: 31002}, Hosts: func() []string { return hosts }, Log: logr.Discard()}, c
}

func get[T client.Object](t *testing.T, c client.Client, name string, o T) T {
	t.Helper()
	if err := c.Get(context.Background(), types.NamespacedName{Namespace: "ns", Name: name}, o); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return o
}

// TestAllocator: each asking Service gets replica ports of its own from
// the range, a cloud-side Service mapping its ports to them and an
// EndpointSlice of the relaying replicas (IPv4 only); one the range cannot
// hold is refused with the reason; a Service that stops asking loses them.
func TestAllocator(t *testing.T) {
	ctx := context.Background()
	a, c := newAllocator(t, []string{"10.0.0.2", "10.0.0.1", "fd00::1", "127.0.0.1", "169.254.0.9"},
		svc("cam", true, 80, 554), svc("plc", true, 502), svc("other", false, 80), svc("full", true, 1))
	err := a.Sync(ctx)
	if err == nil || !strings.Contains(err.Error(), "no replica port left in 31000-31002") {
		t.Fatalf("sync: %v; want the fourth port refused", err)
	}
	got := map[string]map[int32]int32{}
	seen := map[int32]string{}
	for _, n := range []string{"cam", "plc", "full"} {
		got[n] = ports(get(t, c, n, &corev1.Service{}))
		for _, rp := range got[n] {
			if other, dup := seen[rp]; dup {
				t.Fatalf("port %d given to %s and %s", rp, other, n)
			}
			seen[rp] = n
		}
	}
	if len(got["cam"])+len(got["plc"])+len(got["full"]) != 3 || len(seen) != 3 {
		t.Fatalf("ports %v: want the range's three given, each once", got)
	}
	if ann := get(t, c, "other", &corev1.Service{}).Annotations[AnnotationPorts]; ann != "" {
		t.Errorf("a Service that did not ask got ports %q", ann)
	}
	var asked string
	for _, n := range []string{"cam", "plc"} {
		if len(got[n]) > 0 {
			asked = n
		}
	}
	cloud := get(t, c, asked+Suffix, &corev1.Service{})
	if len(cloud.Spec.Selector) != 0 || cloud.Labels[LabelCloudOf] != asked || cloud.OwnerReferences[0].UID != types.UID("uid-"+asked) {
		t.Errorf("cloud side %+v", cloud.ObjectMeta)
	}
	for _, p := range cloud.Spec.Ports {
		if got[asked][p.Port] == 0 || p.TargetPort.IntVal != got[asked][p.Port] {
			t.Errorf("cloud port %d → %v, want its replica port %d", p.Port, p.TargetPort, got[asked][p.Port])
		}
	}
	slice := get(t, c, asked+Suffix, &discoveryv1.EndpointSlice{})
	if slice.Labels[discoveryv1.LabelServiceName] != asked+Suffix || len(slice.Endpoints) != 2 ||
		slice.Endpoints[0].Addresses[0] != "10.0.0.2" || slice.Endpoints[1].Addresses[0] != "10.0.0.1" {
		t.Errorf("slice %+v: want the two IPv4 replicas for %s (no IPv6, loopback or link-local address)", slice.Endpoints, asked+Suffix)
	}

	// Given ports stay with their Services across syncs.
	_ = a.Sync(ctx)
	for n, want := range got {
		if now := ports(get(t, c, n, &corev1.Service{})); len(now) != len(want) || formatPorts(now) != formatPorts(want) {
			t.Errorf("%s's ports moved from %v to %v", n, want, now)
		}
	}

	// The Service stops asking: its ports and cloud side go.
	s := get(t, c, asked, &corev1.Service{})
	delete(s.Labels, LabelReach)
	if err := c.Update(ctx, s); err != nil {
		t.Fatal(err)
	}
	_ = a.Sync(ctx)
	if ann := get(t, c, asked, &corev1.Service{}).Annotations[AnnotationPorts]; ann != "" {
		t.Errorf("ports %q kept by a Service that no longer asks", ann)
	}
	if err := c.Get(ctx, types.NamespacedName{Namespace: "ns", Name: asked + Suffix}, &corev1.Service{}); !apierrors.IsNotFound(err) {
		t.Errorf("cloud side of a Service that no longer asks: %v", err)
	}
}

// TestTargetPort: a number, a container port's name, or the Service port.
func TestTargetPort(t *testing.T) {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "b"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Ports: []corev1.ContainerPort{{Name: "rtsp", ContainerPort: 8554}}}}}}
	for _, c := range []struct {
		sp   corev1.ServicePort
		want int32
	}{
		{corev1.ServicePort{Port: 80, TargetPort: intstr.FromInt32(8080)}, 8080},
		{corev1.ServicePort{Port: 554, TargetPort: intstr.FromString("rtsp")}, 8554},
		{corev1.ServicePort{Port: 502}, 502},
	} {
		if got, err := targetPort(p, &c.sp); err != nil || got != c.want {
			t.Errorf("%+v: %d, %v; want %d", c.sp, got, err, c.want)
		}
	}
	if _, err := targetPort(p, &corev1.ServicePort{Port: 1, TargetPort: intstr.FromString("http")}); err == nil {
		t.Error("a port name the pod lacks was taken")
	}
}

func TestParsePortRange(t *testing.T) {
	if r, err := ParsePortRange("31000-31999"); err != nil || r.Min != 31000 || r.Max != 31999 || r.Off() {
		t.Errorf("%+v %v", r, err)
	}
	if r, err := ParsePortRange(""); err != nil || !r.Off() {
		t.Errorf("empty: %+v %v", r, err)
	}
	for _, bad := range []string{"31999-31000", "0-10", "1-70000", "x-y", "31000"} {
		if _, err := ParsePortRange(bad); err == nil {
			t.Errorf("%q taken", bad)
		}
	}
}
