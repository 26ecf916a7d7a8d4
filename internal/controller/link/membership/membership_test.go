package membership

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/dowse-dev/dowse/internal/scheme"
	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

func newFake(t *testing.T) *fake.ClientBuilder {
	t.Helper()
	s, err := scheme.New()
	if err != nil {
		t.Fatal(err)
	}
	return fake.NewClientBuilder().WithScheme(s)
}

func instance(name string, nodes ...string) *v1alpha1.Instance {
	inst := &v1alpha1.Instance{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns"}, Spec: v1alpha1.InstanceSpec{ConfigurationName: "c", DeviceID: name}}
	for _, n := range nodes {
		inst.Status.Nodes = append(inst.Status.Nodes, v1alpha1.InstanceNode{Name: n})
	}
	return inst
}

// A node speaks for the Instances that list it and the Devices whose twin
// it owns, and no others.
func TestAuthorizeDevice(t *testing.T) {
	dev := &v1alpha1.Device{ObjectMeta: metav1.ObjectMeta{Name: "twin", Namespace: "ns"}}
	dev.Spec.NodeName = "edge-a"
	c := newFake(t).WithObjects(instance("seen", "edge-a", "edge-b"), instance("elsewhere", "edge-b"), dev).
		WithIndex(&v1alpha1.Instance{}, NodeIndex, IndexByNode).Build()
	a := Authorizer{Reader: c}
	ctx := context.Background()
	for _, tc := range []struct {
		node, name, wantErr string
	}{
		{"edge-a", "seen", ""},
		{"edge-b", "seen", ""},
		{"edge-a", "elsewhere", "does not see"},
		{"edge-a", "gone", "does not exist"},
		{"edge-a", "twin", ""},
		{"edge-b", "twin", `node "edge-a"'s`},
		{"edge-a", "", "named no device"},
	} {
		err := a.AuthorizeDevice(ctx, tc.node, &linkv1.DeviceRef{Namespace: "ns", Name: tc.name})
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("%s on %s: %v", tc.node, tc.name, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%s on %s: %v, want an error saying %q", tc.node, tc.name, err, tc.wantErr)
		}
	}
	m, err := Of(ctx, c, "edge-b")
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Devices) != 2 || m.Devices[0].Name != "elsewhere" || m.Devices[1].Name != "seen" {
		t.Fatalf("edge-b's membership: %v", m.Devices)
	}
}

func TestNodeUIDOnlyOfNodesOfTheCluster(t *testing.T) {
	c := newFake(t).WithObjects(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "edge-a", UID: "uid-a"}}).Build()
	for node, want := range map[string]string{"edge-a": "uid-a", "edge-gone": ""} {
		uid, ok, err := NodeUID(c)(context.Background(), node)
		if err != nil || uid != want || ok != (want != "") {
			t.Errorf("NodeUID(%s) = %q, %v, %v; want %q", node, uid, ok, err, want)
		}
	}
}
