package dra

import (
	"context"
	"reflect"
	"testing"

	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	shareddra "github.com/dowse-dev/dowse/internal/dra"
	"github.com/dowse-dev/dowse/internal/scheme"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// TestDesired: a shared Instance of a DRA Configuration is one pool with
// one device whose selector names its nodes by hostname label (the name
// when a Node has none); local Instances, Instances of device-plugin
// Configurations and Instances no node sees are left out; the slices are
// owned by the Configuration's DeviceClass.
func TestDesired(t *testing.T) {
	sch, err := scheme.New()
	if err != nil {
		t.Fatal(err)
	}
	inst := func(name, cfg string, shared bool, nodes ...string) *v1alpha1.Instance {
		i := &v1alpha1.Instance{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "plant"},
			Spec: v1alpha1.InstanceSpec{ConfigurationName: cfg, Shared: shared, Capacity: 3, BrokerProperties: map[string]string{"MODEL": "x"}}}
		for _, n := range nodes {
			i.Status.Nodes = append(i.Status.Nodes, v1alpha1.InstanceNode{Name: n})
		}
		return i
	}
	c := fake.NewClientBuilder().WithScheme(sch).WithObjects(
		&v1alpha1.Configuration{ObjectMeta: metav1.ObjectMeta{Name: "cams", Namespace: "plant"}, Spec: v1alpha1.ConfigurationSpec{Allocation: v1alpha1.AllocationDRA}},
		&v1alpha1.Configuration{ObjectMeta: metav1.ObjectMeta{Name: "plain", Namespace: "plant"}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: map[string]string{corev1.LabelHostname: "host-a"}}},
		&resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: shareddra.DeviceClassName("plant", "cams"), UID: "class-uid"}},
		inst("cams-0123456789abcdef", "cams", true, "node-b", "node-a"),
		inst("cams-1111111111111111", "cams", false, "node-a"),
		inst("cams-2222222222222222", "cams", true),
		inst("plain-3333333333333333", "plain", true, "node-a"),
	).Build()
	p := NewPublisher(nil, nil, nil, nil, testr.New(t))
	p.reader = c
	got, err := p.Desired(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	pool := shareddra.SharedPool("plant", "cams", "0123456789abcdef")
	if len(got) != 1 {
		t.Fatalf("pools %v", got)
	}
	pl := got[pool]
	if len(pl.Slices) != 1 || len(pl.Slices[0].Devices()) != 1 || pl.Slices[0].Devices()[0].Name != "0123456789abcdef" {
		t.Fatalf("pool %+v", pl)
	}
	if pl.Owner == nil || pl.Owner.Kind != "DeviceClass" || pl.Owner.UID != "class-uid" {
		t.Errorf("owner %+v, want the Configuration's DeviceClass", pl.Owner)
	}
	if v := pl.NodeSelector.NodeSelectorTerms[0].MatchExpressions[0].Values; !reflect.DeepEqual(v, []string{"host-a", "node-b"}) {
		t.Errorf("selected %v", v)
	}
}
